"""`triage` against a backfilled Prometheus: 128 nodes x 8 GPUs x 11 days of dcgm-exporter series.

Writes OpenMetrics history (util, power, temperature, SM clock, clock event reasons; labels
Hostname/gpu/UUID as dcgm-exporter) with one thermal straggler GPU (hot, HW_THERMAL +
HW_SLOWDOWN reasons, clock sagging from day 2 on) and one collective-hang window (every GPU at
100 % util, near-idle power, full clock for 1 h on day 8), backfills it with
``promtool tsdb create-blocks-from openmetrics --max-block-duration=288h`` (one run per metric,
to bound promtool's memory), starts a private ``prometheus`` on 127.0.0.1 and times
``slurm-triage triage`` (the real CLI, in a subprocess) for the 11-day job window.

Scale chosen for 2-core machines: 5 metrics @ 120 s = 1,024 series x 7,920 samples x 5 = 40.5 M
samples (≈ the 48 M of "3 metrics @ 60 s", but every metric the rules need is present; an
11-day range query needs a step >= 87 s anyway, so the triage queries see the same resolution).
The generator and the server helper are also used by tests/test_triage_metrics.py at small scale.

usage: nice python bench/bench_triage_prom.py [--nodes 128] [--days 11] [--step 120] [--runs 3] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent
GPUS = 8
HW_SLOWDOWN, HW_THERMAL = 0x8, 0x40


@dataclass
class Scenario:
    """What to inject: the straggler GPU (node, gpu, from when) and the hang window."""

    nodes: int
    start: int
    end: int
    step: int
    straggler: Tuple[int, int] = (5, 3)  # (node index, gpu)
    straggler_from: int = 0
    hang: Tuple[int, int] = (0, 0)

    def node(self, i: int) -> str:
        return f"gpu{i:04d}"

    @property
    def straggler_node(self) -> str:
        return self.node(self.straggler[0])

    @classmethod
    def make(cls, nodes: int, seconds: int, step: int, end: Optional[int] = None) -> "Scenario":
        end = (end or int(time.time()) - 600) // step * step
        start = end - seconds
        return cls(nodes, start, end, step, (min(5, nodes - 1), 3), start + seconds // 8,
                   (start + seconds * 2 // 3, start + seconds * 2 // 3 + max(1800, seconds // 264)))


def _value(metric: str, s: Scenario, node: int, gpu: int, ts: int, i: int) -> int:
    """Deterministic dcgm-like value (integers, as DCGM exports) at sample ``i``."""
    hung = s.hang[0] <= ts < s.hang[1]
    hot = (node, gpu) == s.straggler and ts >= s.straggler_from
    jitter = (i * 7 + node * 13 + gpu * 5) % 11
    if metric == "DCGM_FI_DEV_GPU_UTIL":
        return 100 if hung else 92 + jitter % 8
    if metric == "DCGM_FI_DEV_POWER_USAGE":
        return 88 + jitter if hung else (420 if hot else 600) + jitter * 5
    if metric == "DCGM_FI_DEV_GPU_TEMP":
        return 86 + jitter % 2 if hot else (41 if hung else 62) + jitter % 5
    if metric == "DCGM_FI_DEV_SM_CLOCK":
        return 1395 + jitter if hot and not hung else 1980 - (jitter % 3) * 15
    if metric == "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS":
        return HW_SLOWDOWN | HW_THERMAL if hot else 0
    raise KeyError(metric)


METRICS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK",
           "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")


def write_metric(fh: IO[str], metric: str, s: Scenario) -> int:
    """One gauge family, series by series, timestamps in seconds; the number of samples."""
    fh.write(f"# HELP {metric} synthetic dcgm-exporter history\n# TYPE {metric} gauge\n")
    times = list(range(s.start, s.end + 1, s.step))
    stamps = [str(t) for t in times]
    n = 0
    for node in range(s.nodes):
        for gpu in range(GPUS):
            lab = (f'{metric}{{Hostname="{s.node(node)}",gpu="{gpu}",'
                   f'UUID="GPU-{node:04d}{gpu:04d}-0000-0000-0000-000000000000"}} ')
            fh.write("".join(f"{lab}{_value(metric, s, node, gpu, t, i)} {stamps[i]}\n" for i, t in enumerate(times)))
            n += len(times)
    return n


def write_extra(fh: IO[str], s: Scenario, job_id: str) -> None:
    """node_exporter InfiniBand counter rising on one node, and our watcher's thread count growing on another."""
    times = list(range(s.start, s.end + 1, s.step))
    fh.write("# HELP node_infiniband_symbol_error Symbol errors.\n# TYPE node_infiniband_symbol_error counter\n")
    for node in range(s.nodes):
        lab = f'node_infiniband_symbol_error_total{{instance="{s.node(node)}:9100",device="mlx5_0",port="1"}} '
        fh.write("".join(f"{lab}{(i // 10 if node == 1 else 0)} {t}\n" for i, t in enumerate(times)))
    fh.write("# HELP slurm_triage_watch_threads Threads.\n# TYPE slurm_triage_watch_threads gauge\n")
    for node in range(s.nodes):
        lab = f'slurm_triage_watch_threads{{instance="{s.node(node)}",slurm_job_id="{job_id}",job="slurm_triage"}} '
        fh.write("".join(f"{lab}{(200 + i if node == 2 else 200)} {t}\n" for i, t in enumerate(times)))


