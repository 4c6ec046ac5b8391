"""Job metrics from the Prometheus HTTP API, aggregated on the server.

A job of 128 nodes × 8 GPUs over 11 days is 1,024 series × 30,000+ samples per metric: pulling
that raw would take minutes and gigabytes. Every question is therefore asked as PromQL that
returns one number per GPU or node (``avg_over_time(X[W] @ end)``), or a range query whose
filter (``> 0``, ``count by (node)``) leaves only the few steps that matter, with a step that
keeps every series under Prometheus' 11,000-point limit. Queries run in parallel; each one's
wall time is recorded so the report (and the benchmark) can show where the time went.

Labels: dcgm-exporter names the node ``Hostname`` and the GPU ``gpu`` (plus ``UUID``);
node_exporter's node is its scrape ``instance`` (``host:9100``); our own series carry
``instance=<node>`` and ``slurm_job_id`` (pushed with honor_labels). All names are settings.
"""
from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# Clock event (throttle) reason bits that mean heat or a hardware slowdown, not the job's own
# power cap: HW_SLOWDOWN 0x8, SW_THERMAL 0x20, HW_THERMAL 0x40 (nvml.h nvmlClocksEventReason*).
THERMAL_BITS = (8, 32, 64)
MAX_DETAIL_GPUS = 8


class PromError(Exception):
    pass


