"""GPU checks over the ``gpu`` facts of collect/gpu.py: pure, no I/O.

Each GPU is named by UUID (and PCI bus id in the text), never by NVML index alone.
No finding means OK. Thresholds come from the GPU itself (its own slowdown temperature),
because they differ per SKU and driver; nothing here hard-codes a temperature.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List

from ..config import Config
from ..model import Finding, Verdict
from . import check, Facts

# Reasons that mean the hardware itself pulls the clocks down (not idle, not app settings).
HW_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
_HW_TEXT = {"hw_slowdown": "HW slowdown", "hw_thermal_slowdown": "HW thermal slowdown",
            "hw_power_brake_slowdown": "HW power brake slowdown"}


def _gpus(facts: Facts) -> Iterator[Dict[str, Any]]:
    # Facts may be partial (a lost GPU filled from the inventory, an older snapshot): .get only.
    yield from (facts.get("gpu") or {}).get("gpus") or []


def _who(g: Dict[str, Any]) -> str:
    """'GPU 3 (GPU-…, 0000:5d:00.0)' with whatever identity NVML still gave."""
    ids = ", ".join(x for x in (g.get("uuid"), g.get("pci_bus_id")) if x)
    index = g.get("index")
    return ("GPU" if index is None else f"GPU {index}") + (f" ({ids})" if ids else "")


def _evidence(facts: Facts, g: Dict[str, Any], **values: Any) -> Dict[str, Any]:
    ev: Dict[str, Any] = {"index": g.get("index"), "pci_bus_id": g.get("pci_bus_id")}
    ev.update(values)
    ev["seen_at"] = facts.get("time")
    return ev


def _hw_slowdowns(g: Dict[str, Any]) -> List[str]:
    """The HW_REASONS among the GPU's active clock event reasons."""
    return [r for r in HW_REASONS if r in (g.get("clock_event_names") or [])]


def _hw_text(hw: List[str]) -> str:
    return ", ".join(_HW_TEXT[r] for r in hw)


@check("gpu.count", needs=("gpu",))
def gpu_count(facts: Facts, cfg: Config) -> List[Finding]:
    """NVML sees as many GPUs as gpu.expected_count says (-1: not checked)."""
    expected, seen = cfg.get("gpu", "expected_count"), (facts.get("gpu") or {}).get("count")
    if expected < 0 or seen is None or seen == expected:
        return []
    ev = {"expected_count": expected, "count": seen, "seen_at": facts.get("time")}
    if seen < expected:
        return [Finding("gpu.count", Verdict.FAIL, f"NVML sees {seen} GPUs, {expected} expected", evidence=ev,
                        action="a GPU is missing: look for Xid 79 / 'fallen off the bus' in the kernel log, "
                               "then power-cycle the node or reseat/RMA the GPU", hardware=True)]
    return [Finding("gpu.count", Verdict.WARN, f"NVML sees {seen} GPUs, only {expected} expected", evidence=ev,
                    action="set gpu.expected_count to this node's real GPU count")]


@check("gpu.lost", needs=("gpu",))
def gpu_lost(facts: Facts, cfg: Config) -> List[Finding]:
    """A GPU answers NVML_ERROR_GPU_IS_LOST (fallen off the bus / unreachable)."""
    return [Finding("gpu.lost", Verdict.FAIL, f"{_who(g)} is lost: NVML answers GPU_IS_LOST (fallen off the bus, Xid 79)", gpu=g.get("uuid"),
                    evidence=_evidence(facts, g, errors=g.get("errors", {})),
                    action="drain the node; check the kernel log for Xid 79 on this bus id; power-cycle "
                           "(a reset does not bring it back), then reseat or RMA the GPU if it recurs",
                    hardware=True)
            for g in _gpus(facts) if g.get("lost")]


@check("gpu.ecc", needs=("gpu",))
def gpu_ecc(facts: Facts, cfg: Config) -> List[Finding]:
    """Uncorrectable ECC errors: volatile (since driver load) FAIL, aggregate (lifetime) WARN."""
    out = []
    for g in _gpus(facts):
        vol, agg = g.get("ecc_uncorrected_volatile") or 0, g.get("ecc_uncorrected_aggregate") or 0
        ev = _evidence(facts, g, ecc_uncorrected_volatile=vol, ecc_uncorrected_aggregate=agg)
        if vol > 0:
            out.append(Finding("gpu.ecc", Verdict.FAIL, f"{_who(g)}: {vol} uncorrectable ECC errors since driver load",
                               gpu=g.get("uuid"), evidence=ev, hardware=True,
                               action="drain the node; reset the GPU or reboot to trigger row remapping, then "
                                      "check gpu.row_remap; RMA if uncorrectable errors come back"))
        elif agg > 0:
            out.append(Finding("gpu.ecc", Verdict.WARN, f"{_who(g)}: {agg} uncorrectable ECC errors in its lifetime",
                               gpu=g.get("uuid"), evidence=ev,
                               action="watch the trend; RMA if the count grows or rows fail to remap"))
    return out


@check("gpu.row_remap", needs=("gpu",))
def gpu_row_remap(facts: Facts, cfg: Config) -> List[Finding]:
    """Row remapping failed (FAIL) or is pending until the next GPU reset (WARN)."""
    out = []
    for g in _gpus(facts):
        ev = _evidence(facts, g, remap_failure=g.get("remap_failure"), remap_pending=g.get("remap_pending"))
        if g.get("remap_failure"):
            out.append(Finding("gpu.row_remap", Verdict.FAIL, f"{_who(g)}: row remapping failed (no spare rows)",
                               gpu=g.get("uuid"), evidence=ev, hardware=True,
                               action="drain the node and RMA the GPU: its memory can no longer repair itself"))
        elif g.get("remap_pending"):
            out.append(Finding("gpu.row_remap", Verdict.WARN, f"{_who(g)}: a row remap is pending",
                               gpu=g.get("uuid"), evidence=ev,
                               action="reset the GPU (nvidia-smi -r -i <bus id> while idle) or reboot the node "
                                      "to apply the pending remap"))
    return out


