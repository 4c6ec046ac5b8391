"""The MCP tools as plain functions: validated arguments in, bounded JSON-able facts out.

Nothing here imports the MCP SDK, so the tools are tested (and usable) without it; the server
module only registers them. Every answer is bounded (lists cut with a ``*_total`` count,
long strings clipped, the whole under :data:`MAX_ANSWER_BYTES`): an agent's context is
precious and a 3 a.m. job can have gigabytes of logs.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..config import Config
from ..slurmctl import run_tool
from . import guard

MAX_ANSWER_BYTES = 32 << 10
MAX_LOG_BYTES = 2 << 30
MAX_STRING = 600
EVIDENCE_SOURCES = ("slurm", "prometheus", "pushgateway", "hooks", "watcher", "logs")
DETAILS = ("summary", "full")
# Which follow-up helps most after a root cause of each category.
_NEXT = {
    "collective_hang": ("query_metrics", "gpu_power"), "thermal_power": ("query_metrics", "gpu_temp"),
    "gpu_hardware": ("node_history", None), "network": ("get_evidence", "prometheus"),
    "host_resources": ("get_evidence", "hooks"), "memory": ("get_evidence", "logs"),
    "scheduler": ("get_evidence", "slurm"), "security": ("get_evidence", "hooks"),
    "config": ("get_evidence", "logs"), "unknown": ("get_evidence", "logs"),
}
# query_metrics names -> the [triage] key that holds the site's metric name (dcgm-exporter,
# node_exporter, a job's step time) ...
METRICS = {"gpu_util": "metric_gpu_util", "gpu_power": "metric_gpu_power", "gpu_temp": "metric_gpu_temp",
           "sm_clock": "metric_sm_clock", "step_time": "metric_step_time", "procs_running": "metric_procs_running",
           "load1": "metric_load1", "watch_threads": "metric_watch_threads",
           "hang_suspected": "metric_hang_suspected"}
# ... and the watcher's own per-GPU series of --triage steps (fixed names: slurm_triage.step.watcher).
WATCH_GPU_METRICS = {"watch_gpu_power": "slurm_triage_watch_gpu_power_watts",
                     "watch_gpu_util": "slurm_triage_watch_gpu_utilization_ratio",
                     "watch_gpu_temp": "slurm_triage_watch_gpu_temperature_celsius",
                     "watch_sm_clock": "slurm_triage_watch_gpu_sm_clock_hertz"}
_WATCHER_TWIN = {"gpu_power": "watch_gpu_power", "gpu_util": "watch_gpu_util", "gpu_temp": "watch_gpu_temp",
                 "sm_clock": "watch_sm_clock"}
_NODE_METRICS = ("procs_running", "load1")  # node_exporter: labelled by instance, no GPU label
_WATCH_METRICS = ("watch_threads", "hang_suspected")  # ours: instance + slurm_job_id


def clip(value: Any, limit: int = MAX_STRING) -> Any:
    """Strings cut to ``limit`` characters, recursively; lists and dicts keep their shape."""
    if isinstance(value, str):
        return value if len(value) <= limit else value[:limit] + f"... [{len(value)} chars]"
    if isinstance(value, list):
        return [clip(v, limit) for v in value]
    if isinstance(value, dict):
        return {str(k): clip(v, limit) for k, v in value.items()}
    return value


def _longest_list(obj: Any, path: Tuple[Any, ...] = ()) -> Tuple[int, Tuple[Any, ...]]:
    best: Tuple[int, Tuple[Any, ...]] = (len(obj), path) if isinstance(obj, list) and len(obj) > 1 else (0, ())
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        cand = _longest_list(v, path + (k,))
        if cand[0] > best[0]:
            best = cand
    return best


def bound(answer: Dict[str, Any], limit: int = MAX_ANSWER_BYTES) -> Dict[str, Any]:
    """Halve the longest list until the JSON fits ``limit`` bytes; ``truncated`` says what was cut."""
    answer = clip(answer)
    while len(json.dumps(answer, default=str)) > limit:
        n, path = _longest_list(answer)
        if n < 2:
            break
        parent: Any = answer
        for k in path[:-1]:
            parent = parent[k]
        parent[path[-1]] = parent[path[-1]][: n // 2]
        answer.setdefault("truncated", {}).setdefault("/".join(map(str, path)), n)
    return answer


class Tools:
    """The server's read-only tools over one config; ``triage`` is injectable for tests of bounds."""

    def __init__(self, cfg: Config, cache_seconds: float = 30.0):
        from ..triage.sources import settings

        self.cfg = cfg
        self.settings = settings(cfg)
        self.cache_seconds = cache_seconds
        self._cache: Dict[str, Tuple[float, Any]] = {}

    # ---- shared -------------------------------------------------------------------------------

    def _cached(self, key: str, make: Callable[[], Any]) -> Any:
        hit = self._cache.get(key)
        if hit and time.monotonic() - hit[0] < self.cache_seconds:
            return hit[1]
        value = make()
        self._cache[key] = (time.monotonic(), value)
        return value

    def _result(self, job: str) -> Any:
        from ..triage import triage_job

        return self._cached("result:" + job, lambda: triage_job(self.cfg, job))

    def _evidence(self, job: str) -> Tuple[Any, Dict[str, Any], Any]:
        from ..triage import gather_job

        return self._cached("evidence:" + job, lambda: gather_job(self.cfg, job, self.settings))

    # ---- tools --------------------------------------------------------------------------------

    def triage_job(self, job_id: Any, detail: Any = "summary") -> Dict[str, Any]:
        """Ranked findings of a job, root cause first, with a one-line summary and the next step."""
        job = guard.job_id(job_id)
        detail = guard.choice(detail, DETAILS, "detail")
        result = self._result(job)
        findings = []
        for f in result.findings[: 50 if detail == "full" else 10]:
            d = f.to_dict()
            item = {k: d[k] for k in ("id", "category", "verdict", "confidence", "node", "gpu", "rank",
                                      "summary", "action", "caused_by")}
            item["evidence_ids"] = sorted(d["evidence"])
            if detail == "full":
                item["evidence"] = d["evidence"]
            findings.append(item)
        unread = sorted(k for k, v in result.sources.items() if isinstance(v, dict) and v.get("read") is False)
        answer: Dict[str, Any] = {"job": job, "summary": _summary(job, result.findings), "findings": findings,
                                  "findings_total": len(result.findings), "sources_unread": unread,
                                  "next": _next(job, result.findings)}
        return bound(answer)

    def get_evidence(self, job_id: Any, source: Any) -> Dict[str, Any]:
        """One evidence source of a job: what it said, bounded."""
        job = guard.job_id(job_id)
        source = guard.choice(source, EVIDENCE_SOURCES, "source")
        if source == "logs":
            result = self._result(job)
            return bound({"job": job, "source": source, "files": result.sources.get("logs") or {},
                          "lines": _log_lines(result.events)})
        ev, sources, _ = self._evidence(job)
        if source == "slurm":
            data: Any = ev.job
        elif source == "prometheus":
            data = ev.metrics
        elif source == "watcher":
            data = {n: f["watch"] for n, f in ev.nodes.items() if f.get("watch")}
        else:  # pushgateway / hooks: what our Prolog, Epilog and watcher recorded per node
            want = "pushgateway:" if source == "pushgateway" else "state:"
            data = {n: {k: f.get(k) for k in ("findings", "gpu_diff", "leftovers", "leftover_processes", "watch")
                        if f.get(k) not in (None, [], {})}
                    for n, f in ev.nodes.items() if any(s.startswith(want) for s in f["sources"])}
        record = sources.get(source if source in sources else {"hooks": "state"}.get(source, source)) or {}
        return bound({"job": job, "source": source, "read": data not in (None, {}, []),
                      "record": record, "data": data})

    def node_history(self, node: Any, since: Any = None, until: Any = None) -> Dict[str, Any]:
        """A node's drain reasons now (ours and others'), the jobs that failed on it, and our records."""
        name = guard.node(node)
        start, end = _window(since, until)
        drains = _sinfo_reasons(self.cfg, name)
        jobs = _failed_jobs(self.settings["sacct"], name, start, end, float(self.settings["slurm_timeout_seconds"]))
        records = _state_records(self.cfg, name, start, end)
        return bound({"node": name, "since": start, "until": end, "drain": drains, "failed_jobs": jobs,
                      "hook_records": records,
                      "hardware_findings": [f for r in records for f in r["findings"] if f.get("hardware")]})

    def query_metrics(self, job_id: Any, metric: Any, node: Any = None, gpu: Any = None,
                      step: Any = None) -> Dict[str, Any]:
        """A bounded, server-side aggregated series of one named metric over the job's window."""
        from ..triage.sources.prometheus import PromError, Prometheus, range_step

        job = guard.job_id(job_id)
        name = guard.choice(metric, tuple(METRICS) + tuple(WATCH_GPU_METRICS), "metric")
        where = guard.node(node) if node is not None else None
        gpu_id = guard.gpu(gpu)
        metric_name = WATCH_GPU_METRICS.get(name) or self.settings[METRICS[name]]
        if not metric_name:
            raise guard.GuardError(f"metric {name} is not configured here (triage.{METRICS[name]} is empty)")
        if step is not None and not (isinstance(step, (int, float)) and 1 <= step <= 86400):
            raise guard.GuardError("step must be a number of seconds between 1 and 86400")
        url = self.settings["prometheus_url"]
        if not url:
            raise guard.GuardError("triage.prometheus_url is not set")
        _, _, facts = self._evidence(job)
        if facts is None or facts.start is None:
            raise guard.GuardError(f"Slurm does not know when job {job} ran")
        nodes = [where] if where else list(facts.nodes)
        start, end = facts.start, facts.end or time.time()
        step_s = float(step) if step is not None else range_step(end - start, 200, floor=1.0)
        step_s = max(step_s, (end - start) / 500)  # never more than 500 points a series
        prom = Prometheus(url, float(self.settings["prometheus_timeout_seconds"]))
        answer: Dict[str, Any] = {}
        # A site without dcgm-exporter still has the watcher's series of a --triage step.
        for candidate in (name, _WATCHER_TWIN.get(name)):
            if candidate is None:
                continue
            mname = WATCH_GPU_METRICS.get(candidate) or metric_name
            expr, by = self._expr(candidate, mname, job, nodes, gpu_id)
            try:
                res, _ = prom.query_range(expr, start, end, step_s)
            except PromError as e:
                raise guard.GuardError(f"Prometheus: {e}") from None
            answer = {"job": job, "metric": candidate, "metric_name": mname, "query": expr, "start": start,
                      "end": end, "step_seconds": step_s, "series_total": len(res),
                      "series": [{"labels": {k: r["metric"].get(k) for k in by if r["metric"].get(k) is not None},
                                  "points": [[float(t), _num(v)] for t, v in r.get("values") or []]}
                                 for r in res[:32]]}
            if res:
                break
        return bound(answer)

    def _expr(self, name: str, metric: str, job: str, nodes: Sequence[str],
              gpu: Optional[str]) -> Tuple[str, Tuple[str, ...]]:
        """PromQL built here from closed parts: the agent never writes a query."""
        alt = "|".join(n.replace(".", "\\\\.") for n in nodes)
        if name in WATCH_GPU_METRICS:
            sel = f'slurm_job_id="{job}",instance=~"{alt}"' + (f',gpu_uuid="{gpu}"' if gpu and gpu.startswith("GPU-") else "")
            return f"max by (instance, gpu_uuid) ({metric}{{{sel}}})", ("instance", "gpu_uuid")
        if name in _WATCH_METRICS:
            return (f'max by (instance) ({metric}{{slurm_job_id="{job}",instance=~"{alt}"}})', ("instance",))
        if name in _NODE_METRICS:
            label = self.settings["node_exporter_node_label"]
            return f'max by ({label}) ({metric}{{{label}=~"({alt})(:.*)?"}})', (label,)
        if name == "step_time":
            label = self.settings["step_time_node_label"]
            return f'max by ({label}) ({metric}{{{label}=~"{alt}"}})', (label,)
        nl, gl = self.settings["dcgm_node_label"], self.settings["dcgm_gpu_label"]
        sel = f'{nl}=~"{alt}"'
        if gpu is not None:
            sel += f',UUID="{gpu}"' if gpu.startswith("GPU-") else f',{gl}="{gpu}"'
        return f"max by ({nl}, {gl}) ({metric}{{{sel}}})", (nl, gl)

    def scan_logs(self, paths: Any) -> Dict[str, Any]:
        """Findings for log files this (the calling) user can read; devices, FIFOs and huge files refused."""
        from ..triage import triage_logs

        if isinstance(paths, str):
            paths = [paths]
        if not isinstance(paths, list) or not paths or len(paths) > 32:
            raise guard.GuardError("paths must be a list of 1 to 32 file paths")
        checked = [guard.readable_log(p, MAX_LOG_BYTES) for p in paths]
        result = triage_logs([c["path"] for c in checked])
        return bound({"files": checked, "summary": _summary(None, result.findings),
                      "findings": [_brief(f) for f in result.findings[:20]],
                      "findings_total": len(result.findings), "lines": _log_lines(result.events)})

    def describe(self, topic: Any) -> Dict[str, Any]:
        """What a finding id, category, metric or evidence source means, and what to do about it."""
        from ..triage.model import CATEGORIES
        from ..triage.rules import JOB_RULES, RULES

        if not isinstance(topic, str) or not 0 < len(topic) <= 200:
            raise guard.GuardError("topic must be a short string (a finding id, category, metric or source)")
        rules = {r.id: r for r in RULES + JOB_RULES}
        if topic in ("", "topics", "index"):
            return {"categories": list(CATEGORIES), "rules": sorted(rules), "metrics": sorted(list(METRICS) + list(WATCH_GPU_METRICS)),
                    "sources": list(EVIDENCE_SOURCES)}
        if topic in rules:
            r = rules[topic]
            return {"topic": topic, "kind": "rule", "categories": list(r.categories), "doc": r.doc}
        if topic in CATEGORIES:
            return {"topic": topic, "kind": "category", "rules": sorted(i for i, r in rules.items() if topic in r.categories),
                    "runbook": f"docs/runbook.md#{topic.replace('_', '-')}"}
        if topic in METRICS:
            return {"topic": topic, "kind": "metric", "config_key": f"triage.{METRICS[topic]}",
                    "metric_name": self.settings[METRICS[topic]] or None}
        if topic in WATCH_GPU_METRICS:
            return {"topic": topic, "kind": "metric", "metric_name": WATCH_GPU_METRICS[topic],
                    "doc": "the watcher's per-GPU series of a --triage step (labels instance, gpu_uuid, slurm_job_id)"}
        if topic in EVIDENCE_SOURCES:
            return {"topic": topic, "kind": "source", "tool": f"get_evidence(job_id, {topic!r})"}
        near = sorted(t for t in list(rules) + list(CATEGORIES) + list(METRICS) + list(WATCH_GPU_METRICS) if topic.lower() in t.lower())[:20]
        raise guard.GuardError(f"unknown topic {guard._show(topic)}" + (f"; did you mean: {', '.join(near)}" if near else
                                                                        "; describe('topics') lists them"))


