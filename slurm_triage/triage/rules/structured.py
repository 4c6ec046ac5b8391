"""Judging the facts that :mod:`slurm_triage.triage.parsers` reads from pasted structured outputs.

What each reason, state or event name means is kept in the tables below (with their sources);
the functions only join facts across lines (a root-port AER error and the GPU below it, ranks
stuck in one collective and the one that is elsewhere) and rank them. Hardware evidence has
``tier=0`` so that a later process error on the same node follows from it; symptoms that
usually follow another failure (a time limit, a cancel, a corrected PCIe error) are
``consequence=True``. A line that the line scanner (the catalog's signatures) already turned into
an event is not judged again here; tables and blocks (nvidia-smi -q, dcgmi diag, sacct, py-spy,
Flight Recorder) are judged as a whole.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ...model import Verdict
from .. import healthy, lexicon
from ..model import LogEvent, TriageFinding, from_events
from . import Rule, prior
from .catalog import deferring_kinds
from .common import of_kind, only, ranks_text
from .slurm import _STATES as SACCT_STATES

Meaning = Tuple[str, str, Verdict, float, str]
"""(category, what it means, verdict, confidence, action)."""

# nvidia-smi -q "Clocks Event/Throttle Reasons" (nvml.h, nvmlClocksEventReasons*; NVIDIA's nvidia-smi
# man page). Idle, Applications/Display Clock Setting and Sync Boost are not failures.
CLOCK_EVENTS: Dict[str, Meaning] = {
    "hw_power_brake_slowdown": ("thermal_power", "the external power brake signal is asserted (HW Power Brake "
                                "Slowdown): a PSU, BMC or facility power event", Verdict.FAIL, 0.85,
                                "check the node's PSUs and BMC power events; drain until the brake clears"),
    "hw_thermal_slowdown": ("thermal_power", "the GPU cut its clocks in hardware for heat (HW Thermal Slowdown)",
                            Verdict.FAIL, 0.8, "check cooling (fans, airflow, inlet temperature) of that node"),
    "sw_thermal_slowdown": ("thermal_power", "the driver lowered clocks because the GPU or its memory is over its "
                            "temperature limit (SW Thermal Slowdown)", Verdict.WARN, 0.7,
                            "check cooling of that node; compare its GPU and memory temperatures with its peers'"),
    "hw_slowdown": ("thermal_power", "clocks cut by half or more in hardware (HW Slowdown: heat or power brake)",
                    Verdict.WARN, 0.65, "check the node's cooling and power supply"),
    "sw_power_cap": ("thermal_power", "the GPU is held at its power limit (SW Power Cap); normal under full load",
                     Verdict.WARN, 0.3, "only a problem when the limit is below the GPU's default or peers differ"),
}

# sinfo -R / scontrol show node reasons, first match wins. Slurm sets the first ones itself
# (slurmctld/slurmd source: "Kill task failed", "Prolog error", "Epilog error", "Not responding",
# "Node unexpectedly rebooted", "Low RealMemory"); admins and health checks set free text.
NODE_REASONS: Tuple[Tuple[str, str, float, str, str], ...] = (
    (r"^kill task failed", "scheduler", 0.7,
     "Slurm could not kill the job's processes within UnkillableStepTimeout and drained the node",
     "look for processes in D state on the node (hung filesystem, GPU driver); resume it once they are gone"),
    (r"^(?:job )?prolog (?:error|failed)", "scheduler", 0.75, "the Prolog failed on the node and Slurm drained it",
     "read the Prolog's output in slurmd's log on that node; fix it, then resume the node"),
    (r"^epilog (?:error|failed)", "scheduler", 0.6, "the Epilog failed on the node and Slurm drained it",
     "read the Epilog's output in slurmd's log on that node; fix it, then resume the node"),
    (r"not[ _]responding", "scheduler", 0.6, "slurmctld lost contact with the node's slurmd",
     "check the node is up (power, kernel panic, network) and slurmd runs"),
    (r"^node unexpectedly rebooted", "scheduler", 0.6, "the node rebooted while Slurm thought it was up",
     "check the node's console/BMC log for a crash or power event"),
    (r"^low (?:realmemory|tmpdisk|socket)", "config", 0.6,
     "the node registered fewer resources than slurm.conf declares", "fix the node's line in slurm.conf or the node"),
    # src/interfaces/gres.c: "%s count reported lower than configured (%lu < %lu)"; sinfo -R cuts it at 20 chars.
    (r"^gres/\w+ count repor", "config", 0.5,
     "slurmd found fewer GRES than slurm.conf configures: its GPU detection (gres.conf File=/AutoDetect, a slurmd "
     "built without NVML, a MIG layout changed) sees fewer devices than Gres= declares, or a GPU went missing",
     "compare slurmd -G on the node with nvidia-smi -L: when nvidia-smi sees them all, fix gres.conf/slurm.conf "
     "(or slurmd's NVML support); when it misses one, see that GPU's kernel log"),
    (r"\b(?:xid|gpu|ecc|nvlink|row remap)", "gpu_hardware", 0.5, "the node was drained for a GPU problem",
     "see the GPU evidence on that node (kernel log, nvidia-smi -q) before resuming it"),
)

# dcgmi diag tests (DCGM user guide, "DCGM Diagnostics": deployment, integration, hardware, stress).
DCGM_TESTS: Dict[str, str] = {
    "denylist": "config", "nvml library": "config", "cuda main library": "config", "cuda toolkit libraries": "config",
    "permissions and os blocks": "config", "persistence mode": "config", "environment variables": "config",
    "graphics processes": "host_resources", "page retirement/row remap": "gpu_hardware", "inforom": "gpu_hardware",
    "pcie": "gpu_hardware", "gpu memory": "gpu_hardware", "memory": "gpu_hardware", "diagnostic": "gpu_hardware",
    "sm stress": "gpu_hardware", "targeted stress": "gpu_hardware", "targeted power": "thermal_power",
    "memory bandwidth": "gpu_hardware", "memtest": "gpu_hardware", "pulse test": "thermal_power",
    "nvlink": "gpu_hardware", "eud test": "gpu_hardware",
}
# Message text that says more than the test's name (first match wins).
DCGM_MESSAGES: Tuple[Tuple[str, str], ...] = (
    (r"thermal violation|clocks event due to thermal", "thermal_power"),
    (r"did not reach desired power|power violation|power limit", "thermal_power"),
    (r"uncorrectable memory error|row remap|retired page|ecc", "gpu_hardware"),
    (r"cuInit|system not yet initialized|unsupported display driver|driver combination|persistence mode", "config"),
)
DCGM_HEALTH_SYSTEMS: Dict[str, str] = {
    "thermal": "thermal_power", "power": "thermal_power", "pcie": "gpu_hardware", "memory": "gpu_hardware",
    "inforom": "gpu_hardware", "nvlink": "gpu_hardware", "nvswitch": "gpu_hardware", "driver": "gpu_hardware",
    "sm": "gpu_hardware", "connectx": "network", "cpu": "host_resources",
}

# A temperature in a table (nvidia-smi, rocm-smi) comes without the GPU's own limits (nvidia-smi -q has
# them): NVIDIA GPUs' "GPU Slowdown Temp" lies at about 85-95 °C by model, AMD GPUs throttle on the
# edge sensor from about 90-100 °C and on the junction sensor from about 105-110 °C (nvidia-smi -q,
# rocm-smi --showtemp/--showmaxpower). At or over these a GPU is at its throttling point.
HOT_C = 90.0
HOT_JUNCTION_C = 105.0
AT_CAP = 0.98  # power draw within 2 % of the cap: held at its power limit

# Kernel modules of GPU drivers (NVIDIA's open-gpu-kernel-modules kernel-open/*, amdgpu): a call trace through
# them is a task stuck or crashed in the GPU driver; a hung task's trace so tells a stuck GPU from a hung file system.
GPU_DRIVER_MODULES = ("nvidia", "nvidia_uvm", "nvidia_modeset", "nvidia_drm", "nvidia_peermem", "nvidia_fs", "amdgpu")

# Programs that only talk to the GPU driver (NVIDIA's and AMD's management tools and daemons): one of them in
# uninterruptible sleep (ps STAT D) waits on the driver, i.e. the GPU or its driver stopped answering.
GPU_TOOLS = re.compile(r"(?:^|/)(?:nvidia-(?:smi|persistenced|docker[\w-]*|container-[\w-]+|cuda-mps-[\w-]+|"
                       r"fabricmanager)|nv-hostengine|nv-fabricmanager|dcgmi|rocm-smi|amd-smi)(?:\s|$)")

# /dev/shm (parsers/shm.py): full from SHM_FULL_PCT; under SHM_SMALL_MIB DeepSpeed's ds_report warns that it
# "might be too small" (deepspeed/env_report.py get_shm_size); Docker's default --shm-size is 64 MiB, below what
# NCCL's shared-memory transport (NCCL_BUFFSIZE, 4 MiB by default, per channel and local peer) and DataLoader
# workers' shared batches need (NCCL troubleshooting guide, "Sharing Data").
SHM_FULL_PCT = 95
SHM_SMALL_MIB = 512.0

# InfiniBand port states (IBTA spec vol. 1 §7.2; ibstat(8)): what a port that is not Active means.
IB_PROBLEMS: Tuple[Tuple[str, str, str], ...] = (
    ("Disabled", "", "the port is disabled (by an admin or the switch side)"),
    ("Polling", "", "the port has no physical link: cable unplugged or broken, or the peer port / switch is down"),
    ("LinkUp", "Initializing", "the link is up but no subnet manager has made the port Active (opensm or the "
                              "fabric's SM is not running or cannot reach it)"),
    ("LinkUp", "Armed", "the link is up but the port was left Armed by the subnet manager"),
    ("LinkErrorRecovery", "", "the link keeps failing and retraining (cable, transceiver or port)"),
    ("", "Down", "the port is down"),
)

# mlx5_core (ConnectX) kernel messages (drivers/net/ethernet/mellanox/mlx5): (regex, meaning, verdict,
# confidence, a note only). An unplugged cable is also what an unused port reports at every boot.
MLX5_MESSAGES: Tuple[Tuple[str, str, Verdict, float, bool], ...] = (
    (r"health compromised|firmware internal error|Health issue observed|fatal",
     "the NIC firmware reported itself unhealthy", Verdict.FAIL, 0.7, False),
    (r"No done completion|cmd_work_handler|exec_timeout|recovered after timeout",
     "a NIC firmware command timed out", Verdict.WARN, 0.5, False),
    (r"\bLink down\b", "the NIC port lost its link", Verdict.WARN, 0.5, False),
    (r"insufficient power", "the NIC reports insufficient PCIe slot power", Verdict.WARN, 0.5, False),
    (r"Cable (?:error|unplugged)|High Temperature|Bad parameter", "the NIC reports a cable/module problem",
     Verdict.WARN, 0.2, True),
)

# nvidia-smi -q fields whose "Unknown Error" means NVML lost the GPU (a field a driver does not
# implement, e.g. "Addressing Mode" on GeForce with R535, also reads "Unknown Error" and is harmless).
UNKNOWN_ERROR_FIELDS = ("gpu uuid", "serial number", "product name", "temperature/gpu current temp",
                        "power draw", "fb memory usage/total", "minor number", "bus id")

_OURS = {"smi_q_gpu", "smi_row", "smi_processes", "smi_handle_error", "smi_no_devices", "smi_no_driver", "dcgm_diag_result",
         "dcgm_diag_message", "dcgm_health", "dcgm_health_incident", "slurm_node_reason", "sacct_job",
         "kmsg_gpu_lost", "kmsg_aer", "kmsg_gpu_dev", "kmsg_oom_kill", "kmsg_hung_task", "kmsg_sxid", "kmsg_mlx5",
         "kmsg_call_trace", "ps_row", "rank_progress",
         "pyspy_thread", "pyspy_error", "fr_missing_ranks", "fr_last_collective", "rocm_row", "ib_port",
         "gpustat_row", "shm_df", "shm_segment", "log_stall"}
"""The parsers' event kinds (a catalog entry may share a prefix, e.g. ``dcgm_thermal_violation``)."""
# What the fallback's second pass reads (error lines, words, success markers): no judgement of its own, so a
# word on a parsed line ("State: Down" in an ibstat paste) leaves the parser's reading of that line standing.
_FALLBACK_KINDS = ("first_error", "first_exception", lexicon.KIND, lexicon.WHOLE_KIND, prior.KIND, healthy.KIND)
_COLLECTIVES = {"all_reduce", "all_gather", "all_gather_into_tensor", "_all_gather_base", "reduce_scatter",
                "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast", "barrier", "all_to_all",
                "all_to_all_single", "reduce", "gather", "scatter", "send", "recv", "isend", "irecv",
                "monitored_barrier", "broadcast_object_list", "all_gather_object", "recv_object_list",
                "send_object_list", "batch_isend_irecv", "wait"}


