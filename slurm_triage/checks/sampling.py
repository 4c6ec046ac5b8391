"""Checks over the Prolog's NVML sampling window (only for jobs run with --triage)."""
from __future__ import annotations

from typing import List

from ..config import Config
from ..model import Finding, Verdict
from . import Facts, check
from .gpu import HW_REASONS

IDLE_POWER_RATIO = 0.35


@check("gpu.idle_power", needs=("gpu_samples",))
def idle_power(facts: Facts, cfg: Config) -> List[Finding]:
    """An idle GPU (no process, no utilization) drawing over 35 % of its power limit all window."""
    out = []
    for uuid, s in facts["gpu_samples"].get("summary", {}).items():
        limit, low = s.get("power_limit_watts"), s.get("power_watts_min")
        if not limit or low is None or s.get("processes") or (s.get("util_gpu_percent_max") or 0) > 0:
            continue
        if low > IDLE_POWER_RATIO * limit:
            out.append(Finding(
                id="gpu.idle_power", verdict=Verdict.WARN, gpu=uuid,
                summary=f"idle GPU draws {low:.0f} W of its {limit:.0f} W limit for the whole window",
                evidence={"power_watts_min": low, "power_limit_watts": limit,
                          "window_seconds": facts["gpu_samples"].get("seconds")},
                action="check for a stuck context or clocks pinned by another tool; reset the GPU if it persists"))
    return out


@check("gpu.throttle_window", needs=("gpu_samples",))
def throttle_window(facts: Facts, cfg: Config) -> List[Finding]:
    """A hardware slowdown seen at any moment of the window, even if the snapshot missed it."""
    out = []
    for uuid, s in facts["gpu_samples"].get("summary", {}).items():
        seen = [r for r in s.get("clock_event_names", []) if r in HW_REASONS]
        if seen:
            out.append(Finding(
                id="gpu.throttle_window", verdict=Verdict.WARN, gpu=uuid,
                summary=f"hardware slowdown during the sampling window: {', '.join(seen)}",
                evidence={"reasons": seen, "sm_clock_mhz_min": s.get("sm_clock_mhz_min"),
                          "sm_clock_max_mhz": s.get("sm_clock_max_mhz")},
                action="check cooling and power delivery of this GPU before a long run"))
    return out
