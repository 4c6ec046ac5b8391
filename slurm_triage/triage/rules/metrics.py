"""Rules over the job's metrics (Prometheus answers, already aggregated per GPU and node).

A gang job runs at the pace of its slowest GPU, so most metric evidence is peer-relative:
a GPU whose clock sags below the job's median, a node whose step time doubles the median,
a node whose run queue stands out. Thermal slowdown is the usual reason for a sagging clock
and is judged against the GPU's own slowdown threshold (from the Prolog's snapshot when we
have it), so the straggler it causes points to it through ``caused_by``.
"""
from __future__ import annotations

import statistics
from typing import Any, Dict, List, Optional, Tuple

from ...model import Verdict
from ..model import JobEvidence, TriageFinding
from .gpu import xid_class


def _median(values: List[float]) -> Optional[float]:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def _gpus(ev: JobEvidence) -> List[Dict[str, Any]]:
    return list((ev.metrics or {}).get("gpus") or [])


def _finding(first_time: Optional[float] = None, **kw: Any) -> TriageFinding:
    f = TriageFinding(**kw)
    f.first_time = first_time
    return f


def _slowdown(ev: JobEvidence, g: Dict[str, Any]) -> Tuple[float, str]:
    """The GPU's own slowdown threshold when the Prolog recorded it, else the configured one."""
    known = (ev.nodes.get(g["node"]) or {}).get("gpus") or {}
    t = (known.get(g.get("uuid") or "") or {}).get("slowdown_temp_celsius")
    if isinstance(t, (int, float)):
        return float(t), "prolog snapshot"
    return float(ev.setting("slowdown_temp_celsius")), "triage.slowdown_temp_celsius"


def _gpu_key(g: Dict[str, Any]) -> str:
    return f"{g['node']}.{g['gpu']}"


def thermal_throttling(ev: JobEvidence) -> List[TriageFinding]:
    """GPUs with thermal/HW slowdown reasons active for a share of the job, hot near their own threshold."""
    out: List[TriageFinding] = []
    margin = float(ev.setting("thermal_margin_celsius"))
    for g in _gpus(ev):
        frac = g.get("thermal_fraction") or 0.0
        if frac < float(ev.setting("thermal_fraction")):
            continue
        limit, origin = _slowdown(ev, g)
        temp = g.get("temp_max")
        hot = temp is not None and temp >= limit - margin
        out.append(_finding(
            g.get("thermal_since"), id=f"metric.thermal.{_gpu_key(g)}", category="thermal_power",
            verdict=Verdict.FAIL if hot else Verdict.WARN, confidence=0.85 if hot else 0.5,
            node=g["node"], gpu=g["gpu"],
            summary=(f"GPU {g['gpu']} on {g['node']} throttled by heat {frac:.0%} of the job "
                     f"(max {temp:.0f} C, slowdown at {limit:.0f} C)" if hot else
                     f"GPU {g['gpu']} on {g['node']} slowed by the hardware {frac:.0%} of the job "
                     f"(max {temp if temp is not None else float('nan'):.0f} C: not thermal, check power brake)"),
            action=("check that node's cooling (fans, inlet temperature, airflow, blanking panels) and "
                    "drain it until fixed; the whole job ran at this GPU's pace" if hot else
                    "check the node's power supply/power-brake events and the GPU's clock event reasons"),
            evidence={"uuid": g.get("uuid"), "thermal_fraction": round(frac, 3), "temp_max_celsius": temp,
                      "slowdown_celsius": limit, "slowdown_from": origin, "sm_clock_mhz": g.get("clock"),
                      "since": g.get("thermal_since")},
            tier=0))
    return out


