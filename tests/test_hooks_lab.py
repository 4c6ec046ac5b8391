"""Prolog and Epilog on the real 4-node lab: what an operator sees in Slurm, the state
files and the Pushgateway. Skipped (with the reason) when `make lab-up` has not run."""
from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any, Dict, List

import requests

import lab as labmod

GPU3 = "GPU-0dbc98d5-f864-2c28-5be9-e56faf4ee96b"

def state(lab: labmod.Lab, node: str, job: int, kind: str) -> Dict[str, Any]:
    p = lab.node_dir(node) / "state" / "jobs" / str(job) / f"{kind}.json"
    return json.loads(p.read_text())["data"]


def wait_state(lab: labmod.Lab, node: str, job: int, kind: str, timeout: float = 30) -> Dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        try:
            return state(lab, node, job, kind)
        except (OSError, ValueError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def groups(lab: labmod.Lab, job: int) -> List[Dict[str, Any]]:
    """The job's live groups (keyed by job id) and the nodes' last_job groups that hold it."""
    data = requests.get(lab.pushgateway_url + "/api/v1/metrics", timeout=5).json()["data"]

    def holds(g: Dict[str, Any]) -> bool:
        fam = g.get("slurm_triage_node_verdict", {}).get("metrics", [])
        return any(m["labels"].get("slurm_job_id") == str(job) for m in fam)

    return [g for g in data if g["labels"].get("slurm_job_id") == str(job)
            or (g["labels"].get("phase") == "last_job" and holds(g))]


def last_job_id(out: str) -> int:
    return int(out.strip().splitlines()[-1])


def srun_job(lab: labmod.Lab, *args: str, timeout: float = 60) -> int:
    """Run a 4-node step that prints its job id; the job id."""
    r = lab.srun("-N4", *args, "sh", "-c", 'test "$SLURM_NODEID" = 0 && echo "$SLURM_JOB_ID"; true',
                 timeout=timeout)
    assert r.returncode == 0, r.stderr
    return last_job_id(r.stdout)


def test_prolog_and_epilog_run_on_every_node_for_srun(lab):
    job = srun_job(lab)
    lab.wait_idle()
    for node in lab.nodes:
        pro, epi = state(lab, node, job, "prolog"), wait_state(lab, node, job, "epilog")
        assert pro["verdict"] == "OK" and pro["node"] == node and len(pro["job_gpus"]) == 8
        assert pro["uid"] == lab_uid()
        assert epi["verdict"] == "OK" and set(epi["gpu_diff"]) == set(pro["job_gpus"])
    # live prolog groups deleted by the Epilog; an Epilog that queued behind the Prolog's
    # publisher is replayed by it (or by the Epilog's second try) just after
    want = {(n, "last_job") for n in lab.nodes}
    phases = lambda: {(g["labels"]["instance"], g["labels"]["phase"]) for g in groups(lab, job)}  # noqa: E731
    logs = {n: (lab.node_dir(n) / "state" / "hooks.log") for n in lab.nodes}
    assert eventually(lambda: phases() == want, timeout=15), (
        phases(), {n: p.read_text()[-2000:] for n, p in logs.items() if p.exists()})


def lab_uid() -> int:
    import pwd

    return pwd.getpwnam(labmod.TEST_USER).pw_uid


def test_batch_job_runs_the_prolog_on_nodes_where_nothing_is_launched(lab):
    job = lab.sbatch("-N3", "-o", "/dev/null", "--wrap", "true")
    assert lab.wait_job(job)["JobState"] == "COMPLETED"
    lab.wait_idle()
    nodes = [n for n in lab.nodes if (lab.node_dir(n) / "state" / "jobs" / str(job) / "prolog.json").exists()]
    assert len(nodes) == 3  # PrologFlags=Alloc
    for n in nodes:
        assert wait_state(lab, n, job, "epilog")["verdict"] == "OK"


def test_xid79_node_is_drained_with_our_reason_and_the_srun_job_cancelled(lab):
    lab.set_scenario("node2", "h100x8-xid79.json")
    r = lab.srun("-N4", "true", timeout=60)
    assert r.returncode != 0 and "Prolog failure on node node2" in r.stderr
    info = lab.node_info("node2")
    assert "DRAIN" in info["State"]
    reason = info["Reason"]
    assert reason.startswith("triage: ") and GPU3 in reason and "Xid 79" in reason, reason
    # our resume (run here, not on node2) refuses on node2's own pushed FAIL, then resumes
    # once a fresh check pushed from node2 passes
    cli = [str(labmod.ROOT / ".venv/bin/slurm-triage"), "node", "resume", "node2"]
    env = {"SLURM_TRIAGE_CONFIG": str(lab.triage_config)}
    push_check(lab, "node2")
    r = lab.run(*cli, user=None, extra_env=env)
    assert r.returncode == 1 and "FAIL" in r.stderr, r.stdout + r.stderr
    lab.set_scenario("node2", labmod.DEFAULT_SCENARIO)
    push_check(lab, "node2")
    r = lab.run(*cli, user=None, extra_env=env)
    assert r.returncode == 0, r.stderr
    lab.wait_node("node2", lambda s: "DRAIN" not in s)


def push_check(lab: labmod.Lab, node: str) -> None:
    """`slurm-triage check --push` as it runs on NODE (its Slurm name names its paths)."""
    r = lab.run(str(labmod.ROOT / ".venv/bin/slurm-triage"), "check", "--push", user=None,
                extra_env={"SLURM_TRIAGE_CONFIG": str(lab.triage_config), "SLURMD_NODENAME": node})
    assert r.returncode in (0, 1) and "push: delivered" in r.stdout, r.stdout + r.stderr


def test_xid79_batch_job_is_requeued_held(lab):
    lab.set_scenario("node3", "h100x8-xid79.json")
    job = lab.sbatch("-N4", "-o", "/dev/null", "--wrap", "true")
    info = lab.wait_job(job, states=("PENDING",), timeout=60)
    deadline = time.monotonic() + 30
    while "requeued_held" not in info.get("Reason", "") and time.monotonic() < deadline:
        time.sleep(0.3)
        info = lab.job_info(job)
    assert info["Reason"] == "launch_failed_requeued_held" and info["Restarts"] == "1", info
    assert lab.node_info("node3")["Reason"].startswith("triage: ")


def test_foreign_drain_reason_is_never_overwritten(lab):
    """An admin drained node4 (say while a job was starting there); our drain and our resume
    both leave that reason alone."""
    lab.scontrol("update", "nodename=node4", "state=drain", "reason=bad DIMM ticket 4711")
    from slurm_triage.config import load
    from slurm_triage.slurmctl import drain

    os.environ["SLURM_CONF"] = lab.slurm_conf
    out = drain(load(str(lab.triage_config)), "node4", "GPU-x Xid 79")
    assert "left foreign reason untouched" in out
    assert lab.node_info("node4")["Reason"].startswith("bad DIMM ticket 4711 [")
    cli = [str(labmod.ROOT / ".venv/bin/slurm-triage"), "node", "resume", "node4"]
    r = lab.run(*cli, user=None, extra_env={"SLURM_TRIAGE_CONFIG": str(lab.triage_config)})
    assert r.returncode == 1 and "not ours" in r.stderr
    assert "DRAIN" in lab.node_state("node4")


def test_next_jobs_prolog_reports_the_previous_jobs_leftovers(lab):
    with lab.escaped_process("node1", shm=f"/dev/shm/nccl-lab-{uuid.uuid4().hex[:8]}") as left:
        lab.wait_idle(["node1"])
        r = lab.srun("-N1", "-w", "node1", "sh", "-c", "echo $SLURM_JOB_ID", timeout=60)
        job2 = last_job_id(r.stdout)
        pro = state(lab, "node1", job2, "prolog")
        mine = [f for f in pro["findings"] if f.get("pid") == left["pid"] and f["id"] == "leftover.process"]
        assert mine and mine[0]["verdict"] == "WARN", pro["findings"]
        text = json.dumps(mine)
        assert str(left["job"]) in text and str(left["port"]) in text
        ipc = [f for f in pro["findings"] if f["id"] == "leftover.ipc" and left["shm"] in json.dumps(f)]
        assert ipc, pro["findings"]


def test_epilog_cleans_this_jobs_leftovers_and_spares_another_running_job(lab):
    with lab.config("[hooks]\ncleanup = true\ncleanup_grace_seconds = 1.0\n"):
        other = lab.sbatch("-N1", "-n1", "-w", "node1", "-o", "/dev/null", "--wrap", "sleep 60")
        lab.wait_job(other, states=("RUNNING",), timeout=30)
        deadline = time.monotonic() + 20
        other_pids: List[int] = []
        while not other_pids and time.monotonic() < deadline:
            time.sleep(0.2)
            other_pids = [p for p in _job_pids(other) if _cmdline(p).startswith(b"sleep")]
        assert other_pids
        with lab.escaped_process("node1", shm=f"/dev/shm/nccl-lab-{uuid.uuid4().hex[:8]}") as left:
            deadline = time.monotonic() + 20
            while _alive(left["pid"]) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not _alive(left["pid"]), "the Epilog did not kill this job's leftover"
            epi = wait_state(lab, "node1", left["job"], "epilog")
            assert left["pid"] in epi["cleanup"]["killed"]
            # the same user still runs job `other` on node1: its shm files are not removed
            assert "removed" not in epi["cleanup"] and os.path.exists(left["shm"])
        assert all(_alive(p) for p in other_pids)
        lab.run("scancel", str(other), user=None)


def _job_pids(job: int) -> List[int]:
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                env = Path(f"/proc/{d}/environ").read_bytes()
            except OSError:
                continue
            if f"SLURM_JOB_ID={job}\0".encode() in env:
                pids.append(int(d))
    return pids


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_pushgateway_down_jobs_still_start_and_the_spool_delivers_later(lab):
    pid = int((lab.dir / "run" / "pushgateway.pid").read_text())
    os.kill(pid, signal.SIGSTOP)  # a hung gateway: connections open, nothing answers
    try:
        t0 = time.monotonic()
        job = srun_job(lab)
        elapsed = time.monotonic() - t0
        lab.wait_idle()
        # the hooks' background publishers spool what the hung gateway did not take, each
        # within its hook's deadline
        assert eventually(lambda: spooled(lab) >= 4, timeout=30), spooled(lab)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert elapsed < 8.0 + 8.0, elapsed  # Prolog and Epilog each within their deadline
    job2 = srun_job(lab)  # the next job's hooks flush the spool in order, then push their own
    lab.wait_idle()
    assert eventually(lambda: spooled(lab) == 0, timeout=30), spooled(lab)
    assert eventually(lambda: {g["labels"]["instance"] for g in groups(lab, job2)
                               if g["labels"]["phase"] == "last_job"} == set(lab.nodes), timeout=30)
    assert not [g for g in groups(lab, job) if g["labels"]["phase"] == "prolog"]  # the DELETE came last


def spooled(lab: labmod.Lab) -> int:
    return sum(len(list((lab.node_dir(n) / "spool").glob("*.json"))) for n in lab.nodes)


def eventually(predicate, timeout: float) -> bool:
    """Poll: an OK hook's push is made by its background publisher, just after the hook."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_nvml_hang_is_unknown_within_the_deadline_and_does_not_drain(lab):
    lab.set_scenario("node3", "h100x8-nvml-hang.json")
    t0 = time.monotonic()
    job = srun_job(lab)
    assert time.monotonic() - t0 < 15
    pro = state(lab, "node3", job, "prolog")
    assert pro["verdict"] == "UNKNOWN" and "timed out" in pro["snapshot"]["errors"]["gpu"]
    assert "DRAIN" not in lab.node_state("node3")


def test_broken_config_jobs_still_run_and_the_error_is_logged_once_per_run(lab):
    logs = {n: lab.node_dir(n) / "state" / "hooks.log" for n in lab.nodes}
    count = lambda n: logs[n].read_text().count("hooks.prolog_deadline_seconds") if logs[n].exists() else 0  # noqa: E731
    before = {n: count(n) for n in lab.nodes}
    with lab.config("[hooks]\nprolog_deadline_seconds = 'soon'\n"):
        r = lab.srun("-N4", "true", timeout=60)
        lab.wait_idle()
    assert r.returncode == 0, r.stderr
    # one line per hook run: the Prolog's and the Epilog's on each node
    assert {n: count(n) - before[n] for n in lab.nodes} == {n: 2 for n in lab.nodes}
