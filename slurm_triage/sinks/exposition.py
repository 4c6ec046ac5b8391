"""Prometheus text exposition of a snapshot and its findings.

One function feeds both the Pushgateway and the textfile collector; ``to_text`` (shared
with the in-step watcher) serializes families. prometheus_client is imported inside
``to_text`` because the import costs 150-270 ms and the Prolog pays it only when it
actually pushes or writes a textfile. Every family carries ``# TYPE`` (the
Pushgateway answers 400 when typed and untyped pushes of one name meet); names use the
``slurm_triage_`` prefix and base units; a value that is None (NVML: not supported) or a
section that is None (probe failed) simply yields no sample.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ..model import Finding, Verdict, worst

P = "slurm_triage_"
GPU_LABELS = ("gpu_uuid", "pci_bus_id", "index")

# (metric suffix, snapshot key, scale, help) for one sample per GPU.
GPU_GAUGES: Sequence[Tuple[str, str, float, str]] = (
    ("temperature_celsius", "temperature_celsius", 1, "GPU core temperature."),
    ("slowdown_temperature_celsius", "slowdown_temp_celsius", 1, "Temperature at which the GPU slows down."),
    ("shutdown_temperature_celsius", "shutdown_temp_celsius", 1, "Temperature at which the GPU shuts down."),
    ("power_watts", "power_watts", 1, "Power draw."),
    ("power_limit_watts", "power_limit_watts", 1, "Enforced power limit."),
    ("utilization_ratio", "util_gpu_percent", 0.01, "Fraction of time a kernel was running."),
    ("memory_utilization_ratio", "util_mem_percent", 0.01, "Fraction of time device memory was read or written."),
    ("memory_used_bytes", "mem_used_bytes", 1, "Device memory in use."),
    ("memory_total_bytes", "mem_total_bytes", 1, "Device memory size."),
    ("sm_clock_hertz", "sm_clock_mhz", 1e6, "Current SM clock."),
    ("sm_clock_max_hertz", "sm_clock_max_mhz", 1e6, "Maximum SM clock."),
    ("row_remap_pending", "remap_pending", 1, "1 when a row remap waits for a GPU reset."),
    ("row_remap_failure", "remap_failure", 1, "1 when a row remap failed (replace the GPU)."),
    ("retired_pages_pending", "retired_pages_pending", 1, "1 when a page retirement waits for a reset."),
    ("pcie_link_gen", "pcie_gen", 1, "Current PCIe link generation."),
    ("pcie_link_gen_max", "pcie_gen_max", 1, "Maximum PCIe link generation."),
    ("pcie_link_width", "pcie_width", 1, "Current PCIe link width (lanes)."),
    ("pcie_link_width_max", "pcie_width_max", 1, "Maximum PCIe link width (lanes)."),
    ("lost", "lost", 1, "1 when the GPU is lost or unreachable."),
)
# Monotonic GPU counters; the family name gets _total from prometheus_client.
GPU_COUNTERS: Sequence[Tuple[str, str, str]] = (
    ("energy_joules", "energy_joules", "Energy consumed since the driver loaded."),
    ("ecc_uncorrected_volatile_errors", "ecc_uncorrected_volatile", "Uncorrected ECC errors since the last reset."),
    ("ecc_uncorrected_aggregate_errors", "ecc_uncorrected_aggregate", "Uncorrected ECC errors over the GPU's life."),
)
# extra= keys: (metric name, is_counter, help).
EXTRA: Dict[str, Tuple[str, bool, str]] = {
    "internal_errors": ("internal_errors", True, "slurm-triage's own faults (failed open)."),
    "spooled_pushes": ("spooled_pushes", False, "Pushes waiting in the local spool."),
    "spool_dropped": ("spool_dropped", True, "Spooled pushes dropped (spool full or rejected)."),
    "hook_duration_seconds": ("hook_duration_seconds", False, "Wall time of the hook that pushed this group."),
    "leftover_processes": ("leftover_processes", False, "Processes of the job still alive at its Epilog."),
    "drain_suppressed": ("drain_suppressed", True, "Drains of this node the circuit breaker held back ([drain] max_nodes/max_fraction)."),
}
# gpu_diff keys of the Epilog's job summary: (metric suffix, key, help).
JOB_GPU: Sequence[Tuple[str, str, str]] = (
    ("energy_joules", "energy_joules", "Energy the GPU used during the job."),
    ("max_temperature_celsius", "max_temperature_celsius", "Highest GPU temperature seen during the job."),
    ("ecc_uncorrected_errors", "ecc_uncorrected_volatile_delta", "Uncorrected ECC errors during the job."),
)


def _num(v: Any) -> Optional[float]:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    return None


def _families(snapshot: Dict[str, Any], findings: Optional[List[Finding]],
              extra: Dict[str, float], gpus: bool) -> Iterable[Any]:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    if findings is not None:
        verdict = worst(f.verdict for f in findings)
        g = GaugeMetricFamily(P + "node_verdict", "1 for the node's worst verdict, 0 for the others.",
                              labels=["verdict"])
        for v in Verdict:
            g.add_metric([v.value], 1.0 if v is verdict else 0.0)
        yield g
        counts = Counter((f.id, f.verdict.value, f.gpu or "", "" if f.pid is None else str(f.pid),
                          "true" if f.hardware else "false") for f in findings)
        g = GaugeMetricFamily(P + "findings", "Findings of the last check, by check, verdict, GPU and process.",
                              labels=["check", "verdict", "gpu_uuid", "pid", "hardware"])
        for labels, n in sorted(counts.items()):
            g.add_metric(list(labels), float(n))
        if counts:
            yield g
    t = _num(snapshot.get("time"))
    if t is not None:
        yield GaugeMetricFamily(P + "check_timestamp_seconds", "When the snapshot was taken (unix time).", value=t)
    errors = snapshot.get("errors") or {}
    durations = snapshot.get("probe_seconds") or {}
    probes = sorted(set(durations) | set(errors))
    if probes:
        d = GaugeMetricFamily(P + "probe_duration_seconds", "Wall time of each collector probe.", labels=["probe"])
        up = GaugeMetricFamily(P + "probe_up", "1 when the probe returned facts, 0 when it failed or timed out.",
                               labels=["probe"])
        for p in probes:
            if _num(durations.get(p)) is not None:
                d.add_metric([p], float(durations[p]))
            up.add_metric([p], 0.0 if p in errors or snapshot.get(p) is None else 1.0)
        yield d
        yield up
    if gpus:
        yield from _gpu_families(snapshot.get("gpu"))
    for key in sorted(extra):
        name, counter, doc = EXTRA[key]
        cls = CounterMetricFamily if counter else GaugeMetricFamily
        yield cls(P + name, doc, value=float(extra[key]))


def _gpu_families(gpu: Optional[Dict[str, Any]]) -> Iterable[Any]:
    from prometheus_client.core import CounterMetricFamily as Counter_, GaugeMetricFamily as Gauge

    if not gpu:
        return
    yield Gauge(P + "gpus", "GPUs NVML reports on this node.", value=float(gpu.get("count", len(gpu.get("gpus") or []))))
    info = Gauge(P + "gpu_driver_info", "NVIDIA driver and NVML versions.", labels=["driver_version", "nvml_version"])
    info.add_metric([str(gpu.get("driver_version") or ""), str(gpu.get("nvml_version") or "")], 1.0)
    yield info
    gpus = gpu.get("gpus") or []
    keyed = [([str(g.get("uuid") or ""), str(g.get("pci_bus_id") or ""), str(g.get("index", ""))], g) for g in gpus]
    fam = Gauge(P + "gpu_info", "One series per GPU, keyed by UUID and PCI bus id.",
                labels=list(GPU_LABELS) + ["minor", "name"])
    for labels, g in keyed:
        fam.add_metric(labels + [str(g.get("minor", "")), str(g.get("name") or "")], 1.0)
    yield fam
    for suffix, key, scale, doc in GPU_GAUGES:
        fam = Gauge(P + "gpu_" + suffix, doc, labels=list(GPU_LABELS))
        for labels, g in keyed:
            v = _num(g.get(key))
            if v is not None:
                fam.add_metric(labels, v * scale)
        if fam.samples:
            yield fam
    for suffix, key, doc in GPU_COUNTERS:
        fam = Counter_(P + "gpu_" + suffix, doc, labels=list(GPU_LABELS))
        for labels, g in keyed:
            v = _num(g.get(key))
            if v is not None:
                fam.add_metric(labels, v)
        if fam.samples:
            yield fam
    fam = Gauge(P + "gpu_processes", "Compute processes NVML lists on the GPU.", labels=list(GPU_LABELS))
    for labels, g in keyed:
        if isinstance(g.get("processes"), list):
            fam.add_metric(labels, float(len(g["processes"])))
    if fam.samples:
        yield fam
    fam = Gauge(P + "gpu_clock_event_reason", "1 for each active clock event (throttle) reason.",
                labels=list(GPU_LABELS) + ["reason"])
    for labels, g in keyed:
        for reason in sorted(set(g.get("clock_event_names") or [])):
            fam.add_metric(labels + [str(reason)], 1.0)
    if fam.samples:
        yield fam


def _job_families(gpu_diff: Dict[str, Dict[str, Any]]) -> Iterable[Any]:
    from prometheus_client.core import GaugeMetricFamily

    for suffix, key, doc in JOB_GPU:
        fam = GaugeMetricFamily(P + "job_gpu_" + suffix, doc, labels=["gpu_uuid", "index"])
        for uuid, d in sorted(gpu_diff.items()):
            v = _num(d.get(key))
            if v is not None:
                fam.add_metric([uuid, str(d.get("index", ""))], v)
        if fam.samples:
            yield fam


def render(snapshot: Dict[str, Any], findings: Optional[List[Finding]],
           extra: Optional[Dict[str, float]] = None, gpu_diff: Optional[Dict[str, Dict[str, Any]]] = None,
           more: Iterable[Any] = (), labels: Optional[Dict[str, str]] = None, gpus: bool = True) -> bytes:
    """The exposition text for ``snapshot`` and ``findings`` (None: no verdict families).

    ``extra`` takes the keys of EXTRA, e.g. ``{"internal_errors": 1, **spool.stats(cfg)}``;
    ``gpu_diff`` is the Epilog's per-GPU job summary; ``more`` adds families built elsewhere;
    ``labels`` are added to every sample (e.g. the job id of a group keyed by node only);
    ``gpus=False`` leaves out the per-GPU series (the Prolog's lean Pushgateway group).
    """
    extra = dict(extra or {})
    unknown = set(extra) - set(EXTRA)
    if unknown:
        raise ValueError(f"unknown extra metric keys: {sorted(unknown)} (known: {sorted(EXTRA)})")
    families = list(_families(snapshot or {}, findings, extra, gpus))
    families.extend(_job_families(gpu_diff or {}))
    families.extend(more)
    for fam in families if labels else ():
        fam.samples = [smp._replace(labels={**smp.labels, **labels}) for smp in fam.samples]
    return to_text(families)


def to_text(families: Iterable[Any]) -> bytes:
    """Text exposition of ready-made metric families (no default registry, no process metrics)."""
    from prometheus_client import CollectorRegistry, generate_latest

    fams = list(families)

    class _Static:
        def collect(self) -> Iterable[Any]:
            return fams

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Static())
    return generate_latest(registry)