def _covered(events: Iterable[LogEvent]) -> Set[Tuple[str, int]]:
    """(source, line) of lines the line scanner (catalog signatures) already turned into events; an
    entry that defers to a parser (``defers_to``) covers nothing: the parser's reading of it wins."""
    deferring = deferring_kinds()
    return {(e.source, e.line) for e in events
            if e.kind not in _OURS and e.kind not in _FALLBACK_KINDS and e.kind not in deferring}


def _fresh(events: List[LogEvent], kind: str, window: int = 0) -> List[LogEvent]:
    """Events of ``kind`` whose line (or a line within ``window`` of it, for multi-line messages) the
    line scanner has not judged already: one fact, one finding."""
    seen = _covered(events)
    return [e for e in of_kind(events, kind)
            if not any((e.source, e.line + d) in seen for d in range(-window, window + 1))]


def _cite(e: LogEvent, *facts: str) -> List[str]:
    """Evidence lines for ``facts`` of an ``smi_q_gpu`` event (its header line when none apply)."""
    cite = e.fields.get("cite", {})
    lines = [f"{e.source}:{cite[f][0]}: {cite[f][1]}" for f in facts if f in cite]
    return lines or [f"{e.where}: {e.text}"]


def _gpus_text(evs: Sequence[LogEvent]) -> str:
    gpus = sorted({e.gpu for e in evs if e.gpu})
    if not gpus:
        return "a GPU (no bus id in the paste)"
    return "GPU " + ", ".join(gpus[:4]) + (f" … ({len(gpus)} GPUs)" if len(gpus) > 4 else "")


def _lines(evs: Sequence[LogEvent], facts: Sequence[str]) -> List[str]:
    out: List[str] = []
    for e in evs:
        out += _cite(e, *facts)
    return out[:5]


def smi_clock_events(events: List[LogEvent]) -> List[TriageFinding]:
    """nvidia-smi -q clock-event reasons per reason: power brake, HW/SW thermal slowdown, HW slowdown, power cap."""
    gpus = of_kind(events, "smi_q_gpu")
    out: List[TriageFinding] = []
    for reason, (cat, meaning, verdict, conf, action) in CLOCK_EVENTS.items():
        evs = [e for e in gpus if reason in e.fields.get("reasons_active", [])]
        if reason == "hw_slowdown":  # its sub-reasons, when listed, say which one it is
            evs = [e for e in evs if not {"hw_thermal_slowdown", "hw_power_brake_slowdown"}
                   & set(e.fields.get("reasons_active", []))]
        if not evs:
            continue
        if reason == "sw_power_cap" and any(set(e.fields["reasons_active"]) - {"sw_power_cap", "idle"} for e in evs):
            continue  # a stronger reason on the same GPU explains the slowdown
        temps = {e.gpu or "?": _temps(e) for e in evs}
        clocks = {e.gpu or "?": f"{e.fields['sm_mhz']} / {e.fields['sm_max_mhz']} MHz" for e in evs
                  if "sm_mhz" in e.fields and "sm_max_mhz" in e.fields}
        thermal = reason in ("hw_thermal_slowdown", "sw_thermal_slowdown")
        summary = f"{meaning} on {_gpus_text(evs)}"
        shown = [(g, t) for g, t in temps.items() if t]
        if thermal and shown:
            summary += "; " + "; ".join(f"{g}: {t}" for g, t in shown[:3])
        out.append(from_events(
            evs, id=f"smi.{'thermal' if thermal else 'power'}.{reason}", category=cat, verdict=verdict,
            confidence=conf, gpu=only(e.gpu for e in evs), node=only(e.node for e in evs), summary=summary,
            action=action, tier=0 if verdict is Verdict.FAIL else 1, consequence=reason == "sw_power_cap",
            evidence={"reason": reason, "gpus": sorted({e.gpu or "?" for e in evs}), "temperature": temps,
                      "sm_clock": clocks, "lines": _lines(evs, ("reason." + reason, "temp_c", "slowdown_c"))}))
    out += _hot_without_reason(gpus)
    return out


def _temps(e: LogEvent) -> str:
    f = e.fields
    if "temp_c" not in f:
        return ""
    limits = [f"{name} {f[key]} °C" for key, name in (("slowdown_c", "slowdown"), ("max_operating_c", "max operating"),
                                                      ("shutdown_c", "shutdown")) if key in f]
    text = f"{f['temp_c']} °C" + (f" (limits: {', '.join(limits)})" if limits else "")
    if "mem_temp_c" in f:
        text += f", memory {f['mem_temp_c']} °C" + (f" of {f['mem_max_operating_c']} °C"
                                                    if "mem_max_operating_c" in f else "")
    return text


def _hot_without_reason(gpus: List[LogEvent]) -> List[TriageFinding]:
    """GPUs at their own temperature limits with no thermal reason shown (e.g. ``nvidia-smi -q -d TEMPERATURE``):
    at or over "GPU Slowdown Temp" the hardware throttles; within 1 °C of "GPU Max Operating Temp" the
    driver holds clocks down to stay there."""
    out: List[TriageFinding] = []
    plain = [e for e in gpus if "temp_c" in e.fields
             and not {"hw_thermal_slowdown", "sw_thermal_slowdown"} & set(e.fields.get("reasons_active", []))]
    over = [e for e in plain if "slowdown_c" in e.fields and e.fields["temp_c"] >= e.fields["slowdown_c"]]
    near = [e for e in plain if e not in over and "max_operating_c" in e.fields
            and e.fields["temp_c"] >= e.fields["max_operating_c"] - 1]
    for evs, key, limit, conf in ((over, "over_slowdown", "slowdown", 0.6), (near, "at_max_operating",
                                                                              "max operating", 0.45)):
        if not evs:
            continue
        out.append(from_events(
            evs, id=f"smi.thermal.{key}", category="thermal_power", verdict=Verdict.WARN, confidence=conf,
            gpu=only(e.gpu for e in evs), tier=1,
            summary=f"{_gpus_text(evs)} at its {limit} temperature: " + "; ".join(_temps(e) for e in evs[:3]),
            action="check cooling of that node (fans, airflow, inlet temperature); the GPU lowers its clocks here",
            evidence={"temperature": {e.gpu or "?": _temps(e) for e in evs},
                      "lines": _lines(evs, ("temp_c", "slowdown_c" if key == "over_slowdown" else "max_operating_c"))}))
    return out


