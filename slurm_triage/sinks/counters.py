"""Persistent per-node counters (``internal_errors_total``, ``drain_suppressed_total``) under
node.state_dir: one integer per file, replaced atomically, so every hook can count what it did
without a daemon and a torn write never resets a counter."""
from __future__ import annotations

import os

from ..config import Config
from .atomic import write_atomic


def read(cfg: Config, name: str) -> int:
    """The counter's value; 0 when it was never counted or cannot be read."""
    try:
        with open(os.path.join(cfg.get("node", "state_dir"), name)) as fh:
            return int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return 0


def bump(cfg: Config, name: str) -> int:
    """Add one and return the new value (still returned when the state dir is unwritable)."""
    n = read(cfg, name) + 1
    path = os.path.join(cfg.get("node", "state_dir"), name)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, f"{n}\n".encode(), mode=0o644, fsync=False)
    except OSError:
        pass
    return n
