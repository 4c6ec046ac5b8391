"""Atomic file replacement shared by the spool, the state files and the textfile sink.

Readers (node_exporter, a concurrent hook, `triage`) must never see a half-written file,
so every write goes to ``<path>.<pid>`` in the same directory and is renamed over the
target; a crash leaves at most a stray temporary that no reader picks up.
"""
from __future__ import annotations

import os


def write_atomic(path: str, data: bytes, mode: int = 0o600, fsync: bool = True) -> None:
    """Replace ``path`` with ``data``; ``fsync`` makes the new content survive a power cut."""
    tmp = f"{path}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        try:
            os.fchmod(fd, mode)  # the umask must not decide who can read it
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if fsync:
        dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