def smi_gpu_health(events: List[LogEvent]) -> List[TriageFinding]:
    """nvidia-smi -q memory and reachability: uncorrectable ECC, row-remap failure/pending, retired pages,
    reset required, fields NVML answers with "Unknown Error"."""
    out: List[TriageFinding] = []
    for e in of_kind(events, "smi_q_gpu"):
        f = e.fields
        problems: List[Tuple[str, Verdict, float, str, Tuple[str, ...]]] = []
        if f.get("ecc_volatile_uncorrectable", 0) > 0:
            problems.append((f"{f['ecc_volatile_uncorrectable']} uncorrectable ECC error(s) since the last reset",
                             Verdict.FAIL, 0.85, ("ecc_volatile_uncorrectable",)))
        elif f.get("ecc_aggregate_uncorrectable", 0) > 0:
            problems.append((f"{f['ecc_aggregate_uncorrectable']} uncorrectable ECC error(s) over the GPU's life",
                             Verdict.WARN, 0.5, ("ecc_aggregate_uncorrectable",)))
        if f.get("remap_failure"):
            problems.append(("row remapping failed (no spare rows left)", Verdict.FAIL, 0.9, ("remap_failure",)))
        elif f.get("remap_pending"):
            problems.append(("a row remap is pending: the GPU must be reset to apply it", Verdict.WARN, 0.6,
                             ("remap_pending", "remap_uncorrectable")))
        if f.get("retired_pending"):
            problems.append(("a page retirement is pending: the GPU must be reset to apply it", Verdict.WARN, 0.6,
                             ("retired_pending",)))
        if f.get("reset_required") or f.get("drain_and_reset"):
            problems.append(("the driver says the GPU needs a reset", Verdict.FAIL, 0.8,
                             ("reset_required", "drain_and_reset")))
        unknown = [p for p in f.get("unknown_error_fields", []) if any(p.endswith(k) for k in UNKNOWN_ERROR_FIELDS)]
        if unknown:
            problems.append((f"NVML answers \"Unknown Error\" for {', '.join(unknown[:3])}: the GPU is unreachable",
                             Verdict.FAIL, 0.8, ("unknown_error",)))
        if not problems:
            continue
        worst = max(problems, key=lambda p: (p[1].severity, p[2]))
        facts = tuple(x for p in problems for x in p[3])
        summary = f"GPU {e.gpu or '(no bus id in the paste)'}" + (f" ({f['product']})" if "product" in f else "") \
            + ": " + "; ".join(p[0] for p in problems)
        out.append(from_events(
            [e], id="smi.ecc" + (f".{e.gpu}" if e.gpu else ""), category="gpu_hardware", verdict=worst[1],
            confidence=worst[2], gpu=e.gpu, node=e.node, summary=summary, tier=0 if worst[1] is Verdict.FAIL else 1,
            action="drain the node and reset the GPU (nvidia-smi -r) or reboot; replace it if errors or remap "
                   "failures return (NVIDIA GPU debug guidelines)",
            evidence={k: f[k] for k in ("ecc_volatile_uncorrectable", "ecc_aggregate_uncorrectable", "remap_pending",
                                        "remap_failure", "retired_pending", "reset_required", "uuid") if k in f}
            | {"lines": _cite(e, *facts)}))
    return out


def smi_unreachable(events: List[LogEvent]) -> List[TriageFinding]:
    """nvidia-smi cannot open a GPU ("Unable to determine the device handle ... Unknown Error"), finds none,
    or cannot talk to the driver; ERR! cells and uncorrectable ECC counts in the table."""
    out: List[TriageFinding] = []
    groups: Dict[str, List[LogEvent]] = {}
    for e in _fresh(events, "smi_handle_error"):
        groups.setdefault(str(e.fields.get("bus_id") or "?"), []).append(e)
    for bus, evs in groups.items():
        out.append(from_events(
            evs, id=f"smi.unreachable.{bus}", category="gpu_hardware", verdict=Verdict.FAIL, confidence=0.85,
            gpu=None if bus == "?" else bus, node=only(e.node for e in evs), tier=0,
            summary=f"NVML cannot open GPU {bus}: {evs[0].fields.get('error', 'error')} (lost from the bus or "
                    "needs a reset)",
            action="drain the node; check the kernel log for Xid 79 / AER on that bus; reset or reseat the GPU",
            evidence={"bus_id": bus, "error": evs[0].fields.get("error"), "count": len(evs)}))
    none = _fresh(events, "smi_no_devices")
    if none:
        out.append(from_events(none, id="smi.no_devices", category="gpu_hardware", verdict=Verdict.FAIL,
                               confidence=0.4, summary="nvidia-smi found no GPUs",
                               action="check that the driver is loaded and the GPUs are on the PCI bus (lspci); "
                                      "inside a job, check the cgroup/CUDA_VISIBLE_DEVICES the job got"))
    driver = _fresh(events, "smi_no_driver")
    if driver:
        out.append(from_events(driver, id="smi.no_driver", category="config", verdict=Verdict.FAIL, confidence=0.6,
                               summary="nvidia-smi cannot communicate with the NVIDIA driver",
                               action="load the driver (and match it to the installed user-space libraries)"))
    rows = of_kind(events, "smi_row")
    ecc = [e for e in rows if (e.fields.get("ecc_uncorrectable") or 0) > 0]
    if ecc:
        out.append(from_events(ecc, id="smi.table_ecc", category="gpu_hardware", verdict=Verdict.FAIL,
                               confidence=0.8, gpu=only(e.gpu for e in ecc), tier=0,
                               summary=f"{_gpus_text(ecc)} shows volatile uncorrectable ECC errors in nvidia-smi",
                               action="drain the node; reset the GPU and watch whether the count returns",
                               evidence={"ecc": {e.gpu or "?": e.fields["ecc_uncorrectable"] for e in ecc}}))
    idle_p0 = [e for e in rows if e.fields.get("persistence") is False and e.fields.get("perf") == "P0"
               and e.fields.get("util_pct") == 0 and (e.fields.get("mem_used_mib") or 0) <= 16]
    if idle_p0:
        out.append(from_events(
            idle_p0, id="smi.persistence_off", category="config", verdict=Verdict.WARN, confidence=0.3,
            consequence=True, gpu=only(e.gpu for e in idle_p0),
            summary=f"persistence mode is off and {_gpus_text(idle_p0)} sit idle in P0 (no memory used, 0 % busy): "
                    "the driver keeps the GPUs awake, hot and slow to start",
            action="enable persistence (nvidia-persistenced, or nvidia-smi -pm 1 at boot)",
            evidence={"gpus": {e.gpu or "?": f"{e.fields.get('temp_c')} °C, {e.fields.get('power_w')} W"
                               for e in idle_p0}}))
    err = [e for e in rows if e.fields.get("err_cells")]
    cells = sorted({c for e in err for c in e.fields.get("err_cells", [])})
    if err:
        out.append(from_events(err, id="smi.table_err", category="gpu_hardware", verdict=Verdict.WARN,
                               confidence=0.3, gpu=only(e.gpu for e in err), consequence=True,
                               summary=f"nvidia-smi could not read {', '.join(cells)} (ERR!) on {_gpus_text(err)}",
                               action="often transient; if it persists or comes with Xid/ECC errors, reset the GPU",
                               evidence={"cells": {e.gpu or "?": e.fields["err_cells"] for e in err}}))
    return out


def _row_temps(e: LogEvent) -> str:
    f = e.fields
    parts = [f"{f[k]:g} °C{label}" for k, label in (("temp_c", ""), ("junction_temp_c", " junction"),
                                                   ("mem_temp_c", " memory")) if k in f]
    return ", ".join(parts)


def _row_name(e: LogEvent) -> str:
    index = str(e.fields.get("index", "?"))
    return f"GPU {index}" + (f" ({e.gpu})" if e.gpu and e.gpu != index else "")


def table_heat(events: List[LogEvent]) -> List[TriageFinding]:
    """GPUs in an nvidia-smi or rocm-smi table at their throttling temperature (no limits in a table:
    HOT_C edge, HOT_JUNCTION_C junction), and GPUs drawing their full power cap."""
    rows = of_kind(events, "smi_row", "rocm_row")
    out: List[TriageFinding] = []
    hot = [e for e in rows if (e.fields.get("temp_c") or 0) >= HOT_C
           or (e.fields.get("junction_temp_c") or 0) >= HOT_JUNCTION_C]
    if hot:
        out.append(from_events(
            hot, id="table.hot", category="thermal_power", verdict=Verdict.WARN, confidence=0.45,
            gpu=only(e.gpu for e in hot),
            summary=f"{', '.join(_row_name(e) for e in hot[:4])} at {'; '.join(_row_temps(e) for e in hot[:3])}: at or "
                    f"over the {HOT_C:g} °C where GPUs throttle their clocks",
            action="check cooling of that node (fans, airflow, inlet temperature); nvidia-smi -q -d TEMPERATURE "
                   "(or rocm-smi --showtemp) shows the GPU's own slowdown limit",
            evidence={"temperature": {_row_name(e): _row_temps(e) for e in hot}, "limit_c": HOT_C}))
    capped = [e for e in rows if e not in hot and (e.fields.get("power_cap_w") or 0) > 0
              and (e.fields.get("power_w") or 0) >= AT_CAP * e.fields["power_cap_w"]]
    if capped:
        out.append(from_events(
            capped, id="table.power_cap", category="thermal_power", verdict=Verdict.WARN, confidence=0.25,
            consequence=True, gpu=only(e.gpu for e in capped),
            summary=f"{', '.join(_row_name(e) for e in capped[:4])} draw their full power cap ("
                    + "; ".join(f"{e.fields['power_w']:g} / {e.fields['power_cap_w']:g} W" for e in capped[:3])
                    + "): clocks are held by the power limit",
            action="normal under full load; a problem when the cap is below the GPU's default or its peers'",
            evidence={"power_w": {_row_name(e): [e.fields["power_w"], e.fields["power_cap_w"]] for e in capped}}))
    return out