def stragglers(ev: JobEvidence) -> List[TriageFinding]:
    """Nodes whose step time exceeds factor x the job's median, or whose GPUs' clock sags below the peers'."""
    out: List[TriageFinding] = []
    factor = float(ev.setting("straggler_factor"))
    steps = (ev.metrics or {}).get("step_time") or {}
    med = _median(list(steps.values()))
    # Each node against the median of its peers: in a 2-node job the job median is the mean of
    # the two, which no node can exceed twice.
    peers = {n: _median([w for m, w in steps.items() if m != n]) for n in steps}
    slow_nodes = {n: v for n, v in steps.items() if peers[n] and v > factor * peers[n]}
    gpus = _gpus(ev)
    cmed = _median([g.get("clock") for g in gpus])
    ratio = float(ev.setting("straggler_clock_ratio"))
    slow_gpus: Dict[str, List[Dict[str, Any]]] = {}
    for g in gpus:
        if cmed and len(gpus) > 1 and g.get("clock") is not None and g["clock"] < ratio * cmed:
            slow_gpus.setdefault(g["node"], []).append(g)
    flagged = {(w.get("node"), w.get("gpu_uuid")) for w in (ev.metrics or {}).get("watch_straggler") or []}
    for node, facts in ev.nodes.items():
        flagged |= {(node, u) for u in facts.get("watch", {}).get("straggler_gpus") or []}
    for node in sorted(set(slow_nodes) | set(slow_gpus) | {n for n, _ in flagged if n}):
        gs = slow_gpus.get(node, [])
        parts = []
        if node in slow_nodes:
            parts.append(f"step time {slow_nodes[node]:.3g} s, {slow_nodes[node] / peers[node]:.1f}x its peers' "
                         f"median {peers[node]:.3g} s")
        if gs:
            parts.append("SM clock " + ", ".join(f"GPU {g['gpu']} {g['clock']:.0f} MHz" for g in gs[:4])
                         + f" vs job median {cmed:.0f} MHz")
        watch = sorted(u for n, u in flagged if n == node and u)
        if watch:
            parts.append(f"the watcher flagged {len(watch)} GPU(s) as hardware-slowed")
        out.append(_finding(
            None, id=f"metric.straggler.{node}", category="thermal_power" if gs or watch else "host_resources",
            verdict=Verdict.FAIL, confidence=0.8 if (node in slow_nodes and gs) else 0.65, node=node,
            gpu=gs[0]["gpu"] if len(gs) == 1 else None,
            summary=f"straggler node {node}: " + "; ".join(parts) + " — the gang waits for it every step",
            action=f"take {node} out of the job (exclude it: sbatch --exclude={node}) and find why it is slow",
            # a straggler is what a slow GPU or a starved CPU looks like: it follows from that cause
            # (thermal, thread leak, contention) whenever one was found, and is the answer only alone
            consequence=True,
            evidence={"step_time_seconds": slow_nodes.get(node), "job_median_step_seconds": med,
                      "peers_median_step_seconds": peers.get(node),
                      "slow_gpus": [{"gpu": g["gpu"], "uuid": g.get("uuid"), "sm_clock_mhz": g["clock"]} for g in gs],
                      "job_median_sm_clock_mhz": cmed, "watcher_flagged": watch}))
    return out


