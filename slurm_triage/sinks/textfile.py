"""node_exporter textfile collector output.

The collector reads every ``*.prom`` file in its directory on each scrape, so a file is
written as ``name.prom.<pid>`` (ignored: wrong suffix) and renamed into place; a scrape
sees the old or the new content, never half of it.
"""
from __future__ import annotations

import os
import re

from .atomic import write_atomic

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def _path(directory: str, name: str) -> str:
    if not _NAME.fullmatch(name) or name.endswith(".prom"):
        raise ValueError(f"textfile name must match {_NAME.pattern} without .prom, got {name!r}")
    return os.path.join(directory, name + ".prom")


def write(directory: str, name: str, body: bytes) -> str:
    """Write ``body`` to ``directory/name.prom`` atomically; returns the path.

    Mode 0644 because node_exporter usually runs as its own user. No fsync: the next
    run rewrites the file anyway, and the Prolog should not wait on the disk for it.
    """
    path = _path(directory, name)
    write_atomic(path, body, mode=0o644, fsync=False)
    return path


def remove(directory: str, name: str) -> bool:
    """Remove ``directory/name.prom`` (e.g. a finished job's file); False if it was absent."""
    try:
        os.unlink(_path(directory, name))
        return True
    except FileNotFoundError:
        return False
