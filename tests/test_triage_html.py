"""`triage JOBID --format html`: a self-contained page (root cause first, per-node timelines,
evidence, sources) that loads nothing, escapes every hostile string, and opens in a real
headless Chromium with its SVG plots and no console message; the timeline's series come from
a real Prometheus (a backfilled dcgm-exporter history) and, in the lab, from the watcher."""
from __future__ import annotations

import importlib.util
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from conftest import cli
from slurm_triage.config import Config, defaults
from slurm_triage.model import Verdict
from slurm_triage.triage import TriageResult
from slurm_triage.triage import timeline as tlmod
from slurm_triage.triage.model import TriageFinding
from slurm_triage.triage.sources import DEFAULTS
from slurm_triage.triage.timeline import NodeTimeline, Series, Timeline

pytest.importorskip("matplotlib", reason="matplotlib not installed (pip install '.[html]')")
from slurm_triage.triage.html import render_html  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
T0 = 1796110000.0  # 2026-12-01T07:26:40Z
HOSTILE = '<script>alert("x")</script><img src=http://127.0.0.1:1/x.png>'
# What `scontrol show node -o` printed on the lab (Slurm 22.05) for a node our Epilog drained.
SCONTROL = ("NodeName=node2 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 State=IDLE+DRAIN ThreadsPerCore=1 "
            "Partitions=debug BootTime=2026-12-01T10:14:45 "
            "Reason=triage: GPU 5 (GPU-5291fbdf) thermal slowdown 91 C [root@2026-12-01T08:35:00] "
            "Comment=(null)\n"
            "NodeName=node1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 State=IDLE ThreadsPerCore=1 Partitions=debug\n")
LOADING = ("src", "srcset", "href", "xlink:href", "action", "poster", "data", "background")


class Loads(HTMLParser):
    """Every element of a page, and whatever in it would load something (an attribute naming a
    URL that is not a fragment or data:, a CSS url() or @import)."""

    def __init__(self, page: str):
        super().__init__()
        self.tags: List[str] = []
        self.loads: List[str] = []
        self._css = 0
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: List[Tuple[str, Optional[str]]]) -> None:
        self.tags.append(tag)
        self._css += tag == "style"
        for k, v in attrs:
            if k in LOADING and v and not v.startswith(("#", "data:")):
                self.loads.append(f"<{tag} {k}={v}>")
            if k == "style" and v and re.search(r"url\(|@import", v):
                self.loads.append(f"<{tag} style={v}>")

    def handle_endtag(self, tag: str) -> None:
        self._css -= tag == "style" and self._css > 0

    def handle_data(self, data: str) -> None:
        if self._css and re.search(r"url\(\s*['\"]?(?!#|data:)|@import", data):
            self.loads.append(f"<style>{data[:80]}")


def _hang_result() -> TriageResult:
    """A hang on node2 as the metrics rule words it, a consequence on node1 carrying a hostile log line."""
    hang = TriageFinding(
        id="metric.hang", category="collective_hang", verdict=Verdict.FAIL, confidence=0.7, node="node2",
        summary="collective hang: GPUs busy at near-idle power with clocks up",
        action="the ranks wait in a collective for a peer: find the first failure or the straggler",
        evidence={"windows": [{"start": T0 + 1800, "end": T0 + 3600, "nodes": ["node2"], "watcher": True}],
                  "nodes": ["node2"], "watcher_flag_nodes": ["node2"]})
    hang.first_time = T0 + 1800
    wd = TriageFinding(
        id="nccl.watchdog", category="network", verdict=Verdict.WARN, confidence=0.5, node="node1", rank=3,
        summary=f"watchdog timeout {HOSTILE}", action="follows from the hang", caused_by="metric.hang",
        evidence={"timeout_seconds": 600.0, "lines": [f"job.out:12: [rank3] NCCL WARN {HOSTILE}"]})
    r = TriageResult("4242", [hang, wd], {
        "logs": {"/work/job.out": {"read": True, "lines": 100, "events": 3}},
        "prometheus": {"read": True, "url": "http://127.0.0.1:9090", "queries": 12, "seconds": 0.4,
                       "query_seconds_sum": 1.0, "step_seconds": 15.0, "gpus": 16}})
    r.job_facts = {"state": "FAILED", "exit_code": 1, "nodelist": "node[1-2]", "nodes": ["node1", "node2"],
                   "start": T0, "end": T0 + 4000, "user": HOSTILE}
    return r


