"""What the MCP server may run and accept: read-only by construction, not by convention.

An agent's arguments are untrusted text. Identifiers are checked against the project's closed
forms (:mod:`slurm_triage.ids`) before any use, and every subprocess this process starts passes
an audit hook that admits only read-only Slurm queries and the log scanner's ``grep``/``wc``,
by absolute path, without a shell. A tool that slipped past review still cannot drain, resume,
requeue or kill anything: ``scontrol update`` or ``scancel`` never leave this process.
"""
from __future__ import annotations

import ipaddress
import os
import re
import stat
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import ids

# Read-only Slurm queries by basename; scontrol only with "show" as its first argument.
_SLURM_READERS = ("sacct", "sinfo", "squeue", "scontrol")
# The log scanner's prefilter (triage.logs): read-only tools it runs by absolute path.
_SCAN_TOOLS = ("grep", "wc")
_SAFE_DIRS = ("/usr/bin", "/bin", "/usr/local/bin", "/usr/sbin", "/sbin")
_installed: List[Tuple[str, ...]] = []
"""The directories the installed hook trusts (install's), once installed."""


class GuardError(ValueError):
    """An argument or a subprocess the server refuses; its text is safe to show the agent."""


def allowed_command(executable: Any, argv: Sequence[Any], dirs: Sequence[str] = _SAFE_DIRS) -> Optional[str]:
    """None when ``argv`` may run from one of ``dirs``, else why not. Pure, so the rule is testable on its own."""
    args = [os.fsdecode(a) if isinstance(a, (bytes, os.PathLike)) else str(a) for a in argv]
    exe = os.fsdecode(executable) if executable is not None else (args[0] if args else "")
    if not args or not os.path.isabs(exe):
        return f"not an absolute path: {exe!r}"
    if os.path.dirname(exe) not in dirs:
        return f"not in a system directory: {exe!r}"
    name = os.path.basename(exe)
    if name in _SCAN_TOOLS:
        return None
    if name not in _SLURM_READERS:
        return f"not on the allowlist ({', '.join(_SLURM_READERS + _SCAN_TOOLS)}): {name}"
    if name == "scontrol":
        verbs = [a for a in args[1:] if not a.startswith("-")]
        if not verbs or verbs[0] != "show":
            return "scontrol is allowed only as 'scontrol show ...'"
    return None


def _audit(event: str, args: Tuple[Any, ...]) -> None:
    if event == "subprocess.Popen":
        executable, argv = args[0], args[1]
        argv = [argv] if isinstance(argv, (str, bytes)) else list(argv or ())
        why = allowed_command(executable, argv, _installed[0] if _installed else _SAFE_DIRS)
        if why:
            raise GuardError(f"subprocess refused: {why}")
    elif event in ("os.system", "os.posix_spawn", "os.exec", "os.spawn"):
        raise GuardError(f"subprocess refused: {event} is never used by the MCP server")


def _root_only(d: str, sticky_ok: bool) -> bool:
    """Root owns ``d`` and no one else may write to it (or, for a directory above, only under the sticky
    bit, which keeps others from renaming or removing root's entries: /tmp)."""
    try:
        st = os.stat(d)
    except OSError:
        return False
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return st.st_uid == 0 and (not writable or (sticky_ok and bool(st.st_mode & stat.S_ISVTX)))


def trusted_dirs(clients: Sequence[str]) -> Tuple[str, ...]:
    """The system directories, and those of the Slurm clients the (root's) config names by absolute path
    (a Slurm built under /opt/slurm/bin) when root owns the directory and every one above it, and no one
    else may write to them."""
    out = list(_SAFE_DIRS)
    for path in clients:
        d = os.path.dirname(os.path.normpath(path)) if path else ""
        if not os.path.isabs(path or "") or d in out or not _root_only(d, sticky_ok=False):
            continue
        above = [os.path.dirname(d)]
        while above[-1] != os.path.dirname(above[-1]):
            above.append(os.path.dirname(above[-1]))
        if all(_root_only(a, sticky_ok=True) for a in above):
            out.append(d)
    return tuple(out)


def install(dirs: Sequence[str] = _SAFE_DIRS) -> None:
    """Install the subprocess audit hook for the rest of this process (it cannot be removed); it admits
    programs from ``dirs`` only (:func:`trusted_dirs`). A second call changes nothing."""
    if not _installed:
        _installed.append(tuple(dirs))
        sys.addaudithook(_audit)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and "localhost": the only binds allowed without a token."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def job_id(value: Any) -> str:
    text = value if isinstance(value, str) else str(value) if isinstance(value, int) else ""
    if not ids.is_job_id(text):
        raise GuardError(f"not a Slurm job id: {_show(value)} (digits only)")
    return text


def node(value: Any) -> str:
    if not isinstance(value, str) or not ids.is_node(value):
        raise GuardError(f"not a Slurm node name: {_show(value)}")
    return value


def choice(value: Any, allowed: Sequence[str], what: str) -> str:
    if value not in allowed:
        raise GuardError(f"{what} must be one of {', '.join(allowed)}, not {_show(value)}")
    return str(value)


_GPU = re.compile(r"[0-9]{1,3}|GPU-[0-9a-fA-F-]{8,64}")


def gpu(value: Any) -> Optional[str]:
    if value is None:
        return None
    text = str(value) if isinstance(value, (int, str)) else ""
    if not _GPU.fullmatch(text):
        raise GuardError(f"not a GPU index or UUID: {_show(value)}")
    return text


def readable_log(path: Any, max_bytes: int) -> Dict[str, Any]:
    """``{"path", "bytes"}`` for a regular file this process may read, else GuardError.

    Devices, FIFOs, sockets and directories are refused before anything opens them (a FIFO
    would block the server, /dev/zero would never end); symlinks are resolved and the target
    judged, and a symlink loop is an error, not a hang."""
    if not isinstance(path, str) or not path or "\x00" in path or len(path) > 4096:
        raise GuardError(f"not a path: {_show(path)}")
    try:
        real = os.path.realpath(path, strict=True) if sys.version_info >= (3, 10) else os.path.realpath(path)
        st = os.stat(real)
    except OSError as e:
        raise GuardError(f"{_show(path)}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        raise GuardError(f"{_show(path)}: not a regular file")
    if st.st_size > max_bytes:
        raise GuardError(f"{_show(path)}: {st.st_size} bytes, over the {max_bytes}-byte limit for one log")
    if not os.access(real, os.R_OK):
        raise GuardError(f"{_show(path)}: not readable by this user")
    return {"path": real, "bytes": st.st_size}


def _show(value: Any, limit: int = 60) -> str:
    """An argument quoted for an error message: bounded and free of control characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars)"
