"""The real Prolog/Epilog scripts of this tree against those of an earlier commit, side by side.

A figure from another day or another load says little on a shared 2-core machine; this runs
both trees' hook scripts in the same rounds, interleaved, so drift hits both alike. The earlier
commit is exported (`git archive`) to a temporary directory with a tiny virtual environment
that reuses this tree's installed packages, so only our code differs. Per tree and hook kind:
wall time of one hook alone (median and min), its CPU time (the hook and its probe children,
not the detached publisher), how long its publisher runs after it, and the wall time of each
of 4 hooks started at once (4 lab nodes on these 2 cores). Runs the hooks with the lab's
config and a slurmd-like environment (no slurmd; `bench/bench_hooks.py` measures through it).

    flock /tmp/slurm-lab/.test-lock .venv/bin/python bench/bench_hooks_ab.py --base 6c59ead [--rounds 20]
"""
from __future__ import annotations

import argparse
import json
import os
import pwd
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

from bench_prolog_phases import LAB, ROOT, _forget_jobs, _hook_env, _publisher_tail  # noqa: E402 (bench/ is on sys.path)


def export(commit: str, into: Path) -> Path:
    """``commit``'s tree under ``into`` with a .venv whose site-packages are this tree's."""
    tree = into / "tree"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tree / ".venv")], check=True)
    ours = Path(next(p for p in sys.path if p.endswith("site-packages") and p.startswith(str(ROOT))))
    theirs = tree / ".venv" / ours.relative_to(ROOT / ".venv")
    # .pth files run in name order: the old tree first (it shadows this tree's editable
    # install), then our packages, whose own distutils hook needs them on the path.
    (theirs / "00-bench-base.pth").write_text(f"{tree}\n{ours}\n")
    for pth in ours.glob("distutils-precedence.pth"):
        shutil.copy(pth, theirs / pth.name)
    return tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the earlier commit (e.g. 6c59ead)")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--kinds", default="prolog,epilog")
    ap.add_argument("--format", choices=("text", "json"), default="text")
    args = ap.parse_args()
    if not (LAB / "etc" / "slurm-triage.toml").exists():
        raise SystemExit("the lab is not set up: make lab-up")
    user = pwd.getpwnam("nobody")
    job = 8_000_000 + (int(time.time()) % 100_000) * 10
    used: List[int] = []
    out: Dict[str, Dict[str, Dict[str, float]]] = {}
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"base": export(args.base, Path(tmp)), "this tree": ROOT}
        for kind in args.kinds.split(","):
            got = {t: {"alone": [], "cpu": [], "publisher": [], "4 at once": []} for t in trees}
            for r in range(args.rounds + 1):  # round 0 warms the page cache and the .pyc files
                for name, tree in trees.items():
                    script = [str(tree / kind / f"slurm-triage-{kind}")]
                    job += 1
                    used.append(job)
                    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    t0 = time.monotonic()
                    subprocess.run(script, env=_hook_env("node1", job, user.pw_uid, user.pw_name), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, cwd="/")
                    wall = time.monotonic() - t0
                    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                    tail = _publisher_tail()
                    job += 1
                    used.append(job)
                    t0 = time.monotonic()
                    procs = [subprocess.Popen(script, env=_hook_env(f"node{n}", job, user.pw_uid, user.pw_name), stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL, cwd="/") for n in range(1, 5)]
                    walls = []
                    for p in procs:
                        p.wait()
                        walls.append(time.monotonic() - t0)
                    _publisher_tail()
                    if r:
                        got[name]["alone"].append(wall)
                        got[name]["cpu"].append(c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime)
                        got[name]["publisher"].append(tail)
                        got[name]["4 at once"].extend(walls)
                print(f"\r{kind} round {r}/{args.rounds}", end="", file=sys.stderr, flush=True)
            print(file=sys.stderr)
            out[kind] = {name: {"alone_ms": statistics.median(v["alone"]) * 1000,
                                "alone_min_ms": min(v["alone"]) * 1000,
                                "cpu_ms": statistics.median(v["cpu"]) * 1000,
                                "publisher_after_ms": statistics.median(v["publisher"]) * 1000,
                                "four_at_once_ms": statistics.median(v["4 at once"]) * 1000}
                         for name, v in got.items()}
    _forget_jobs(used)
    load1 = os.getloadavg()
    if args.format == "json":
        print(json.dumps({"base": args.base, "rounds": args.rounds, "load": [load0[0], load1[0]], "hooks": out},
                         indent=1))
        return
    print(f"hook scripts, {args.base} vs this tree, {args.rounds} interleaved rounds, load {load0[0]:.2f} -> "
          f"{load1[0]:.2f} (medians)")
    for kind, trees_out in out.items():
        b, n = trees_out["base"], trees_out["this tree"]
        for name, v in trees_out.items():
            print(f"  {kind} {name:<9}  alone {v['alone_ms']:6.1f} ms (min {v['alone_min_ms']:5.1f})  "
                  f"cpu {v['cpu_ms']:6.1f} ms  publisher after {v['publisher_after_ms']:6.1f} ms  "
                  f"4 at once {v['four_at_once_ms']:6.1f} ms")
        print(f"  {kind} this tree / base: alone {n['alone_ms'] / b['alone_ms']:.2f}, cpu {n['cpu_ms'] / b['cpu_ms']:.2f}, "
              f"4 at once {n['four_at_once_ms'] / b['four_at_once_ms']:.2f}")


if __name__ == "__main__":
    main()