SPIN_UTIL_PCT = 95.0
SPIN_POWER_SHARE = 0.4
"""A GPU that nvidia-smi shows ``100%`` busy while it draws under 40 % of its power cap is not computing: a
kernel sits resident and polls (an NCCL collective waiting for a peer). NCCL users report such hangs as
"some GPUs are 100% occupied" while the job hangs (NVIDIA/nccl#1033), and soperator's
stuck-NCCL check tests exactly 100 % utilisation at very low power (nebius/soperator#796)."""


def table_busy_wait(events: List[LogEvent]) -> List[TriageFinding]:
    """GPUs in an nvidia-smi table at full utilisation but low power: spinning in a collective, not working.
    A hint for a log that shows no error (the table a user pasted of a stuck job); any real cause ranks first."""
    rows = [e for e in of_kind(events, "smi_row") if (e.fields.get("util_pct") or 0) >= SPIN_UTIL_PCT
            and (e.fields.get("power_cap_w") or 0) > 0 and e.fields.get("power_w") is not None
            and e.fields["power_w"] <= SPIN_POWER_SHARE * e.fields["power_cap_w"]]
    if not rows:
        return []
    return [from_events(
        rows, id="table.busy_wait", category="collective_hang", verdict=Verdict.WARN, confidence=0.3,
        consequence=True, gpu=only(e.gpu for e in rows),
        summary=f"{', '.join(_row_name(e) for e in rows[:4])} show {rows[0].fields['util_pct']:g} % utilisation at "
                + "; ".join(f"{e.fields['power_w']:g} / {e.fields['power_cap_w']:g} W" for e in rows[:3])
                + ": a kernel spins waiting (a collective whose peer never came), the job hangs rather than computes",
        action="py-spy dump (--native) every rank to find the one not in the collective; check its log, its node's "
               "kernel log and the fabric (NCCL_DEBUG=INFO) for what stopped it",
        evidence={"gpus": {_row_name(e): {"util_pct": e.fields["util_pct"], "power_w": e.fields["power_w"],
                                          "power_cap_w": e.fields["power_cap_w"]} for e in rows}})]


ORPHAN_MIB = 1024.0
"""GPU memory in use that no listed process owns, from which a gpustat row says "held by someone unseen"
(a CUDA context alone takes a few hundred MiB)."""


def gpustat_orphans(events: List[LogEvent]) -> List[TriageFinding]:
    """gpustat rows whose GPU memory is in use while no process that holds it is named (``(null)`` or
    none): a process outside this view (an ended job's leftover or zombie, another container) holds it.
    Ranked after any cause (a paste from inside the job's own container names no process either)."""
    rows = [e for e in of_kind(events, "gpustat_row")
            if e.fields["mem_used_mib"] >= ORPHAN_MIB and not e.fields["owners"]]
    if not rows:
        return []
    busy = [e for e in rows if e.fields["util_pct"] >= 50]
    return [from_events(
        rows, id="gpustat.unowned", category="host_resources", verdict=Verdict.WARN,
        confidence=0.45 if busy else 0.35, consequence=True, gpu=only(e.gpu for e in rows),
        node=only(e.node for e in rows),
        summary=f"{', '.join('GPU ' + str(e.fields['index']) for e in rows[:4])}: "
                + "; ".join(f"{e.fields['mem_used_mib']:g} / {e.fields['mem_total_mib']:g} MB used, "
                            f"{e.fields['util_pct']:g} % busy" for e in rows[:2])
                + f", but gpustat names no process that holds it ({rows[0].fields['procs'] or 'none listed'}): a "
                  "process outside this view (a leftover or zombie of an ended job, another container) holds the GPU",
        action="find the owner (nvidia-smi --query-compute-apps=pid,used_memory --format=csv; fuser -v /dev/nvidia*) "
               "and end it; when nothing owns it, reset the GPU (nvidia-smi -r) or drain the node",
        evidence={"gpus": {str(e.fields["index"]): {"mem_used_mib": e.fields["mem_used_mib"],
                                                     "util_pct": e.fields["util_pct"]} for e in rows}})]


RESTRICTED_MODES = {"E. Thread": "Exclusive_Thread: one thread of one process per GPU",
                    "Prohibited": "Prohibited: no process may create a CUDA context"}
"""nvidia-smi's compute modes that refuse a job's second context (nvidia-smi(1) --compute-mode; CUDA's
cudaComputeModeExclusive/Prohibited: "all CUDA-capable devices are busy or unavailable"). Exclusive_Process
is left out: sites set it on purpose, and one process per GPU is the usual layout."""


def smi_compute_mode(events: List[LogEvent]) -> List[TriageFinding]:
    """GPUs in a compute mode that lets no second context (or none) onto them: a node setting the job did not
    expect, when nothing else is wrong."""
    rows = [e for e in of_kind(events, "smi_row") if e.fields.get("compute_mode") in RESTRICTED_MODES]
    if not rows:
        return []
    mode = str(rows[0].fields["compute_mode"])
    return [from_events(
        rows, id="smi.compute_mode", category="config", verdict=Verdict.WARN, confidence=0.3, consequence=True,
        gpu=only(e.gpu for e in rows),
        summary=f"{', '.join(_row_name(e) for e in rows[:4])} in compute mode {RESTRICTED_MODES[mode]}: a job that "
                "opens more contexts (several threads or processes per GPU, a leftover holder) is refused the GPU",
        action="set the mode the jobs need (nvidia-smi -c DEFAULT, or EXCLUSIVE_PROCESS via the scheduler's prolog) "
               "and check that no earlier process still holds the GPU",
        evidence={"compute_mode": {_row_name(e): e.fields["compute_mode"] for e in rows}})]


def smi_unowned(events: List[LogEvent]) -> List[TriageFinding]:
    """nvidia-smi's table: GPU memory in use while its Processes section lists none (gpustat's case,
    ``gpustat.unowned``, in the other tool's paste). Ranked after any cause, for the same reason: nvidia-smi run
    inside a container lists no process of another PID namespace."""
    sections = of_kind(events, "smi_processes")
    if not sections or any(e.fields["count"] for e in sections):
        return []
    rows = [e for e in of_kind(events, "smi_row") if (e.fields.get("mem_used_mib") or 0) >= ORPHAN_MIB]
    if not rows:
        return []
    return [from_events(
        rows + sections[:1], id="smi.unowned", category="host_resources", verdict=Verdict.WARN, confidence=0.35,
        consequence=True, gpu=only(e.gpu for e in rows),
        summary=f"{', '.join(_row_name(e) for e in rows[:4])}: "
                + "; ".join(f"{e.fields['mem_used_mib']:g} / {e.fields.get('mem_total_mib') or 0:g} MiB used"
                            for e in rows[:2])
                + ", but nvidia-smi lists no process: one outside this view (a leftover or zombie of an ended job, "
                  "another container) holds the GPU",
        action="find the owner (nvidia-smi --query-compute-apps=pid,used_memory --format=csv; fuser -v /dev/nvidia*) "
               "and end it; when nothing owns it, reset the GPU (nvidia-smi -r) or drain the node",
        evidence={"gpus": {_row_name(e): e.fields["mem_used_mib"] for e in rows}})]