def power_axiom_hang(ev: JobEvidence) -> List[TriageFinding]:
    """Windows where GPUs were busy at near-idle power with clocks up: ranks spinning in a collective."""
    m = ev.metrics or {}
    step = float((m.get("window") or {}).get("step") or 60.0)
    # The watcher's flag already held for its own window: it is not held to hang_min_seconds.
    spans: List[Tuple[float, float, str, bool]] = [
        (a, b + step, n, False) for n, rs in (m.get("hang") or {}).items() for a, b in rs]
    spans += [(a, b + step, n, True) for n, rs in (m.get("watch_hang") or {}).items() for a, b in rs]
    live = sorted(n for n, f in ev.nodes.items() if f.get("watch", {}).get("hang_suspected"))
    windows: List[List[Any]] = []
    for a, b, n, watched in sorted(spans):
        if windows and a <= windows[-1][1] + step:
            windows[-1][1] = max(windows[-1][1], b)
            windows[-1][2].add(n)
            windows[-1][3] = windows[-1][3] or watched
        else:
            windows.append([a, b, {n}, watched])
    windows = [w for w in windows if w[3] or w[1] - w[0] >= float(ev.setting("hang_min_seconds"))]
    if not windows and not live:
        return []
    nodes = sorted(set().union(*(w[2] for w in windows)) | set(live)) if windows else live
    first = windows[0] if windows else None
    desc = ", ".join(f"{_t(a)} – {_t(b)} ({_span(b - a)}, {len(ns)} node(s))" for a, b, ns, _ in windows[:5])
    return [_finding(
        first[0] if first else None, id="metric.hang", category="collective_hang", verdict=Verdict.FAIL,
        confidence=0.7, node=nodes[0] if len(nodes) == 1 else None,
        summary=("collective hang: GPUs busy at near-idle power with clocks up " + (f"during {desc}" if desc else
                 f"(watcher flag on {', '.join(live)})")),
        action="the ranks wait in a collective for a peer: find the first failure or the straggler "
               "(earlier finding); py-spy dump every rank if it recurs",
        evidence={"windows": [{"start": a, "end": b, "nodes": sorted(ns), "watcher": w}
                              for a, b, ns, w in windows[:10]],
                  "evidence_bundles": sorted(p for f in ev.nodes.values() for p in f.get("watch", {}).get("bundles", [])),
                  "nodes": nodes, "watcher_flag_nodes": live},
        consequence=True)]


def _span(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def _t(ts: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))


_EVENT = {
    "ecc_dbe": ("uncorrectable (double-bit) ECC errors", "drain the node; check row-remap/retired pages; reset or RMA the GPU"),
    "row_remap_failure": ("row-remap failure", "drain the node and replace the GPU (no spare rows left)"),
}


def gpu_events(ev: JobEvidence) -> List[TriageFinding]:
    """Xid, uncorrectable ECC and row-remap failures reported by dcgm-exporter during the job."""
    out: List[TriageFinding] = []
    for e in (ev.metrics or {}).get("gpu_events") or []:
        if e["kind"] == "xid":
            xid = int(e["value"])
            meaning, fatal, app, _ = xid_class(xid)
            verdict, conf, what = (Verdict.FAIL, 0.9, f"Xid {xid} ({meaning})") if fatal else \
                (Verdict.WARN, 0.4 if app else 0.6, f"Xid {xid} ({meaning})")
            action = ("drain the node and reset/replace the GPU" if fatal else
                      "usually the application: check the CUDA error of the rank on this GPU")
        else:
            verdict, conf = Verdict.FAIL, 0.9
            what, action = _EVENT[e["kind"]]
        out.append(_finding(
            e["time"], id=f"metric.{e['kind']}.{e['node']}.{e['gpu']}", category="gpu_hardware", verdict=verdict,
            confidence=conf, node=e["node"], gpu=e["gpu"],
            summary=f"{what} on GPU {e['gpu']} of {e['node']} at {_t(e['time'])}", action=action,
            evidence={"metric": e["kind"], "value": e["value"], "time": e["time"]},
            tier=0 if verdict == Verdict.FAIL else 1, consequence=e["kind"] == "xid" and int(e["value"]) == 45))
    return out


def ib_errors(ev: JobEvidence) -> List[TriageFinding]:
    """InfiniBand/RoCE error counters that rose during the job, per node and port."""
    ports: Dict[Tuple[str, str, str], Dict[str, float]] = {}
    for r in (ev.metrics or {}).get("ib") or []:
        name = str(r.get("counter") or "").replace("node_infiniband_", "").replace("_total", "")
        ports.setdefault((r["node"], str(r.get("device")), str(r.get("port"))), {})[name] = r.get("delta") or 0.0
    out: List[TriageFinding] = []
    for (node, dev, port), counters in sorted(ports.items()):
        down = counters.get("link_downed", 0) > 0
        text = ", ".join(f"{k} +{v:.0f}" for k, v in sorted(counters.items()))
        out.append(_finding(
            None, id=f"metric.ib.{node}.{dev}.{port}", category="network",
            verdict=Verdict.FAIL if down else Verdict.WARN, confidence=0.75 if down else 0.55, node=node,
            summary=f"InfiniBand errors on {node} {dev} port {port} during the job: {text}",
            action="check the cable/transceiver and the switch port (ibdiagnet, `perfquery -x`); "
                   "a flapping link stalls every collective of the job",
            evidence={"device": dev, "port": port, "deltas": counters}))
    return out


