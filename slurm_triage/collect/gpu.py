"""GPU facts from NVML (pynvml), one dict per GPU keyed by UUID and PCI bus id.

Runs inside a forked child under a deadline (snapshot.take), because an NVML call on a
wedged GPU can block forever; the parent kills the child and reports UNKNOWN. pynvml is
imported here, lazily (through collect.nvml, without ctypes.util), so the parent never pays for it. Units follow the key names
(NVML's mW/mJ are converted to W/J).
"""
from __future__ import annotations

import ctypes
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from .. import pci
from ..config import Config

# Clock event ("throttle") reason bits, as in NVIDIA's nvml.h 13.x (nvmlClocksEventReason* /
# nvmlClocksThrottleReason*); tests/fakenvml `make check-header` pins them to the header.
CLOCK_EVENT_REASONS = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
    (0x200, "board_limit"),
    (0x400, "reliability"),
)

GPU_KEYS = (
    "index", "uuid", "pci_bus_id", "minor", "name", "pci_device_id",
    "temperature_celsius", "slowdown_temp_celsius", "shutdown_temp_celsius",
    "power_watts", "power_limit_watts", "energy_joules", "util_gpu_percent", "util_mem_percent",
    "mem_used_bytes", "mem_total_bytes", "sm_clock_mhz", "sm_clock_max_mhz",
    "clock_event_reasons", "clock_event_names", "ecc_uncorrected_volatile", "ecc_uncorrected_aggregate",
    "remap_pending", "remap_failure", "retired_pages_pending", "processes",
    "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max", "nvlink", "persistence_mode",
    "recovery_action",
)
RECOVERY_ACTION_FIELD = 230
"""NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvml.h), for pynvml releases that lack the name."""


def decode_clock_events(mask: int) -> List[str]:
    """Names of the reason bits set in ``mask`` (unknown bits are ignored)."""
    return [name for bit, name in CLOCK_EVENT_REASONS if mask & bit]


