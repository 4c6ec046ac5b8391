"""leftover.process, leftover.ipc, gpu.orphan_process and listener.public.

The facts come from the real collector run over real child processes (a fake job rank
that outlived its job), so the checks are judged on what /proc really shows.
"""
from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from slurm_triage.checks import leftovers, listeners, run_checks
from slurm_triage.collect import procs
from slurm_triage.config import Config, defaults
from slurm_triage.model import Finding, Verdict

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from procs_fixture import JobProcess, wildcard_listener_facts  # noqa: E402

DEAD_JOB = "987654321"


def make_cfg(**listener_keys: Any) -> Config:
    values = defaults()
    values["node"]["name"] = "thisnode"
    values["procs"]["ipc_dirs"] = ["/dev/shm"]
    values["listeners"].update(listener_keys)
    return Config(values)


def snapshot_of(procs_facts: Dict[str, Any]) -> Dict[str, Any]:
    return {"schema": 1, "node": "thisnode", "time": 0, "errors": {}, "gpu": None, "kernel": None,
            "rdma": None, "procs": procs_facts}


def snapshot(cfg: Config) -> Dict[str, Any]:
    return snapshot_of(procs.collect(cfg))


def mine(findings: List[Finding], pid: int) -> List[Finding]:
    return [f for f in findings if f.pid == pid]


@pytest.fixture
def leftover() -> Iterator[JobProcess]:
    """A rank of a finished job: listener on 127.0.0.1, an NCCL segment it keeps open and mapped."""
    with JobProcess(DEAD_JOB, ipc_path=f"/dev/shm/nccl-{secrets.token_hex(6)}", node="thisnode") as rank:
        yield rank


def test_leftover_process_and_its_ipc_file(leftover: JobProcess) -> None:
    cfg = make_cfg()
    facts = snapshot(cfg)
    found = mine(run_checks(facts, cfg), leftover.pid)
    proc = [f for f in found if f.id == "leftover.process"]
    assert len(proc) == 1 and proc[0].verdict is Verdict.WARN and not proc[0].hardware
    assert proc[0].evidence["job_id"] == DEAD_JOB and str(leftover.pid) in proc[0].summary
    assert str(leftover.port) in proc[0].summary and proc[0].evidence["shm"] == [leftover.ipc_path]
    ipc = [f for f in found if f.id == "leftover.ipc"]
    assert len(ipc) == 1 and ipc[0].evidence["path"] == leftover.ipc_path
    assert ipc[0].evidence["holders"] == [leftover.pid] and DEAD_JOB in ipc[0].summary


def test_running_job_is_not_a_leftover(leftover: JobProcess) -> None:
    cfg = make_cfg()
    facts = snapshot(cfg)
    facts["procs"]["running_jobs"].append(DEAD_JOB)  # as if its slurmstepd were alive
    assert mine(leftovers.leftover_process(facts, cfg), leftover.pid) == []
    assert [f for f in leftovers.leftover_ipc(facts, cfg) if f.evidence["path"] == leftover.ipc_path] == []


def test_process_of_another_node_is_not_ours(leftover: JobProcess) -> None:
    """In the lab every node sees every process; SLURMD_NODENAME tells them apart."""
    cfg = make_cfg()
    facts = snapshot(cfg)
    facts["node"] = "othernode"
    assert mine(leftovers.leftover_process(facts, cfg), leftover.pid) == []


def test_gpu_holder_fails_and_names_the_gpu(leftover: JobProcess) -> None:
    cfg = make_cfg()
    facts = snapshot(cfg)
    row = [p for p in facts["procs"]["processes"] if p["pid"] == leftover.pid][0]
    row["dev_nvidia"] = ["/dev/nvidia3", "/dev/nvidiactl"]  # what fd links of a CUDA process show
    facts["gpu"] = {"gpus": [{"index": 0, "minor": 3, "uuid": "GPU-aaaa", "pci_bus_id": "0000:18:00.0",
                              "processes": [{"pid": leftover.pid, "used_bytes": 1 << 30}]}]}
    found = leftovers.leftover_process(facts, cfg) + leftovers.gpu_orphan_process(facts, cfg)
    by_id = {f.id: f for f in mine(found, leftover.pid)}
    assert by_id["leftover.process"].verdict is Verdict.FAIL and by_id["leftover.process"].gpu == "GPU-aaaa"
    orphan = by_id["gpu.orphan_process"]
    assert orphan.verdict is Verdict.FAIL and orphan.gpu == "GPU-aaaa" and DEAD_JOB in orphan.summary


