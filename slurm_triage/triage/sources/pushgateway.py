"""What our own hooks recorded for the job: Pushgateway groups and the nodes' state files.

The Prolog and the watcher push live groups keyed by job (``phase`` = prolog, watch); the
Epilog deletes them and replaces the node's ``last_job`` group, whose samples carry the
``slurm_job_id`` label (so only the newest job per node is still in the gateway), and
save ``prolog.json`` / ``epilog.json`` under ``node.state_dir``. Both are read into one shape
per node: the node checks' non-OK findings (leftovers, public dashboards, hardware), the
Epilog's per-GPU job summary and the watcher's flags. The gateway has no server-side filter:
one GET of ``/api/v1/metrics``, filtered here by ``slurm_job_id``.
"""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ...config import Config

_ONE = ("1", "1.0", "1e+00")


def _family(g: Dict[str, Any], name: str) -> List[Dict[str, Any]]:
    return ((g.get(name) or {}).get("metrics")) or []


def _num(v: Any) -> Optional[float]:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def node_facts(out: Dict[str, Dict[str, Any]], node: str) -> Dict[str, Any]:
    """The per-node facts every hook source fills (created empty on first use)."""
    return out.setdefault(node, {"findings": [], "watch": {}, "gpu_diff": {}, "leftovers": [], "gpus": {},
                                 "sources": []})


def group_job(g: Dict[str, Any]) -> Optional[str]:
    """The job a group is about: its grouping key, or (``last_job``) its samples' label."""
    labels = g.get("labels") or {}
    if labels.get("slurm_job_id"):
        return labels["slurm_job_id"]
    for m in _family(g, "slurm_triage_node_verdict"):
        return (m.get("labels") or {}).get("slurm_job_id")
    return None


def from_groups(groups: Iterable[Dict[str, Any]], job_id: str) -> Dict[str, Dict[str, Any]]:
    """Pure: per-node facts from a ``/api/v1/metrics`` answer, this job's groups only."""
    out: Dict[str, Dict[str, Any]] = {}
    for g in groups:
        labels = g.get("labels") or {}
        if group_job(g) != job_id or labels.get("job") != "slurm_triage" or not labels.get("instance"):
            continue
        phase = labels.get("phase", "")
        n = node_facts(out, labels["instance"])
        n["sources"].append(f"pushgateway:{phase}")
        for m in _family(g, "slurm_triage_findings"):
            ml = m.get("labels") or {}
            if ml.get("verdict") not in (None, "OK"):
                n["findings"].append({"id": ml.get("check", "?"), "verdict": ml["verdict"], "phase": phase,
                                      "gpu": ml.get("gpu_uuid") or None, "pid": ml.get("pid") or None,
                                      "hardware": ml.get("hardware") == "true", "count": _num(m.get("value"))})
        for m in _family(g, "slurm_triage_leftover_processes"):
            n["leftover_processes"] = _num(m.get("value"))
        for key in ("max_temperature_celsius", "ecc_uncorrected_errors", "energy_joules"):
            for m in _family(g, "slurm_triage_job_gpu_" + key):
                uuid = (m.get("labels") or {}).get("gpu_uuid", "?")
                n["gpu_diff"].setdefault(uuid, {})[key] = _num(m.get("value"))
        for fam, key in (("slurm_triage_hang_suspected", "hang_suspected"), ("slurm_triage_watch_thread_leak", "thread_leak"),
                         ("slurm_triage_watch_threads", "threads"), ("slurm_triage_watch_procs_running", "procs_running")):
            for m in _family(g, fam):
                n["watch"][key] = _num(m.get("value"))
        slow = [(m.get("labels") or {}).get("gpu_uuid") for m in _family(g, "slurm_triage_watch_straggler")
                if str(m.get("value")) in _ONE]
        if slow:
            n["watch"]["straggler_gpus"] = slow
    return out


