"""A short NVML sampling window (Prolog of an opted-in job) and the peer figures.

One snapshot cannot tell a GPU pinned at full power while idle, or clocks that never
rise, from a passing moment; a few samples over a couple of seconds can. The peer figures
(what should be equal on every node of a gang) go to the state and the Pushgateway for
the gang gate.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Dict, List

from ..config import Config
from ..deadline import run_probe


def _sample(cfg: Config, seconds: float, interval: float) -> List[Dict[str, Any]]:
    from ..collect import gpu

    out = []
    end = time.monotonic() + seconds
    while True:
        facts = gpu.collect(cfg)
        out.append({"t": time.time(), "gpus": facts.get("gpus", [])})
        if time.monotonic() + interval > end:
            return out
        time.sleep(interval)


def sample_gpus(cfg: Config, seconds: float, interval: float = 0.5) -> Dict[str, Any]:
    """``{"samples": [...], "summary": {uuid: {...}}}`` or ``{"error": ...}`` on a hung NVML."""
    r = run_probe(lambda: _sample(cfg, seconds, interval), seconds + cfg.get("gpu", "deadline_seconds"),
                  "gpu_samples")
    if not r.ok:
        return {"error": r.error}
    return {"count": len(r.value), "seconds": seconds, "summary": summarize(r.value)}


def summarize(samples: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """Per GPU UUID: min/max of power, util and SM clock, and every clock-event reason seen."""
    per: Dict[str, Dict[str, Any]] = {}
    for s in samples:
        for g in s["gpus"]:
            u = g.get("uuid")
            if not u or g.get("lost"):
                continue
            d = per.setdefault(u, {"index": g.get("index"), "power_watts": [], "util_gpu_percent": [],
                                   "sm_clock_mhz": [], "reasons": set(),
                                   "power_limit_watts": g.get("power_limit_watts"),
                                   "sm_clock_max_mhz": g.get("sm_clock_max_mhz"),
                                   "processes": 0})
            for k in ("power_watts", "util_gpu_percent", "sm_clock_mhz"):
                if g.get(k) is not None:
                    d[k].append(g[k])
            d["reasons"].update(g.get("clock_event_names") or [])
            d["processes"] = max(d["processes"], len(g.get("processes") or []))
    out: Dict[str, Dict[str, Any]] = {}
    for u, d in per.items():
        row: Dict[str, Any] = {"index": d["index"], "power_limit_watts": d["power_limit_watts"],
                               "sm_clock_max_mhz": d["sm_clock_max_mhz"], "processes": d["processes"],
                               "clock_event_names": sorted(d["reasons"])}
        for k in ("power_watts", "util_gpu_percent", "sm_clock_mhz"):
            row[k + "_min"] = min(d[k]) if d[k] else None
            row[k + "_max"] = max(d[k]) if d[k] else None
        out[u] = row
    return out


def peer_figures(snapshot: Dict[str, Any]) -> Dict[str, Any]:
    """Figures that must match across the nodes of one gang (compared by the gang gate)."""
    gpu = snapshot.get("gpu") or {}
    gpus = [g for g in gpu.get("gpus", []) if not g.get("lost")]

    def pick(key: str, fn: Any) -> Any:
        vals = [g[key] for g in gpus if g.get(key) is not None]
        return fn(vals) if vals else None

    return {
        "gpu_count": len(gpu.get("gpus", [])) if gpu else None,
        "gpu_name": gpus[0].get("name") if gpus else None,
        "driver_version": gpu.get("driver_version"),
        "idle_temp_celsius": pick("temperature_celsius", statistics.median),
        "max_sm_clock_mhz": pick("sm_clock_max_mhz", min),
        "power_limit_watts": pick("power_limit_watts", min),
        "pcie_width": pick("pcie_width", min),
    }