def _series(node: str, hung: bool) -> Dict[str, List[Series]]:
    out: Dict[str, List[Series]] = {}
    for metric in tlmod.METRICS:
        out[metric] = []
        for g in range(8):
            pts = []
            for i in range(0, 4000, 15):
                h = hung and 1800 <= i <= 3600
                v = {"power_watts": 90.0 if h else 650 + 10 * math.sin(i / 300 + g), "util_percent": 100.0,
                     "temp_celsius": 70.0 + g, "sm_clock_mhz": 1980.0 if h else 1755.0}[metric]
                pts.append((T0 + i, v))
            name = f"{g} $x^2$ {HOSTILE}" if g == 7 and not hung else str(g)  # labels are hostile too
            out[metric].append(Series(name, f"GPU-{g}", "watcher", pts))
    return out


def _timeline() -> Timeline:
    drains = tlmod.parse_drains(SCONTROL)
    n2 = NodeTimeline("node2", "root cause", _series("node2", True), [(T0 + 1800, T0 + 3600)], 87.0,
                      "triage.slowdown_temp_celsius", drains["node2"])
    n1 = NodeTimeline("node1", "network", _series("node1", False), [], 89.0, "the GPUs' own, from the node inventory",
                      None, ["5"])
    return Timeline(T0, T0 + 4000, 15.0, [n2, n1], 2, T0 + 1800, "node2",
                    {"read": True, "queries": 10, "seconds": 0.3, "step_seconds": 15.0, "nodes_with_series": 2})


def test_page_escapes_hostile_text_and_loads_nothing() -> None:
    page = render_html(_hang_result(), _timeline(), now=T0 + 5000)
    assert "<script" not in page.lower() and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    parsed = Loads(page)
    assert parsed.loads == [] and "script" not in parsed.tags and "img" not in parsed.tags
    assert "prometheus: 12 queries in 0.4 s" in page and "/work/job.out: 100 lines, 3 events" in page
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert page.count("<svg") == 2 and "<metadata" not in page and "dc:date" not in page
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "duplicate ids across the inline SVGs"
    # root cause first, node2 first among the plots, UTC ISO times, units
    assert page.index("Root cause") < page.index('id="node-node2"') < page.index('id="node-node1"')
    assert "2026-12-01T07:26:40Z" in page and "2026-12-01T07:56:40Z" in page
    assert "600 s" in page and "slowdown threshold 87 °C" in page
    assert "triage: GPU 5 (GPU-5291fbdf) thermal slowdown 91 C" in page  # the drain reason, from scontrol
    assert render_html(_hang_result(), _timeline(), now=T0 + 5000) == page  # reproducible bytes


def test_page_without_prometheus_still_renders_and_says_so() -> None:
    values = defaults()
    port = _free_port()
    values["triage"]["prometheus_url"] = f"http://127.0.0.1:{port}"
    values["hooks"]["scontrol"] = "/nonexistent/scontrol"
    tl = tlmod.build(Config(values), _hang_result())
    assert not tl.record["read"] and str(port) in tl.record["error"]
    assert [n.node for n in tl.nodes] == ["node2", "node1"] and not tl.nodes[0].series
    assert tl.nodes[0].hang == [(T0 + 1800, T0 + 3600)]  # from the finding's windows
    page = render_html(_hang_result(), tl)
    assert "No metrics for the plots" in page and "<svg" not in page
    assert "drains: not read" in page


