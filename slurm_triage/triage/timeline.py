"""Per-node time series of a job for the HTML report: what its GPUs did, minute by minute.

The judging path (``sources.prometheus``) asks only for one number per GPU; a person wants to
*see* a node's power fall to idle while its utilisation stays at 100 %. So this module asks
for the series themselves, bounded: at most ``MAX_NODES`` nodes (the nodes the findings name
first, in rank order, then the job's other nodes), at most ``MAX_POINTS`` points per series.
Each metric is read from dcgm-exporter (the configured names, labels ``Hostname``/``gpu``)
and from the watcher's ``slurm_triage_watch_gpu_*`` series (labels ``instance``/``gpu_uuid``/
``slurm_job_id``); dcgm wins for a node that has both, as it covers the whole job.

Marks come from three places: hang windows from the watcher's ``slurm_triage_hang_suspected``
and from the findings' ``windows`` evidence, the first failure from the root cause, drains
from Slurm (``scontrol show node``: the reason and its ``[user@time]``). Nothing here raises
on a missing source: the record says what could not be read and the report says so.
"""
from __future__ import annotations

import math
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .sources.prometheus import Prometheus, PromError, _alt, range_step, runs

MAX_POINTS = 500
MAX_NODES = 16
# Above this step a raw sample per step would skip what happened between steps: aggregate instead.
AGGREGATE_STEP_SECONDS = 60.0
DRAIN_AFTER_END_SECONDS = 1800.0
"""A drain this long after the job's end is still drawn (the Epilog drains after the last step)."""

# metric -> (settings key of the dcgm name, watcher series, scale of the watcher's base unit to the
# plotted one, over_time fn); dcgm-exporter already exports W, %, °C and MHz.
METRICS: Dict[str, Tuple[str, str, float, str]] = {
    "power_watts": ("metric_gpu_power", "slurm_triage_watch_gpu_power_watts", 1.0, "avg"),
    "util_percent": ("metric_gpu_util", "slurm_triage_watch_gpu_utilization_ratio", 100.0, "avg"),
    "temp_celsius": ("metric_gpu_temp", "slurm_triage_watch_gpu_temperature_celsius", 1.0, "max"),
    "sm_clock_mhz": ("metric_sm_clock", "slurm_triage_watch_gpu_sm_clock_hertz", 1e-6, "avg"),
}
SLOWDOWN_METRIC = "slurm_triage_gpu_slowdown_temperature_celsius"
HANG_METRIC = "slurm_triage_hang_suspected"


@dataclass
class Series:
    gpu: str
    """What people call the GPU: its index when known, else its UUID."""
    uuid: Optional[str]
    source: str
    points: List[Tuple[float, float]]


@dataclass
class NodeTimeline:
    node: str
    why: str
    """Why this node is plotted (the findings that name it), or '' for the job's other nodes."""
    series: Dict[str, List[Series]] = field(default_factory=dict)
    hang: List[Tuple[float, float]] = field(default_factory=list)
    slowdown_celsius: Optional[float] = None
    slowdown_from: str = ""
    drain: Optional[Dict[str, Any]] = None
    highlight: List[str] = field(default_factory=list)
    """GPUs (index or UUID, as the findings name them) to draw in front."""


@dataclass
class Timeline:
    start: float
    end: float
    step: float
    nodes: List[NodeTimeline]
    job_nodes: int
    first_failure: Optional[float] = None
    first_failure_node: Optional[str] = None
    record: Dict[str, Any] = field(default_factory=dict)


def plot_order(findings: Sequence[Any], job_nodes: Sequence[str], limit: int = MAX_NODES) -> List[Tuple[str, str]]:
    """(node, why) to plot: the nodes the findings name, in rank order, then the job's others."""
    why: Dict[str, List[str]] = {}
    for i, f in enumerate(findings):
        named = [f.node] if f.node else []
        named += [n for w in (f.evidence.get("windows") or []) if isinstance(w, dict) for n in w.get("nodes") or []]
        for n in named:
            why.setdefault(n, [])
            label = "root cause" if i == 0 else f.category
            if label not in why[n]:
                why[n].append(label)
    order = list(why) + [n for n in job_nodes if n not in why]
    return [(n, ", ".join(why.get(n, []))) for n in order[:limit]]