@check("gpu.temperature", needs=("gpu",))
def gpu_temperature(facts: Facts, cfg: Config) -> List[Finding]:
    """Temperature against the GPU's own slowdown threshold (minus gpu.temperature_margin_celsius)."""
    margin = cfg.get("gpu", "temperature_margin_celsius")
    out = []
    for g in _gpus(facts):
        temp, slowdown = g.get("temperature_celsius"), g.get("slowdown_temp_celsius")
        if temp is None or slowdown is None or temp < slowdown - margin:
            continue
        hw = _hw_slowdowns(g)
        ev = _evidence(facts, g, temp_celsius=temp, slowdown_celsius=slowdown, margin_celsius=margin,
                       clock_event_names=g.get("clock_event_names"))
        if temp >= slowdown and hw:
            out.append(Finding("gpu.temperature", Verdict.FAIL,
                               f"{_who(g)} at {temp} °C, at/above its {slowdown} °C slowdown threshold, "
                               f"with {_hw_text(hw)} active",
                               gpu=g.get("uuid"), evidence=ev, hardware=True,
                               action="drain the node and check its cooling (fans, airflow, inlet temperature, "
                                      "heatsink contact) before it runs jobs again"))
        else:
            out.append(Finding("gpu.temperature", Verdict.WARN,
                               f"{_who(g)} at {temp} °C, within {margin:g} °C of its {slowdown} °C slowdown threshold",
                               gpu=g.get("uuid"), evidence=ev,
                               action="check the node's cooling; the GPU will slow down if it gets hotter"))
    return out


@check("gpu.throttle", needs=("gpu",))
def gpu_throttle(facts: Facts, cfg: Config) -> List[Finding]:
    """Hardware clock slowdown (HW slowdown / HW thermal / HW power brake) is active."""
    out = []
    for g in _gpus(facts):
        hw = _hw_slowdowns(g)
        if not hw:
            continue
        out.append(Finding("gpu.throttle", Verdict.WARN,
                           f"{_who(g)}: {_hw_text(hw)} active, SM clock "
                           f"{g.get('sm_clock_mhz')} of {g.get('sm_clock_max_mhz')} MHz",
                           gpu=g.get("uuid"),
                           evidence=_evidence(facts, g, clock_event_reasons=g.get("clock_event_reasons"),
                                              clock_event_names=g.get("clock_event_names"),
                                              sm_clock_mhz=g.get("sm_clock_mhz"),
                                              sm_clock_max_mhz=g.get("sm_clock_max_mhz"),
                                              temp_celsius=g.get("temperature_celsius"),
                                              power_watts=g.get("power_watts")),
                           action="HW thermal: check cooling; HW power brake / HW slowdown: check the PSUs and "
                                  "the board's power-brake signal (BMC/SEL log); this GPU drags every collective"))
    return out


@check("gpu.pcie", needs=("gpu",))
def gpu_pcie(facts: Facts, cfg: Config) -> List[Finding]:
    """PCIe link narrower than its maximum, or slower while busy (idle GPUs downshift gen)."""
    out = []
    for g in _gpus(facts):
        width, wmax, gen, gmax = g.get("pcie_width"), g.get("pcie_width_max"), g.get("pcie_gen"), g.get("pcie_gen_max")
        narrow = width is not None and wmax is not None and width < wmax
        slow = (gen is not None and gmax is not None and gen < gmax and (g.get("util_gpu_percent") or 0) > 0)
        if not (narrow or slow):
            continue
        out.append(Finding("gpu.pcie", Verdict.WARN,
                           f"{_who(g)}: PCIe link Gen{gen} x{width}, capable of Gen{gmax} x{wmax}",
                           gpu=g.get("uuid"),
                           evidence=_evidence(facts, g, pcie_gen=gen, pcie_gen_max=gmax, pcie_width=width,
                                              pcie_width_max=wmax, util_gpu_percent=g.get("util_gpu_percent")),
                           action="reseat the GPU/riser and check PCIe AER errors in the kernel log; a degraded "
                                  "link slows host<->GPU and GPUDirect RDMA traffic"))
    return out


@check("gpu.recovery_action", needs=("gpu",))
def gpu_recovery_action(facts: Facts, cfg: Config) -> List[Finding]:
    """The driver asks for a recovery action (GPU reset, node reboot, ...): newer drivers' field."""
    from .. import xid_codes

    out: List[Finding] = []
    for g in _gpus(facts):
        code = g.get("recovery_action")
        if not code:
            continue  # None: not supported / not read; 0: no action needed
        what, verdict = xid_codes.RECOVERY_ACTIONS.get(code, (f"an unknown recovery action ({code})", xid_codes.WARN))
        fail = verdict == xid_codes.FAIL
        out.append(Finding(
            "gpu.recovery_action", Verdict.FAIL if fail else Verdict.WARN,
            f"{_who(g)}: the driver asks for {what} (recovery action {code})", gpu=g.get("uuid"),
            evidence=_evidence(facts, g, recovery_action=code, recovery_action_name=what),
            action=f"drain the node and do the {what}; run diagnostics before returning it" if fail
            else f"{what}; the node itself can stay in service",
            hardware=fail))
    return out
