"""The lab for integration tests: lab/labctl.py, plus `require()`, which skips (with the
reason) when the lab is not up, so the unit suite still runs on machines without Slurm."""
from __future__ import annotations

import fcntl
import sys
from pathlib import Path
from typing import IO, List

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "lab"))

from labctl import (DEFAULT_SCENARIO, ROOT, TERMINAL_JOB_STATES, TEST_USER, Lab,  # noqa: E402,F401
                    find, lab_dir)


_LOCK: List[IO[str]] = []


def _hold_lock() -> None:
    """One pytest session at a time drives the lab (its jobs, drains and scenarios are shared):
    the first lab test takes an exclusive lock on it and holds it until this session ends."""
    if not _LOCK:
        fh = open(lab_dir() / ".test-lock", "a")
        fcntl.flock(fh, fcntl.LOCK_EX)
        _LOCK.append(fh)


def require() -> Lab:
    """The running lab (held for this session), or pytest.skip saying how to start it."""
    lab = find()
    if lab is None:
        pytest.skip(f"Slurm lab not up ({lab_dir()}/env.sh missing or scontrol ping fails): "
                    "run `sudo make lab-up`")
    _hold_lock()
    return lab
