"""InfiniBand/RoCE checks: ports that are down or slow, error counters that rise.

A GPU node whose fabric port is down cannot run a gang-scheduled job: FAIL (hardware).
Ports an admin disabled (phys_state ``Disabled``) are intentional and skipped. Error
counters are judged by how much they rose since the baseline snapshot the hooks put in
``facts["baseline"]["rdma"]``; without a baseline only the absolute counters that mean
link trouble on their own are looked at.
"""
from __future__ import annotations

from typing import Any, Dict, List, Tuple

from ..config import Config
from ..model import Finding, Verdict
from . import Facts, check

# counter -> rise (since baseline) at which we WARN. Link-level counters first, then mlx5
# transport counters (hw_counters), which also move a little under congestion.
RISE_WARN: Dict[str, int] = {
    "link_downed": 1, "link_error_recovery": 1, "symbol_error": 10, "port_rcv_errors": 10,
    "local_link_integrity_errors": 1, "excessive_buffer_overrun_errors": 1,
    "port_rcv_remote_physical_errors": 10, "port_xmit_discards": 100,
    "local_ack_timeout_err": 10, "rnr_nak_retry_err": 10, "packet_seq_err": 100,
    "implied_nak_seq_err": 100, "out_of_sequence": 1000, "req_cqe_error": 10, "resp_cqe_error": 10,
}
# Without a baseline: absolute values that already mean an unstable link since boot.
ABSOLUTE_WARN: Dict[str, int] = {"link_downed": 1, "symbol_error": 100}

Key = Tuple[str, Any]


def _port_name(p: Dict[str, Any]) -> str:
    return f"{p['device']} port {p['port']}"


def _all_counters(p: Dict[str, Any]) -> Dict[str, int]:
    out = dict(p.get("counters") or {})
    out.update(p.get("hw_counters") or {})
    return out


@check("rdma.port", needs=("rdma",))
def port(facts: Facts, cfg: Config) -> List[Finding]:
    """RDMA port not ACTIVE/LinkUp -> FAIL (hardware); below rdma.expected_rate_gbps -> WARN."""
    expected = cfg.get("rdma", "expected_rate_gbps")
    findings: List[Finding] = []
    for p in facts["rdma"].get("ports", []):
        ev = {"device": p["device"], "port": p["port"], "state": p.get("state"),
              "phys_state": p.get("phys_state"), "rate_gbps": p.get("rate_gbps"), "link_layer": p.get("link_layer")}
        if p.get("phys_state") == "Disabled":
            continue
        if p.get("state") != "ACTIVE" or p.get("phys_state") != "LinkUp":
            findings.append(Finding(
                id="rdma.port", verdict=Verdict.FAIL, hardware=True, evidence=ev,
                summary=f"{_port_name(p)} is {p.get('state')}/{p.get('phys_state')}, not ACTIVE/LinkUp",
                action="check the cable, transceiver and switch port (ibstat, mlxlink); drain until the link is up"))
        elif expected > 0 and (p.get("rate_gbps") or 0.0) < expected:
            findings.append(Finding(
                id="rdma.port", verdict=Verdict.WARN, evidence={**ev, "expected_rate_gbps": expected},
                summary=f"{_port_name(p)} runs at {p.get('rate_gbps')} Gb/s, expected {expected:g}",
                action="a degraded link width/speed: check the cable and transceiver, reseat at next maintenance"))
    return findings


@check("rdma.errors", needs=("rdma",))
def errors(facts: Facts, cfg: Config) -> List[Finding]:
    """RDMA error counters rising since the baseline (or high since boot without one) -> WARN."""
    base_ports = ((facts.get("baseline") or {}).get("rdma") or {}).get("ports")
    before: Dict[Key, Dict[str, int]] = {(p["device"], p["port"]): _all_counters(p) for p in base_ports or []}
    findings: List[Finding] = []
    for p in facts["rdma"].get("ports", []):
        now = _all_counters(p)
        if base_ports is not None:
            old = before.get((p["device"], p["port"]))
            if old is None:
                continue  # a port that appeared since the baseline: nothing to compare
            # A negative delta means the counter was reset (driver reload): skip it.
            rises = {c: now[c] - old[c] for c, limit in RISE_WARN.items()
                     if c in now and c in old and now[c] - old[c] >= limit}
            if rises:  # listed in RISE_WARN order: link-level counters first
                findings.append(Finding(
                    id="rdma.errors", verdict=Verdict.WARN,
                    summary=f"{_port_name(p)}: " + ", ".join(f"{c} +{d}" for c, d in rises.items())
                            + " since the baseline",
                    evidence={"device": p["device"], "port": p["port"], "rises": rises,
                              "values": {c: now[c] for c in rises}},
                    action="check the link (cable, transceiver, switch port); "
                           "rising link_downed/symbol_error means a flapping or marginal link"))
        else:
            high = {c: now[c] for c, limit in ABSOLUTE_WARN.items() if now.get(c, 0) >= limit}
            if high:
                findings.append(Finding(
                    id="rdma.errors", verdict=Verdict.WARN,
                    summary=f"{_port_name(p)}: " + ", ".join(f"{c}={v}" for c, v in high.items())
                            + " since the counters were last cleared (no baseline to compare)",
                    evidence={"device": p["device"], "port": p["port"], "values": high},
                    action="compare with the next snapshot; clear counters (perfquery -x -R) after fixing the link"))
    return findings
