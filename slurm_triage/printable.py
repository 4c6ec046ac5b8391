"""Text from outside (file names, process titles, log lines) made safe to print and store.

A user chooses the bytes of a /dev/shm name or a process title: 0xff, a newline, an ANSI
escape. Printed raw they crash a UTF-8 writer (UnicodeEncodeError on a surrogate) or forge
lines in hooks.log and on a terminal. ``printable`` maps any bytes to one line of UTF-8
text, reversibly: undecodable bytes and control characters become ``\\xNN``, a backslash
becomes ``\\\\``, so two different names never print alike.
"""
from __future__ import annotations

import re
from typing import Union

# C0 controls, DEL, C1 controls, the backslash (escaped so the mapping stays one-to-one), the
# surrogates that stand for undecodable bytes, line/paragraph separators and bidi overrides
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\\\\\udc80-\udcff\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(m: "re.Match[str]") -> str:
    c = ord(m.group(0))
    if c == 0x5c:
        return "\\\\"
    if 0x2028 <= c <= 0x2069:
        return f"\\u{c:04x}"
    return f"\\x{c - 0xdc00 if c >= 0xdc80 else c:02x}"


def printable(raw: Union[bytes, str]) -> str:
    """One printable line for ``raw`` (bytes, or a str that may carry surrogate escapes)."""
    if isinstance(raw, str):
        try:
            raw = raw.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:  # a lone surrogate that stands for no byte
            raw = raw.encode("utf-8", "backslashreplace")
    return _UNSAFE.sub(_escape, raw.decode("utf-8", "surrogateescape"))
