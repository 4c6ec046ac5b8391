"""`triage JOBID` on jobs of the real lab with injected faults: it must name the right node
(and GPU) first. The evidence comes the way it would on a site: the Prolog/Epilog state and
groups, the watcher's series scraped by Prometheus, and Slurm's accounting."""
from __future__ import annotations

import json
import subprocess
import time
from typing import Any, Dict


import lab as labmod

GPU5 = "GPU-5291fbdf-f219-fa52-b105-db419085eaf2"
FAST = "[watcher]\ninterval_seconds = 0.5\nhang_window_seconds = 2.0\nstraggler_window_seconds = 2.0\n"
CLI = str(labmod.ROOT / ".venv" / "bin" / "slurm-triage")


def triage(lab: labmod.Lab, job: str) -> Dict[str, Any]:
    r = subprocess.run([CLI, "triage", job, "--format", "json"], capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "SLURM_CONF": lab.slurm_conf,
                            "SLURM_TRIAGE_CONFIG": str(lab.triage_config)})
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)


def triage_step(lab: labmod.Lab, switch_node: str, scenario: str, seconds: int = 10) -> str:
    """`srun --triage` on node1+node2 for `seconds`; `switch_node` changes scenario mid-step.
    Returns the job id once Prometheus has scraped the watcher's last series."""
    for n in ("node1", "node2"):
        lab.set_scenario(n, "h100x8-busy.json")
    proc = subprocess.Popen(
        ["runuser", "-u", labmod.TEST_USER, "--", "env", "-i", "PATH=/usr/bin:/bin", f"SLURM_CONF={lab.slurm_conf}",
         "srun", "--triage", "-N2", "-w", "node1,node2", "sh", "-c",
         f'test "$SLURM_NODEID" = 0 && echo "$SLURM_JOB_ID"; sleep {seconds}'],
        cwd=str(lab.workdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    lab.set_scenario(switch_node, scenario)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    for n in ("node1", "node2"):  # a thermal node is drained by its Epilog: not idle, but done
        lab.wait_node(n, lambda s: "COMPLETING" not in s)
    time.sleep(6)  # one more Prometheus scrape interval (5 s) of the Pushgateway
    return out.split()[0]


def first(report: Dict[str, Any]) -> Dict[str, Any]:
    assert report["findings"], report
    return report["findings"][0]


def test_nccl_hang_node_is_named_first(lab):
    with lab.config(FAST):
        job = triage_step(lab, "node2", "h100x8-nccl-hang.json")
    report = triage(lab, job)
    f = first(report)
    assert f["category"] == "collective_hang" and f["node"] == "node2", f
    # the watcher's evidence bundle (as the job's user, in the shared /tmp of the lab) is cited
    assert report["sources"]["bundles"]["files"] >= 1
    assert any(f"/{job}/hang-node2-" in p for p in f["evidence"]["evidence_bundles"]), f["evidence"]


def test_thermal_straggler_node_and_gpu_are_named_first(lab):
    with lab.config(FAST):
        job = triage_step(lab, "node2", "h100x8-thermal.json")
    f = first(triage(lab, job))
    assert f["category"] == "thermal_power" and f["node"] == "node2" and f["gpu"] == GPU5, f


def next_job_on(lab: labmod.Lab, node: str) -> str:
    lab.wait_idle([node])
    r = lab.srun("-N1", "-w", node, "sh", "-c", "echo $SLURM_JOB_ID", timeout=60)
    assert r.returncode == 0, r.stderr
    lab.wait_idle([node])
    return r.stdout.split()[0]


def test_leftover_listener_of_an_earlier_job_is_named(lab):
    with lab.escaped_process("node3") as left:
        job = next_job_on(lab, "node3")
        f = first(triage(lab, job))
    assert f["category"] == "host_resources" and f["node"] == "node3", f
    assert str(left["job"]) in json.dumps(f) and str(left["pid"]) in json.dumps(f), f


def test_a_completed_job_without_error_lines_gets_no_guess(lab):
    """Slurm's COMPLETED, exit 0 is a success marker: a real healthy training log (NCCL INFO over EFA, whose
    words lean to network) printed by a job that succeeded gives no finding; by one that exits 1, a guess."""
    log = labmod.ROOT / "tests" / "corpus_healthy" / "awsome-dt-fsdp-llama31-8b-training-start" / "log.txt"
    reports = []
    for tail in ("true", "exit 1"):
        job = lab.sbatch("-N1", "-w", "node1", "-o", str(lab.workdir / "healthy-%j.out"), "--wrap", f"cat {log}; {tail}")
        lab.wait_job(job)
        reports.append(triage(lab, str(job)))
    ok, failed = reports
    assert ok["job"]["state"] == "COMPLETED" and ok["findings"] == [], ok["findings"]
    assert failed["job"]["state"] == "FAILED" and failed["findings"], failed