def host_contention(ev: JobEvidence) -> List[TriageFinding]:
    """Thread leaks (threads grew all job, or the watcher's flag) and run-queue outliers among the nodes."""
    m = ev.metrics or {}
    out: List[TriageFinding] = []
    grow = int(ev.setting("thread_growth"))
    leak_flags = set(m.get("thread_leak") or []) | {n for n, f in ev.nodes.items() if f.get("watch", {}).get("thread_leak")}
    threads = m.get("threads") or {}
    leaking = {n: t for n, t in threads.items() if t.get("min") is not None and t["max"] - t["min"] >= grow}
    for node in sorted(set(leaking) | leak_flags):
        t = threads.get(node) or {}
        out.append(_finding(
            None, id=f"metric.thread_leak.{node}", category="host_resources", verdict=Verdict.WARN, confidence=0.6,
            node=node, summary=f"thread leak on {node}: the step's threads grew"
                               + (f" from {t['min']:.0f} to {t['max']:.0f}" if t.get("min") is not None else ""),
            action="look for threads created per step (dataloader workers not joined, per-batch pools); "
                   "py-spy dump shows them",
            evidence={"threads_min": t.get("min"), "threads_max": t.get("max"), "watcher_flag": node in leak_flags}))
    for key, what in (("procs_running", "runnable tasks"), ("watch_procs_running", "runnable tasks (watcher)")):
        rq = m.get(key) or {}
        med = _median(list(rq.values()))
        for node, v in sorted(rq.items()):
            if med and len(rq) > 2 and v > float(ev.setting("run_queue_ratio")) * med and v - med >= 4:
                out.append(_finding(
                    None, id=f"metric.run_queue.{node}", category="host_resources", verdict=Verdict.WARN,
                    confidence=0.5, node=node,
                    summary=f"run-queue contention on {node}: {v:.1f} {what} on average vs {med:.1f} on its peers",
                    action="find what else runs there (another job, a leftover, a busy daemon); "
                           "check the job's CPU binding (--cpus-per-task, --cpu-bind)",
                    evidence={"mean": v, "peer_median": med, "metric": key}))
        if any(f.id.startswith("metric.run_queue.") for f in out):
            break
    return out


def _figures(ev: JobEvidence) -> Dict[str, Optional[float]]:
    m = ev.metrics or {}
    gpus = _gpus(ev)
    threads = [t.get("max") for t in (m.get("threads") or {}).values()]
    # Without dcgm-exporter, the watcher's per-node averages of a --triage step stand in.
    watch_util = [v * 100 for v in (m.get("watch_util") or {}).values()]
    return {"median GPU utilization %": _median([g.get("util") for g in gpus]) or _median(watch_util),
            "median GPU power W": _median([g.get("power") for g in gpus]) or _median(list((m.get("watch_power") or {}).values())),
            "median SM clock MHz": _median([g.get("clock") for g in gpus]),
            "median step time s": _median(list((m.get("step_time") or {}).values())),
            "max threads per node": max([t for t in threads if t is not None], default=None),
            "median runnable tasks per node": _median(list((m.get("procs_running") or {}).values())
                                                      or list((m.get("watch_procs_running") or {}).values())),
            "median load1 per node": _median(list((m.get("load1") or {}).values()))}