def shm_space(events: List[LogEvent]) -> List[TriageFinding]:
    """/dev/shm as the paste shows it: full or at Docker's default size (df), or holding NCCL/PSM
    segments (ls): the cause an NCCL "unhandled system error" or a worker's bus error does not name."""
    rows = _fresh(events, "shm_df")
    full = [e for e in rows if e.fields["used_pct"] >= SHM_FULL_PCT]
    small = [e for e in rows if e not in full and 0 < e.fields.get("size_mib", 0.0) < SHM_SMALL_MIB]
    action = ("give the job a larger /dev/shm (containers: --shm-size=16g or --ipc=host) and remove stale "
              "segments (nccl-*, psm_*, torch_*) that ended jobs left there; NCCL_SHM_DISABLE=1 only as a slow "
              "fallback")
    out: List[TriageFinding] = []
    for evs, key, verdict, conf, what in (
            (full, "full", Verdict.FAIL, 0.6, "full"),
            (small, "small", Verdict.WARN, 0.5,
             f"under {SHM_SMALL_MIB:g} MiB (Docker's default --shm-size is 64 MiB)")):
        if evs:
            out.append(from_events(
                evs, id=f"shm.{key}", category="host_resources", verdict=verdict, confidence=conf,
                node=only(e.node for e in evs), action=action,
                summary=f"/dev/shm is {what}: " + "; ".join(
                    f"{e.fields.get('size_mib', 0):g} MiB, {e.fields['used_pct']} % used" for e in evs[:2])
                    + ": NCCL's intra-node transport and DataLoader workers cannot allocate shared memory",
                evidence={"size_mib": [e.fields.get("size_mib") for e in evs],
                          "used_pct": [e.fields["used_pct"] for e in evs]}))
    segs = of_kind(events, "shm_segment")
    if len(segs) >= 2:
        total = sum(e.fields.get("size_mib", 0.0) for e in segs)
        out.append(from_events(
            segs, id="shm.segments", category="host_resources", verdict=Verdict.WARN, confidence=0.4,
            node=only(e.node for e in segs),
            summary=f"/dev/shm holds {len(segs)} NCCL/PSM shared-memory segments ({total:.0f} MiB): those of "
                    "processes that have ended are leftovers that fill /dev/shm for the next run",
            action="check that no running process holds them (lsof /dev/shm/nccl-* /dev/shm/psm_*), remove the stale "
                   "ones and clean /dev/shm when a job or container ends (Epilog, a fresh --ipc per container)",
            evidence={"segments": len(segs), "total_mib": round(total, 1)}))
    return out


def ib_ports(events: List[LogEvent]) -> List[TriageFinding]:
    """InfiniBand/RoCE ports that are not Active (ibstat, ibv_devinfo, ibstatus), by what their logical
    and physical states mean; weak when another port in the paste is Active (often a spare port)."""
    active = [e for e in of_kind(events, "ib_port") if e.fields.get("state") == "Active"]
    groups: Dict[str, List[LogEvent]] = {}
    for e in _fresh(events, "ib_port"):
        if e in active:
            continue
        phys, state = str(e.fields.get("phys_state", "")), str(e.fields.get("state", ""))
        meaning = next((m for p, s, m in IB_PROBLEMS if (not p or p == phys) and (not s or s == state)), None)
        if meaning:
            groups.setdefault(meaning, []).append(e)
    out: List[TriageFinding] = []
    for meaning, evs in groups.items():
        names = [f"{e.fields['ca']} port {e.fields['port']}" for e in evs]
        spare = bool(active)
        out.append(from_events(
            evs, id="ib.port." + re.sub(r"\W+", "_", str(evs[0].fields.get("phys_state") or evs[0].fields["state"]).lower()),
            category="network", verdict=Verdict.WARN if spare else Verdict.FAIL, confidence=0.3 if spare else 0.55,
            consequence=spare, tier=1, node=only(e.node for e in evs),
            summary=f"{', '.join(names[:4])}: {meaning}" + (f" ({len(active)} other port(s) Active: it may be an "
                                                              "unused port)" if spare else ""),
            action="check the cable, transceiver and switch port of that HCA port (ibstat, iblinkinfo, the switch's "
                   "log); for Initializing check that the subnet manager runs",
            evidence={"ports": {n: f"{e.fields.get('state')}/{e.fields.get('phys_state', '?')}"
                                for n, e in zip(names, evs)},
                      "active_ports": [f"{e.fields['ca']} port {e.fields['port']}" for e in active]}))
    return out


def _dcgm_category(test: Optional[str], messages: Sequence[str]) -> str:
    for text in messages:
        for pattern, cat in DCGM_MESSAGES:
            if re.search(pattern, text, re.I):
                return cat
    return DCGM_TESTS.get((test or "").strip().lower(), "gpu_hardware")


def dcgm_results(events: List[LogEvent]) -> List[TriageFinding]:
    """dcgmi diag failures per test (with their Warning/Error messages) and dcgmi health warnings/failures."""
    out: List[TriageFinding] = []
    results = [e for e in of_kind(events, "dcgm_diag_result") if e.fields["result"] in ("fail", "warn")]
    messages = of_kind(events, "dcgm_diag_message")
    tests = {str(e.fields["test"]) for e in results}
    for test in sorted(tests):
        evs = [e for e in results if e.fields["test"] == test]
        msgs = [m for m in messages if m.fields.get("test") == test and m.fields["level"] in ("warning", "error")]
        fail = any(e.fields["result"] == "fail" for e in evs)
        cat = _dcgm_category(test, [str(m.fields["message"]) for m in msgs])
        gpus = sorted({g for e in evs if isinstance(e.fields.get("gpus"), list) for g in e.fields["gpus"]})
        out.append(from_events(
            evs + msgs, id="dcgm.diag." + re.sub(r"\W+", "_", test.lower()).strip("_"), category=cat,
            verdict=Verdict.FAIL if fail else Verdict.WARN,
            confidence=(0.8 if cat != "config" else 0.6) if fail else 0.5,
            tier=0 if fail and cat in ("gpu_hardware", "thermal_power") else 1,
            summary=f"dcgmi diag {test}: {'Fail' if fail else 'Warn'}"
                    + (f" on GPU {', '.join(map(str, gpus))}" if gpus else "")
                    + (f" — {msgs[0].fields['message'][:160]}" if msgs else ""),
            action="follow DCGM's message; for hardware tests drain the node and rerun dcgmi diag -r 3 before RMA",
            evidence={"test": test, "gpus": gpus, "messages": [m.fields["message"] for m in msgs]}))
    loose = [m for m in messages if m.fields.get("test") not in tests and m.fields["level"] == "error"]
    for m in loose:
        cat = _dcgm_category(None, [str(m.fields["message"])])
        out.append(from_events(
            [m], id=f"dcgm.diag.error.{m.line}", category=cat, verdict=Verdict.FAIL, confidence=0.75,
            tier=0 if cat == "gpu_hardware" else 1, summary=f"dcgmi diag error: {m.fields['message'][:200]}",
            action="drain the node; reset the GPU and rerun dcgmi diag; RMA if it returns",
            evidence={"section": m.fields.get("section"), "gpu_index": m.fields.get("gpu_index")}))
    for e in _fresh(events, "dcgm_health_incident"):
        cat = DCGM_HEALTH_SYSTEMS.get(str(e.fields["system"]).lower(), "gpu_hardware")
        failure = e.fields["level"] in ("failure", "error")
        out.append(from_events(
            [e], id=f"dcgm.health.{str(e.fields['system']).lower()}", category=cat,
            verdict=Verdict.FAIL if failure else Verdict.WARN, confidence=0.7 if failure else 0.55,
            summary=f"DCGM health {e.fields['level']} ({e.fields['system']}): {e.fields['message'][:200]}",
            action="follow DCGM's advice in the message; rerun dcgmi health -c after fixing",
            evidence={"system": e.fields["system"], "gpu_index": e.fields.get("gpu_index")}))
    bad = [e for e in of_kind(events, "dcgm_health") if e.fields["health"] != "healthy"]
    if bad and not of_kind(events, "dcgm_health_incident"):
        out.append(from_events(bad, id="dcgm.health", category="gpu_hardware", verdict=Verdict.WARN, confidence=0.4,
                               summary=f"dcgmi health -c: Overall Health {bad[0].fields['health']}",
                               action="read the per-GPU incidents of dcgmi health -c (they name the subsystem)"))
    return out


def _reason_meaning(reason: str) -> Tuple[str, float, str, str]:
    """(category, confidence, meaning, action) of a drain/down reason: Slurm's own reasons exactly,
    then an admin's free text by the lexicon's words ("GPU temp high" -> thermal_power), then the
    node-reason table's loose GPU pattern, else a drain whose cause the reason does not say."""
    hit = next((r for r in NODE_REASONS[:-1] if re.search(r[0], reason, re.I)), None)
    if hit:
        return hit[1], hit[2], hit[3], hit[4]
    lean = lexicon.leaning(reason, minimum=1.5)
    if lean:
        return (lean[0], 0.4, f"the reason's words ({', '.join(lean[1])}) point to {lean[0]}",
                "ask whoever set the reason what they saw; check that evidence on the node before resuming it")
    hit = next((r for r in NODE_REASONS[-1:] if re.search(r[0], reason, re.I)), None)
    if hit:
        return hit[1], hit[2], hit[3], hit[4]
    return "scheduler", 0.3, "the node was drained or set down", "ask whoever set the reason; resume when fixed"


def node_reasons(events: List[LogEvent]) -> List[TriageFinding]:
    """Drain/down reasons from sinfo -R and scontrol show node, by what Slurm (or an admin) wrote there."""
    groups: Dict[str, List[LogEvent]] = {}
    for e in _fresh(events, "slurm_node_reason"):
        groups.setdefault(str(e.fields["reason"]), []).append(e)
    out: List[TriageFinding] = []
    for reason, evs in groups.items():
        cat, conf, meaning, action = _reason_meaning(reason)
        nodes = sorted({str(e.fields["nodes"]) for e in evs})
        out.append(from_events(
            evs, id="slurm.reason." + re.sub(r"\W+", "_", reason.lower()).strip("_")[:40], category=cat,
            verdict=Verdict.FAIL if conf >= 0.6 else Verdict.WARN, confidence=conf, node=only(nodes),
            summary=f"{', '.join(nodes[:4])}: \"{reason}\" — {meaning}", action=action,
            evidence={"reason": reason, "nodes": nodes, "set_by": sorted({str(e.fields.get("user")) for e in evs}),
                      "at": sorted({str(e.fields.get("at")) for e in evs if e.fields.get("at")}),
                      "state": sorted({str(e.fields["state"]) for e in evs if e.fields.get("state")})}))
    return out


