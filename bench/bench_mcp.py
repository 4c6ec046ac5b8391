"""MCP server figures against the lab: start to first answer, triage_job vs the CLI, bytes per tool.

    flock /tmp/slurm-lab/.test-lock .venv/bin/python bench/bench_mcp.py [--runs 5] [--job ID]

Without --job it runs one 2-node job in the lab first. Each run starts a fresh server (stdio,
the SDK's client), so triage_job is never answered from the server's 30 s cache; the CLI run
(`slurm-triage triage JOB --format json`) of the same job alternates with it. Medians.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Tuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "lab"))


def lab_env() -> Dict[str, str]:
    from labctl import find

    lab = find()
    if lab is None:
        sys.exit("bench_mcp: the lab is not up (make lab-up)")
    return {"PATH": "/usr/bin:/bin", "SLURM_CONF": lab.slurm_conf, "SLURM_TRIAGE_CONFIG": str(lab.triage_config)}


def one_job() -> str:
    from labctl import find

    lab = find()
    r = lab.srun("-N2", "sh", "-c", 'test "$SLURM_NODEID" = 0 && echo "$SLURM_JOB_ID"; sleep 1', timeout=120)
    if r.returncode:
        sys.exit(f"bench_mcp: the lab job failed: {r.stderr}")
    lab.wait_idle()
    return r.stdout.split()[0]


def mcp_run(env: Dict[str, str], job: str) -> Tuple[float, float, Dict[str, int]]:
    """(start to first answer, triage_job seconds, bytes per tool) with a fresh server."""
    import anyio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "slurm_triage", "mcp"], cwd=str(ROOT),
                                   env=env)
    calls = [("get_evidence", {"job_id": job, "source": s}) for s in ("slurm", "hooks", "pushgateway", "logs")]
    calls += [("query_metrics", {"job_id": job, "metric": "gpu_power"}), ("node_history", {"node": "node1"}),
              ("describe", {"topic": "topics"})]

    async def main() -> Tuple[float, float, Dict[str, int]]:
        t0 = time.perf_counter()
        async with Client(params) as c:
            await c.call_tool("describe", {"topic": "collective_hang"})
            first = time.perf_counter() - t0
            t1 = time.perf_counter()
            tri = await c.call_tool("triage_job", {"job_id": job, "detail": "full"})
            tri_s = time.perf_counter() - t1
            sizes = {"triage_job(full)": len(tri.model_dump_json())}
            for name, args in calls:
                r = await c.call_tool(name, args)
                sizes[f"{name}({args.get('source') or args.get('metric') or args.get('node') or args['topic']})"] = \
                    len(r.model_dump_json())
        return first, tri_s, sizes

    return anyio.run(main)


def cli_run(env: Dict[str, str], job: str) -> float:
    t0 = time.perf_counter()
    cp = subprocess.run([str(ROOT / ".venv/bin/slurm-triage"), "triage", job, "--format", "json"], env=env,
                        capture_output=True, timeout=300)
    if cp.returncode not in (0, 1):
        sys.exit(f"bench_mcp: the CLI failed: {cp.stderr.decode()[:300]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--job", help="a lab job id (default: run one)")
    ap.add_argument("--format", choices=("text", "json"), default="text")
    a = ap.parse_args()
    env = lab_env()
    os.environ.update({k: v for k, v in env.items() if k != "PATH"})
    job = a.job or one_job()
    firsts: List[float] = []
    tris: List[float] = []
    clis: List[float] = []
    sizes: Dict[str, int] = {}
    for _ in range(a.runs):
        f, t, sz = mcp_run(env, job)
        firsts.append(f)
        tris.append(t)
        clis.append(cli_run(env, job))
        sizes = {k: max(v, sizes.get(k, 0)) for k, v in sz.items()}
    med = {"start_to_first_answer_s": statistics.median(firsts), "triage_job_s": statistics.median(tris),
           "cli_triage_s": statistics.median(clis)}
    med["triage_job_vs_cli"] = med["triage_job_s"] / med["cli_triage_s"]
    out = {"job": job, "runs": a.runs, **{k: round(v, 3) for k, v in med.items()}, "bytes": sizes,
           "max_bytes": max(sizes.values()), "under_32KiB": max(sizes.values()) < 32 << 10}
    if a.format == "json":
        print(json.dumps(out, indent=1))
        return
    print(f"job {job}, {a.runs} runs, medians")
    print(f"  server start -> first answer   {med['start_to_first_answer_s'] * 1000:7.0f} ms")
    print(f"  triage_job (in the server)     {med['triage_job_s'] * 1000:7.0f} ms")
    print(f"  slurm-triage triage (CLI)      {med['cli_triage_s'] * 1000:7.0f} ms")
    print(f"  ratio triage_job / CLI         {med['triage_job_vs_cli']:7.2f}  (goal <= 1.2)")
    for k, v in sorted(sizes.items()):
        print(f"  bytes {k:<28} {v:7d}")
    print(f"  every answer under 32 KiB: {out['under_32KiB']}")


if __name__ == "__main__":
    main()