def _num(v: Any) -> Optional[float]:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _brief(f: Any) -> Dict[str, Any]:
    d = f.to_dict()
    return {k: d[k] for k in ("id", "category", "verdict", "confidence", "node", "gpu", "rank", "summary",
                              "action", "caused_by")}


def _summary(job: Optional[str], findings: List[Any]) -> str:
    what = f"job {job}" if job else "the logs"
    if not findings:
        return f"{what}: no known failure signature found"
    root = findings[0]
    where = " ".join(p for p in (root.node and f"on {root.node}", root.gpu and f"GPU {root.gpu}",
                                 root.rank is not None and f"rank {root.rank}") if p)
    more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
    return f"{what}: {root.category} {where}: {root.summary}{more}".replace("  ", " ")


def _next(job: str, findings: List[Any]) -> str:
    if not findings:
        return f"get_evidence({job}, 'slurm') to see how the job ended, or scan_logs([...]) on its output"
    root = findings[0]
    tool, arg = _NEXT.get(root.category, ("get_evidence", "logs"))
    if tool == "node_history" and root.node:
        return f"node_history({root.node!r}) for the node's earlier drains and failed jobs"
    if tool == "query_metrics":
        node = f", node={root.node!r}" if root.node else ""
        return f"query_metrics({job}, {arg!r}{node}) to see it over the job's window"
    return f"get_evidence({job}, {arg!r})"