def collect(cfg: Config, indices: Optional[Sequence[int]] = None) -> Dict[str, Any]:
    """Query every GPU (or only NVML ``indices``, the job's GPUs) once."""
    library = cfg.get("gpu", "nvml_library")
    if library:
        # Loaded first, by absolute path: pynvml's later CDLL("libnvidia-ml.so.1") is then
        # satisfied by this object through its SONAME (LD_LIBRARY_PATH would be too late).
        ctypes.CDLL(library)
    from .nvml import pynvml

    t0 = time.monotonic()
    pynvml.nvmlInit()  # without persistence mode the driver sets up every GPU here: 100s of ms
    init_seconds = time.monotonic() - t0
    codes = {getattr(pynvml, n): n for n in dir(pynvml) if n.startswith("NVML_ERROR_")}  # once, not per GPU
    try:
        count = pynvml.nvmlDeviceGetCount()
        wanted = range(count) if indices is None else sorted({i for i in indices if 0 <= i < count})
        return {
            "library": library or "libnvidia-ml.so.1",
            "driver_version": _text(pynvml.nvmlSystemGetDriverVersion()),
            "nvml_version": _text(pynvml.nvmlSystemGetNVMLVersion()),
            "count": count,
            "nvml_init_seconds": round(init_seconds, 4),
            "gpus": [_Reader(pynvml, i, codes).read() for i in wanted],
        }
    finally:
        pynvml.nvmlShutdown()


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class _Reader:
    """Reads one GPU; every field is independent, so one failing call costs one field."""

    def __init__(self, nv: Any, index: int, codes: Dict[int, str]):
        self.nv = nv
        self.g: Dict[str, Any] = dict.fromkeys(GPU_KEYS)
        self.g.update(index=index, lost=False, unsupported=[], errors={})
        self.codes = codes  # NVML return code -> its NVML_ERROR_* name

    def call(self, key: str, fn: Callable[[], Any]) -> Any:
        """fn() or None; NOT_SUPPORTED -> ``unsupported``, else -> ``errors``; GPU_IS_LOST -> lost."""
        if self.g["lost"]:
            return None  # every further call would fail the same way, maybe slowly
        try:
            return fn()
        except self.nv.NVMLError as e:
            self.record(key, e)
        except self.nv.NVMLLibraryMismatchError as e:  # pynvml's "symbol missing" for versioned calls
            self.g["errors"][key] = f"NVMLLibraryMismatchError: {e}"
        return None

    def record(self, key: str, e: Any) -> None:
        if e.value == self.nv.NVML_ERROR_NOT_SUPPORTED:
            self.g["unsupported"].append(key)
        else:
            self.g["errors"][key] = self.codes.get(e.value, f"NVML_ERROR_{e.value}")
        if e.value == self.nv.NVML_ERROR_GPU_IS_LOST:
            self.g["lost"] = True

    def newer(self, new: str, old: str, *args: Any) -> Callable[[], Any]:
        """Call pynvml's ``new`` wrapper, falling back to the deprecated ``old`` one on older
        drivers (FunctionNotFound) or older pynvml (no wrapper)."""

        def fn() -> Any:
            wrapper = getattr(self.nv, new, None)
            if wrapper is not None:
                try:
                    return wrapper(*args)
                except self.nv.NVMLError_FunctionNotFound:
                    pass
            return getattr(self.nv, old)(*args)

        return fn

    def set(self, key: str, fn: Callable[[], Any], convert: Callable[[Any], Any] = lambda v: v) -> None:
        v = self.call(key, fn)
        self.g[key] = None if v is None else convert(v)

    def read(self) -> Dict[str, Any]:
        nv, g = self.nv, self.g
        h = self.call("handle", lambda: nv.nvmlDeviceGetHandleByIndex(g["index"]))
        if h is None:
            return g
        self.set("uuid", lambda: nv.nvmlDeviceGetUUID(h), _text)
        info = self.call("pci_bus_id", lambda: nv.nvmlDeviceGetPciInfo(h))
        if info is not None:
            g["pci_bus_id"] = pci.normalize(_text(info.busId))
            g["pci_device_id"] = int(info.pciDeviceId)
        self.set("minor", lambda: nv.nvmlDeviceGetMinorNumber(h))
        self.set("name", lambda: nv.nvmlDeviceGetName(h), _text)
        self.set("temperature_celsius",
                 self.newer("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU))
        self.set("slowdown_temp_celsius",
                 lambda: nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN))
        self.set("shutdown_temp_celsius",
                 lambda: nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN))
        self.set("power_watts", lambda: nv.nvmlDeviceGetPowerUsage(h), lambda mw: mw / 1000.0)
        self.set("power_limit_watts", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h), lambda mw: mw / 1000.0)
        self.set("energy_joules", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h), lambda mj: mj / 1000.0)
        util = self.call("util_gpu_percent", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            g["util_gpu_percent"], g["util_mem_percent"] = int(util.gpu), int(util.memory)
        mem = self.call("mem_used_bytes", lambda: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2))
        if mem is not None:  # v2: "used" excludes the driver-reserved area (v1 would include it)
            g["mem_used_bytes"], g["mem_total_bytes"] = int(mem.used), int(mem.total)
        self.set("sm_clock_mhz", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        self.set("sm_clock_max_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM))
        self.set("clock_event_reasons", self.newer("nvmlDeviceGetCurrentClocksEventReasons",
                                                   "nvmlDeviceGetCurrentClocksThrottleReasons", h), int)
        if g["clock_event_reasons"] is not None:
            g["clock_event_names"] = decode_clock_events(g["clock_event_reasons"])
        self.set("ecc_uncorrected_volatile", lambda: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC))
        self.set("ecc_uncorrected_aggregate", lambda: nv.nvmlDeviceGetTotalEccErrors(
            h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_AGGREGATE_ECC))
        remap = self.call("remap_pending", lambda: nv.nvmlDeviceGetRemappedRows(h))
        if remap is not None:
            g["remap_pending"], g["remap_failure"] = bool(remap[2]), bool(remap[3])
        self.set("retired_pages_pending", lambda: nv.nvmlDeviceGetRetiredPagesPendingStatus(h), bool)
        self.set("processes", lambda: nv.nvmlDeviceGetComputeRunningProcesses(h),
                 lambda ps: [{"pid": int(p.pid), "used_bytes": p.usedGpuMemory} for p in ps])
        self.set("pcie_gen", lambda: nv.nvmlDeviceGetCurrPcieLinkGeneration(h))
        self.set("pcie_gen_max", lambda: nv.nvmlDeviceGetMaxPcieLinkGeneration(h))
        self.set("pcie_width", lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h))
        self.set("pcie_width_max", lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(h))
        g["nvlink"] = self._nvlink(h)
        self.set("persistence_mode", lambda: nv.nvmlDeviceGetPersistenceMode(h), bool)
        self._recovery_action(h)
        return g

    def _recovery_action(self, h: Any) -> None:
        """The driver's recommended recovery (newer drivers, the value behind Xid 154) from
        the field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION; a field NVML answers per value."""
        nv = self.nv
        fv = self.call("recovery_action", lambda: nv.nvmlDeviceGetFieldValues(
            h, [getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", RECOVERY_ACTION_FIELD)])[0])
        if fv is None:
            return
        if fv.nvmlReturn == nv.NVML_SUCCESS:
            self.g["recovery_action"] = int(fv.value.uiVal)
        else:
            self.record("recovery_action", nv.NVMLError(fv.nvmlReturn))

    def _nvlink(self, h: Any) -> Optional[List[Dict[str, Any]]]:
        """Links from 0 up to the first one NVML rejects (H100 SXM has 18, A100 SXM 12)."""
        nv, links = self.nv, []
        if self.g["lost"]:
            return None
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                links.append({"link": link, "active": bool(nv.nvmlDeviceGetNvLinkState(h, link))})
            except nv.NVMLError as e:
                past_last = e.value in (nv.NVML_ERROR_INVALID_ARGUMENT, nv.NVML_ERROR_NOT_SUPPORTED)
                if link == 0 or not past_last:
                    self.record("nvlink", e)
                    return None if link == 0 else links
                break
        return links
