"""The Prolog's peer figures as ``slurm_triage_peer_*`` gauges, for the gang gate.

The gate compares the nodes of one allocation with each other from a single Pushgateway
query, so the figures that must match across a gang travel in the Prolog's own group.
The text is written by hand (no prometheus_client import: this runs in the Prolog) and
appended to the group's exposition body; the family names below are used nowhere else.
Base units, as everywhere: the max SM clock goes out in hertz.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

P = "slurm_triage_peer_"

# (metric suffix, peer key, scale, help): numeric figures, one sample each.
NUMERIC: Tuple[Tuple[str, str, float, str], ...] = (
    ("gpus", "gpu_count", 1, "GPUs NVML reports on the node (peer comparison)."),
    ("idle_temperature_celsius", "idle_temp_celsius", 1, "Median GPU temperature at allocation (idle)."),
    ("sm_clock_max_hertz", "max_sm_clock_mhz", 1e6, "Lowest maximum SM clock among the node's GPUs."),
    ("power_limit_watts", "power_limit_watts", 1, "Lowest enforced power limit among the node's GPUs."),
    ("pcie_link_width", "pcie_width", 1, "Narrowest current PCIe link width among the node's GPUs."),
)
# String figures travel as labels of one info gauge.
INFO_LABELS: Tuple[Tuple[str, str], ...] = (("gpu_name", "gpu_name"), ("driver_version", "driver_version"))
INFO = P + "info"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def render(peer: Optional[Dict[str, Any]]) -> bytes:
    """Exposition text (with ``# TYPE``) for a ``sampling.peer_figures`` dict; b"" for None."""
    if not peer:
        return b""
    out: List[str] = []
    for suffix, key, scale, doc in NUMERIC:
        v = _number(peer.get(key))
        if v is None:
            continue
        name = P + suffix
        out += [f"# HELP {name} {doc}", f"# TYPE {name} gauge", f"{name} {v * scale!r}"]
    labels = ",".join(f'{label}="{_escape(str(peer.get(key) or ""))}"' for label, key in INFO_LABELS)
    out += [f"# HELP {INFO} GPU model and driver of the node (peer comparison).", f"# TYPE {INFO} gauge",
            f"{INFO}{{{labels}}} 1.0"]
    return ("\n".join(out) + "\n").encode("utf-8")


def parse_group(group: Dict[str, Any]) -> Dict[str, Any]:
    """The peer figures back from one group of the Pushgateway's ``/api/v1/metrics`` answer.

    Keys as in ``sampling.peer_figures``; a figure the group lacks is absent.
    """
    peer: Dict[str, Any] = {}
    for suffix, key, scale, _ in NUMERIC:
        fam = group.get(P + suffix)
        if not fam or not fam.get("metrics"):
            continue
        try:
            v = float(fam["metrics"][0]["value"]) / scale
        except (KeyError, TypeError, ValueError):
            continue
        peer[key] = int(v) if v.is_integer() and key != "idle_temp_celsius" else v
    fam = group.get(INFO)
    if fam and fam.get("metrics"):
        labels = fam["metrics"][0].get("labels") or {}
        for label, key in INFO_LABELS:
            if labels.get(label):
                peer[key] = labels[label]
    return peer
