"""The evidence-bundle reader against planted evidence (issue 13, break 13): another user's
bundle is not believed, a FIFO does not hang triage, a symlink is not followed, size is capped."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from slurm_triage.triage.sources import bundles

SRC = Path(__file__).parent / "data" / "bundles" / "hang-node2-0-1795977277.json"
JOB = "4711"  # the job id inside the recorded bundle
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create files owned by other uids")


def _job_dir(base: Path, uid: int) -> Path:
    d = base / f"slurm-triage-{uid}" / JOB
    d.mkdir(parents=True)
    if os.geteuid() == 0:
        os.chown(d.parent, uid, uid)
        os.chown(d, uid, uid)
    return d


def _bundle(d: Path, name: str, uid: int) -> Path:
    p = d / name
    shutil.copy(SRC, p)
    if os.geteuid() == 0:
        os.chown(p, uid, uid)
    return p


@ROOT_ONLY
def test_only_the_jobs_users_bundles_are_believed(tmp_path: Path) -> None:
    mine = _bundle(_job_dir(tmp_path, 4242), "hang-node2-0-1.json", 4242)
    _bundle(_job_dir(tmp_path, 4343), "hang-node9-0-1.json", 4343)  # another user's directory
    planted = _bundle(mine.parent, "hang-node7-0-1.json", 4343)      # another user's file in mine
    nodes, rec = bundles.gather(str(tmp_path), JOB, 4242)
    assert sorted(nodes) == ["node2"] and rec["files"] == 1
    assert nodes["node2"]["watch"]["bundles"] == [str(mine)]
    assert any(str(planted) in e and "uid 4343" in e for e in rec["errors"])
    nodes, rec = bundles.gather(str(tmp_path), JOB, None)  # job's user unknown: root's own only
    assert nodes == {} and rec["read"] is False


@ROOT_ONLY
def test_the_attackers_uid_cannot_vouch_for_itself(tmp_path: Path) -> None:
    """A directory named for the job's uid but owned by someone else is not the job's."""
    d = tmp_path / "slurm-triage-4242" / JOB
    d.mkdir(parents=True)
    os.chown(d.parent, 4343, 4343)
    os.chown(d, 4343, 4343)
    _bundle(d, "hang-node2-0-1.json", 4343)
    nodes, rec = bundles.gather(str(tmp_path), JOB, 4242)
    assert nodes == {} and rec["read"] is False


def test_fifo_symlink_and_oversize_are_notes_not_hangs(tmp_path: Path, monkeypatch) -> None:
    d = _job_dir(tmp_path, os.getuid())
    os.mkfifo(d / "hang-node3-0-1.json")
    os.symlink(SRC, d / "hang-node4-0-1.json")
    big = _bundle(d, "hang-node5-0-1.json", os.getuid())
    monkeypatch.setattr(bundles, "MAX_BYTES", big.stat().st_size - 1)
    t = time.monotonic()
    nodes, rec = bundles.gather(str(tmp_path), JOB, os.getuid())
    assert time.monotonic() - t < 5  # opening the FIFO did not block
    assert nodes == {} and rec["read"] is False
    errors = " ".join(rec["errors"])
    assert "not a regular file" in errors and "symbolic link" in errors and "larger than" in errors


def test_a_bundle_for_another_job_in_the_right_place_is_ignored(tmp_path: Path) -> None:
    d = _job_dir(tmp_path, os.getuid())
    p = d / "hang-node2-0-1.json"
    doc = json.loads(SRC.read_text())
    doc["job_id"] = "999"
    p.write_text(json.dumps(doc))
    nodes, rec = bundles.gather(str(tmp_path), JOB, os.getuid())
    assert nodes == {} and rec["read"] is False


def test_a_bundle_of_an_earlier_run_of_the_same_job_id_is_left_out(tmp_path: Path) -> None:
    """Job ids start over (a controller's state reset, a lab made afresh): a bundle detected well before the
    job's start or after its end is another job's, counted as such, not its evidence."""
    d = _job_dir(tmp_path, os.getuid())
    _bundle(d, "hang-node2-0-1.json", os.getuid())
    at = json.loads(SRC.read_text())["detected_at"]
    for window, believed in (((at - 30, at + 30), True), ((None, None), True), ((at - 5, None), True),
                             ((at + 3600, at + 7200), False), ((at - 7200, at - 3600), False)):
        nodes, rec = bundles.gather(str(tmp_path), JOB, os.getuid(), window=window)
        assert bool(nodes) is believed and rec["read"] is believed, window
        assert rec.get("outside_the_job", 0) == (0 if believed else 1), window
