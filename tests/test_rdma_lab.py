"""RDMA counters in the lab: each node has a recorded mlx5 sysfs tree (lab/set-rdma); a port whose
retransmit and link counters climb during a job is in that job's Epilog record and named by triage."""
from __future__ import annotations

import json
import os
import subprocess
import time

import lab as labmod
from test_triage_lab import triage


def test_rdma_errors_during_a_job_are_named_with_node_and_port(lab):
    release = lab.workdir / f"rdma-release-{os.getpid()}"  # the job runs until the counters have moved
    proc = subprocess.Popen(
        ["runuser", "-u", labmod.TEST_USER, "--", "env", "-i", "PATH=/usr/bin:/bin", f"SLURM_CONF={lab.slurm_conf}",
         "srun", "-N2", "-w", "node1,node2", "sh", "-c",
         f'test "$SLURM_NODEID" = 0 && echo "$SLURM_JOB_ID"; i=0; while [ ! -e {release} ] && [ $i -lt 600 ]; '
         'do sleep 0.1; i=$((i+1)); done'],
        cwd=str(lab.workdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        job = proc.stdout.readline().strip()
        assert job.isdigit(), job
        deadline = time.monotonic() + 30  # both Prologs took their baseline: their records are written
        while not all((lab.node_dir(n) / "state" / "jobs" / job / "prolog.json").exists() for n in ("node1", "node2")):
            assert time.monotonic() < deadline, "no Prolog record for the job on node1 and node2"
            time.sleep(0.1)
        lab.set_rdma("node2", "local_ack_timeout_err+=250", "symbol_error+=40", "port_xmit_discards+=500")
    finally:
        release.touch()
        out, err = proc.communicate(timeout=60)
        release.unlink()
    assert proc.returncode == 0, err
    lab.wait_idle(["node1", "node2"])
    rec = json.loads((lab.node_dir("node2") / "state" / "jobs" / job / "epilog.json").read_text())["data"]
    found = [f for f in rec["findings"] if f["id"] == "rdma.errors"]
    assert found and found[0]["evidence"]["rises"]["local_ack_timeout_err"] == 250, rec["findings"]
    quiet = json.loads((lab.node_dir("node1") / "state" / "jobs" / job / "epilog.json").read_text())["data"]
    assert not [f for f in quiet["findings"] if f["id"] == "rdma.errors"]
    report = triage(lab, job)
    net = [f for f in report["findings"] if f["category"] == "network"]
    assert net and net[0]["node"] == "node2" and "mlx5_0" in json.dumps(net[0]), report["findings"]
