"""Issue 13 on the real lab: an Xid-45 storm over every GPU of every node drains nothing (the
same storm plus one Xid 79 drains exactly that node), and a job's process titled like a
slurmstepd neither counts as a step nor hides the job's leftovers."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Dict, List

import lab as labmod

SCENARIO = labmod.ROOT / "tests" / "fakenvml" / "scenarios" / labmod.DEFAULT_SCENARIO


def _buses() -> List[str]:
    """The lab GPUs' bus ids, as the driver prints them in an Xid line (PCI:DDDD:BB:DD)."""
    gpus = json.loads(SCENARIO.read_text())["gpus"]
    return [f"{g['pci_bus_id'][-12:-8]}:{g['pci_bus_id'][-7:-2]}".lower() for g in gpus]


def _storm(t0: float) -> List[str]:
    """The recorded Xid 45 shape (tests/data/kernel/xid45_after_nvlink.journal.log) on all 8 GPUs."""
    return [f"[{t0 + i / 1000:12.6f}] NVRM: Xid (PCI:{bus}): 45, pid=1818990, name=python3, Ch 0000000{k}"
            for i, (bus, k) in enumerate((b, k) for b in _buses() for k in range(1, 4))]


def _state(lab: labmod.Lab, node: str, job: int, kind: str) -> Dict:
    return json.loads((lab.node_dir(node) / "state" / "jobs" / str(job) / f"{kind}.json").read_text())["data"]


def test_xid45_storm_drains_nothing_and_one_xid79_drains_exactly_its_node(lab):
    logs = {n: lab.node_dir(n) / "kernel.log" for n in lab.nodes}
    saved = {n: p.read_bytes() for n, p in logs.items()}
    try:
        for n, p in logs.items():
            p.write_text("\n".join(_storm(5000.0)) + "\n")
        r = lab.srun("-N4", "sh", "-c", 'test "$SLURM_NODEID" = 0 && echo "$SLURM_JOB_ID"; true', timeout=90)
        assert r.returncode == 0, r.stderr
        job = int(r.stdout.split()[-1])
        for n in lab.nodes:
            assert "DRAIN" not in lab.node_state(n), n
            xids = [f for f in _state(lab, n, job, "prolog")["findings"] if f["id"] == "kernel.xid"]
            assert len(xids) == 8 and all(f["verdict"] == "WARN" and not f["hardware"] for f in xids), xids
        lab.wait_idle()  # every Epilog has read the storm-only log
        bus = _buses()[3]
        x79 = f"[ 5100.000000] NVRM: Xid (PCI:{bus}): 79, pid=1173, GPU has fallen off the bus."
        logs["node2"].write_text("\n".join(_storm(5000.0) + [x79] + _storm(5100.1)) + "\n")
        r = lab.srun("-N4", "true", timeout=90)
        assert r.returncode != 0 and "Prolog failure on node node2" in r.stderr
        lab.wait_node("node2", lambda s: "DRAIN" in s)
        assert lab.node_info("node2")["Reason"].startswith("triage: ") and "Xid 79" in lab.node_info("node2")["Reason"]
        time.sleep(1.0)
        assert [n for n in lab.nodes if "DRAIN" in lab.node_state(n)] == ["node2"]
    finally:
        for n, p in logs.items():
            p.write_bytes(saved[n])


FAKE_STEPD = r"""
import ctypes, os, sys, time
out = sys.argv[1]
if os.fork():
    os._exit(0)
os.setsid()
title = "slurmstepd: [%s.0]" % os.environ["SLURM_JOB_ID"]
code = ("import ctypes, os, sys, time; ctypes.CDLL(None).prctl(15, b'slurmstepd', 0, 0, 0); "
        "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); os.rename(sys.argv[1] + '.tmp', sys.argv[1]); "
        "time.sleep(600)")
os.execv(sys.executable, [title, "-c", code, out])
"""


def test_a_user_process_titled_slurmstepd_is_a_leftover_not_a_step(lab):
    out = lab.workdir / f"fake-stepd-{os.getpid()}-{time.monotonic_ns()}"
    script = Path(str(out) + ".py")
    script.write_text(FAKE_STEPD)
    os.chmod(script, 0o644)
    pid = 0
    try:
        r = lab.srun("-N1", "-w", "node1", "sh", "-c",
                     f"echo $SLURM_JOB_ID; /usr/bin/python3 {script} {out} </dev/null >/dev/null 2>&1; "
                     f"while [ ! -e {out} ]; do sleep 0.05; done", timeout=60)
        assert r.returncode == 0, r.stderr
        job1 = int(r.stdout.split()[0])
        pid = int(out.read_text())
        assert Path(f"/proc/{pid}/comm").read_text().strip() == "slurmstepd"
        lab.wait_idle(["node1"])
        r = lab.srun("-N1", "-w", "node1", "sh", "-c", "echo $SLURM_JOB_ID", timeout=60)
        job2 = int(r.stdout.split()[-1])
        pro = _state(lab, "node1", job2, "prolog")
        assert str(job1) not in pro["snapshot"]["procs"]["running_jobs"]
        mine = [f for f in pro["findings"] if f["id"] == "leftover.process" and f.get("pid") == pid]
        assert mine and str(job1) in mine[0]["summary"], pro["findings"]
    finally:
        if pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in (out, script):
            if p.exists():
                p.unlink()