_STATE_ORDER = ("OUT_OF_MEMORY", "NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "DEADLINE", "TIMEOUT", "CANCELLED")


def sacct_states(events: List[LogEvent]) -> List[TriageFinding]:
    """sacct end states per job (steps included): OUT_OF_MEMORY, NODE_FAIL, PREEMPTED, TIMEOUT, CANCELLED by uid."""
    jobs: Dict[str, List[LogEvent]] = {}
    for e in of_kind(events, "sacct_job"):
        jobs.setdefault(str(e.fields["jobid"]).split(".")[0], []).append(e)
    out: List[TriageFinding] = []
    for job, evs in jobs.items():
        states = [s for s in _STATE_ORDER if any(e.fields["state"] == s for e in evs)]
        if not states:
            continue
        state = states[0]
        cat, verdict, conf, consequence, summary, action = SACCT_STATES[state]
        sel = [e for e in evs if e.fields["state"] == state]
        by = sorted({str(e.fields["cancelled_by"]) for e in sel if e.fields.get("cancelled_by")})
        if by:
            summary += f" (by uid {', '.join(by)}{': root or Slurm' if '0' in by else ''})"
        out.append(from_events(
            sel, id=f"sacct.{state.lower()}.{job}", category=cat, verdict=verdict, confidence=conf,
            consequence=consequence, node=only(e.node for e in sel), summary=f"job {job}: {summary}", action=action,
            evidence={"job": job, "state": state, "exit_codes": sorted({str(e.fields.get("exit_code")) for e in sel}),
                      "steps": [str(e.fields["jobid"]) for e in sel][:8]}))
    return out


def _gpu_near(e: LogEvent, gpu_lines: Sequence[LogEvent], window: int = 12) -> Optional[LogEvent]:
    return next((g for g in gpu_lines if g.source == e.source and 0 <= g.line - e.line <= window), None)


def kernel_pcie(events: List[LogEvent]) -> List[TriageFinding]:
    """PCIe AER errors: uncorrected ones on (or just above) a GPU are hardware; corrected ones only a note.
    The multi-line "fallen off the bus" text, when the line scanner did not already report it."""
    gpu_lines = [e for e in events if e.kind in ("kmsg_gpu_dev", "kmsg_gpu_lost", "xid", "fallen_off_bus")]
    out: List[TriageFinding] = []
    for severity in ("fatal", "nonfatal", "corrected"):
        evs = [e for e in _fresh(events, "kmsg_aer", window=3) if e.fields.get("severity") == severity]
        on_gpu = [(e, _gpu_near(e, gpu_lines)) for e in evs]
        on_gpu = [(e, g) for e, g in on_gpu if e.fields.get("driver") == "nvidia" or g is not None]
        if not on_gpu:
            continue
        aer = [e for e, _ in on_gpu]
        gpus = sorted({(g.gpu or g.fields.get("bus_id") or "") for _, g in on_gpu if g is not None} - {""})
        gpu = only(gpus) or only(e.fields["bus_id"] for e in aer if e.fields.get("driver") == "nvidia")
        devices = sorted({str(e.fields["bus_id"]) for e in aer})
        if severity == "corrected":
            out.append(from_events(
                aer, id="kmsg.aer.corrected", category="gpu_hardware", verdict=Verdict.WARN, confidence=0.15,
                consequence=True, gpu=gpu, node=only(e.node for e in aer),
                summary=f"corrected PCIe errors on {', '.join(devices)} next to GPU {gpu or '?'} (recovered by the "
                        "link; a note, not a cause on their own)",
                action="watch for uncorrected errors or Xid 79 on that GPU; reseat/replace the riser if they grow",
                evidence={"devices": devices, "gpus": gpus, "count": len(aer)}))
            continue
        out.append(from_events(
            aer + [g for _, g in on_gpu if g is not None][:3], id=f"kmsg.aer.{severity}", category="gpu_hardware",
            verdict=Verdict.FAIL, confidence=0.7, tier=0, gpu=gpu, node=only(e.node for e in aer),
            summary=f"uncorrected ({severity}) PCIe error on {', '.join(devices)}" + (f" at GPU {gpu}" if gpu else
                                                                                      " next to a GPU"),
            action="drain the node; the GPU's PCIe link (riser, slot, switch) failed: reseat or replace it",
            evidence={"devices": devices, "gpus": gpus, "severity": severity}))
    lost = _fresh(events, "kmsg_gpu_lost", window=3)
    for bus in sorted({str(e.gpu) for e in lost}):
        evs = [e for e in lost if str(e.gpu) == bus]
        out.append(from_events(
            evs, id=f"kmsg.gpu_lost.{bus}", category="gpu_hardware", verdict=Verdict.FAIL, confidence=0.9, tier=0,
            gpu=bus, node=only(e.node for e in evs), summary=f"GPU {bus} has fallen off the bus",
            action=f"drain the node and reset/replace GPU {bus}; do not reschedule on it",
            evidence={"bus_id": bus, "uuid": evs[0].fields.get("uuid")}))
    return out


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def kernel_host(events: List[LogEvent]) -> List[TriageFinding]:
    """oom-killer and memory-cgroup kills (not already read by the line scanner), hung tasks (D state), and
    call traces through a GPU driver (a hung task waiting there is the GPU's, not a file system's)."""
    out: List[TriageFinding] = []
    kills = _fresh(events, "kmsg_oom_kill")
    for cgroup in (True, False):
        evs = [e for e in kills if bool(e.fields.get("cgroup")) == cgroup]
        if not evs:
            continue
        procs = sorted({f"{e.fields['comm']}:{e.fields['pid']}" for e in evs})
        rss = max((e.fields.get("anon_rss_kb") or 0) for e in evs)
        jobs = sorted({str(e.fields["job_id"]) for e in evs if e.fields.get("job_id")})
        out.append(from_events(
            evs, id="kmsg.oom." + ("cgroup" if cgroup else "host"), category="memory", verdict=Verdict.FAIL,
            confidence=0.8, node=only(e.node for e in evs),
            summary=("memory cgroup limit hit" if cgroup else "the node ran out of memory")
                    + f": the kernel killed {', '.join(procs[:4])}" + (f" ({len(procs)} processes)" if len(procs) > 4
                                                                       else "")
                    + (f", largest {_size(rss * 1024)} resident" if rss else ""),
            action="request more memory (--mem / --mem-per-gpu) or cut host-side buffers (DataLoader workers, "
                   "pinned memory)" if cgroup else "find what used the node's memory; keep jobs within --mem",
            evidence={"processes": procs[:8], "largest_anon_rss_bytes": rss * 1024, "jobs": jobs}))
    out += _gpu_driver_traces([t for t in of_kind(events, "kmsg_call_trace") if _in_gpu_driver(t)])
    hung = _fresh(events, "kmsg_hung_task")
    if hung:
        procs = sorted({f"{e.fields['comm']}:{e.fields['pid']}" for e in hung})
        out.append(from_events(
            hung, id="kmsg.hung_task", category="host_resources", verdict=Verdict.WARN, confidence=0.5,
            node=only(e.node for e in hung),
            summary=f"{', '.join(procs[:4])} blocked in the kernel for over "
                    f"{max(e.fields['blocked_s'] for e in hung)} s (D state: a hung filesystem or device)",
            action="check the filesystem/NFS/GPFS mounts and device drivers of that node; a rank stuck so blocks "
                   "every collective",
            evidence={"processes": procs[:8], "reports": len(hung)}))
    return out


def gpu_tools_stuck(events: List[LogEvent]) -> List[TriageFinding]:
    """ps rows of GPU management tools in uninterruptible sleep (D): they wait on a GPU driver that no
    longer answers (a hung or lost GPU), which is why nvidia-smi itself "hangs"."""
    rows = [e for e in of_kind(events, "ps_row")
            if e.fields["state"] == "D" and GPU_TOOLS.search(str(e.fields["command"]))]
    if not rows:
        return []
    procs = [f"{str(e.fields['command']).split()[0].rsplit('/', 1)[-1]}:{e.fields['pid']}" for e in rows]
    return [from_events(
        rows, id="ps.gpu_tools_stuck", category="gpu_hardware", verdict=Verdict.WARN, confidence=0.5,
        node=only(e.node for e in rows),
        summary=f"{', '.join(procs[:4])} stuck in uninterruptible sleep (ps STAT D): the GPU driver does not answer",
        action="look in that node's kernel log for Xid / 'fallen off the bus' / hung-task traces in nvidia modules; "
               "the processes cannot be killed: drain the node and reboot it",
        evidence={"processes": procs[:8]})]


def ranks_out_of_step(events: List[LogEvent]) -> List[TriageFinding]:
    """Ranks whose last progress lines stopped at different counts of one counter: they fell out of step,
    and the ones ahead wait in a collective for those behind. Weak and ranked after any cause: a log cut
    while every rank still runs shows the same."""
    out: List[TriageFinding] = []
    by_counter: Dict[str, List[LogEvent]] = {}
    for e in of_kind(events, "rank_progress"):
        by_counter.setdefault(str(e.fields["counter"]), []).append(e)
    for counter, evs in by_counter.items():
        values = {e.rank: int(e.fields["value"]) for e in evs}
        if len(values) < 2 or len(set(values.values())) < 2:
            continue
        behind = min(values.values())
        ranks = sorted(values, key=lambda r: (values[r], r))
        out.append(from_events(
            evs, id=f"progress.out_of_step.{counter}", category="collective_hang", verdict=Verdict.WARN,
            confidence=0.3, consequence=True,
            summary=f"the ranks' last {counter} lines disagree ("
                    + ", ".join(f"rank {r} at {values[r]}" for r in ranks[:4])
                    + f"): rank(s) {ranks_text([r for r in ranks if values[r] == behind])} fell behind, the others "
                      "wait for them in a collective",
            action="find why the ranks behind stopped (py-spy dump of each rank) or why their loops ran a different "
                   "number of steps (unequal data shards, a rank-dependent branch)",
            evidence={"counter": counter, "last": {str(r): values[r] for r in ranks}}))
    return out


STALLS: Dict[str, Tuple[str, str, float, str, str, str]] = {
    "extension_build": (
        "stall.extension_build", "host_resources", 0.3,
        "the log ends at an extension build step ({text}): the job most likely waits on the lock file a killed "
        "earlier build left in the extensions directory",
        "look for a 'lock' file under the extensions root (TORCH_EXTENSIONS_DIR, default "
        "~/.cache/torch_extensions/<py_cu>/<name>/) and delete it, or point TORCH_EXTENSIONS_DIR to a per-job local "
        "directory; py-spy dump shows FileBaton.wait when this is it",
        "last_line"),
    "after_finish": (
        "stall.after_finish", "collective_hang", 0.2,
        "the training loop reported it finished ({text}) and the log ends there without an error: the job hung at "
        "teardown (a process-group shutdown or barrier a rank never reached, pending checkpoint saves)",
        "py-spy dump the ranks of a running job; destroy the process group only after every rank finished its last "
        "collective and its async checkpoint saves; check the exit of each rank",
        "finished_line"),
    "progress": (
        "stall.progress", "collective_hang", 0.2,
        "the log ends mid-way through a progress bar ({done}/{total}): the loop stopped without an error, as a job "
        "that hangs in a collective (or its data loader) does",
        "py-spy dump every rank of a running job to see where it waits; for an ended one, compare the ranks' last "
        "lines and look for uneven work per rank (the last batch, unused parameters)",
        "last_line"),
}
"""What the end of a silent log says, by the stall parser's ``at`` (parsers/stall.py): (finding id, category,
confidence, summary, action, the evidence key of the line)."""


def log_stalls(events: List[LogEvent]) -> List[TriageFinding]:
    """A log that ends waiting (parsers.stall): at an extension build, a stale build lock (a host's leftover
    file, host_resources); mid-way through a progress bar, a loop that stopped (in a multi-rank job most
    often a collective a rank never joined); right after the loop said it finished, a hang at teardown.
    Hints for a log without an error: any finding ranks first."""
    out: List[TriageFinding] = []
    baton = [e for e in of_kind(events, "pyspy_thread") if any("file_baton.py" in str(f) for f in e.fields["frames"])]
    if baton:  # a stack dump of the same wait: torch.utils.file_baton.FileBaton.wait
        out.append(from_events(
            baton[:3], id="stall.build_lock_wait", category="host_resources", verdict=Verdict.WARN, confidence=0.45,
            summary=f"{len(baton)} dumped thread(s) wait in torch's build lock ({baton[0].fields['frames'][0][:100]}): "
                    "a lock file left by a killed extension build blocks every later job",
            action="delete the 'lock' file in the extension's build directory (TORCH_EXTENSIONS_DIR, default "
                   "~/.cache/torch_extensions/<py_cu>/<name>/), or give each job its own TORCH_EXTENSIONS_DIR",
            evidence={"frames": baton[0].fields["frames"][:6]}))
    for e in of_kind(events, "log_stall"):
        kind, category, confidence, summary, action, where = STALLS[e.fields["at"]]
        out.append(from_events(
            [e], id=kind, category=category, verdict=Verdict.WARN, confidence=confidence, consequence=True,
            summary=summary.format(text=e.text[:120], **e.fields), action=action,
            evidence={where: e.where, **{k: e.fields[k] for k in ("done", "total") if k in e.fields}}))
    return out


def _in_gpu_driver(trace: LogEvent) -> bool:
    """The trace's top frame, or two of its frames, lie in a GPU driver's module."""
    mods = [str(m) for m in trace.fields.get("modules", [])]
    return bool(mods) and (mods[0] in GPU_DRIVER_MODULES or sum(m in GPU_DRIVER_MODULES for m in mods) >= 2)


def _trace_text(trace: LogEvent) -> str:
    pairs = [(str(f), str(m)) for f, m in zip(trace.fields.get("functions", []), trace.fields.get("modules", []))]
    first = next(((f, m) for f, m in pairs if m in GPU_DRIVER_MODULES), pairs[0])
    return f"{first[0]} [{first[1]}]"


def _gpu_driver_traces(traces: List[LogEvent]) -> List[TriageFinding]:
    """Call traces through a GPU driver, with or without the report they belong to: a task (a hung task's,
    whose report alone reads as a file system's) stuck or crashed inside the GPU driver."""
    if not traces:
        return []
    return [from_events(
        traces, id="kmsg.gpu_driver_trace", category="gpu_hardware", verdict=Verdict.WARN, confidence=0.45,
        node=only(e.node for e in traces),
        summary=f"a kernel call trace runs through the GPU driver ({_trace_text(traces[0])}): a task is stuck or "
                "crashed inside it",
        action="check that node's kernel log around it for Xid lines; reset the GPU (nvidia-smi -r) or reboot the "
               "node and drain it until then; a trace that recurs in one driver function is a driver bug: update "
               "the driver",
        evidence={"traces": len(traces), "frames": [_trace_text(t) for t in traces[:4]]})]


def kernel_fabric(events: List[LogEvent]) -> List[TriageFinding]:
    """NVSwitch SXids (fatal ones are hardware) and mlx5 (ConnectX) NIC faults."""
    out: List[TriageFinding] = []
    sx = _fresh(events, "kmsg_sxid")
    for fatal in (True, False):
        evs = [e for e in sx if bool(e.fields.get("fatal")) == fatal]
        if not evs or (not fatal and any(e.fields.get("fatal") for e in sx)):
            continue
        codes = sorted({int(e.fields["sxid"]) for e in evs})
        switches = sorted({str(e.fields["bus_id"]) for e in evs})
        out.append(from_events(
            evs, id="kmsg.sxid" + (".fatal" if fatal else ""), category="gpu_hardware",
            verdict=Verdict.FAIL if fatal else Verdict.WARN, confidence=0.8 if fatal else 0.4, tier=0 if fatal else 1,
            node=only(e.node for e in evs),
            summary=f"NVSwitch {'fatal ' if fatal else ''}SXid {', '.join(map(str, codes))} on switch "
                    f"{', '.join(switches[:4])}",
            action="drain the node; fatal SXids need a reset of the NVSwitch fabric (reboot) and, if they return, "
                   "hardware service (NVIDIA Fabric Manager guide)",
            evidence={"sxid": codes, "switches": switches, "count": len(evs)}))
    groups: Dict[str, List[LogEvent]] = {}
    for e in _fresh(events, "kmsg_mlx5"):
        hit = next((m for m in MLX5_MESSAGES if re.search(m[0], str(e.fields["message"]))), None)
        if hit:
            groups.setdefault(hit[1], []).append(e)
    for meaning, evs in groups.items():
        _, _, verdict, conf, note = next(m for m in MLX5_MESSAGES if m[1] == meaning)
        devs = sorted({str(e.fields.get("ifname") or e.fields["bus_id"]) for e in evs})
        out.append(from_events(
            evs, id="kmsg.mlx5." + re.sub(r"\W+", "_", meaning)[:30], category="network", verdict=verdict,
            confidence=conf, tier=0 if verdict is Verdict.FAIL else 1, node=only(e.node for e in evs),
            consequence=note, summary=f"{meaning}: {', '.join(devs[:4])}",
            action="check the port (ibstat / ethtool), cable and NIC firmware; compare its counters with peers'",
            evidence={"devices": devs, "count": len(evs)}))
    return out


def _where(e: LogEvent) -> Tuple[bool, str]:
    """(inside a torch.distributed call, where the main thread is)."""
    frames = [str(f) for f in e.fields.get("frames", [])]
    for f in frames:
        m = re.match(r"^(\S+) \((?:.*/)?distributed_c10d\.py", f)
        if m and m.group(1) in _COLLECTIVES:
            return True, m.group(1)
    for f in frames:
        if "torch/utils/data" in f:
            return False, "DataLoader (" + f + ")"
    return False, frames[0] if frames else "no Python frames"


def _who(e: LogEvent) -> str:
    if e.rank is not None:
        return f"rank {e.rank}"
    pid = e.fields.get("pid") or e.fields.get("tid")
    return (f"pid {pid}" if pid else f"line {e.line}") + (f" on {e.node}" if e.node else "")


def pyspy_outliers(events: List[LogEvent]) -> List[TriageFinding]:
    """py-spy dumps: the ranks whose main thread is not in the collective the others wait in."""
    mains = [e for e in of_kind(events, "pyspy_thread") if e.fields.get("thread_name") == "MainThread"
             and e.fields.get("frames")]
    errors = of_kind(events, "pyspy_error")
    if len(mains) + len(errors) < 2:
        return _one_process(of_kind(events, "pyspy_thread"))
    placed = [(e, *_where(e)) for e in mains]
    inside = [(e, w) for e, ins, w in placed if ins]
    outside = [(e, w) for e, ins, w in placed if not ins] + [(e, "py-spy could not read it: "
                                                              + str(e.fields["error"])) for e in errors]
    if not inside:
        return []
    ops = Counter(w for _, w in inside)
    evidence = {"in_collective": dict(ops), "processes": len(mains) + len(errors)}
    unreadable = len(outside) == len(errors)  # py-spy could not even suspend them: they sit in the kernel
    if outside and (len(outside) < len(inside) or unreadable):
        who = [_who(e) for e, _ in outside]
        ranks = [e.rank for e, _ in outside if e.rank is not None]
        evidence["outliers"] = {w: where for w, (_, where) in zip(who, outside)}
        return [from_events(
            [e for e, _ in outside] + [e for e, _ in inside][:2], id="pyspy.outlier", category="collective_hang",
            verdict=Verdict.FAIL, confidence=0.75 if len(outside) == 1 else 0.6,
            rank=ranks[0] if len(ranks) == 1 else None, node=only(e.node for e, _ in outside),
            summary=f"{', '.join(who[:4])} is not in a collective ({outside[0][1][:120]}) while "
                    f"{len(inside)} other process(es) wait in {'/'.join(sorted(ops))}: it is the one holding them up",
            action="look at what that rank is doing (its data loader, I/O, a host-side deadlock); py-spy dump "
                   "--native it again to see whether it moves",
            evidence=evidence)]
    if len(ops) > 1 and not outside:
        return [from_events(
            [e for e, _ in inside][:5], id="pyspy.mismatch", category="collective_hang", verdict=Verdict.FAIL,
            confidence=0.5, summary="ranks wait in different collectives ("
            + ", ".join(f"{op} ×{n}" for op, n in ops.most_common(4)) + "): their collective order diverged",
            action="compare the call sites of each group; the minority group took another code path",
            evidence=evidence)]
    if not outside:
        op = next(iter(ops))
        return [from_events(
            [e for e, _ in inside][:5], id="pyspy.all_in_collective", category="collective_hang",
            verdict=Verdict.WARN, confidence=0.35, consequence=True,
            summary=f"all {len(inside)} dumped processes wait in {op}: the missing peer is elsewhere (not dumped) "
                    "or the fabric is stuck",
            action="dump the ranks not included here; check NCCL/IB errors and the watchdog's SeqNum per rank",
            evidence=evidence)]
    # As many elsewhere as in the collective: no single outlier, but ranks out of step all the same.
    evidence["elsewhere"] = {_who(e): where for e, where in outside[:4]}
    return [from_events(
        [e for e, _ in inside][:3] + [e for e, _ in outside][:3], id="pyspy.split", category="collective_hang",
        verdict=Verdict.WARN, confidence=0.3, consequence=True,
        summary=f"{len(inside)} dumped process(es) wait in {'/'.join(sorted(ops))} while {len(outside)} are elsewhere "
                f"({outside[0][1][:120]}): the ranks are out of step, the ones outside the collective hold it up",
        action="dump every rank again: the ones that stay outside the collective (a data loader, I/O, another code "
               "path) are the ones to look at",
        evidence=evidence)]


def _one_process(threads: List[LogEvent]) -> List[TriageFinding]:
    """A single dump: a thread waiting inside a collective is the local half of a hang (which peer is
    missing needs the other ranks' dumps); a main thread blocked waiting for its input (a queue
    get, torch's DataLoader) is, in a job that hangs (why else dump it), most often the rank the
    others wait for: its data loader stalled."""
    waiting = [(e, w) for e, (ins, w) in ((e, _where(e)) for e in threads) if ins]
    if not waiting:
        main = next((e for e in threads if e.fields.get("thread_name") == "MainThread" and e.fields.get("frames")), None)
        frames = [str(f) for f in (main.fields["frames"] if main is not None else [])]
        if main is None or not any(f.startswith("get (queue.py") or "torch/utils/data" in f for f in frames):
            return []
        # py-spy prints the standard library by bare file name ("wait (threading.py:302)"): the first
        # frame with a path is where the program itself waits.
        where = next((f for f in frames if "/" in f), frames[0])
        return [from_events(
            [main], id="pyspy.main_thread_waits_for_data", category="collective_hang", verdict=Verdict.WARN,
            confidence=0.25, consequence=True,
            summary=f"the dumped process's main thread waits for its input data in {where[:120]}, not in a "
                    "collective: if the job hangs, this is likely the rank the others wait for",
            action="py-spy dump the other ranks: if they wait in a collective, look at what holds this one "
                   "(its data loader, storage, a lock); dump it again to see whether it moves",
            evidence={"main_thread_at": where, "frames": frames[:8]})]
    return [from_events(
        [e for e, _ in waiting][:3], id="pyspy.waits_in_collective", category="collective_hang",
        verdict=Verdict.WARN, confidence=0.3, consequence=True,
        summary=f"thread {waiting[0][0].fields.get('tid')} ({waiting[0][0].fields.get('thread_name') or 'unnamed'})"
                f" waits in {waiting[0][1]}: this process is stuck in a collective a peer has not joined",
        action="py-spy dump every rank: the one not in this collective is the one to look at",
        evidence={"in_collective": dict(Counter(w for _, w in waiting))})]


def fr_outliers(events: List[LogEvent]) -> List[TriageFinding]:
    """Flight Recorder: ranks that did not join a collective, or whose last collective differs from the others'."""
    out: List[TriageFinding] = []
    for e in of_kind(events, "fr_missing_ranks"):
        missing = [int(r) for r in e.fields.get("missing_ranks") or []]
        out.append(from_events(
            [e], id=f"fr.missing.{e.fields.get('seq')}", category="collective_hang", verdict=Verdict.FAIL,
            confidence=0.8, rank=missing[0] if len(missing) == 1 else None,
            summary=f"rank {ranks_text(missing) if missing else '?'} did not join collective "
                    f"{e.fields.get('op', '?')} #{e.fields.get('seq', '?')} in group {e.fields.get('group', '?')} "
                    f"(state {e.fields.get('state', '?')}); the other ranks wait for it",
            action="look at that rank's log and stack: it crashed, hangs elsewhere, or took another code path",
            evidence={k: e.fields.get(k) for k in ("seq", "op", "group", "missing_ranks", "expected_ranks", "state")}))
    lasts = [e for e in of_kind(events, "fr_last_collective") if e.rank is not None]
    for group in sorted({str(e.fields["group"]) for e in lasts}):
        evs = [e for e in lasts if e.fields["group"] == group]
        seqs = {int(e.rank): int(e.fields["seq"]) for e in evs}  # type: ignore[arg-type]
        if len(seqs) < 2 or len(set(seqs.values())) == 1:
            continue
        counts = Counter(seqs.values())
        top = counts.most_common(2)
        mode = top[0][0] if len(top) == 1 or top[0][1] > top[1][1] else None
        odd = sorted(r for r, s in seqs.items() if s != mode) if mode is not None else \
            sorted(r for r, s in seqs.items() if s == min(seqs.values()))
        out.append(from_events(
            [e for e in evs if e.rank in odd][:5], id=f"fr.outlier.{group}", category="collective_hang",
            verdict=Verdict.FAIL, confidence=0.7, rank=odd[0] if len(odd) == 1 else None,
            summary=f"rank {ranks_text(odd)}'s last collective in group {group} differs from the others' "
                    f"(seq {', '.join(str(seqs[r]) for r in odd[:4])} vs "
                    f"{mode if mode is not None else max(seqs.values())})",
            action="that rank fell behind or ran an extra collective: check its stack and log first",
            evidence={"group": group, "last_seq_by_rank": {str(r): s for r, s in sorted(seqs.items())}}))
    return out


RULES: Tuple[Rule, ...] = (
    Rule("smi.clock_events", ("thermal_power",), smi_clock_events),
    Rule("smi.gpu_health", ("gpu_hardware",), smi_gpu_health),
    Rule("smi.unreachable", ("gpu_hardware", "config"), smi_unreachable),
    Rule("table.heat", ("thermal_power",), table_heat),
    Rule("table.busy_wait", ("collective_hang",), table_busy_wait),
    Rule("ib.ports", ("network",), ib_ports),
    Rule("gpustat.unowned", ("host_resources",), gpustat_orphans),
    Rule("smi.unowned", ("host_resources",), smi_unowned),
    Rule("smi.compute_mode", ("config",), smi_compute_mode),
    Rule("shm.space", ("host_resources",), shm_space),
    Rule("ps.gpu_tools", ("gpu_hardware",), gpu_tools_stuck),
    Rule("progress.out_of_step", ("collective_hang",), ranks_out_of_step),
    Rule("stall", ("host_resources", "collective_hang"), log_stalls),
    Rule("dcgm.diag", ("gpu_hardware", "thermal_power", "config", "network"), dcgm_results),
    Rule("slurm.reason", ("scheduler", "config", "gpu_hardware"), node_reasons),
    Rule("sacct.state", ("scheduler", "memory"), sacct_states),
    Rule("kmsg.aer", ("gpu_hardware",), kernel_pcie),
    Rule("kmsg.host", ("memory", "host_resources"), kernel_host),
    Rule("kmsg.fabric", ("gpu_hardware", "network"), kernel_fabric),
    Rule("pyspy.outlier", ("collective_hang",), pyspy_outliers),
    Rule("fr.outlier", ("collective_hang",), fr_outliers),
)