def baseline_diff(ev: JobEvidence) -> List[TriageFinding]:
    """With --baseline: the job-level figures that differ from the other run by the baseline ratio or more."""
    if ev.baseline is None:
        return []
    ratio = float(ev.setting("baseline_ratio"))
    mine, theirs = _figures(ev), _figures(ev.baseline)
    diffs = {}
    for k, a in mine.items():
        b = theirs.get(k)
        if a is not None and b is not None and a > 0 and b > 0 and max(a / b, b / a) >= ratio:
            diffs[k] = {"this": round(a, 2), "baseline": round(b, 2), "ratio": round(a / b, 2)}
    if not diffs:
        return []
    host = any(k.startswith(("max threads", "median runnable", "median load")) for k in diffs)
    other = (ev.baseline.job or {}).get("job_id", "baseline")
    threads = diffs.get("max threads per node")
    if threads and threads["ratio"] > 1:
        return [_thread_leak(ev, other, mine, theirs, diffs, ratio)]
    return [_finding(
        None, id="metric.baseline", category="host_resources" if host else "config", verdict=Verdict.WARN,
        confidence=0.5, summary=f"differs from job {other}: " + "; ".join(
            f"{k} {d['this']} vs {d['baseline']}" for k, d in diffs.items()),
        action="the runs differ in these figures: compare their configs/env (checkpoint restore, dataloader "
               "workers, NCCL settings) starting with the largest ratio",
        evidence={"baseline_job": other, "differences": diffs})]


_HARDWARE_FIGURES = ("median GPU utilization %", "median GPU power W", "median SM clock MHz")


def _new_threads(ev: JobEvidence) -> List[Dict[str, Any]]:
    """Named threads this run holds beyond the baseline's (per node, process and name), most first."""
    def by_name(e: Optional[JobEvidence]) -> Dict[str, int]:
        out: Dict[str, int] = {}
        for ts in ((e.metrics or {}).get("thread_names") or {}).values() if e else ():
            for t in ts:
                out[t["thread"]] = out.get(t["thread"], 0) + int(t["count"])
        return out
    before = by_name(ev.baseline)
    grown = {n for n, c in by_name(ev).items() if c > before.get(n, 0)}
    rows = [{"node": node, **t} for node, ts in sorted(((ev.metrics or {}).get("thread_names") or {}).items())
            for t in ts if t["thread"] in grown]
    return sorted(rows, key=lambda t: -t["count"])


def _thread_leak(ev: JobEvidence, other: str, mine: Dict[str, Optional[float]], theirs: Dict[str, Optional[float]],
                 diffs: Dict[str, Dict[str, float]], ratio: float) -> TriageFinding:
    """More threads than the same work's baseline, the hardware alike: threads that never exit compete
    with the training loop (the checkpoint-restore story: communicators rebuilt, the old ones left)."""
    t = diffs["max threads per node"]
    named = _new_threads(ev)
    parts = [f"{t['this']:.0f} vs {t['baseline']:.0f} threads per node"
             + (" (" + ", ".join(f"{r['thread']} x{r['count']} in pid {r['pid']} ({r['comm']}) on {r['node']}"
                                 for r in named[:3]) + ")" if named else "")]
    for k, label in (("median runnable tasks per node", "runnable tasks"), ("median load1 per node", "load")):
        if k in diffs:
            parts.append(f"{label} {diffs[k]['this']:g} vs {diffs[k]['baseline']:g}")
    if "median step time s" in diffs:
        parts.append(f"step time x{diffs['median step time s']['ratio']:g}")
    same = {k: round(mine[k] / theirs[k], 2) for k in _HARDWARE_FIGURES
            if mine.get(k) and theirs.get(k) and k not in diffs}
    if same:
        parts.append("the GPU figures did not differ (" + ", ".join(f"{k.replace('median ', '')} x{v:g}"
                                                                    for k, v in same.items()) + ")")
    pid = f" --pid {named[0]['pid']}" if named else ""
    return _finding(
        None, id="metric.baseline.threads", category="host_resources", verdict=Verdict.WARN,
        confidence=0.75 if named else 0.6, node=named[0]["node"] if named else None,
        summary=f"thread leak against job {other}: " + "; ".join(parts),
        action="threads started at restore never exit and steal the training loop's CPU: destroy the old process "
               "group/communicators before re-creating them on restore (or restart the processes); "
               f"py-spy dump{pid} shows what they run",
        evidence={"baseline_job": other, "differences": diffs, "new_threads": named[:8],
                  "hardware_unchanged": same, "ratio_threshold": ratio})