def first_failure(findings: Sequence[Any]) -> Tuple[Optional[float], Optional[str]]:
    """When and where the root cause began: its first time, else its first window's start."""
    if not findings:
        return None, None
    f = findings[0]
    t = f.first_time
    if t is None:
        starts = [w.get("start") for w in f.evidence.get("windows") or [] if isinstance(w, dict)]
        t = min((s for s in starts if isinstance(s, (int, float))), default=None)
    return (float(t) if t is not None else None), f.node


def finding_marks(findings: Sequence[Any]) -> Tuple[Dict[str, List[Tuple[float, float]]], Dict[str, List[str]],
                                                    Dict[Tuple[str, str], float]]:
    """Pure: per node, the hang windows and the GPUs the findings name; per (node, gpu), a
    slowdown threshold a thermal finding recorded."""
    hang: Dict[str, List[Tuple[float, float]]] = {}
    gpus: Dict[str, List[str]] = {}
    limits: Dict[Tuple[str, str], float] = {}
    for f in findings:
        for w in f.evidence.get("windows") or []:
            if isinstance(w, dict) and isinstance(w.get("start"), (int, float)) and isinstance(w.get("end"), (int, float)):
                for n in w.get("nodes") or ([f.node] if f.node else []):
                    hang.setdefault(n, []).append((float(w["start"]), float(w["end"])))
        if f.node and f.gpu:
            gpus.setdefault(f.node, [])
            if f.gpu not in gpus[f.node]:
                gpus[f.node].append(f.gpu)
            lim = f.evidence.get("slowdown_celsius")
            if isinstance(lim, (int, float)):
                limits[(f.node, f.gpu)] = float(lim)
    return hang, gpus, limits


def merge_windows(windows: Sequence[Tuple[float, float]]) -> List[Tuple[float, float]]:
    out: List[Tuple[float, float]] = []
    for a, b in sorted(windows):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _node_of(labels: Dict[str, str], *keys: str) -> str:
    for k in keys:
        v = labels.get(k)
        if v:
            return v
    return ""


def shape_series(answer: List[Dict[str, Any]], source: str, node_label: str, gpu_label: str, scale: float,
                 index_of: Dict[Tuple[str, str], str]) -> Dict[str, List[Series]]:
    """Pure: a range-query answer as per-node series in plotted units; NaN/Inf samples dropped.
    A GPU known only by UUID (the watcher) is named by its index when the inventory gives one."""
    out: Dict[str, List[Series]] = {}
    for r in answer:
        lab = r.get("metric") or {}
        node = _node_of(lab, node_label)
        uuid = lab.get("UUID") or lab.get("gpu_uuid")
        gpu = lab.get(gpu_label) or index_of.get((node, uuid or ""), "") or uuid or "?"
        pts = []
        for t, v in r.get("values") or []:
            try:
                x = float(v) * scale
            except (TypeError, ValueError):
                continue
            if math.isfinite(x):
                pts.append((float(t), x))
        if pts:
            out.setdefault(node, []).append(Series(gpu, uuid, source, pts))
    for lst in out.values():
        lst.sort(key=lambda s: (len(s.gpu), s.gpu))
    return out


def parse_drains(text: str) -> Dict[str, Dict[str, Any]]:
    """Pure: drained nodes from ``scontrol show node -o`` output: {node: {state, reason, ours, time, by}}
    (each line read by slurmctl.parse_node, the parser the drain/resume paths use)."""
    from ..slurmctl import parse_node

    out: Dict[str, Dict[str, Any]] = {}
    for line in text.splitlines():
        name = re.search(r"\bNodeName=(\S+)", line)
        n = parse_node(line)
        if name and "DRAIN" in n.state:
            out[name.group(1)] = {"state": n.state, "reason": n.reason, "ours": n.ours, "time": n.reason_time,
                                  "by": n.by}
    return out


def fetch_drains(scontrol: str, nodes: Sequence[str], timeout: float = 5.0) -> Tuple[Dict[str, Dict[str, Any]], Dict[str, Any]]:
    """The nodes' current drains (one scontrol call) and the source record."""
    from ..slurmctl import run_tool

    if not nodes:
        return {}, {"read": False, "error": "no nodes"}
    out, err = run_tool([scontrol, "show", "node", "-o", ",".join(nodes)], timeout)
    if out is None:
        return {}, {"read": False, "error": f"{scontrol} show node: {err}"}
    found = parse_drains(out)
    return found, {"read": True, "drained": sorted(found)}