class Prometheus:
    """A tiny client: POSTed queries (selectors of 1,000 nodes do not fit a URL), no proxies."""

    def __init__(self, url: str, timeout: float):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def _call(self, path: str, params: Dict[str, Any]) -> Tuple[List[Dict[str, Any]], float]:
        t0 = time.monotonic()
        data = urllib.parse.urlencode(params).encode()
        try:
            with self.opener.open(self.url + path, data=data, timeout=self.timeout) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as e:
            try:
                msg = json.loads(e.read()).get("error", str(e))
            except ValueError:
                msg = str(e)
            raise PromError(f"HTTP {e.code}: {msg}") from None
        except (OSError, ValueError) as e:
            raise PromError(f"{self.url}: {e}") from None
        if body.get("status") != "success":
            raise PromError(str(body.get("error", "query failed")))
        return body["data"]["result"], time.monotonic() - t0

    def query(self, expr: str, at: float) -> Tuple[List[Dict[str, Any]], float]:
        return self._call("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})

    def query_range(self, expr: str, start: float, end: float, step: float) -> Tuple[List[Dict[str, Any]], float]:
        return self._call("/api/v1/query_range", {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                   "step": f"{step:.0f}"})

    def ready(self) -> None:
        """Raise PromError unless the server answers (one cheap query)."""
        self.query("vector(1)", time.time())


def range_step(seconds: float, max_points: int, floor: float = 15.0) -> float:
    """The smallest whole-second step that keeps ``seconds`` under ``max_points`` points.

    ``floor`` (a usual scrape interval) shrinks for short jobs, so a job shorter than one
    floor is still looked at more than once.
    """
    floor = min(floor, max(1.0, math.ceil(seconds / 10)))
    return float(max(floor, math.ceil(seconds / max_points)))


def _alt(values: Sequence[str]) -> str:
    """A PromQL regex alternation of literal names (``.`` escaped for RE2 inside a PromQL string)."""
    return "|".join(re.sub(r"([.+*?()\[\]{}|^$\\])", r"\\\\\1", v) for v in values)


def runs(times: Sequence[float], step: float) -> List[Tuple[float, float]]:
    """Contiguous [start, end] runs of sorted sample times (a gap > 1.5 steps ends a run)."""
    out: List[Tuple[float, float]] = []
    for t in sorted(times):
        if out and t - out[-1][1] <= 1.5 * step:
            out[-1] = (out[-1][0], t)
        else:
            out.append((t, t))
    return out


def _node(labels: Dict[str, str], label: str) -> str:
    v = labels.get(label, "")
    return v.rsplit(":", 1)[0] if re.search(r":\d+$", v) else v


class _Plan:
    """The queries of one job, built from the settings, in three stages.

    Range queries over every GPU cost one evaluation per step and series (1,024 × 9,900 for
    11 days: tens of seconds), so every question is first asked as ONE pass over the samples
    (``*_over_time(X[W] @ end)``) and only its few positive answers get a range query of
    their own series: 1) per-GPU figures and candidates; 2) the coarse hang scan (node
    averages, a step of W/1000) and the candidates' details; 3) the hang windows at full step.
    """

    def __init__(self, s: Dict[str, Any], job_id: str, nodes: Sequence[str], start: float, end: float):
        self.s, self.start, self.end = s, start, end
        self.w = max(60, int(math.ceil(end - start)))
        self.step = range_step(end - start, int(s["max_points"]))
        self.coarse = max(self.step, float(math.ceil(self.w / 1000)))
        # Each coarse point averages at least Prometheus' 5-min lookback, so sparse scrapes never leave holes.
        self.coarse_range = max(self.coarse, 300.0)
        self.nl, self.gl = s["dcgm_node_label"], s["dcgm_gpu_label"]
        alt = _alt(nodes)
        self.gpu_sel = f'{self.nl}=~"{alt}"'
        self.ne_sel = f'{s["node_exporter_node_label"]}=~"({alt})(:[0-9]+)?"'
        self.job_sel = f'slurm_job_id="{job_id}"'
        # A job's step-time series pushed to a Pushgateway outlive the job there: when they carry
        # slurm_job_id, only this job's count (=~"J|" also keeps series without the label).
        self.step_sel = f'{s["step_time_node_label"]}=~"({alt})(:[0-9]+)?",slurm_job_id=~"{job_id}|"'
        self.e = f"{self.end:.0f}"

    def m(self, key: str, sel: str) -> str:
        return f"{self.s[key]}{{{sel}}}"

    def over(self, fn: str, key: str, sel: str, sub: str = "") -> str:
        """``fn(X[W] @ end)``; ``sub`` (e.g. ``1h``) samples X at that resolution instead (cheaper,
        for figures that only need to be approximate)."""
        rng = f"{self.w}s:{sub}" if sub else f"{self.w}s"
        return f"{fn}({self.m(key, sel)}[{rng}] @ {self.e})"

    def reasons_max(self) -> str:
        """Per GPU, the largest clock event reasons value: >= 8 means a bit above SW power cap was
        set at least once (HW slowdown, thermal, power brake ...). One pass; ``or`` keeps one
        series per GPU when a site exports both the old and the new metric name."""
        return " or ".join(f"max_over_time({n}{{{self.gpu_sel}}}[{self.w}s] @ {self.e}) >= 8"
                           for n in self.s["metric_clock_reasons"])

    def stage1(self) -> Dict[str, Tuple[str, str]]:
        """name -> ("instant", PromQL): one pass each; nothing here is a range query."""
        s, g, nl, gl = self.s, self.gpu_sel, self.nl, self.gl
        q: Dict[str, Tuple[str, str]] = {
            "util": ("instant", self.over("avg_over_time", "metric_gpu_util", g, "1h")),
            "power": ("instant", self.over("avg_over_time", "metric_gpu_power", g, "1h")),
            "clock": ("instant", self.over("avg_over_time", "metric_sm_clock", g)),
            "power_peak": ("instant", f"quantile(0.5, {self.over('max_over_time', 'metric_gpu_power', g, '1h')})"),
            "clock_peak": ("instant", f"quantile(0.5, {self.over('max_over_time', 'metric_sm_clock', g, '1h')})"),
            "reasons": ("instant", self.reasons_max()),
            "xid": ("instant", f"max by ({nl}, {gl}) ({self.over('max_over_time', 'metric_xid', g)}) > 0"),
            "ecc_dbe": ("instant", f"sum by ({nl}, {gl}) ({self.over('increase', 'metric_ecc_dbe', g)}) > 0"),
            "row_remap_failure": ("instant", f"max by ({nl}, {gl}) "
                                             f"({self.over('max_over_time', 'metric_row_remap_failure', g)}) > 0"),
            "ib": ("instant", " or ".join(
                f'label_replace(increase({name}{{{self.ne_sel}}}[{self.w}s] @ {self.e}), "counter", "{name}", "", "") > 0'
                for name in s["metric_ib_errors"])),
            "procs_running": ("instant", f"avg by ({s['node_exporter_node_label']}) "
                                         f"({self.over('avg_over_time', 'metric_procs_running', self.ne_sel)})"),
            "load1": ("instant", f"avg by ({s['node_exporter_node_label']}) "
                                 f"({self.over('avg_over_time', 'metric_load1', self.ne_sel)})"),
            "threads_max": ("instant", f"max by (instance) ({self.over('max_over_time', 'metric_watch_threads', self.job_sel)})"),
            "threads_min": ("instant", f"min by (instance) ({self.over('min_over_time', 'metric_watch_threads', self.job_sel)})"),
            "thread_leak": ("instant", f"max by (instance) ({self.over('max_over_time', 'metric_watch_thread_leak', self.job_sel)}) > 0"),
            "watch_procs_running": ("instant", f"avg by (instance) "
                                               f"({self.over('avg_over_time', 'metric_watch_procs_running', self.job_sel)})"),
            "watch_hang": ("instant", f"max by (instance) ({self.over('max_over_time', 'metric_hang_suspected', self.job_sel)}) > 0"),
            "watch_straggler": ("instant", f"max by (instance, gpu_uuid) "
                                           f"({self.over('max_over_time', 'metric_watch_straggler', self.job_sel)}) > 0"),
            # the watcher's own series of a --triage step: thread names, and GPU figures where no
            # dcgm-exporter runs (fixed names: slurm_triage.step.watcher.render)
            "thread_names": ("instant", f"max by (instance, pid, comm, thread) (max_over_time("
                                        f"slurm_triage_watch_thread_names{{{self.job_sel}}}[{self.w}s] @ {self.e}))"),
            "watch_power": ("instant", f"avg by (instance) (avg_over_time("
                                       f"slurm_triage_watch_gpu_power_watts{{{self.job_sel}}}[{self.w}s] @ {self.e}))"),
            "watch_util": ("instant", f"avg by (instance) (avg_over_time("
                                      f"slurm_triage_watch_gpu_utilization_ratio{{{self.job_sel}}}[{self.w}s] @ {self.e}))"),
        }
        if s["metric_step_time"]:
            q["step_time"] = ("instant", f"avg by ({s['step_time_node_label']}) "
                                         f"({self.over('avg_over_time', 'metric_step_time', self.step_sel)})")
        return q

    def hang(self, power_peak: float, clock_peak: float, coarse: bool) -> str:
        """The power axiom: util high, power near idle, clock up. Coarse: node averages over each
        coarse step (one pass over the samples); fine: per GPU, counted by node."""
        s, nl, gl, g = self.s, self.nl, self.gl, self.gpu_sel
        pw, ck = float(s["hang_power_ratio"]) * power_peak, float(s["hang_clock_ratio"]) * clock_peak
        hu = float(s["hang_util_percent"])
        if coarse:
            def avg(key: str) -> str:
                return f"avg by ({nl}) (avg_over_time({self.m(key, g)}[{self.coarse_range:.0f}s]))"
            return (f"{avg('metric_gpu_util')} >= {hu} and on({nl}) {avg('metric_gpu_power')} <= {pw:.3f}"
                    f" and on({nl}) {avg('metric_sm_clock')} >= {ck:.3f}")
        return (f"count by ({nl}) ({self.m('metric_gpu_util', g)} >= {hu} and on({nl}, {gl}) "
                f"{self.m('metric_gpu_power', g)} <= {pw:.3f} and on({nl}, {gl}) {self.m('metric_sm_clock', g)} >= {ck:.3f})")

    def series(self, labels: Dict[str, str], keys: Sequence[str]) -> str:
        return ", ".join(f'{k}="{labels[k]}"' for k in keys if labels.get(k) is not None)

    def thermal_detail(self, node: str, gpu: str) -> Tuple[str, str]:
        """(range: 1 while a thermal/HW slowdown bit is set, instant: max temperature) for one GPU."""
        sel = f'{self.nl}="{node}", {self.gl}="{gpu}"'
        names = _alt(self.s["metric_clock_reasons"])
        r = f'max by ({self.nl}, {self.gl}) ({{__name__=~"{names}", {sel}}})'
        bits = "(" + " + ".join(f"floor({r} / {b}) % 2" for b in THERMAL_BITS) + ") > 0"
        return bits, f"max_over_time({self.m('metric_gpu_temp', sel)}[{self.w}s] @ {self.e})"

    def event_detail(self, kind: str, labels: Dict[str, str]) -> str:
        """A range query over the one series that stage 1 found positive: when it happened."""
        nl, gl = self.nl, self.gl
        if kind == "watch_hang":
            return f"max by (instance) ({self.m('metric_hang_suspected', self.job_sel + ', ' + self.series(labels, ['instance']))}) > 0"
        sel = self.series(labels, [nl, gl])
        if kind == "ecc_dbe":
            return f"sum by ({nl}, {gl}) (increase({self.m('metric_ecc_dbe', sel)}[{2 * self.step:.0f}s])) > 0"
        key = {"xid": "metric_xid", "row_remap_failure": "metric_row_remap_failure"}[kind]
        return f"max by ({nl}, {gl}) ({self.m(key, sel)}) > 0"


def _value(sample: Any) -> Optional[float]:
    try:
        v = float(sample[1])
    except (TypeError, ValueError, IndexError):
        return None
    return None if math.isnan(v) or math.isinf(v) else v


def shape(raw: Dict[str, List[Dict[str, Any]]], s: Dict[str, Any], step: float) -> Dict[str, Any]:
    """Pure: the answers of the plan's queries (name -> result list) as plain per-GPU/per-node facts."""
    nl, gl, ne = s["dcgm_node_label"], s["dcgm_gpu_label"], s["node_exporter_node_label"]
    gpus: Dict[Tuple[str, str], Dict[str, Any]] = {}
    for key in ("util", "power", "temp_max", "clock", "thermal_fraction"):
        for r in raw.get(key) or []:
            lab = r["metric"]
            k = (lab.get(nl, ""), lab.get(gl, ""))
            g = gpus.setdefault(k, {"node": k[0], "gpu": k[1], "uuid": lab.get("UUID")})
            g["uuid"] = g["uuid"] or lab.get("UUID")
            g[key] = _value(r.get("value"))
    hang: Dict[str, List[List[float]]] = {}
    for r in raw.get("hang") or []:  # one result per window: a node may appear in several
        ts = [float(v[0]) for v in r.get("values") or []]
        hang.setdefault(r["metric"].get(nl, ""), []).extend([a, b] for a, b in runs(ts, step))
    events = []
    for kind in ("xid", "ecc_dbe", "row_remap_failure"):
        for r in raw.get(kind) or []:
            vals = r.get("values") or []
            if vals:
                events.append({"kind": kind, "node": r["metric"].get(nl), "gpu": r["metric"].get(gl),
                               "time": float(vals[0][0]), "value": max(_value(v) or 0 for v in vals)})
    ib = [{"node": _node(r["metric"], ne), "device": r["metric"].get("device"), "port": r["metric"].get("port"),
           "counter": r["metric"].get("counter"), "delta": _value(r.get("value"))} for r in raw.get("ib") or []]

    def per_node(key: str, label: str = "instance") -> Dict[str, float]:
        return {_node(r["metric"], label): v for r in raw.get(key) or [] if (v := _value(r.get("value"))) is not None}

    tmax, tmin = per_node("threads_max"), per_node("threads_min")
    return {
        "gpus": sorted(gpus.values(), key=lambda g: (g["node"], g["gpu"])),
        "hang": hang, "gpu_events": sorted(events, key=lambda e: e["time"]), "ib": ib,
        "step_time": per_node("step_time", s["step_time_node_label"]),
        "procs_running": per_node("procs_running", ne), "load1": per_node("load1", ne),
        "threads": {n: {"min": tmin.get(n), "max": v} for n, v in tmax.items()},
        "thread_leak": sorted(per_node("thread_leak")),
        "watch_procs_running": per_node("watch_procs_running"),
        "watch_hang": {r["metric"].get("instance", ""): [[a, b] for a, b in runs(
            [float(v[0]) for v in r.get("values") or []], step)] for r in raw.get("watch_hang") or []},
        "watch_straggler": [{"node": r["metric"].get("instance"), "gpu_uuid": r["metric"].get("gpu_uuid")}
                            for r in raw.get("watch_straggler") or []],
        "thread_names": {n: sorted(v, key=lambda t: -t["count"]) for n, v in _thread_names(raw).items()},
        "watch_power": per_node("watch_power"), "watch_util": per_node("watch_util"),
    }


def _thread_names(raw: Dict[str, List[Dict[str, Any]]]) -> Dict[str, List[Dict[str, Any]]]:
    out: Dict[str, List[Dict[str, Any]]] = {}
    for r in raw.get("thread_names") or []:
        lab, v = r["metric"], _value(r.get("value"))
        if v:
            out.setdefault(lab.get("instance", ""), []).append(
                {"pid": lab.get("pid"), "comm": lab.get("comm"), "thread": lab.get("thread"), "count": int(v)})
    return out


END_SLACK_SECONDS = 1.0


def gather(s: Dict[str, Any], job_id: str, nodes: Sequence[str], start: float, end: float,
           progress: Optional[Callable[[str], None]] = None) -> Tuple[Optional[Dict[str, Any]], Dict[str, Any]]:
    """The job's metric facts and the source record; (None, record with the error) when unreachable."""
    url = s["prometheus_url"]
    if not url:
        return None, {"read": False, "error": "triage.prometheus_url is not set"}
    if not nodes or end <= start:
        return None, {"read": False, "error": "no node list or time window for the job (use --nodes/--since/--until)"}
    # Slurm gives a job's End in whole seconds: it ended within the second after. A short job's
    # last scrape (what its ranks and watcher pushed last) often falls in that second.
    end += END_SLACK_SECONDS
    prom = Prometheus(url, float(s["prometheus_timeout_seconds"]))
    t0 = time.monotonic()
    try:
        prom.ready()
    except PromError as e:
        return None, {"read": False, "url": url, "error": str(e)}
    plan = _Plan(s, job_id, nodes, start, end)
    raw: Dict[str, List[Dict[str, Any]]] = {}
    timings: Dict[str, float] = {}
    errors: Dict[str, str] = {}

    def ask(name: str, kind: str, expr: str, lo: float = start, hi: float = end) -> List[Dict[str, Any]]:
        try:
            res, sec = prom.query(expr, end) if kind == "instant" else prom.query_range(
                expr, lo, hi, plan.coarse if name == "hang_coarse" else plan.step)
        except PromError as e:
            errors[name] = str(e)[:300]
            return []
        timings[name] = round(sec, 3)
        if progress:
            progress(f"prometheus: {name} {sec:.1f} s")
        return res

    def parallel(jobs: Dict[str, Callable[[], List[Dict[str, Any]]]]) -> Dict[str, List[Dict[str, Any]]]:
        with ThreadPoolExecutor(max_workers=4) as pool:
            futures = {k: pool.submit(fn) for k, fn in jobs.items()}
            return {k: f.result() for k, f in futures.items()}

    first = parallel({k: (lambda k=k, q=q: ask(k, *q)) for k, q in plan.stage1().items()})
    raw.update(first)
    nl, gl = plan.nl, plan.gl
    peaks = [_value((first.get(k) or [{}])[0].get("value")) for k in ("power_peak", "clock_peak")]
    hot = sorted(((r["metric"].get(nl, ""), r["metric"].get(gl, "")) for r in first.get("reasons") or []))
    stage2: Dict[str, Callable[[], List[Dict[str, Any]]]] = {}
    if None not in peaks:
        stage2["hang_coarse"] = lambda: ask("hang_coarse", "range", plan.hang(peaks[0], peaks[1], True))  # type: ignore[arg-type]
    for node, gpu in hot[:MAX_DETAIL_GPUS]:
        bits, temp = plan.thermal_detail(node, gpu)
        stage2[f"thermal:{node}/{gpu}"] = lambda b=bits, n=node, g=gpu: ask(f"thermal:{n}/{g}", "range", b)
        stage2[f"temp:{node}/{gpu}"] = lambda t=temp, n=node, g=gpu: ask(f"temp:{n}/{g}", "instant", t)
    for kind in ("xid", "ecc_dbe", "row_remap_failure", "watch_hang"):
        for i, r in enumerate((first.get(kind) or [])[:MAX_DETAIL_GPUS]):
            stage2[f"{kind}:{i}"] = lambda k=kind, lab=r["metric"], i=i: ask(f"{k}:{i}", "range", plan.event_detail(k, lab))
    second = parallel(stage2)
    for kind in ("xid", "ecc_dbe", "row_remap_failure", "watch_hang"):
        raw[kind] = [r for k, v in second.items() if k.startswith(kind + ":") for r in v]
    raw["thermal_fraction"], raw["temp_max"], since = [], [], {}
    for node, gpu in hot[:MAX_DETAIL_GPUS]:
        ts = [float(v[0]) for r in second.get(f"thermal:{node}/{gpu}") or [] for v in r.get("values") or []]
        labels = {nl: node, gl: gpu}
        raw["thermal_fraction"].append({"metric": labels, "value": [end, str(min(1.0, len(ts) * plan.step / plan.w))]})
        raw["temp_max"] += [{"metric": labels, "value": r["value"]} for r in second.get(f"temp:{node}/{gpu}") or []]
        since[(node, gpu)] = min(ts) if ts else None
    windows = runs([float(v[0]) for r in second.get("hang_coarse") or [] for v in r.get("values") or []], plan.coarse)
    fine = parallel({f"hang:{i}": (lambda a=a, b=b, i=i: ask(f"hang:{i}", "range", plan.hang(peaks[0], peaks[1], False),  # type: ignore[arg-type]
                                                            max(start, a - plan.coarse - plan.coarse_range),
                                                            min(end, b + plan.coarse)))
                     for i, (a, b) in enumerate(windows[:3])})
    raw["hang"] = [r for v in fine.values() for r in v]
    facts = shape(raw, s, plan.step)
    for g in facts["gpus"]:
        if (g["node"], g["gpu"]) in since:
            g["thermal_since"] = since[(g["node"], g["gpu"])]
    facts["window"] = {"start": start, "end": end, "step": plan.step}
    facts["peaks"] = {"power_watts": peaks[0], "sm_clock_mhz": peaks[1]}
    record: Dict[str, Any] = {"read": True, "url": url, "queries": len(timings), "seconds": round(time.monotonic() - t0, 3),
                              "query_seconds_sum": round(sum(timings.values()), 3), "query_seconds": timings,
                              "step_seconds": plan.step, "gpus": len(facts["gpus"])}
    if errors:
        record["errors"] = errors
    if not timings:
        return None, {**record, "read": False, "error": "every query failed"}
    return facts, record