def test_plot_order_names_the_findings_nodes_first_and_is_bounded() -> None:
    r = _hang_result()
    nodes = [f"n{i:03d}" for i in range(40)] + ["node1", "node2"]
    order = tlmod.plot_order(r.findings, nodes)
    assert [n for n, _ in order[:2]] == ["node2", "node1"] and order[0][1] == "root cause"
    assert len(order) == tlmod.MAX_NODES and order[2] == ("n000", "")
    assert tlmod.first_failure(r.findings) == (T0 + 1800, "node2")


def test_scontrol_drains_and_series_shapes() -> None:
    d = tlmod.parse_drains(SCONTROL)
    assert list(d) == ["node2"] and d["node2"]["ours"] and d["node2"]["by"] == "root"
    assert d["node2"]["reason"] == "triage: GPU 5 (GPU-5291fbdf) thermal slowdown 91 C"
    assert d["node2"]["time"] == pytest.approx(__import__("time").mktime((2026, 12, 1, 8, 35, 0, 0, 0, -1)))
    answer = [{"metric": {"instance": "node2", "gpu_uuid": "GPU-a"}, "values": [[T0, "0.97"], [T0 + 5, "NaN"]]},
              {"metric": {"instance": "node2", "gpu_uuid": "GPU-b"}, "values": [[T0, "1"]]}]
    got = tlmod.shape_series(answer, "watcher", "instance", "", 100.0, {("node2", "GPU-b"): "5"})
    assert [(s.gpu, s.points) for s in got["node2"]] == [("5", [(T0, 100.0)]), ("GPU-a", [(T0, 97.0)])]
    # long jobs: one aggregated point per step, never more than MAX_POINTS
    eleven_days = 11 * 86400
    step = tlmod.range_step(eleven_days, tlmod.MAX_POINTS)
    assert eleven_days / step <= tlmod.MAX_POINTS
    assert tlmod.series_expr("X", 'a="b"', "max", step) == f'max_over_time(X{{a="b"}}[{step:.0f}s])'
    assert tlmod.series_expr("X", 'a="b"', "avg", 15.0) == 'X{a="b"}'


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- real Prometheus

def _bench():
    spec = importlib.util.spec_from_file_location("bench_triage_prom", ROOT / "bench" / "bench_triage_prom.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_dcgm_series_from_a_real_prometheus_are_bounded_and_in_units(tmp_path: Path) -> None:
    for tool in ("prometheus", "promtool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (Debian package prometheus)")
    bench = _bench()
    s = bench.Scenario.make(nodes=2, seconds=6 * 3600, step=60)
    bench.build(s, tmp_path, "777", per_metric=False)
    server = bench.PrometheusServer(tmp_path / "data")
    server.start()
    try:
        server.wait_for("count(DCGM_FI_DEV_GPU_UTIL)", s.end)
        nodes = [s.node(0), s.node(1)]
        per_node, hang, _limits, rec = tlmod.fetch_series({**DEFAULTS, "prometheus_url": server.url}, "777",
                                                          nodes, s.start, s.end)
    finally:
        server.stop()
    assert rec["read"] and not rec.get("errors"), rec
    assert sorted(per_node) == nodes and hang == {}
    power = per_node[s.straggler_node]["power_watts"]
    assert len(power) == 8 and all(0 < len(x.points) <= tlmod.MAX_POINTS for x in power)
    assert all(x.source == "dcgm" for x in power)
    hot = next(x for x in per_node[s.straggler_node]["temp_celsius"] if x.gpu == "3")
    assert max(v for _, v in hot.points) >= 86
    # the injected hang: every GPU at idle power (< 100 W) inside the window, working power outside
    inside = [v for x in power for t, v in x.points if s.hang[0] + 60 <= t < s.hang[1] - 60]
    assert inside and max(inside) < 100
    assert max(v for x in power for t, v in x.points if t < s.hang[0]) > 400


# --------------------------------------------------------------------------- real browser

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
                  "--disable-extensions", "--enable-logging=stderr", "--v=0"]