class _Queries:
    """The range queries of one report; each answer and its time, errors kept per name."""

    def __init__(self, prom: Prometheus, start: float, end: float, step: float):
        self.prom, self.start, self.end, self.step = prom, start, end, step
        self.timings: Dict[str, float] = {}
        self.errors: Dict[str, str] = {}

    def range(self, name: str, expr: str) -> List[Dict[str, Any]]:
        try:
            res, sec = self.prom.query_range(expr, self.start, self.end, self.step)
        except PromError as e:
            self.errors[name] = str(e)[:300]
            return []
        self.timings[name] = round(sec, 3)
        return res

    def instant(self, name: str, expr: str) -> List[Dict[str, Any]]:
        try:
            res, sec = self.prom.query(expr, self.end)
        except PromError as e:
            self.errors[name] = str(e)[:300]
            return []
        self.timings[name] = round(sec, 3)
        return res


def series_expr(name: str, sel: str, fn: str, step: float) -> str:
    """One metric per step: the raw sample for short steps, else the step's avg/max (no spike skipped)."""
    if step < AGGREGATE_STEP_SECONDS:
        return f"{name}{{{sel}}}"
    return f"{fn}_over_time({name}{{{sel}}}[{step:.0f}s])"


def fetch_series(s: Dict[str, Any], job_id: str, nodes: Sequence[str], start: float, end: float,
                 ) -> Tuple[Dict[str, Dict[str, List[Series]]], Dict[str, List[Tuple[float, float]]],
                            Dict[Tuple[str, str], float], Dict[str, Any]]:
    """Per node: metric -> series, the watcher's hang runs, per (node, GPU) the slowdown threshold
    the hooks recorded; and the source record. Empty answers (and the record's error) when
    Prometheus is not configured or does not answer."""
    url = s.get("prometheus_url")
    if not url:
        return {}, {}, {}, {"read": False, "error": "triage.prometheus_url is not set"}
    if not nodes or end <= start:
        return {}, {}, {}, {"read": False, "error": "no node list or time window for the job"}
    prom = Prometheus(url, float(s["prometheus_timeout_seconds"]))
    t0 = time.monotonic()
    try:
        prom.ready()
    except PromError as e:
        return {}, {}, {}, {"read": False, "url": url, "error": str(e)}
    step = range_step(end - start, MAX_POINTS)
    q = _Queries(prom, start, end, step)
    alt = _alt(nodes)
    nl, gl = s["dcgm_node_label"], s["dcgm_gpu_label"]
    dcgm_sel = f'{nl}=~"{alt}"'
    watch_sel = f'slurm_job_id="{job_id}", instance=~"{alt}"'
    w = max(60, int(math.ceil(end - start)))
    # The inventory (Prolog/Epilog/check): index and slowdown threshold per GPU UUID, pushed
    # (instance=<node>) or from the textfile collector (node=<node>).
    inv = (f'max by (instance, node, gpu_uuid, index) (max_over_time({SLOWDOWN_METRIC}{{instance=~"{alt}"}}[{w}s] @ {end:.0f})'
           f' or max_over_time({SLOWDOWN_METRIC}{{node=~"{alt}"}}[{w}s] @ {end:.0f}))')
    jobs: Dict[str, Any] = {"inventory": lambda: q.instant("inventory", inv),
                            "hang": lambda: q.range("hang", f"max by (instance) ({HANG_METRIC}{{{watch_sel}}}) > 0")}
    for metric, (key, watch, _scale, fn) in METRICS.items():
        jobs[f"dcgm:{metric}"] = lambda k=key, f=fn, m=metric: q.range(f"dcgm:{m}", series_expr(s[k], dcgm_sel, f, step))
        jobs[f"watcher:{metric}"] = lambda n=watch, f=fn, m=metric: q.range(f"watcher:{m}", series_expr(n, watch_sel, f, step))
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {k: pool.submit(fn) for k, fn in jobs.items()}
        raw = {k: fut.result() for k, fut in futures.items()}
    index_of: Dict[Tuple[str, str], str] = {}
    limits: Dict[Tuple[str, str], float] = {}
    for r in raw["inventory"]:
        lab = r.get("metric") or {}
        node = lab.get("node") or lab.get("instance", "")
        try:
            v = float((r.get("value") or [0, "nan"])[1])
        except (TypeError, ValueError):
            continue
        if lab.get("gpu_uuid") and lab.get("index") is not None:
            index_of[(node, lab["gpu_uuid"])] = lab["index"]
        if math.isfinite(v):
            limits[(node, lab.get("index") or lab.get("gpu_uuid", ""))] = v
    per_node: Dict[str, Dict[str, List[Series]]] = {}
    for metric, (_key, _watch, scale, _fn) in METRICS.items():
        dcgm = shape_series(raw[f"dcgm:{metric}"], "dcgm", nl, gl, 1.0, index_of)
        watched = shape_series(raw[f"watcher:{metric}"], "watcher", "instance", "", scale, index_of)
        for node in nodes:
            got = dcgm.get(node) or watched.get(node)
            if got:
                per_node.setdefault(node, {})[metric] = got
    hang = {r["metric"].get("instance", ""): runs([float(v[0]) for v in r.get("values") or []], step)
            for r in raw["hang"]}
    record: Dict[str, Any] = {"read": bool(q.timings), "url": url, "queries": len(q.timings),
                              "seconds": round(time.monotonic() - t0, 3), "step_seconds": step,
                              "nodes_with_series": len(per_node)}
    if q.errors:
        record["errors"] = q.errors
    if not q.timings:
        record["error"] = "every query failed"
    return per_node, hang, limits, record


