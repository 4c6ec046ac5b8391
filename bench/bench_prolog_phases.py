"""Where the Prolog's and the Epilog's wall time goes, phase by phase, on one node and on 4 at once.

Runs the real hooks with the lab's config and a slurmd-like environment (no slurmd: the
phases are the hook's own), interleaved round-robin with the interpreter floors:
  * the real hook scripts (prolog/slurm-triage-prolog, epilog/...), whole wall time;
  * the same Python entry, traced: interpreter start (spawn to first line), import of the
    hook module, then every phase as a timed call (config, probes with each probe's own
    time, checks, state write, drain decision, exposition, push and each HTTP request,
    textfile, log) and interpreter exit;
  * 4 traced hooks at once (node1..node4 of one job), as a 4-node job on these 2 cores;
  * `python -I -c pass` and `python -I -c 'import psutil'` (the floors).
One more run per hook under `-X importtime` gives the imports by top-level module, for
the hook's own process and for the probe children apart (importtime inflates them).

    flock /tmp/slurm-lab/.test-lock .venv/bin/python bench/bench_prolog_phases.py [--rounds 20] [--format json]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import pwd
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, Iterable, List, Tuple

from procs_fixture import publisher_pids  # noqa: E402 (bench/ is the script's own directory)

ROOT = Path(__file__).resolve().parent.parent
PY = str(ROOT / ".venv" / "bin" / "python")
LAB = Path(os.environ.get("LAB_DIR") or "/tmp/slurm-lab")
JOB_BASE = 7_000_000 + (int(time.time()) % 100_000) * 10
"""Job ids no real lab job has; each run of the bench uses fresh ones."""

# The traced hook: what `python -I -m slurm_triage.hooks KIND` does, with every phase
# function wrapped as its module is imported (a meta-path hook, so import order and cost
# stay the hook's own). argv: KIND TRACE_PATH.
TRACER = r"""
import time
_T0 = time.monotonic()
import gc
gc.disable()  # as slurm_triage/hooks/__main__.py
import sys, importlib.abc, importlib.machinery
WRAP = {
 "slurm_triage.config": ["load"],
 "slurm_triage.snapshot": ["start", "Pending.result", "take", "preload_sinks"],
 "slurm_triage.hooks.prolog": ["warm_up"],
 "slurm_triage.hooks.env": ["from_environ"],
 "slurm_triage.inventory": ["update"],
 "slurm_triage.checks": ["run_checks"],
 "slurm_triage.sinks.state": ["save", "load"],
 "slurm_triage.hooks.common": ["drain_on_hardware", "write_textfile", "log", "deliver_logged", "internal_errors", "in_background"],
 "slurm_triage.hooks.epilog": ["gpu_diff", "clean_up", "job_leftovers"],
 "slurm_triage.sinks.exposition": ["render"],
 "slurm_triage.sinks.spool": ["deliver_all", "stats"],
 "slurm_triage.sinks.pushgateway": ["push", "delete", "ready"],
 "slurm_triage.breaker": ["suppressed_total"],
}
CALLS = []
def wrap(name, fn):
    def timed(*a, **kw):
        t = time.monotonic()
        try:
            out = fn(*a, **kw)
            if name in ("snapshot.take", "snapshot.Pending.result"):
                for probe, s in (out.get("probe_seconds") or {}).items():
                    CALLS.append(("  probe " + probe, 0.0, s))
            return out
        finally:
            CALLS.append((name, t, time.monotonic()))
    timed.__wrapped__ = fn
    return timed
class Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in WRAP:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        ex = spec.loader.exec_module
        def exec_module(mod, ex=ex, name=name):
            ex(mod)
            for attr in WRAP[name]:
                owner, _, leaf = attr.rpartition(".")
                where = getattr(mod, owner, None) if owner else mod
                if where is not None and hasattr(where, leaf):
                    setattr(where, leaf, wrap(name.rsplit(".", 1)[1] + "." + attr, getattr(where, leaf)))
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Finder())
kind, trace = sys.argv[1], sys.argv[2]
_T1 = time.monotonic()
from slurm_triage.deadline import Spare
from slurm_triage.snapshot import GPU_SPARE
spare = Spare.fork(*GPU_SPARE)  # the GPU probe's child, forked first, as the hooks' __main__ does
mod = importlib.import_module("slurm_triage.hooks." + kind)
_T2 = time.monotonic()
rc = mod.main(spare)
_T3 = time.monotonic()
import json
with open(trace, "w") as fh:
    json.dump({"t0": _T0, "tracer_ready": _T1, "imported": _T2, "main_done": _T3, "rc": rc, "calls": CALLS,
               "modules": len(sys.modules)}, fh)
import os
sys.stderr.flush()
os._exit(rc)  # as slurm_triage/hooks/__main__.py ends
"""


def _gateway_groups() -> int:
    """Groups in the lab's Pushgateway: with its consistency check each PUT costs ~1 ms per group."""
    import urllib.request

    try:
        with urllib.request.urlopen("http://127.0.0.1:9091/api/v1/metrics", timeout=5) as r:
            return len(json.load(r)["data"])
    except (OSError, ValueError, KeyError):
        return -1



def _publisher_tail(limit: float = 10.0) -> float:
    """Seconds until the Prolog's background publisher (if any) is done: its push lands
    after the hook exits; waiting keeps its CPU out of the next measurement."""
    t0 = time.monotonic()
    while publisher_pids() and time.monotonic() - t0 < limit:
        time.sleep(0.005)
    return time.monotonic() - t0


def _hook_env(node: str, job_id: int, uid: int, user: str, triage: str = "") -> Dict[str, str]:
    """What slurmd 22.05 gives a Prolog/Epilog (the parts the hooks read)."""
    env = {"SLURM_JOB_ID": str(job_id), "SLURMD_NODENAME": node, "SLURM_JOB_UID": str(uid),
           "SLURM_JOB_USER": user, "SLURM_NODELIST": "node[1-4]", "SLURM_JOB_PARTITION": "debug",
           "SLURM_TRIAGE_CONFIG": str(LAB / "etc" / "slurm-triage.toml")}
    if triage:
        env["SPANK_TRIAGE"] = triage
    return env


def _timed(cmd: List[str], env: Dict[str, str]) -> Tuple[float, float, int]:
    """(spawn monotonic, wall seconds, rc)."""
    t0 = time.monotonic()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/")
    return t0, time.monotonic() - t0, r.returncode


def _traced(kinds: List[Tuple[str, Dict[str, str]]], tmp: str) -> List[Dict[str, Any]]:
    """Run traced hooks at once; one phase dict (seconds) per hook."""
    procs = []
    for i, (kind, env) in enumerate(kinds):
        trace = os.path.join(tmp, f"trace-{i}.json")
        t0 = time.monotonic()
        p = subprocess.Popen([PY, "-I", "-c", TRACER, kind, trace], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, cwd="/")
        procs.append((p, t0, trace))
    out = []
    for p, t0, trace in procs:
        p.wait()
        t_end = time.monotonic()
        try:
            with open(trace) as fh:
                tr = json.load(fh)
        except (OSError, ValueError):
            out.append({"wall": t_end - t0, "error": f"no trace (rc {p.returncode})"})
            continue
        out.append(_phases(tr, t0, t_end))
    return out


def _phases(tr: Dict[str, Any], t_spawn: float, t_end: float) -> Dict[str, float]:
    ph: Dict[str, float] = defaultdict(float)
    ph["wall"] = t_end - t_spawn
    ph["interpreter start (spawn to first line)"] = tr["t0"] - t_spawn
    ph["import hook module (and fork the GPU spare)"] = tr["imported"] - tr["tracer_ready"]
    ph["interpreter exit"] = t_end - tr["main_done"]
    for name, a, b in tr["calls"]:
        ph[name] += b - a
    return dict(ph)


