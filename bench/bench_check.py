"""Wall time of `slurm-triage check` as the Prolog would pay it (interpreter start included).

Runs the real command on the 8-GPU fake NVML with N extra processes holding sockets,
and the same with GPU collection disabled, plus the interpreter floor, interleaved
round-robin so machine drift hits all variants alike. Prints medians and ratios.

    .venv/bin/python bench/bench_check.py [--runs 15] [--procs 2000] [--format json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from procs_fixture import Fleet  # noqa: E402


def _config(tmp: str, gpu: bool, lib: Path) -> str:
    path = os.path.join(tmp, f"bench-{'gpu' if gpu else 'nogpu'}.toml")
    with open(path, "w") as fh:
        fh.write(f'[node]\nstate_dir = "{tmp}/state"\nspool_dir = "{tmp}/spool"\n'
                 f'[gpu]\nenabled = {"true" if gpu else "false"}\nnvml_library = "{lib}"\n'
                 f'[kernel]\nsource = "file"\npath = "{ROOT}/tests/data/kernel/SOURCES.md"\n')
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--procs", type=int, default=2000)
    ap.add_argument("--scenario", default="h100x8-idle.json")
    ap.add_argument("--fleet-job", default=None, metavar="JOBID",
                    help="give the extra processes SLURM_JOB_ID=JOBID (a dead job: every one is a leftover)")
    ap.add_argument("--format", choices=("text", "json"), default="text")
    args = ap.parse_args()
    subprocess.run(["make", "-s", "-C", str(ROOT / "tests/fakenvml")], check=True)
    lib = ROOT / "tests/fakenvml/build/libnvidia-ml.so.1"
    py = sys.executable
    env = dict(os.environ, FAKENVML_SCENARIO=str(ROOT / "tests/fakenvml/scenarios" / args.scenario))
    with tempfile.TemporaryDirectory() as tmp, Fleet(args.procs, job_id=args.fleet_job):
        variants: Dict[str, List[str]] = {
            "python -I -c pass (floor)": [py, "-I", "-c", "pass"],
            "python -I -c 'import psutil'": [py, "-I", "-c", "import psutil"],
            "check, all collectors": [py, "-I", "-m", "slurm_triage", "--config", _config(tmp, True, lib),
                                      "check", "--format", "json"],
            "check, no GPU": [py, "-I", "-m", "slurm_triage", "--config", _config(tmp, False, lib),
                              "check", "--format", "json"],
        }
        times: Dict[str, List[float]] = {k: [] for k in variants}
        for cmd in variants.values():  # warm-up: page cache, .pyc
            subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True)
        for i in range(args.runs):
            for name, cmd in variants.items():
                t0 = time.perf_counter()
                r = subprocess.run(cmd, env=env, cwd=str(ROOT), capture_output=True)
                times[name].append(time.perf_counter() - t0)
                if r.returncode not in (0, 1):
                    raise SystemExit(f"{name} failed: {r.stderr.decode()[-400:]}")
            print(f"\rrun {i + 1}/{args.runs}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
    med = {k: statistics.median(v) for k, v in times.items()}
    full = med["check, all collectors"]
    out = {"runs": args.runs, "extra_processes": args.procs, "fleet_job": args.fleet_job, "scenario": args.scenario,
           "median_seconds": {k: round(v, 4) for k, v in med.items()},
           "min_seconds": {k: round(min(v), 4) for k, v in times.items()},
           "ratio_no_gpu_vs_full": round(med["check, no GPU"] / full, 3),
           "ratio_check_vs_import_psutil": round(full / med["python -I -c 'import psutil'"], 2),
           "load_average": [round(x, 2) for x in os.getloadavg()],
           "goal_seconds": 0.3, "meets_goal": full <= 0.3}
    if args.format == "json":
        print(json.dumps(out, indent=1))
        return
    print(f"slurm-triage check, {args.runs} runs, {args.procs} extra processes holding sockets"
          f"{' of dead job ' + args.fleet_job if args.fleet_job else ''}, 8-GPU fake NVML ({args.scenario})")
    for k, v in med.items():
        print(f"  {k:<28} median {v * 1000:7.1f} ms   min {min(times[k]) * 1000:7.1f} ms")
    print(f"  check / import psutil: {out['ratio_check_vs_import_psutil']} (goal ≤ 2.5)   load average "
          f"{' '.join(map(str, out['load_average']))}")
    print(f"  no-GPU / full ratio: {out['ratio_no_gpu_vs_full']}   goal ≤ 300 ms: "
          f"{'met' if out['meets_goal'] else 'NOT met'}")


if __name__ == "__main__":
    main()