def window(result: Any, since: Optional[float], until: Optional[float],
           now: Optional[float] = None) -> Tuple[Optional[float], Optional[float]]:
    """The report's window: --since/--until, else the job's start and end (now while it runs)."""
    j = result.job_facts or {}
    start = since if since is not None else j.get("start")
    end = until if until is not None else j.get("end")
    if end is None and start is not None:
        end = now if now is not None else time.time()
    return start, end


def build(cfg: Any, result: Any, nodes: Sequence[str] = (), since: Optional[float] = None,
          until: Optional[float] = None) -> Timeline:
    """The timeline of ``result``'s job: its window, the nodes to plot, their series and marks."""
    from .sources import settings as read_settings

    s = read_settings(cfg)
    job_nodes = list(nodes) or list((result.job_facts or {}).get("nodes") or [])
    start, end = window(result, since, until)
    order = plot_order(result.findings, job_nodes)
    plotted = [n for n, _ in order]
    t_first, n_first = first_failure(result.findings)
    if start is None or end is None or end <= start:
        return Timeline(0.0, 0.0, 0.0, [NodeTimeline(n, why) for n, why in order], len(job_nodes), t_first, n_first,
                        {"read": False, "error": "no time window for the job (Slurm does not know it: give --since)"})
    per_node, hang, limits, record = fetch_series(s, result.job or "", plotted, float(start), float(end))
    drains, record["slurm_drains"] = fetch_drains(cfg.get("hooks", "scontrol"), plotted)
    f_hang, f_gpus, f_limits = finding_marks(result.findings)
    out = []
    for node, why in order:
        nt = NodeTimeline(node, why, per_node.get(node, {}), merge_windows(hang.get(node, []) + f_hang.get(node, [])),
                          highlight=f_gpus.get(node, []))
        named = [f_limits[(node, g)] for g in nt.highlight if (node, g) in f_limits]
        own = [limits[(node, g)] for g in nt.highlight if (node, g) in limits]
        known = [v for (n, _g), v in limits.items() if n == node]
        if named:
            nt.slowdown_celsius, nt.slowdown_from = named[0], "the thermal finding"
        elif own:
            nt.slowdown_celsius, nt.slowdown_from = own[0], "the named GPU's own, from the node inventory"
        elif known:
            nt.slowdown_celsius, nt.slowdown_from = min(known), "the GPUs' own, from the node inventory"
        else:
            nt.slowdown_celsius, nt.slowdown_from = float(s["slowdown_temp_celsius"]), "triage.slowdown_temp_celsius"
        d = drains.get(node)
        if d and (d["time"] is None or d["time"] <= float(end) + DRAIN_AFTER_END_SECONDS):
            nt.drain = d
        out.append(nt)
    return Timeline(float(start), float(end), float(record.get("step_seconds") or 0.0), out, len(job_nodes),
                    t_first, n_first, record)
