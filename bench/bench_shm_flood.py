"""Prolog + Epilog cost when a user floods an IPC directory with files (issue 13, break 10).

Creates N files (default 100,000) named like NCCL segments in a private directory, runs
the real hooks (`python -m slurm_triage prolog|epilog`, fake NVML of lab node1, a private
Pushgateway on 127.0.0.1) as slurmd would, and reports the median wall time of each hook,
its findings and the size of its state file. The directory is scanned instead of /dev/shm
itself so other users of the machine do not pay for the flood.

    .venv/bin/python bench/bench_shm_flood.py [--files 100000] [--runs 3] [--repo DIR]

``--repo`` runs another checkout's code (e.g. an unpacked `git archive` of an older commit).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
LAB_NVML = "/tmp/slurm-lab/nodes/node1/nvml/libnvidia-ml.so.1"
USER_UID = 4242

CONFIG = """[node]
name = "shmbench"
state_dir = "{work}/state"
spool_dir = "{work}/spool"
[gpu]
nvml_library = "{nvml}"
[kernel]
source = "file"
path = "{work}/kernel.log"
[rdma]
enabled = false
[procs]
ipc_dirs = ["{flood}"]
[pushgateway]
url = "{pgw}"
[hooks]
cleanup = true
cleanup_grace_seconds = 0.5
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def flood(d: Path, n: int, uid: int) -> None:
    """n empty files, owned by ``uid`` (a user who has no job: every Prolog reports them)."""
    d.mkdir(mode=0o1777, exist_ok=True)
    for i in range(n):
        fd = os.open(d / f"nccl-flood-{i}", os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        os.fchown(fd, uid, uid)
        os.close(fd)


def run_hook(python: str, repo: str, kind: str, job: int, config: Path) -> float:
    env = {"PATH": "/usr/bin:/bin", "SLURM_TRIAGE_CONFIG": str(config), "SLURM_JOB_ID": str(job),
           "SLURMD_NODENAME": "shmbench", "SLURM_JOB_UID": "0", "SLURM_JOB_USER": "root",
           "SLURM_NODELIST": "shmbench"}
    t0 = time.perf_counter()
    r = subprocess.run([python, "-m", "slurm_triage.hooks", kind], cwd=repo, env=env, capture_output=True, timeout=120)
    seconds = time.perf_counter() - t0
    if r.returncode not in (0, 1):
        raise SystemExit(f"{kind} exited {r.returncode}: {r.stderr.decode(errors='replace')[-500:]}")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repo", default=str(ROOT), help="checkout whose slurm_triage runs")
    args = ap.parse_args()
    python = str(ROOT / ".venv" / "bin" / "python")
    binary = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
    if binary is None or not os.path.exists(LAB_NVML):
        raise SystemExit("needs prometheus-pushgateway and the lab's fake NVML (make lab-up)")
    work = Path(tempfile.mkdtemp(prefix="shmbench-"))
    flood_dir = Path("/dev/shm") / work.name
    port = free_port()
    pgw = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        flood(flood_dir, args.files, USER_UID)
        (work / "kernel.log").write_text("")
        config = work / "config.toml"
        config.write_text(CONFIG.format(work=work, nvml=LAB_NVML, flood=flood_dir, pgw=f"http://127.0.0.1:{port}"))
        time.sleep(1.0)  # the Pushgateway's start
        times: Dict[str, List[float]] = {"prolog": [], "epilog": []}
        sizes: Dict[str, int] = {}
        findings: Dict[str, int] = {}
        for i in range(args.runs):
            job = 900000 + i
            for kind in ("prolog", "epilog"):
                times[kind].append(run_hook(python, args.repo, kind, job, config))
                state = work / "state" / "jobs" / str(job) / f"{kind}.json"
                sizes[kind] = state.stat().st_size
                findings[kind] = len(json.loads(state.read_text())["data"]["findings"])
        print(f"{args.files} files in one IPC directory, {args.runs} runs, code from {args.repo} "
              f"(shared 2-core machine: medians)")
        for kind, v in times.items():
            print(f"  {kind}: median {statistics.median(v):.3f} s (runs: {', '.join(f'{x:.3f}' for x in v)}), "
                  f"{findings[kind]} findings, state file {sizes[kind] / 1e6:.2f} MB")
    finally:
        pgw.terminate()
        pgw.wait(10)
        shutil.rmtree(flood_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