def _log_lines(events: List[Any], per_kind: int = 5) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for e in events:
        k = out.setdefault(e.kind, {"count": 0, "lines": []})
        k["count"] += 1
        if len(k["lines"]) < per_kind:
            k["lines"].append(f"{e.where}: {e.text}")
    return out


def _window(since: Any, until: Any) -> Tuple[float, float]:
    now = time.time()
    for v, what in ((since, "since"), (until, "until")):
        if v is not None and not (isinstance(v, (int, float)) and 0 <= v <= now + 86400):
            raise guard.GuardError(f"{what} must be unix seconds")
    end = float(until) if until is not None else now
    start = float(since) if since is not None else end - 14 * 86400
    if start >= end:
        raise guard.GuardError("since must be before until")
    return start, end


def _sinfo_reasons(cfg: Config, node: str) -> Dict[str, Any]:
    sinfo = os.path.join(os.path.dirname(cfg.get("hooks", "scontrol")), "sinfo")
    out, err = run_tool([sinfo, "-h", "-N", "-n", node, "-o", "%N|%T|%E|%u|%H"], 10.0)
    if out is None:
        return {"read": False, "error": err}
    rows = [ln.split("|", 4) for ln in out.splitlines() if ln.count("|") >= 4]
    for r in rows:
        if r[0] == node:
            reason = None if r[2] in ("none", "") else r[2]
            return {"read": True, "state": r[1], "reason": reason, "by": r[3], "since": r[4],
                    "ours": bool(reason and reason.startswith("triage:"))}
    return {"read": True, "error": f"sinfo does not know node {node}"}