def from_state(records: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Pure: per-node facts from the nodes' saved records (``{"prolog": rec, "epilog": rec}`` by node)."""
    out: Dict[str, Dict[str, Any]] = {}
    for node, kinds in records.items():
        n = node_facts(out, node)
        for phase, rec in kinds.items():
            n["sources"].append(f"state:{phase}")
            for f in rec.get("findings") or []:
                if isinstance(f, dict) and f.get("verdict") not in (None, "OK"):
                    n["findings"].append({"id": f.get("id", "?"), "verdict": f["verdict"], "phase": phase,
                                          "gpu": f.get("gpu"), "pid": None if f.get("pid") is None else str(f["pid"]),
                                          "hardware": bool(f.get("hardware")),
                                          "summary": f.get("summary"), "evidence": f.get("evidence") or {},
                                          "time": ((rec.get("snapshot") or {}).get("time"))})
            for gpu in ((rec.get("snapshot") or {}).get("gpu") or {}).get("gpus") or []:
                if isinstance(gpu, dict) and gpu.get("uuid"):
                    n["gpus"][gpu["uuid"]] = {k: gpu.get(k) for k in ("index", "pci_bus_id", "slowdown_temp_celsius")}
            if phase == "epilog":
                n["leftovers"] = rec.get("leftovers") or []
                n["leftover_processes"] = float(len(n["leftovers"]))
                n["gpu_diff"] = rec.get("gpu_diff") or {}
    return out


def merge(*parts: Dict[str, Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """State records (full findings) win over gateway samples for the same node and phase."""
    out: Dict[str, Dict[str, Any]] = {}
    for part in parts:
        for node, facts in part.items():
            n = node_facts(out, node)
            phases = {f["phase"] for f in facts["findings"]}
            if any(s.startswith("state:") for s in facts["sources"]):
                n["findings"] = [f for f in n["findings"] if f["phase"] not in phases]
            n["findings"] += facts["findings"]
            n["watch"].update(facts["watch"])
            n["gpus"].update(facts["gpus"])
            n["gpu_diff"] = facts["gpu_diff"] or n["gpu_diff"]
            n["leftovers"] = facts["leftovers"] or n["leftovers"]
            if "leftover_processes" in facts:
                n["leftover_processes"] = facts["leftover_processes"]
            n["sources"] += facts["sources"]
    return out


def fetch_groups(url: str, timeout: float) -> List[Dict[str, Any]]:
    """Every group on the gateway; raises OSError/ValueError when unreachable or malformed."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url.rstrip("/") + "/api/v1/metrics", timeout=timeout) as resp:
        data = json.loads(resp.read())
    if not isinstance(data, dict) or data.get("status") != "success" or not isinstance(data.get("data"), list):
        raise ValueError("unexpected answer from /api/v1/metrics")
    return data["data"]


def node_config(cfg: Config, template: str, node: str) -> Config:
    """``cfg`` as seen by ``node``'s hooks: its state dir (``{node}`` in the template filled)."""
    return cfg.with_values({**cfg.values, "node": {**cfg.values["node"],
                                                   "state_dir": template.replace("{node}", node)}})


def read_state(cfg: Config, job_id: str, nodes: Sequence[str]) -> Dict[str, Dict[str, Any]]:
    """``{node: {"prolog": rec, "epilog": rec}}`` for the state files this process can read."""
    from ...step.gate import state_dir_template
    from ...sinks import state

    template = state_dir_template(cfg)
    out: Dict[str, Dict[str, Any]] = {}
    for node in nodes:
        node_cfg = node_config(cfg, template, node)
        for kind in ("prolog", "epilog"):
            try:
                rec = state.load(node_cfg, job_id, kind)
            except (OSError, ValueError):
                continue
            if rec and rec.get("node", node) == node:
                out.setdefault(node, {})[kind] = rec
    return out


def gather(cfg: Config, url: str, job_id: str, nodes: Sequence[str]) -> Tuple[Dict[str, Dict[str, Any]], Dict[str, Any]]:
    """Per-node facts from the gateway and the state files, and one source record for each."""
    records: Dict[str, Any] = {}
    pushed: Dict[str, Dict[str, Any]] = {}
    if url:
        try:
            pushed = from_groups(fetch_groups(url, float(cfg.get("pushgateway", "timeout_seconds"))), job_id)
            records["pushgateway"] = {"read": True, "url": url, "nodes": sorted(pushed)}
        except (OSError, ValueError, urllib.error.URLError) as e:
            records["pushgateway"] = {"read": False, "url": url, "error": str(e)[:300]}
    else:
        records["pushgateway"] = {"read": False, "error": "no Pushgateway URL (triage.pushgateway_url, pushgateway.url)"}
    saved = from_state(read_state(cfg, job_id, nodes)) if nodes else {}
    records["state"] = {"read": bool(saved), "nodes": sorted(saved),
                        **({} if saved else {"error": "no readable state file for the job's nodes"})}
    return merge(pushed, saved), records
