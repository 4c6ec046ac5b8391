"""What a Prolog of a given length costs `srun -N1 true` in the lab: a step function, not a slope.

slurmd runs the Prolog (PrologFlags=Alloc) before the step may launch, and srun does not learn
at once that it has finished: it looks again later, so a Prolog a few milliseconds too long costs
a whole wait. This bench replaces the lab's Prolog by `sleep S` for each S given (the Epilog by a
no-op) and times `srun -N1 true`, interleaved round-robin with no-op hooks, to show where the
steps are; the real Prolog's wall time (`bench/bench_hooks.py`) then tells on which one it sits.

    flock /tmp/slurm-lab/.test-lock .venv/bin/python bench/bench_srun_prolog_steps.py [--runs 8] [--sleeps 0.05,0.1,0.3]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "lab"))

from bench_hooks import NOOP, replaced, srun_seconds  # noqa: E402
from labctl import find  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=8, help="jobs per variant")
    ap.add_argument("--sleeps", default="0.02,0.06,0.08,0.09,0.10,0.20,0.30",
                    help="Prolog lengths in seconds, comma-separated")
    ap.add_argument("--format", choices=("text", "json"), default="text")
    args = ap.parse_args()
    sleeps = [s.strip() for s in args.sleeps.split(",") if s.strip()]
    for s in sleeps:
        float(s)  # a typo fails here, not inside slurmd's Prolog
    lab = find()
    if lab is None:
        raise SystemExit("the lab is not up: make lab-up")
    lab.reset()
    bin_dir = lab.dir / "bin"
    times: Dict[str, List[float]] = {"no-op": [], **{f"sleep {s}": [] for s in sleeps}}
    with replaced(bin_dir / "epilog", NOOP):
        for i in range(args.runs):
            with replaced(bin_dir / "prolog", NOOP):
                times["no-op"].append(srun_seconds(lab, 1))
            for s in sleeps:
                with replaced(bin_dir / "prolog", f"#!/bin/sh\nsleep {s}\nexit 0\n"):
                    times[f"sleep {s}"].append(srun_seconds(lab, 1))
            print(f"\rround {i + 1}/{args.runs}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    med = {k: round(statistics.median(v), 4) for k, v in times.items()}
    if args.format == "json":
        print(json.dumps({"runs": args.runs, "srun_seconds_median": med}, indent=1))
        return
    print(f"srun -N1 true in the lab, {args.runs} jobs per Prolog length (medians)")
    for k, v in med.items():
        print(f"  Prolog {k:<12} {v * 1000:6.0f} ms  ({v / med['no-op']:.2f}x no-op)")


if __name__ == "__main__":
    main()
