"""The Epilog's clean-up of a finished job's leftovers: signals that cannot hit a stranger,
file removal that cannot end the Epilog.

A PID names a process only while it lives: a leftover that dies during the grace period
frees its PID, and a fork loop can hand it to anyone within seconds. Each target is
therefore pinned before the first signal: a pidfd (Linux >= 5.3, Python >= 3.9) opened
and then checked against the uid and start time the snapshot saw, so every later signal
and the wait for exit go to that very process. Without pidfds, uid and start time are
re-read immediately before each signal (a small window remains; the pidfd closes it).
A process is "unkillable" only when it is still there KILL_WAIT_SECONDS after SIGKILL:
freeing gigabytes of memory takes a visible fraction of a second.
"""
from __future__ import annotations

import errno
import os
import select
import signal
import stat
import time
from typing import Any, Dict, List, Optional, Tuple

KILL_WAIT_SECONDS = 5.0
"""How long a SIGKILLed process may take to exit before it counts as unkillable."""
POLL_SECONDS = 0.05


def _identity(pid: int) -> Optional[Tuple[int, int, str]]:
    """(uid, start time in clock ticks since boot, state letter) of ``pid``, None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        uid = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    f = data[data.rfind(b")") + 2:].split()
    return uid, int(f[19]), f[0].decode()


class _Target:
    """One leftover, pinned to the process the snapshot saw (or found gone)."""

    def __init__(self, row: Dict[str, Any]):
        self.pid: int = row["pid"]
        self.uid: int = row["uid"]
        self.ticks: Optional[int] = row.get("start_ticks")
        self.comm: str = row.get("comm") or "?"
        self.pidfd: Optional[int] = None
        self.state: Optional[str] = row.get("state")

    def same(self) -> bool:
        """True while ``pid`` is still the process the snapshot saw, and not a zombie."""
        now = _identity(self.pid)
        if now is None or now[0] != self.uid or now[1] != self.ticks:
            return False
        self.state = now[2]
        return now[2] not in ("Z", "X")

    def pin(self) -> bool:
        """Open a pidfd when the system has them; False when the process is already gone."""
        if self.ticks is None:
            return False  # no start time to check the PID against: never signal it
        try:
            self.pidfd = os.pidfd_open(self.pid)  # type: ignore[attr-defined]
        except ProcessLookupError:
            return False
        except (AttributeError, OSError):
            self.pidfd = None  # no pidfds (old kernel or Python): re-check before each signal
        if not self.same():  # checked after the open: the pidfd is that process's
            self.close()
            return False
        return True

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to the pinned process; False when it had exited already."""
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)  # type: ignore[attr-defined]
                return True
            if not self.same():
                return False
            os.kill(self.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def exited(self) -> bool:
        if self.pidfd is not None:
            ready = select.select([self.pidfd], [], [], 0)[0]
            if not ready:
                self.same()  # refresh the state letter (D: stuck in the kernel)
            return bool(ready)
        return not self.same()

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _wait(targets: List[_Target], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(t.exited() for t in targets):
        time.sleep(POLL_SECONDS)


def kill_leftovers(procs: List[Dict[str, Any]], uid: Optional[int], grace: float,
                   kill_wait: float = KILL_WAIT_SECONDS) -> Dict[str, Any]:
    """SIGTERM, ``grace`` seconds, SIGKILL, then up to ``kill_wait`` for the exit.

    Only processes of the job's own (non-root) ``uid`` are touched. Returns
    ``{"killed": [pids signalled and gone], "gone": [pids that had exited before any
    signal], "survivors": [{pid, comm, state}], "errors": [{pid, error}]}``.
    """
    out: Dict[str, Any] = {"killed": [], "gone": [], "survivors": [], "errors": []}
    if uid is None or uid == 0:
        return out
    pinned: List[_Target] = []
    for row in procs:
        if row.get("uid") != uid:
            continue
        t = _Target(row)
        try:
            if t.pin() and t.signal(signal.SIGTERM):
                pinned.append(t)
            else:
                out["gone"].append(t.pid)
        except OSError as e:  # whatever one process does, the others are still cleaned up
            out["errors"].append({"pid": t.pid, "error": f"{errno.errorcode.get(e.errno, e.errno)}: {e.strerror}"})
            t.close()
    try:
        _wait(pinned, grace)
        for t in pinned:
            if not t.exited():
                try:
                    t.signal(signal.SIGKILL)
                except OSError as e:
                    out["errors"].append({"pid": t.pid, "error": f"{errno.errorcode.get(e.errno, e.errno)}: {e.strerror}"})
        _wait(pinned, kill_wait)
        for t in pinned:
            if t.exited():
                out["killed"].append(t.pid)
            else:
                out["survivors"].append({"pid": t.pid, "comm": t.comm, "state": t.state})
    finally:
        for t in pinned:
            t.close()
    return out


def remove_ipc_files(files: List[Dict[str, Any]], uid: int) -> Tuple[List[str], List[Dict[str, Any]]]:
    """Unlink regular files owned by ``uid`` inside their scanned directory, never via a link.

    Returns (removed paths, [{path, error}]): any errno from one file (a name swapped for a
    directory mid-way: EISDIR; an immutable file: EPERM) is that file's, never the end of
    the clean-up. ``raw_name`` (hex) carries a name's exact bytes when it is not printable.
    """
    removed: List[str] = []
    errors: List[Dict[str, Any]] = []
    for f in files:
        d, name = f.get("dir"), f.get("name")
        if not d or not name:
            continue
        raw = bytes.fromhex(f["raw_name"]) if f.get("raw_name") else os.fsencode(name)
        if b"/" in raw or raw in (b".", b".."):
            continue
        path = f.get("path") or os.path.join(d, name)
        try:
            dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as e:
            errors.append({"path": path, "error": f"{errno.errorcode.get(e.errno, e.errno)}: open {d}"})
            continue
        try:
            st = os.lstat(raw, dir_fd=dfd)
            if st.st_uid != uid or not stat.S_ISREG(st.st_mode):
                continue
            os.unlink(raw, dir_fd=dfd)
            removed.append(path)
        except OSError as e:
            if e.errno != errno.ENOENT:
                errors.append({"path": path, "error": f"{errno.errorcode.get(e.errno, e.errno)}: {e.strerror}"})
        finally:
            os.close(dfd)
    return removed, errors
