"""What terminals, launchers and pastes add to a log line that its program did not write.

A job's log comes coloured (ANSI escapes from loguru, rich, colorlog), labelled per rank
(torchrun's ``[rank3]:`` and ``[default0]:``, ``srun --label``'s ``3: ``, Open MPI's
``--tag-output`` ``[1,3]<stderr>:``), stamped by a log collector (``kubectl logs --timestamps``,
``docker logs -t``: RFC 3339 with nanoseconds) or quoted (``> `` in a mail or a Markdown reply). The
catalog's regexes, the parsers' layouts and the first-error scan are written for the line as its
program printed it: each reader takes the line through :func:`undecorate` first. Line numbers never
change (nothing here removes a newline).
"""
from __future__ import annotations

import re
from typing import Optional, Tuple

_ESC = r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[()*+#][0-9A-Za-z@]|[@-Z\\-_])"
"""ECMA-48: a CSI sequence (colours, cursor moves), an OSC string (titles, links), a character-set
designation (tput sgr0 ends with ``ESC ( B``), or a 2-byte escape."""
_ANSI = re.compile(_ESC)
_ANSI_BYTES = re.compile(_ESC.encode())

_LABEL = re.compile(
    r"(?:\s*(?:>[ \t]?)+"                                    # mail / Markdown quote, nested ("> > ")
    r"|\[rank(?P<rank>\d+)\]:[ \t]?"                         # torch.distributed's per-rank prefix
    r"|\[default\d+\]:[ \t]?"                                # torchrun --tee: the local rank of a group
    r"|\[\d+,(?P<mpi>\d+)\]<std(?:out|err|diag)>:[ \t]?"     # Open MPI --tag-output: [job,rank]
    r"|[ \t]{0,4}(?P<task>\d{1,5}): "                       # srun --label: the task id (the line's own
                                                             # indentation follows)
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{7,9}Z[ \t])")    # kubectl/docker logs --timestamps, CI runners'
                                                             # collector time (the line's own time follows)
_LABEL_STARTS = frozenset(" \t>[0123456789")
"""The characters a label can start with: a line that starts otherwise skips the regex."""
MAX_LABELS = 3
"""Labels stack ("> [rank1]: 1: ..."): this many are taken off a line at most."""


def strip_ansi(text: str) -> str:
    """``text`` without escape sequences (a line without ESC is returned as it is, at once)."""
    return _ANSI.sub("", text) if "\x1b" in text else text


def strip_ansi_bytes(data: bytes) -> bytes:
    """The same for undecoded bytes (the word prior reads bytes)."""
    return _ANSI_BYTES.sub(b"", data) if b"\x1b" in data else data


def undecorate(text: str) -> Tuple[str, Optional[int]]:
    """(the line as its program wrote it, the rank its labels name or None). ``text`` is taken
    without escape sequences; labels come off the front only. Of stacked labels, torch's names the
    rank (``srun -l`` then labels the launcher's task, one per node)."""
    text = strip_ansi(text)
    if text[:1] not in _LABEL_STARTS:
        return text, None  # most lines: no regex
    torch: Optional[str] = None
    other: Optional[str] = None
    for _ in range(MAX_LABELS):
        m = _LABEL.match(text)
        if not m or not m.end():
            break
        torch = torch or m["rank"]
        other = other or m["mpi"] or m["task"]
        text = text[m.end():]
    label = torch or other
    return text, int(label) if label is not None else None
