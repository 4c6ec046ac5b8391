"""The lab for integration tests: lab/labctl.py, plus `require()`, which skips (with the
reason) when the lab is not up, so the unit suite still runs on machines without Slurm."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "lab"))

from labctl import (DEFAULT_SCENARIO, ROOT, TERMINAL_JOB_STATES, TEST_USER, Lab,  # noqa: E402,F401
                    find, lab_dir)


def require() -> Lab:
    """The running lab, or pytest.skip saying how to start it."""
    lab = find()
    if lab is None:
        pytest.skip(f"Slurm lab not up ({lab_dir()}/env.sh missing or scontrol ping fails): "
                    "run `sudo make lab-up`")
    return lab
