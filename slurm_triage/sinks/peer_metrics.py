"""The Prolog's peer figures as ``slurm_triage_peer_*`` gauges, for the gang gate.

The gate compares the nodes of one allocation with each other from a single Pushgateway
query, so the figures that must match across a gang travel in the Prolog's own group.
The families go into the group's exposition through ``exposition.render(more=...)``;
the family names below are used nowhere else.
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


def _number(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def families(peer: Optional[Dict[str, Any]]) -> List[Any]:
    """prometheus_client families for a ``sampling.peer_figures`` dict; [] for None."""
    if not peer:
        return []
    from prometheus_client.core import GaugeMetricFamily

    out: List[Any] = []
    for suffix, key, scale, doc in NUMERIC:
        v = _number(peer.get(key))
        if v is not None:
            out.append(GaugeMetricFamily(P + suffix, doc, value=v * scale))
    info = GaugeMetricFamily(INFO, "GPU model and driver of the node (peer comparison).",
                             labels=[label for label, _ in INFO_LABELS])
    info.add_metric([str(peer.get(key) or "") for _, key in INFO_LABELS], 1.0)
    out.append(info)
    return out


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
