"""Log scanner throughput vs `grep -E` with the same signatures.

Generates a synthetic training log (ordinary step lines, a few failure signatures), then
times ``slurm_triage.triage.logs.scan`` and ``grep -E -c <needles>`` (LC_ALL=C) over it and
prints medians. Usage: python bench/bench_logscan.py [--gb 1.0] [--runs 2] [--keep PATH]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from slurm_triage.triage import logs  # noqa: E402

SIGNATURES = [  # shapes from tests/corpus (real reports)
    "[rank3]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=4661, NumelOut=4661, Timeout(ms)=600000) ran for "
    "600060 milliseconds before timing out.",
    "gpu-b02:3468:3905 [4] ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer 10.2.1.6<54862> with "
    "status=12 opcode=0 len=0 vendor err 129 (Recv)",
    "slurmstepd: error: *** JOB 867816 ON gpu-b02 CANCELLED AT 2021-05-11T12:06:17 DUE TO TIME LIMIT ***",
]


def generate(path: Path, size: int) -> None:
    """Write ``size`` bytes of step lines with one signature line every ~256 MiB."""
    block = "".join(
        f"[2024-05-01 12:{i // 60 % 60:02d}:{i % 60:02d},{i % 1000:03d}] INFO train step {i} | loss {2.0 + (i % 97) / 100:.3f}"
        f" | lr 3.0e-4 | grad_norm {1 + (i % 13) / 10:.2f} | tokens/s {120000 + i % 5000} | mem 61.2GiB\n"
        for i in range(40000)).encode()
    written = 0
    n = 0
    with open(path, "wb") as fh:
        while written < size:
            fh.write(block)
            written += len(block)
            if written // (256 << 20) > n:
                n = written // (256 << 20)
                line = (SIGNATURES[n % len(SIGNATURES)] + "\n").encode()
                fh.write(line)
                written += len(line)


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--keep", help="write/reuse the log at this path instead of a temp file")
    a = ap.parse_args()
    size = int(a.gb * (1 << 30))
    tmp = None
    if a.keep:
        path = Path(a.keep)
    else:
        tmp = tempfile.TemporaryDirectory()
        path = Path(tmp.name) / "train.log"
    if not path.exists() or path.stat().st_size < size:
        print(f"generating {size / 2**30:.2f} GiB at {path} ...", flush=True)
        generate(path, size)
    nbytes = path.stat().st_size
    pattern = logs.grep_pattern()
    env = {**os.environ, "LC_ALL": "C"}
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)  # warm the page cache
    ours, grep = [], []
    for _ in range(a.runs):
        res = {}
        ours.append(timed(lambda: res.setdefault("s", logs.scan(str(path)))))
        grep.append(timed(lambda: res.setdefault("g", subprocess.run(
            ["grep", "-c", "-E", pattern, str(path)], env=env, capture_output=True, text=True))))
        events, st = res["s"]
        assert int(res["g"].stdout) == st.candidate_lines, (res["g"].stdout, st.candidate_lines)
    mo, mg = statistics.median(ours), statistics.median(grep)
    mib = nbytes / 2**20
    print(f"file {mib:.0f} MiB, {st.lines} lines, {st.candidate_lines} signature lines, {len(events)} events")
    print(f"scanner  median {mo:.2f} s  {mib / mo:.0f} MiB/s   runs {[round(x, 2) for x in ours]}")
    print(f"grep -E  median {mg:.2f} s  {mib / mg:.0f} MiB/s   runs {[round(x, 2) for x in grep]}")
    print(f"throughput ratio scanner/grep = {mg / mo:.2f}")
    if tmp:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