def _importtime(kind: str, env: Dict[str, str], tmp: str) -> Dict[str, Dict[str, float]]:
    """Self import time (ms) by top-level module: the hook's process vs its probe children."""
    d = tempfile.mkdtemp(dir=tmp)
    code = ("import os, sys, runpy\n"
            f"d = {d!r}\n"
            "def child():\n"
            "    fd = os.open(os.path.join(d, f'child-{os.getpid()}'), os.O_WRONLY | os.O_CREAT, 0o600)\n"
            "    os.dup2(fd, 2)\n"
            "os.register_at_fork(after_in_child=child)\n"
            f"sys.argv = ['hooks', {kind!r}]\n"
            "runpy.run_module('slurm_triage.hooks', run_name='__main__')\n")
    with open(os.path.join(d, "main"), "wb") as err:
        subprocess.run([PY, "-I", "-X", "importtime", "-c", code], env=env, stdout=subprocess.DEVNULL, stderr=err,
                       cwd="/")
    out: Dict[str, Dict[str, float]] = {"hook process": defaultdict(float), "probe children": defaultdict(float)}
    line = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|\s*(\S+)")
    for path in glob.glob(os.path.join(d, "*")):
        where = "hook process" if path.endswith("main") else "probe children"
        with open(path, errors="replace") as fh:
            for text in fh:
                m = line.match(text)
                if m:
                    out[where][m.group(3).lstrip(".").split(".")[0]] += int(m.group(1)) / 1000
    return {k: dict(sorted(v.items(), key=lambda kv: -kv[1])) for k, v in out.items()}


def _median_phases(runs: List[Dict[str, float]]) -> Dict[str, float]:
    keys = sorted({k for r in runs for k in r if k != "error"}, key=lambda k: -statistics.median(
        [r.get(k, 0.0) for r in runs]))
    return {k: round(statistics.median([r.get(k, 0.0) for r in runs]), 4) for k in keys}


def _rounds(args: argparse.Namespace, pw: pwd.struct_passwd, triage: str, floors: Dict[str, List[str]],
            whole: Dict[str, List[float]], traced: Dict[str, List[Dict[str, float]]], errors: List[str],
            base_env: Dict[str, str]) -> Dict[str, Any]:
    """The interleaved rounds (fills ``whole``, ``traced``, ``errors``); the imports by module."""
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds + 1):  # round 0 warms the page cache and the .pyc files
            job = JOB_BASE + 3 * r
            env1 = {**base_env, **_hook_env("node1", job, pw.pw_uid, pw.pw_name, triage)}
            for kind in ("prolog", "epilog"):
                _, wall, rc = _timed([str(ROOT / kind / f"slurm-triage-{kind}")], env1)
                tail = _publisher_tail()
                if r:
                    whole[f"{kind} script, 1 node"].append(wall)
                    if kind == "prolog":
                        whole["prolog publisher after exit, 1 node"].append(tail)
                if rc:
                    errors.append(f"{kind} script exited {rc}")
            for name, cmd in floors.items():
                _, wall, _ = _timed(cmd, base_env)
                if r:
                    whole[name].append(wall)
            env1 = {**base_env, **_hook_env("node1", job + 1, pw.pw_uid, pw.pw_name, triage)}
            for kind in ("prolog", "epilog"):
                ph = _traced([(kind, env1)], tmp)[0]
                _publisher_tail()
                if r:
                    traced[f"{kind}, 1 node"].append(ph)
            envs = [{**base_env, **_hook_env(f"node{n}", job + 2, pw.pw_uid, pw.pw_name, triage)} for n in range(1, 5)]
            for kind in ("prolog", "epilog"):
                phs = _traced([(kind, e) for e in envs], tmp)
                tail = _publisher_tail()
                if r and kind == "prolog":
                    whole["prolog publishers after exit, 4 nodes"].append(tail)
                for ph in phs:
                    if r:
                        traced[f"{kind}, 4 nodes at once"].append(ph)
            print(f"\rround {r}/{args.rounds}", end="", file=sys.stderr, flush=True)
        print(file=sys.stderr)
        env1 = {**base_env, **_hook_env("node1", JOB_BASE - 1, pw.pw_uid, pw.pw_name, triage)}
        return {kind: _importtime(kind, env1, tmp) for kind in ("prolog", "epilog")}


