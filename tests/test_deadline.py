"""Probes run in forked children: results come back, errors are text, hangs are killed."""
from __future__ import annotations

import os
import time

from slurm_triage.deadline import run_probe, run_probes


def _hang() -> None:
    time.sleep(60)


def _boom() -> None:
    raise RuntimeError("sysfs went away")


def test_value_error_and_timeout_in_parallel():
    t0 = time.monotonic()
    res = run_probes({
        "fast": (lambda: {"pid": os.getpid(), "big": "x" * 300_000}, 5.0),
        "boom": (_boom, 5.0),
        "hang": (_hang, 0.5),
    })
    elapsed = time.monotonic() - t0
    assert res["fast"].ok and res["fast"].value["pid"] != os.getpid()  # ran in a child
    assert len(res["fast"].value["big"]) == 300_000  # larger than a pipe buffer
    assert not res["boom"].ok and "RuntimeError: sysfs went away" in res["boom"].error
    assert res["hang"].timed_out and "timed out" in res["hang"].error
    assert 0.5 <= elapsed < 1.5, elapsed


def test_child_that_dies_is_reported():
    r = run_probe(lambda: os._exit(3), 2.0, "dies")
    assert not r.ok and "died" in r.error


def _children() -> set:
    out = set()
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[1] == str(os.getpid()):
                    out.add(int(pid))
        except (OSError, IndexError):
            pass
    return out


def test_no_zombie_or_orphan_left():
    before = _children()
    r = run_probe(_hang, 0.2)
    assert r.timed_out
    assert _children() == before  # the killed child was reaped: not even a zombie is left
