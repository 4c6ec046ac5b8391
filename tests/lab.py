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


def take_turn() -> None:
    """One test at a time drives the lab (its jobs, drains and scenarios are shared by every
    pytest session on this machine): take the exclusive lock unless this test holds it already."""
    if not _LOCK:
        fh = open(lab_dir() / ".test-lock", "a")
        fcntl.flock(fh, fcntl.LOCK_EX)
        _LOCK.append(fh)


def end_turn() -> None:
    """Let the next test, of this or another pytest session, drive the lab (tests/conftest.py)."""
    while _LOCK:
        _LOCK.pop().close()


def require() -> Lab:
    """The running lab (this test's turn on it taken), or pytest.skip saying how to start it."""
    lab = find()
    if lab is None:
        pytest.skip(f"Slurm lab not up ({lab_dir()}/env.sh missing or scontrol ping fails): "
                    "run `sudo make lab-up`")
    take_turn()
    return lab