def backfill(om: Path, data_dir: Path) -> float:
    """promtool blocks from ``om`` into ``data_dir``; the seconds it took."""
    t = time.monotonic()
    subprocess.run([shutil.which("promtool") or "promtool", "tsdb", "create-blocks-from", "openmetrics",
                    "--max-block-duration=288h", str(om), str(data_dir)], check=True, capture_output=True)
    return time.monotonic() - t


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrometheusServer:
    """A private prometheus on 127.0.0.1 over ``data_dir``, scraping nothing; stopped by PID."""

    def __init__(self, data_dir: Path):
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None

    def start(self, timeout: float = 60.0) -> None:
        conf = self.data_dir.parent / "prometheus.yml"
        conf.write_text("global:\n  scrape_interval: 1h\nscrape_configs: []\n")
        log = open(self.data_dir.parent / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [shutil.which("prometheus") or "prometheus", f"--config.file={conf}", f"--storage.tsdb.path={self.data_dir}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=60d",
             "--query.max-samples=100000000"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: see {log.name}")
            try:
                with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                        self.url + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("prometheus not ready")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def wait_for(self, expr: str, at: float, timeout: float = 60.0) -> None:
        """Until ``expr`` evaluated at ``at`` returns data (blocks are loaded at start)."""
        deadline = time.monotonic() + timeout
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        query = urllib.parse.urlencode({"query": expr, "time": str(at)})
        while time.monotonic() < deadline:
            with opener.open(self.url + "/api/v1/query?" + query, timeout=10) as r:
                if json.loads(r.read())["data"]["result"]:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"no data for {expr}")


def build(s: Scenario, work: Path, job_id: str, per_metric: bool = True) -> Dict[str, float]:
    """Generate + backfill everything into work/data; timings per phase."""
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    timings: Dict[str, float] = {"generate": 0.0, "backfill": 0.0, "samples": 0}
    groups: List[Tuple[str, ...]] = [(m,) for m in METRICS] if per_metric else [METRICS]
    for i, group in enumerate(groups + [("extra",)]):
        om = work / f"in{i}.om"
        t = time.monotonic()
        with open(om, "w", buffering=1 << 22) as fh:
            for m in group:
                if m == "extra":
                    write_extra(fh, s, job_id)
                else:
                    timings["samples"] += write_metric(fh, m, s)
            fh.write("# EOF\n")
        timings["generate"] += time.monotonic() - t
        timings["backfill"] += backfill(om, data)
        om.unlink()
    return timings


def dead_slurm_conf(directory: Path) -> Path:
    """A slurm.conf whose controller and slurmdbd refuse at once: the job is known only through
    --nodes/--since/--until, as for a job purged from accounting (a missing file would make the
    Slurm tools try DNS SRV lookups until triage's timeout)."""
    p = directory / "slurm.conf"
    p.write_text("ClusterName=dead\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=9\nMessageTimeout=1\n"
                 "TCPTimeout=1\nAccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=127.0.0.1\n"
                 "AccountingStoragePort=9\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    return p


def triage_cli(url: str, job_id: str, s: Scenario, slurm_conf: Path) -> Tuple[float, Dict[str, object], int]:
    """Run the real CLI; (wall seconds, JSON report, exit code)."""
    nodes = f"gpu[0000-{s.nodes - 1:04d}]"
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "SLURM_CONF": str(slurm_conf)}
    t = time.monotonic()
    cp = subprocess.run([sys.executable, "-m", "slurm_triage", "triage", job_id, "--prometheus", url,
                         "--nodes", nodes, "--since", str(s.start), "--until", str(s.end), "--format", "json"],
                        capture_output=True, text=True, cwd=str(ROOT), env=env, timeout=300)
    wall = time.monotonic() - t
    if cp.returncode not in (0, 1):
        raise RuntimeError(f"triage exit {cp.returncode}: {cp.stderr}")
    return wall, json.loads(cp.stdout), cp.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=128)
    ap.add_argument("--days", type=float, default=11.0)
    ap.add_argument("--step", type=int, default=120)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", help="reuse/keep the TSDB under this directory")
    a = ap.parse_args()
    for tool in ("prometheus", "promtool"):
        if not shutil.which(tool):
            print(f"{tool} not installed", file=sys.stderr)
            return 2
    tmp = None if a.keep else tempfile.TemporaryDirectory()
    work = Path(a.keep or tmp.name)  # type: ignore[union-attr]
    work.mkdir(parents=True, exist_ok=True)
    job_id = "4242"
    meta = work / "scenario.json"
    if a.keep and meta.exists():
        s = Scenario(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(meta.read_text()).items()})
        print("reusing", work)
    else:
        s = Scenario.make(a.nodes, int(a.days * 86400), a.step)
        print(f"generating {a.nodes} nodes x {GPUS} GPUs x {a.days} d @ {a.step} s, {len(METRICS)} metrics ...", flush=True)
        t = build(s, work, job_id)
        meta.write_text(json.dumps(s.__dict__))
        print(f"  samples {t['samples']:,}  generate {t['generate']:.1f} s  backfill {t['backfill']:.1f} s", flush=True)
    server = PrometheusServer(work / "data")
    server.start()
    try:
        server.wait_for("count(DCGM_FI_DEV_GPU_UTIL)", s.end)
        walls, sums, ok = [], [], True
        for r in range(a.runs):
            wall, report, rc = triage_cli(server.url, job_id, s, dead_slurm_conf(work))
            prom = report["sources"]["prometheus"]
            walls.append(wall)
            sums.append(prom["query_seconds_sum"])
            f0 = report["findings"][0]
            hang = next((f for f in report["findings"] if f["id"] == "metric.hang"), None)
            named = (f0["node"] == s.straggler_node and f0["gpu"] == str(s.straggler[1]) and hang is not None
                     and abs(hang["evidence"]["windows"][0]["start"] - s.hang[0]) <= 2 * prom["step_seconds"])
            ok = ok and named
            w = hang["evidence"]["windows"][0] if hang else {}
            print(f"run {r + 1}: triage {wall:.2f} s (prometheus {prom['seconds']:.2f} s, sum of {prom['queries']} "
                  f"query times {prom['query_seconds_sum']:.2f} s); first: {f0['id']}; hang window "
                  f"{w.get('start', 0) - s.hang[0]:+.0f} s / {w.get('end', 0) - s.hang[1]:+.0f} s from the injected "
                  f"one, {len(w.get('nodes', []))} nodes; named both: {named}", flush=True)
        slowest = max(report["sources"]["prometheus"]["query_seconds"].items(), key=lambda kv: kv[1])
        print(f"median triage wall {statistics.median(walls):.2f} s, median sum of query times "
              f"{statistics.median(sums):.2f} s, slowest query {slowest[0]} {slowest[1]:.2f} s; "
              f"budget 10 s: {'OK' if statistics.median(walls) <= 10 and ok else 'MISSED'}")
    finally:
        server.stop()
        if tmp:
            tmp.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