def _forget_jobs(jobs: Iterable[int]) -> None:
    """Remove the state the bench's made-up jobs left on the lab's nodes: what reads the newest
    records of a node (the MCP's node_history, triage) must not find these instead of real jobs."""
    import shutil

    for node_dir in glob.glob(str(LAB / "nodes" / "*" / "state" / "jobs")):
        for j in jobs:
            shutil.rmtree(os.path.join(node_dir, str(j)), ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--triage", action="store_true", help="as a job with --triage (the Prolog samples 2 s)")
    ap.add_argument("--format", choices=("text", "json"), default="text")
    args = ap.parse_args()
    if not (LAB / "etc" / "slurm-triage.toml").exists():
        raise SystemExit("the lab is not up: make lab-up")
    pw = pwd.getpwnam("triage-test")
    triage = "on" if args.triage else ""
    floors = {"python -I -c pass": [PY, "-I", "-c", "pass"],
              "python -I -c 'import psutil'": [PY, "-I", "-c", "import psutil"]}
    whole: Dict[str, List[float]] = defaultdict(list)
    traced: Dict[str, List[Dict[str, float]]] = defaultdict(list)
    errors: List[str] = []
    base_env = {"PATH": "/usr/bin:/bin"}
    groups_before = _gateway_groups()
    try:
        imports = _rounds(args, pw, triage, floors, whole, traced, errors, base_env)
    finally:
        _forget_jobs(range(JOB_BASE - 1, JOB_BASE + 3 * args.rounds + 3))
    errors += [f"{k}: {ph['error']}" for k, v in traced.items() for ph in v if "error" in ph]
    med_whole = {k: round(statistics.median(v), 4) for k, v in whole.items()}
    floor = med_whole["python -I -c 'import psutil'"]
    out = {"rounds": args.rounds, "triage": triage, "load_average": os.getloadavg(),
           "gateway_groups": [groups_before, _gateway_groups()],
           "wall_seconds": med_whole,
           "ratio_vs_import_psutil": {k: round(v / floor, 2) for k, v in med_whole.items()},
           "phases_seconds": {k: _median_phases(v) for k, v in traced.items()},
           "imports_ms_importtime": {k: {w: {m: round(t, 1) for m, t in list(v.items())[:12]} for w, v in d.items()}
                                     for k, d in imports.items()},
           "errors": errors[:10]}
    if args.format == "json":
        print(json.dumps(out, indent=1))
        return
    print(f"hooks on the lab's config, {args.rounds} rounds{' with --triage' if triage else ''}; load average "
          f"{' '.join(f'{x:.2f}' for x in out['load_average'])}; Pushgateway groups {out['gateway_groups'][0]} -> "
          f"{out['gateway_groups'][1]} (medians)")
    for k, v in med_whole.items():
        print(f"  {k:<32} {v * 1000:7.1f} ms  ({out['ratio_vs_import_psutil'][k]}x import psutil)")
    for k, ph in out["phases_seconds"].items():
        print(f"  {k}: phases (median ms; nested calls are inside their callers)")
        for name, s in ph.items():
            print(f"    {name:<44} {s * 1000:7.1f}")
    for k, d in out["imports_ms_importtime"].items():
        for where, mods in d.items():
            print(f"  {k} imports, {where} (-X importtime self ms): "
                  + ", ".join(f"{m} {t:g}" for m, t in mods.items()))
    for e in out["errors"]:
        print(f"  error: {e}")


if __name__ == "__main__":
    main()