def chromium(page: Path, screenshot: Path) -> Tuple[str, List[str]]:
    """Load ``page`` twice in a fresh profile: its DOM, and the console messages (plus a screenshot)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium not installed (Debian package chromium; .ci/run installs it)")
    consoles: List[str] = []
    dom = ""
    for extra in (["--dump-dom"], [f"--screenshot={screenshot}", "--window-size=1300,2400"]):
        with tempfile.TemporaryDirectory(prefix="triage-chromium-") as profile:
            r = subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *extra, page.as_uri()],
                               capture_output=True, text=True, timeout=120, cwd=profile)
        assert r.returncode == 0, r.stderr[-2000:]
        consoles += [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln]
        dom = dom or r.stdout
    return dom, consoles


def test_chromium_sees_a_console_message_when_a_page_tries_a_load(tmp_path: Path) -> None:
    # the control: the detector below must be able to fail
    bad = tmp_path / "bad.html"
    bad.write_text(render_html(_hang_result(), None).replace("</main>", '<img src="http://127.0.0.1:1/x.png"></main>'))
    _dom, consoles = chromium(bad, tmp_path / "bad.png")
    assert any("Content Security Policy" in c for c in consoles), consoles


def test_chromium_renders_the_page_with_its_svgs_and_no_console_message(tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    page.write_text(render_html(_hang_result(), _timeline()))
    shot = tmp_path / "report.png"
    dom, consoles = chromium(page, shot)
    assert consoles == []
    assert dom.count("<svg") == 2 and 'id="node-node2"' in dom and "<script" not in dom
    assert shot.stat().st_size > 20000
    print(f"screenshot: {shot}")


# --------------------------------------------------------------------------- the lab

def test_lab_hang_job_html_names_node2_first_with_its_plot(lab) -> None:
    from test_triage_lab import CLI, FAST, triage_step

    with lab.config(FAST):
        job = triage_step(lab, "node2", "h100x8-nccl-hang.json")
    out_dir = Path(os.environ.get("LAB_DIR") or tempfile.mkdtemp(prefix="triage-html-")) / "reports"
    out_dir.mkdir(parents=True, exist_ok=True)
    page = out_dir / f"triage-{job}.html"
    r = subprocess.run([CLI, "triage", job, "--format", "html", "--output", str(page)], capture_output=True,
                       text=True, timeout=180, env={"PATH": "/usr/bin:/bin", "SLURM_CONF": lab.slurm_conf,
                                                    "SLURM_TRIAGE_CONFIG": str(lab.triage_config)})
    assert r.returncode == 1 and r.stdout == "", r.stderr
    text = page.read_text()
    root = text[text.index("Root cause"):text.index("Timeline per node")]
    assert "collective_hang" in root and "node <b>node2</b>" in root, root[:2000]
    first_fig = text.index("<figure", text.index("Timeline per node"))
    assert text[first_fig:].startswith('<figure id="node-node2"'), text[first_fig:first_fig + 200]
    node2 = text[first_fig:text.index("</figure>", first_fig)]
    assert "<svg" in node2 and "power (W)" in node2 and "utilisation (%)" in node2 and "hang suspected" in node2
    dom, consoles = chromium(page, out_dir / f"triage-{job}.png")
    assert consoles == [] and dom.count("<svg") >= 2
    print(f"lab report: {page}\nscreenshot: {out_dir / f'triage-{job}.png'}")


def test_cli_html_of_logs_alone_and_output_is_atomic(tmp_path: Path) -> None:
    log = tmp_path / "job.out"
    log.write_text("slurmstepd: error: Detected 1 oom_kill event in StepId=77.0. "
                   f"Some of the step tasks have been OOM Killed. {HOSTILE}\n")
    out = tmp_path / "r.html"
    r = cli("triage", "--log", str(log), "--format", "html", "--output", str(out))
    assert r.returncode == 1 and r.stdout == "", r.stderr
    text = out.read_text()
    assert "No job: a report of logs alone has no timeline" in text and "<script" not in text
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".triage-")] == []
    r = cli("triage", "--log", str(log), "--format", "json", "--output", str(tmp_path / "no" / "dir.json"))
    assert r.returncode == 2 and "cannot write" in r.stderr