_FAILED = ("FAILED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY", "CANCELLED", "PREEMPTED", "BOOT_FAIL", "DEADLINE")


def _failed_jobs(sacct: str, node: str, start: float, end: float, timeout: float) -> Dict[str, Any]:
    fmt = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start)), time.strftime(
        "%Y-%m-%dT%H:%M:%S", time.localtime(end))
    out, err = run_tool([sacct, "-n", "-P", "-X", "-a", "-N", node, "-S", fmt[0], "-E", fmt[1],
                     "-o", "JobID,JobName,User,State,ExitCode,Start,End,NodeList"], timeout)
    if out is None:
        return {"read": False, "error": err}
    jobs = []
    for ln in out.splitlines():
        f = ln.split("|")
        if len(f) >= 8 and f[3].split()[0] in _FAILED:
            jobs.append({"job": f[0], "name": f[1], "user": f[2], "state": f[3], "exit_code": f[4],
                         "start": f[5], "end": f[6], "nodes": f[7]})
    return {"read": True, "jobs": jobs[-50:], "jobs_total": len(jobs)}


def _state_records(cfg: Config, node: str, start: float, end: float) -> List[Dict[str, Any]]:
    """Our Prolog/Epilog records on ``node`` in the window, newest first (readable state dirs only)."""
    from ..step.gate import state_dir_template
    from ..sinks import state
    from ..triage.sources.pushgateway import node_config

    node_cfg = node_config(cfg, state_dir_template(cfg), node)
    jobs = os.path.join(node_cfg.get("node", "state_dir"), "jobs")
    try:
        names = [n for n in os.listdir(jobs) if n.isdigit()]
    except OSError:
        return []

    def changed(name: str) -> float:  # job ids are not an order (restarts, federation, SLUIDs)
        try:
            return os.stat(os.path.join(jobs, name)).st_mtime
        except OSError:
            return 0.0

    out = []
    for name in sorted(names, key=lambda n: (changed(n), int(n)), reverse=True)[:200]:
        for kind in ("prolog", "epilog"):
            try:
                rec = state.load(node_cfg, name, kind)
            except (OSError, ValueError):
                continue
            t = float(((rec or {}).get("snapshot") or {}).get("time") or 0)
            if not rec or not start <= t <= end:
                continue
            out.append({"job": name, "phase": kind, "time": t, "verdict": rec.get("verdict"),
                        "findings": [{k: f.get(k) for k in ("id", "verdict", "summary", "gpu", "hardware")}
                                     for f in rec.get("findings") or [] if isinstance(f, dict)
                                     and f.get("verdict") not in (None, "OK")][:10]})
    return out[:60]
