"""Prolog/Epilog wall time in the lab, and what the hooks and the SPANK plugin cost srun.

Needs the lab up (`make lab-up`, as root). Three measurements, interleaved round-robin so
machine drift hits every variant alike:
  1. the Prolog's and the Epilog's wall time as slurmd runs them (median over N jobs), from a
     timing wrapper put around the lab's hook scripts for the duration of the run;
  2. `srun -N4 true` with the hooks vs with no-op hooks (ratio);
  3. `srun -N4 true` with the SPANK plugin loaded but no --triage vs the plugin absent (ratio).

    .venv/bin/python bench/bench_hooks.py [--jobs 20] [--nodes 4] [--format json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterator, List

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "lab"))

from labctl import Lab, find  # noqa: E402

TIMED = """#!/bin/sh
# bench/bench_hooks.py: times the real hook as slurmd runs it (removed after the run)
SLURM_TRIAGE_CONFIG={config}
export SLURM_TRIAGE_CONFIG
t0=$(date +%s%N)
{real}
rc=$?
echo "$SLURMD_NODENAME $SLURM_JOB_ID $(( $(date +%s%N) - t0 ))" >> {log}
exit $rc
"""
NOOP = "#!/bin/sh\nexit 0\n"


def _write(path: Path, text: str, mode: int) -> None:
    """Atomically: slurmd may exec the hook at any moment."""
    tmp = path.with_name(path.name + ".bench")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


@contextmanager
def replaced(path: Path, text: str) -> Iterator[None]:
    saved = path.read_text()
    mode = path.stat().st_mode
    try:
        _write(path, text, mode)
        yield
    finally:
        _write(path, saved, mode)


def srun_seconds(lab: Lab, nodes: int) -> float:
    """One `srun -N<nodes> true`; waits for every Epilog to finish before returning."""
    t0 = time.perf_counter()
    r = lab.srun(f"-N{nodes}", "true", timeout=120)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"srun failed: {r.stderr}")
    lab.wait_idle()
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=4, help="nodes per job (the lab's 4 share 2 cores)")
    ap.add_argument("--format", choices=("text", "json"), default="text")
    args = ap.parse_args()
    lab = find()
    if lab is None:
        raise SystemExit("the lab is not up: make lab-up")
    lab.reset()
    bin_dir, plug = lab.dir / "bin", lab.dir / "etc" / "plugstack.conf.d" / "slurm-triage.conf"
    logs = {k: lab.dir / f"bench-{k}.times" for k in ("prolog", "epilog")}
    for p in logs.values():
        p.unlink(missing_ok=True)
    real = {k: (bin_dir / k).read_text() for k in ("prolog", "epilog")}
    exec_line = {k: next(line for line in real[k].splitlines() if line.startswith("exec ")) for k in real}
    times: Dict[str, List[float]] = {"hooks": [], "no-op hooks": [], "plugin, no flag": [], "plugin absent": []}
    plugline = plug.read_text()
    timed = {k: TIMED.format(config=lab.triage_config, real=exec_line[k][len("exec "):], log=logs[k]) for k in real}
    with replaced(bin_dir / "prolog", timed["prolog"]), replaced(bin_dir / "epilog", timed["epilog"]):
        for i in range(args.jobs):
            times["hooks"].append(srun_seconds(lab, args.nodes))
            with replaced(bin_dir / "prolog", NOOP), replaced(bin_dir / "epilog", NOOP):
                times["no-op hooks"].append(srun_seconds(lab, args.nodes))
            print(f"\rjob round {i + 1}/{args.jobs}", end="", file=sys.stderr, flush=True)
    with replaced(bin_dir / "prolog", NOOP), replaced(bin_dir / "epilog", NOOP):
        for i in range(args.jobs):
            times["plugin, no flag"].append(srun_seconds(lab, args.nodes))
            with replaced(plug, "# plugin absent (bench/bench_hooks.py)\n"):
                times["plugin absent"].append(srun_seconds(lab, args.nodes))
            print(f"\rplugin round {i + 1}/{args.jobs}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    assert plug.read_text() == plugline
    lab.wait_idle()
    hook = {k: [int(line.split()[2]) / 1e9 for line in p.read_text().splitlines()] for k, p in logs.items()}
    for p in logs.values():
        p.unlink()
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {
        "jobs": args.jobs, "nodes": args.nodes,
        "hook_wall_seconds": {k: {"median": round(statistics.median(v), 4), "max": round(max(v), 4), "runs": len(v)}
                              for k, v in hook.items()},
        "srun_true_seconds": {k: round(v, 4) for k, v in med.items()},
        "ratio_hooks_vs_noop": round(med["hooks"] / med["no-op hooks"], 3),
        "ratio_plugin_no_flag_vs_absent": round(med["plugin, no flag"] / med["plugin absent"], 3),
    }
    if args.format == "json":
        print(json.dumps(out, indent=1))
        return
    print(f"lab: 4 nodes on one 2-core machine, jobs of {args.nodes} node(s), {args.jobs} jobs per variant (medians)")
    for k, v in out["hook_wall_seconds"].items():
        print(f"  {k:<7} wall time per node: median {v['median'] * 1000:6.0f} ms, max {v['max'] * 1000:6.0f} ms "
              f"({v['runs']} runs)")
    for k, v in med.items():
        print(f"  srun -N{args.nodes} true, {k:<16} median {v * 1000:6.0f} ms")
    print(f"  hooks / no-op hooks: {out['ratio_hooks_vs_noop']}   "
          f"plugin without --triage / plugin absent: {out['ratio_plugin_no_flag_vs_absent']}")


if __name__ == "__main__":
    main()