def test_gpu_process_of_running_job_or_unseen_pid() -> None:
    cfg = make_cfg()
    facts = {"node": "n", "gpu": {"gpus": [{"index": 1, "uuid": "GPU-bbbb", "pci_bus_id": "0000:3b:00.0",
                                            "processes": [{"pid": 101, "used_bytes": 5}, {"pid": 102, "used_bytes": 7}]}]},
             "procs": {"processes": [{"pid": 101, "job_id": "5", "comm": "python", "uid": 1000}],
                       "running_jobs": ["5"], "ipc_files": [], "listeners": []}}
    # 101 runs in job 5; 102 is not in /proc (another PID namespace): neither is judged.
    assert leftovers.gpu_orphan_process(facts, cfg) == []
    facts["procs"]["running_jobs"] = []
    assert sorted((f.pid, f.verdict) for f in leftovers.gpu_orphan_process(facts, cfg)) == [
        (101, Verdict.FAIL)]


def test_symlink_in_shm_is_flagged_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("secret")
    link = f"/dev/shm/nccl-evil-{secrets.token_hex(6)}"
    os.symlink(str(target), link)
    try:
        cfg = make_cfg()
        facts = snapshot(cfg)
        found = [f for f in leftovers.leftover_ipc(facts, cfg) if f.evidence["path"] == link]
        assert len(found) == 1 and found[0].evidence["symlink"] is True and "symlink" in found[0].summary
        assert found[0].evidence["size_bytes"] == len(str(target))
        assert target.read_text() == "secret"
    finally:
        os.unlink(link)


def test_stale_ipc_file_of_user_without_job() -> None:
    cfg = make_cfg()
    base = {"path": "/dev/shm/psm2_shm.x", "dir": "/dev/shm", "name": "psm2_shm.x", "kind": "psm2",
            "size_bytes": 10, "mtime": 1.0, "symlink": False}
    facts = {"node": "n", "procs": {
        "processes": [{"pid": 7, "uid": 1000, "job_id": "5", "shm": []}], "running_jobs": ["5"],
        "listeners": [], "ipc_files": [dict(base, uid=1000), dict(base, path="/dev/shm/psm2_shm.y", uid=1001)]}}
    found = leftovers.leftover_ipc(facts, cfg)
    assert [f.evidence["path"] for f in found] == ["/dev/shm/psm2_shm.y"]


def test_public_dashboard() -> None:
    """A job's dashboard-like listener on 0.0.0.0, collected in a network namespace of the test's own."""
    got = wildcard_listener_facts(DEAD_JOB, {"ipc_dirs": ["/dev/shm"]})
    if got is None:
        pytest.skip("no network namespace here (needs root and unshare); the check itself is tested on "
                    "recorded listener rows below")
    procs_facts, pid, port = got
    cfg = make_cfg(dashboard_ports=[port])
    facts = snapshot_of(procs_facts)
    found = [f for f in listeners.listener_public(facts, cfg) if f.evidence["port"] == port]
    assert len(found) == 1
    f = found[0]
    assert f.verdict is Verdict.WARN and f.pid == pid and f.evidence["dashboard"] is True
    assert f.evidence["job_id"] == DEAD_JOB and "dashboard" in f.summary and "0.0.0.0" in f.summary


def test_public_listeners_of_jobs_and_daemons() -> None:
    """A job's bootstrap port on 0.0.0.0 and :: (one finding), sshd (no job: none), a dashboard of an unseen owner."""
    cfg = make_cfg()
    facts = {"procs": {"listeners": [
        {"proto": "tcp", "addr": "0.0.0.0", "port": 22, "uid": 0, "pid": 800, "job_id": None},
        {"proto": "tcp", "addr": "0.0.0.0", "port": 43121, "uid": 1000, "pid": 901, "job_id": "5"},
        {"proto": "tcp6", "addr": "::", "port": 43121, "uid": 1000, "pid": 901, "job_id": "5"},
        {"proto": "tcp6", "addr": "::", "port": 8888, "uid": 1000, "pid": None, "job_id": None}]}}
    found = sorted(listeners.listener_public(facts, cfg), key=lambda f: f.evidence["port"])
    assert [(f.evidence["port"], f.evidence["dashboard"]) for f in found] == [(8888, True), (43121, False)]
    assert found[1].evidence["addrs"] == ["0.0.0.0", "::"] and found[1].pid == 901
