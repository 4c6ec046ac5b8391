"""Pure detectors over the watcher's sample series: hang, stragglers, thread growth.

A sample is ``{"t": unix_s, "gpus": [compact GPU dict], "threads": int | None, ...}``
(see watcher.compact_gpu). Every detector looks only at the trailing window and answers
only when the series spans the whole window: one odd sample must never raise a flag,
and a watcher that just started cannot claim anything "for 60 s".
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

Sample = Dict[str, Any]

# Clock event reasons that mean the hardware (not the job) slows the GPU down.
SLOWDOWN_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")


def trailing(samples: List[Sample], seconds: float) -> List[Sample]:
    """The samples of the last ``seconds``; [] unless the series covers that whole span."""
    if not samples or samples[-1]["t"] - samples[0]["t"] < seconds:
        return []
    start = samples[-1]["t"] - seconds
    return [s for s in samples if s["t"] >= start]


def _usable(gpus: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [g for g in gpus if not g.get("lost")
            and None not in (g.get("util_gpu_percent"), g.get("power_watts"), g.get("power_limit_watts"))]


def power_axiom(gpu: Dict[str, Any], util_percent: float, power_ratio: float) -> bool:
    """Busy by NVML's account yet drawing near-idle power: kernels that spin without
    computing, the signature of ranks stuck in an NCCL collective."""
    limit = gpu.get("power_limit_watts") or 0
    return (limit > 0 and gpu["util_gpu_percent"] >= util_percent
            and gpu["power_watts"] <= power_ratio * limit)


def power_axiom_hang(samples: List[Sample], window_seconds: float, util_percent: float = 90.0,
                     power_ratio: float = 0.35, gpu_fraction: float = 1.0) -> Optional[Dict[str, Any]]:
    """The hang episode when, in every sample of the trailing ``window_seconds``, at least
    ``gpu_fraction`` of the step's GPUs satisfy the power axiom; None otherwise.

    A sample without GPU readings (NVML failed) breaks the run: no reading, no claim.
    """
    run: List[Sample] = []
    hits: List[str] = []
    for s in reversed(samples):
        gpus = _usable(s.get("gpus") or [])
        on = [g for g in gpus if power_axiom(g, util_percent, power_ratio)]
        if not gpus or len(on) < gpu_fraction * len(gpus) - 1e-9:
            break
        if not run:
            hits = [str(g.get("uuid")) for g in on]
        run.append(s)
    if not run or run[0]["t"] - run[-1]["t"] < window_seconds:
        return None
    last = run[0]
    return {"since": run[-1]["t"], "seconds": round(last["t"] - run[-1]["t"], 3), "gpus": hits,
            "gpu_count": len(_usable(last["gpus"])),
            "power_watts": {str(g.get("uuid")): g["power_watts"] for g in _usable(last["gpus"])},
            "util_gpu_percent": {str(g.get("uuid")): g["util_gpu_percent"] for g in _usable(last["gpus"])}}


def _slowed(g: Dict[str, Any], margin_celsius: float) -> List[str]:
    why = [r for r in g.get("clock_event_names") or [] if r in SLOWDOWN_REASONS]
    temp, slowdown = g.get("temperature_celsius"), g.get("slowdown_temp_celsius")
    if temp is not None and slowdown and temp >= slowdown - margin_celsius:
        why.append("temperature_near_slowdown")
    return why


def stragglers(samples: List[Sample], window_seconds: float, margin_celsius: float,
               share: float = 0.5) -> Dict[str, Dict[str, Any]]:
    """GPUs slowed by hardware (slowdown reasons, or within ``margin_celsius`` of their own
    slowdown threshold) in more than ``share`` of the window's samples, by UUID: such a
    GPU drags every rank of a synchronous job down to its pace."""
    win = trailing(samples, window_seconds)
    if not win:
        return {}
    seen: Dict[str, Dict[str, Any]] = {}
    for s in win:
        for g in s.get("gpus") or []:
            why = _slowed(g, margin_celsius)
            if not why or g.get("uuid") is None:
                continue
            d = seen.setdefault(str(g["uuid"]), {"samples": 0, "reasons": set(), "temperature_celsius_max": None})
            d["samples"] += 1
            d["reasons"].update(why)
            t = g.get("temperature_celsius")
            if t is not None:
                d["temperature_celsius_max"] = max(t, d["temperature_celsius_max"] or t)
    return {u: {"share": round(d["samples"] / len(win), 3), "reasons": sorted(d["reasons"]),
                "temperature_celsius_max": d["temperature_celsius_max"]}
            for u, d in seen.items() if d["samples"] > share * len(win)}


def thread_growth(samples: List[Sample], window_seconds: float, threshold: int) -> Optional[Dict[str, Any]]:
    """The step's thread count rising at every sample of the window (never falling) by more
    than ``threshold``: a leak (threads spawned per iteration, never joined), not a plateau."""
    win = [s for s in trailing(samples, window_seconds) if s.get("threads") is not None]
    if len(win) < 2:
        return None
    counts = [int(s["threads"]) for s in win]
    if any(b < a for a, b in zip(counts, counts[1:])) or counts[-1] - counts[0] <= threshold:
        return None
    return {"from": counts[0], "to": counts[-1], "growth": counts[-1] - counts[0],
            "seconds": round(win[-1]["t"] - win[0]["t"], 3)}
