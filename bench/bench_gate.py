"""Gang gate at scale: 1,024 nodes' Prolog groups in a real Pushgateway, decision time.

Each synthetic group holds what the gate reads from a Prolog push of an opted-in job:
the node verdict, findings and the peer figures (``sinks.peer_metrics.families``); with
``--full`` also the 8 GPUs' gauges and counters the Prolog pushes today
(``sinks.exposition.render``, ~48 KB of JSON per node). Two nodes are made bad (one
FAIL, one lower power limit) so the decision has work to do. ``--other-nodes`` adds
another job's groups: the gateway has no server-side filter, the gate downloads them too.
Pushing is slow with --full (the gateway checks every push against all it holds).

    .venv/bin/python bench/bench_gate.py [--nodes 1024] [--runs 10] [--other-nodes 0] [--full]

Prints the median and range of: the whole gate (GET + JSON + evidence + decision), and
its parts. Goal: <= 1 s at 1,024 nodes.
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
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from slurm_triage.step import gate# noqa: E402
from slurm_triage.model import Finding, Verdict  # noqa: E402
from slurm_triage.step.sampling import peer_figures  # noqa: E402
from slurm_triage.sinks import exposition, peer_metrics  # noqa: E402
from slurm_triage.sinks.pushgateway import group_path  # noqa: E402

JOB = "777"


def snapshot(node: int, power_limit: float = 700.0) -> Dict[str, Any]:
    """An 8 x H100 idle node (figures from tests/fakenvml/scenarios/h100x8-idle.json)."""
    gpus = []
    for i in range(8):
        gpus.append({
            "index": i, "uuid": f"GPU-{node:08x}-0000-0000-0000-{i:012x}", "pci_bus_id": f"0000:{0x18 + i * 16:02X}:00.0",
            "minor": i, "name": "NVIDIA H100 80GB HBM3", "temperature_celsius": 29 + i % 3,
            "slowdown_temp_celsius": 89, "shutdown_temp_celsius": 95, "power_watts": 68.5,
            "power_limit_watts": power_limit, "energy_joules": 123456789 + i, "util_gpu_percent": 0,
            "util_mem_percent": 0, "mem_used_bytes": 0, "mem_total_bytes": 85520809984, "sm_clock_mhz": 345,
            "sm_clock_max_mhz": 1980, "clock_event_reasons": 1, "clock_event_names": ["gpu_idle"],
            "ecc_uncorrected_volatile": 0, "ecc_uncorrected_aggregate": 0, "remap_pending": False,
            "remap_failure": False, "retired_pages_pending": None, "processes": [], "pcie_gen": 5,
            "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16, "lost": False,
        })
    return {"schema": 1, "node": f"gpu{node:04d}", "time": time.time(), "errors": {},
            "probe_seconds": {"gpu": 0.08, "procs": 0.05, "kernel": 0.01, "rdma": 0.01},
            "gpu": {"driver_version": "580.105.08", "nvml_version": "13.580.105.08", "count": 8, "gpus": gpus},
            "procs": {}, "kernel": {}, "rdma": {}}


def body(node: int, full: bool) -> bytes:
    """full: the Prolog's whole push (8 GPUs' gauges); else only what the gate reads."""
    snap = snapshot(node, power_limit=500.0 if node == 7 else 700.0)
    findings: List[Finding] = []
    if node == 3:
        findings.append(Finding("kernel.xid", Verdict.FAIL, "Xid 79", gpu=snap["gpu"]["gpus"][0]["uuid"], hardware=True))
    return exposition.render(snap, findings, {"internal_errors": 0}, gpus=full,
                             more=peer_metrics.families(peer_figures(snap)))


def push_all(url: str, job: str, nodes: List[str], full: bool) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def one(i_node: Any) -> None:
        i, node = i_node
        path = group_path({"job": "slurm_triage", "instance": node, "slurm_job_id": job, "phase": "prolog"})
        req = urllib.request.Request(url + path, data=body(i, full), method="PUT",
                                     headers={"Content-Type": "text/plain; version=0.0.4"})
        opener.open(req, timeout=30).read()

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(one, enumerate(nodes)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--other-nodes", type=int, default=0, help="groups of another job in the gateway")
    ap.add_argument("--full", action="store_true",
                    help="push the Prolog's whole group (8 GPUs' gauges, ~48 KB of JSON per node) "
                         "instead of the gate's evidence only; pushing is quadratic in the gateway")
    args = ap.parse_args()
    binary = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
    if not binary:
        print("prometheus-pushgateway not installed", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="bench-gate-")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}",
                             f"--persistence.file={work}/pgw.state"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(url + "/-/ready", timeout=0.5).read()
                break
            except OSError:
                time.sleep(0.05)
        nodes = [f"gpu{i:04d}" for i in range(args.nodes)]
        t = time.monotonic()
        push_all(url, JOB, nodes, args.full)
        if args.other_nodes:
            push_all(url, "778", [f"gpu{i:04d}" for i in range(args.other_nodes)], args.full)
        push_s = time.monotonic() - t
        raw = urllib.request.urlopen(url + "/api/v1/metrics", timeout=30).read()
        policy = gate.Policy()
        hostlist = f"gpu[0000-{args.nodes - 1:04d}]"
        whole, get_s, parse_s, ev_s, dec_s = [], [], [], [], []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            names = gate.expand_hostlist(hostlist)
            ev = gate.fetch_pushgateway(url, JOB, 30)
            d = gate.decide(JOB, names, ev, policy)
            whole.append(time.perf_counter() - t0)
            # the parts, measured separately
            t1 = time.perf_counter()
            raw = urllib.request.urlopen(url + "/api/v1/metrics", timeout=30).read()
            t2 = time.perf_counter()
            data = json.loads(raw)
            t3 = time.perf_counter()
            ev = gate.evidence_from_groups(data["data"], JOB)
            t4 = time.perf_counter()
            gate.decide(JOB, names, ev, policy)
            t5 = time.perf_counter()
            get_s.append(t2 - t1)
            parse_s.append(t3 - t2)
            ev_s.append(t4 - t3)
            dec_s.append(t5 - t4)
        assert d.blocked and {r.node for r in d.rows} == {"gpu0003", "gpu0007"}, d.rows

        def fmt(xs: List[float]) -> str:
            return f"median {statistics.median(xs) * 1000:7.1f} ms  (min {min(xs) * 1000:.1f}, max {max(xs) * 1000:.1f})"

        print(f"gang gate, {args.nodes} nodes (+{args.other_nodes} other-job groups), "
              f"{'full Prolog groups' if args.full else 'gate evidence only'}, {args.runs} runs; "
              f"answer {len(raw) / 1e6:.1f} MB; pushing took {push_s:.1f} s")
        print(f"  whole decision         {fmt(whole)}")
        print(f"  GET /api/v1/metrics    {fmt(get_s)}")
        print(f"  json.loads             {fmt(parse_s)}")
        print(f"  evidence from groups   {fmt(ev_s)}")
        print(f"  decide (pure)          {fmt(dec_s)}")
        print(f"  verdict: {'BLOCKED' if d.blocked else 'pass'}; rows: " + "; ".join(f"{r.node} {r.reason}" for r in d.rows))
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
