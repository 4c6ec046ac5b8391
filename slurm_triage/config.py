"""One TOML config file, validated against a declared schema.

Search order: ``--config``, ``$SLURM_TRIAGE_CONFIG``, ``/etc/slurm-triage/config.toml``,
built-in defaults. Every key is declared in ``SCHEMA`` (and documented in
``etc/config.toml.example``, which a test keeps in step with it). String values may
contain ``{node}``, replaced by this node's name, so one file serves every node.
"""
from __future__ import annotations

import math
import os
import re
import stat
import sys
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Tuple


def _toml() -> Any:
    """tomllib (tomli on Python < 3.11), imported when a file is parsed: the hooks' GPU probe
    child imports this module before the config is read, and needs no TOML parser."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on RHEL 9's Python 3.9
        import tomli as tomllib
    return tomllib

DEFAULT_PATH = "/etc/slurm-triage/config.toml"
MAX_NUMBER = 1e9  # no setting needs more; inf, nan and 1e300 are typos or attacks


class Key(NamedTuple):
    """One setting: its type, default, doc line and validator (a NamedTuple, not a dataclass:
    every hook imports this module before its probes start, and dataclasses costs ~8 ms)."""

    type: type
    default: Any
    doc: str
    check: Optional[Callable[[Any], Optional[str]]] = None
    """Returns an error message for a bad value, None when it is fine."""


def _positive(v: Any) -> Optional[str]:
    return None if v > 0 else "must be > 0"


def _non_negative(v: Any) -> Optional[str]:
    return None if v >= 0 else "must be >= 0"


def _between(lo: float, hi: float, lo_open: bool = True) -> Callable[[Any], Optional[str]]:
    """A bounded number: a deadline of inf or 1e300 is a hook that never ends."""
    def check(v: Any) -> Optional[str]:
        ok = (v > lo if lo_open else v >= lo) and v <= hi
        return None if ok else f"must be {'>' if lo_open else '>='} {lo:g} and <= {hi:g}"

    return check


def _absolute_or_empty(v: str) -> Optional[str]:
    return None if v == "" or v.startswith("/") else "must be an absolute path (or empty)"


def _url_or_empty(v: str) -> Optional[str]:
    return None if v == "" or re.match(r"^https?://[^/\s]+", v) else "must be an http(s) URL (or empty)"


def _one_of(*choices: str) -> Callable[[Any], Optional[str]]:
    def check(v: Any) -> Optional[str]:
        return None if v in choices else "must be one of " + ", ".join(repr(c) for c in choices)

    return check


SCHEMA: Dict[str, Dict[str, Key]] = {
    "node": {
        "name": Key(str, "", "This node's Slurm name; empty: $SLURMD_NODENAME, else the short hostname."),
        "state_dir": Key(str, "/var/lib/slurm-triage", "Per-job JSON state (baselines, verdicts).", _absolute_or_empty),
        "spool_dir": Key(str, "/var/spool/slurm-triage", "Pushes that could not be delivered, replayed in order.", _absolute_or_empty),
        "state_max_age_days": Key(float, 14.0, "Job state directories older than this are pruned.", _positive),
        "spool_max_files": Key(int, 1000, "Oldest spooled pushes beyond this count are dropped (and counted).", _between(0, 1000000)),
        "spool_max_bytes": Key(int, 64 << 20, "Oldest spooled pushes beyond this many bytes are dropped (and counted).", _between(0, 1 << 40)),
        "syslog_socket": Key(str, "/dev/log", "Hooks log each line here too (syslog/journald): slurmd discards a hook's stderr on success; empty: do not.", _absolute_or_empty),
    },
    "gpu": {
        "enabled": Key(bool, True, "Collect GPU facts through NVML."),
        "nvml_library": Key(str, "", "Absolute path of libnvidia-ml.so.1 to load; empty: the system one.", _absolute_or_empty),
        "deadline_seconds": Key(float, 5.0, "NVML runs in a child process killed after this long (-> UNKNOWN).", _between(0, 60)),
        "expected_count": Key(int, -1, "GPUs this node must show; -1: do not check the count."),
        "temperature_margin_celsius": Key(float, 5.0, "WARN when a GPU is this close to its own slowdown threshold.", _non_negative),
    },
    "procs": {
        "enabled": Key(bool, True, "Collect processes, sockets and IPC files."),
        "deadline_seconds": Key(float, 3.0, "Deadline for the process scan.", _between(0, 60)),
        "ipc_dirs": Key(list, ["/dev/shm", "/tmp"], "Directories scanned (lstat only) for NCCL/MPI/UCX/PSM2/torch leftovers."),
    },
    "kernel": {
        "enabled": Key(bool, True, "Read NVIDIA Xid, fallen-off-the-bus and PCIe AER lines from the kernel log."),
        "source": Key(str, "auto", "auto (kmsg, then dmesg), kmsg, dmesg or file.", _one_of("auto", "kmsg", "dmesg", "file")),
        "path": Key(str, "", "Kernel log file read when source = \"file\".", _absolute_or_empty),
        "deadline_seconds": Key(float, 2.0, "Deadline for reading the kernel log.", _between(0, 60)),
    },
    "rdma": {
        "enabled": Key(bool, True, "Read InfiniBand/RoCE ports from sysfs."),
        "sysfs_root": Key(str, "/sys/class/infiniband", "Root of the IB class tree (tests point it at a recorded tree).", _absolute_or_empty),
        "expected_rate_gbps": Key(float, 0.0, "WARN when an active port runs below this rate; 0: do not check.", _non_negative),
        "deadline_seconds": Key(float, 2.0, "Deadline for the sysfs read.", _between(0, 60)),
    },
    "listeners": {
        "dashboard_ports": Key(list, [8265, 6006, 8888, 8889, 6007, 5000, 7860, 8080],
                               "Ports of dashboards (Ray, TensorBoard, Jupyter, ...) that must not be bound publicly."),
    },
    "checks": {
        "disabled": Key(list, [], "Check ids to skip (see `slurm-triage checks`)."),
    },
    "hooks": {
        "prolog_deadline_seconds": Key(float, 8.0, "Hard deadline of the Prolog; keep it below MessageTimeout (10 s) and PrologEpilogTimeout.", _between(0, 60)),
        "epilog_deadline_seconds": Key(float, 20.0, "Hard deadline of the Epilog; keep it below PrologEpilogTimeout.", _between(0, 300)),
        "drain": Key(bool, True, "On a hardware FAIL, drain the node with a reason tagged \"triage:\" and exit non-zero."),
        "scontrol": Key(str, "/usr/bin/scontrol", "Absolute path of scontrol (hooks run without PATH).", _absolute_or_empty),
        "cleanup": Key(bool, False, "Epilog: SIGTERM, then SIGKILL, this job's leftover processes and remove its IPC files."),
        "background_push": Key(bool, True, "An OK Prolog (without --triage) or Epilog hands its push to a detached publisher, so neither the job nor the node's release waits for requests and prometheus_client (~100 ms per hook); it holds the spool lock, so order holds, and replays what a later hook queued behind it."),
        "publisher_nice": Key(int, 10, "Nice value of the background publisher: its imports (~150 ms of CPU) yield to the hooks and job starts that share the node's CPUs; 0 keeps slurmd's.", _between(0, 19, lo_open=False)),
        "cleanup_grace_seconds": Key(float, 3.0, "Epilog: time between SIGTERM and SIGKILL.", _between(0, 60, lo_open=False)),
        "sample_seconds": Key(float, 2.0, "Prolog with --triage: NVML sampling window for stuck clocks, throttling, idle power.", _between(0, 30, lo_open=False)),
    },
    "drain": {
        "max_nodes": Key(int, 0, "Circuit breaker: drain no node while this many carry a \"triage:\" drain reason (now or within window_seconds); 0: no absolute cap.", _between(0, 1000000, lo_open=False)),
        "max_fraction": Key(float, 0.0, "Circuit breaker: drain no node while this fraction of its partition (rounded up) carries our reason; 0: no cap.", _between(0, 1, lo_open=False)),
        "on_breaker": Key(str, "run", "When the breaker holds a drain back: \"run\" the job anyway, or \"fail_job\" (cancel it; the node stays in service).", _one_of("run", "fail_job")),
        "window_seconds": Key(float, 3600.0, "Circuit breaker: a node drained by us this recently still counts after it was resumed.", _between(0, 7 * 86400, lo_open=False)),
        "cache_seconds": Key(float, 10.0, "Circuit breaker: reuse this node's last sinfo census this long (1,000 Prologs at once must not hammer slurmctld).", _between(0, 3600, lo_open=False)),
        "sinfo": Key(str, "/usr/bin/sinfo", "Absolute path of sinfo.", _absolute_or_empty),
        "scancel": Key(str, "/usr/bin/scancel", "Absolute path of scancel (on_breaker = \"fail_job\").", _absolute_or_empty),
        "resume_max_age_seconds": Key(float, 900.0, "`node resume NODE` run elsewhere: NODE's pushed check result must be younger than this (and newer than the drain).", _between(0, 7 * 86400)),
        "retry_seconds": Key(float, 600.0, "slurmctld did not answer our drain: keep retrying it this long in the background, and re-tag Slurm's \"Prolog error\" with our reason.", _between(0, 86400, lo_open=False)),
    },
    "gate": {
        "deadline_seconds": Key(float, 10.0, "srun --triage / gang-check: wait at most this long for every node's Prolog verdict (keep it below the plugin's gate_timeout).", _positive),
        "on_unreachable": Key(str, "warn", "No Pushgateway answer and no readable state: \"warn\" (launch anyway) or \"block\".", _one_of("warn", "block")),
        "idle_temp_outlier_celsius": Key(float, 10.0, "Flag a node whose idle GPU temperature is this far above the gang's median.", _positive),
        "block_on": Key(str, "fail", "Block the step on \"fail\" only, or on \"warn\" too (peer outliers are WARN).", _one_of("fail", "warn")),
    },
    "watcher": {
        "interval_seconds": Key(float, 5.0, "Sampling interval of the in-step watcher (srun --triage).", _positive),
        "hang_window_seconds": Key(float, 60.0, "Power-axiom hang: util high and power low on the step's GPUs for this long.", _positive),
        "hang_util_percent": Key(float, 90.0, "Power-axiom hang: utilization at or above this.", _positive),
        "hang_power_ratio": Key(float, 0.35, "Power-axiom hang: power at or below this fraction of the limit.", _positive),
        "hang_gpu_fraction": Key(float, 1.0, "Power-axiom hang: fraction of the step's GPUs that must show it.", _positive),
        "straggler_window_seconds": Key(float, 60.0, "Thermal/throttle straggler: window over which a GPU is mostly slowed down.", _positive),
        "thread_window_seconds": Key(float, 120.0, "Thread leak: window over which the step's thread count keeps growing.", _positive),
        "thread_growth_threshold": Key(int, 64, "Thread leak: growth over the window that counts as a leak.", _positive),
        "run_dir": Key(str, "/tmp", "Where the watcher keeps its pidfile (a per-user directory is made inside).", _absolute_or_empty),
        "evidence_dir": Key(str, "/tmp", "Where hang evidence bundles go (a per-user, per-job directory is made inside).", _absolute_or_empty),
        "pyspy_timeout_seconds": Key(float, 10.0, "Deadline of one `py-spy dump` of a rank in an evidence bundle.", _positive),
    },
    "triage": {
        "prometheus_url": Key(str, "", "Prometheus base URL for `triage JOBID`; empty: no metric evidence.", _url_or_empty),
        "prometheus_timeout_seconds": Key(float, 8.0, "Per-query timeout of the Prometheus HTTP API.", _positive),
        "pushgateway_url": Key(str, "", "Pushgateway to read the job's groups from; empty: pushgateway.url.", _url_or_empty),
        "sacct": Key(str, "/usr/bin/sacct", "Absolute path of sacct.", _absolute_or_empty),
        "slurm_timeout_seconds": Key(float, 10.0, "Timeout of each sacct/scontrol call.", _positive),
        "max_points": Key(int, 10000, "Points per series of a range query (Prometheus refuses more than 11,000).", _positive),
        "straggler_factor": Key(float, 2.0, "Straggler: step time above this many times the job's median.", _positive),
        "straggler_clock_ratio": Key(float, 0.85, "Straggler: mean SM clock below this ratio of the job's median GPU.", _positive),
        "thermal_fraction": Key(float, 0.2, "Thermal: slowdown reasons active for at least this share of the job.", _positive),
        "slowdown_temp_celsius": Key(float, 87.0, "Slowdown threshold used when the GPU's own is unknown.", _positive),
        "thermal_margin_celsius": Key(float, 5.0, "Thermal: this close to the slowdown threshold counts as near.", _non_negative),
        "hang_util_percent": Key(float, 90.0, "Power-axiom hang: utilization at or above this.", _positive),
        "hang_power_ratio": Key(float, 0.35, "Power-axiom hang: power at or below this ratio of the job's median per-GPU peak.", _positive),
        "hang_clock_ratio": Key(float, 0.9, "Power-axiom hang: SM clock at or above this ratio of the job's median peak.", _positive),
        "hang_min_seconds": Key(float, 300.0, "Power-axiom hang: shortest window reported.", _positive),
        "thread_growth": Key(int, 64, "Thread leak: threads gained over the job that flag a leak.", _positive),
        "run_queue_ratio": Key(float, 2.0, "Run-queue contention: a node's runnable tasks against its peers' median.", _positive),
        "baseline_ratio": Key(float, 1.5, "--baseline: a figure that differs by this factor is reported.", _positive),
        "dcgm_node_label": Key(str, "Hostname", "Label naming the node in dcgm-exporter series."),
        "dcgm_gpu_label": Key(str, "gpu", "Label naming the GPU in dcgm-exporter series."),
        "node_exporter_node_label": Key(str, "instance", "Label naming the node in node_exporter series."),
        "step_time_node_label": Key(str, "instance", "Label naming the node in the step-time series."),
        "metric_gpu_util": Key(str, "DCGM_FI_DEV_GPU_UTIL", "GPU utilization (percent)."),
        "metric_gpu_power": Key(str, "DCGM_FI_DEV_POWER_USAGE", "GPU power (watts)."),
        "metric_gpu_temp": Key(str, "DCGM_FI_DEV_GPU_TEMP", "GPU temperature (Celsius)."),
        "metric_sm_clock": Key(str, "DCGM_FI_DEV_SM_CLOCK", "SM clock (MHz)."),
        "metric_clock_reasons": Key(list, ["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"], "Clock-event reason bitmask (old and new names)."),
        "metric_xid": Key(str, "DCGM_FI_DEV_XID_ERRORS", "Last Xid error code."),
        "metric_ecc_dbe": Key(str, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Volatile double-bit ECC errors."),
        "metric_row_remap_failure": Key(str, "DCGM_FI_DEV_ROW_REMAP_FAILURE", "Row-remap failure flag."),
        "metric_step_time": Key(str, "", "A site's training-step time gauge (seconds), e.g. train_step_seconds; empty: none."),
        "metric_ib_errors": Key(list, ["node_infiniband_symbol_error_total", "node_infiniband_port_receive_errors_total", "node_infiniband_link_downed_total", "node_infiniband_link_error_recovery_total", "node_infiniband_local_link_integrity_errors_total", "node_infiniband_excessive_buffer_overrun_errors_total", "node_infiniband_port_transmit_discards_total"], "InfiniBand error counters."),
        "metric_procs_running": Key(str, "node_procs_running", "Runnable tasks of the node."),
        "metric_load1": Key(str, "node_load1", "One-minute load of the node."),
        "metric_watch_threads": Key(str, "slurm_triage_watch_threads", "The watcher's thread count of the step."),
        "metric_watch_procs_running": Key(str, "slurm_triage_watch_procs_running", "The watcher's run queue."),
        "metric_watch_thread_leak": Key(str, "slurm_triage_watch_thread_leak", "The watcher's thread-leak flag."),
        "metric_watch_straggler": Key(str, "slurm_triage_watch_straggler", "The watcher's thermal/throttle straggler flag."),
        "metric_hang_suspected": Key(str, "slurm_triage_hang_suspected", "The watcher's power-axiom hang flag."),
    },
    "pushgateway": {
        "url": Key(str, "", "Pushgateway base URL, e.g. http://127.0.0.1:9091; empty: do not push.", _url_or_empty),
        "timeout_seconds": Key(float, 2.0, "Per-request timeout; a down gateway costs at most this per push.", _between(0, 30)),
        "retries": Key(int, 1, "Extra attempts (with jitter) before spooling.", _between(0, 5, lo_open=False)),
        "hook_budget_seconds": Key(float, 3.0, "A hook's pushes, spool replay included, together take at most this long; the rest waits in the spool.", _between(0, 30)),
        "result_keep_seconds": Key(float, 300.0, "A job's last_job group stays in the gateway this long (keep it several Prometheus scrape intervals), then a later push from the node deletes it; every group kept makes each push slower (the gateway checks a push against all groups).", _between(0, 86400)),
    },
    "textfile": {
        "directory": Key(str, "", "node_exporter textfile collector directory; empty: do not write.", _absolute_or_empty),
    },
}


class ConfigError(Exception):
    """A config problem, with the file, key and line when known."""

    def __init__(self, message: str, path: str = "", key: str = "", line: Optional[int] = None):
        where = path
        if line is not None:
            where += f":{line}"
        if key:
            where += f": {key}"
        super().__init__(f"{where}: {message}" if where else message)
        self.path, self.key, self.line = path, key, line


class Config:
    """The settings of one load: ``values[section][key]``, where they came from, and what was
    wrong with the file (warnings, when loaded fail-open)."""

    __slots__ = ("values", "source", "warnings")

    def __init__(self, values: Dict[str, Dict[str, Any]], source: str = "<defaults>",
                 warnings: Optional[List[str]] = None):
        self.values, self.source = values, source
        self.warnings: List[str] = warnings if warnings is not None else []

    def get(self, section: str, key: str) -> Any:
        return self.values[section][key]

    def with_values(self, values: Dict[str, Dict[str, Any]]) -> "Config":
        """The same source and warnings over other values (a node's state dir, say)."""
        return Config(values, self.source, list(self.warnings))

    def __repr__(self) -> str:
        return f"Config(source={self.source!r}, warnings={self.warnings!r})"


def node_name(explicit: str = "") -> str:
    """Slurm's name for this node: hooks get SLURMD_NODENAME; hostname is the fallback."""
    return explicit or os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def _key_lines(text: str) -> Dict[Tuple[str, str], int]:
    """Map (section, key) to its line number, for error messages (tomllib has none)."""
    lines: Dict[Tuple[str, str], int] = {}
    section = ""
    for n, raw in enumerate(text.splitlines(), 1):
        s = raw.strip()
        m = re.match(r"^\[\s*([^\]]+?)\s*\]", s)
        if m:
            section = m.group(1).strip().strip('"')
            lines.setdefault((section, ""), n)
            continue
        m = re.match(r'^"?([A-Za-z0-9_.-]+)"?\s*=', s)
        if m:
            full = m.group(1)
            sec, _, key = (section + "." + full).rpartition(".") if section else full.rpartition(".")
            lines.setdefault((sec, key), n)
    return lines


def _coerce(key: Key, value: Any) -> Any:
    if key.type is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) and key.type is not bool:
        raise TypeError
    if not isinstance(value, key.type):
        raise TypeError
    if key.type in (int, float) and not (math.isfinite(value) and abs(value) <= MAX_NUMBER):
        raise ValueError(f"must be a finite number of magnitude <= {MAX_NUMBER:g}, got {value!r}")
    return value


def defaults() -> Dict[str, Dict[str, Any]]:
    return {sec: {k: (list(v.default) if isinstance(v.default, list) else v.default) for k, v in keys.items()}
            for sec, keys in SCHEMA.items()}


def parse(text: str, path: str = "<string>", errors: Optional[List[ConfigError]] = None) -> Dict[str, Dict[str, Any]]:
    """Validate TOML text against SCHEMA; raise ConfigError naming file, key and line.

    With an ``errors`` list (the hooks), a bad key or section is recorded there and left at
    its default instead, so one typo does not throw away the rest of the file.
    """
    tomllib = _toml()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        raise ConfigError(f"not valid TOML: {e}", path, line=int(m.group(1)) if m else None) from None
    lines = _key_lines(text)
    values = defaults()

    def bad(err: ConfigError) -> None:
        if errors is None:
            raise err
        errors.append(err)

    for section, table in data.items():
        if section not in SCHEMA:
            bad(ConfigError(f"unknown section [{section}] (known: {', '.join(SCHEMA)})", path,
                            section, lines.get((section, ""))))
            continue
        if not isinstance(table, dict):
            bad(ConfigError("must be a table", path, section, lines.get(("", section))))
            continue
        for k, v in table.items():
            name = f"{section}.{k}"
            line = lines.get((section, k))
            key = SCHEMA[section].get(k)
            if key is None:
                bad(ConfigError(f"unknown key (known in [{section}]: {', '.join(SCHEMA[section])})", path, name, line))
                continue
            try:
                v = _coerce(key, v)
            except TypeError:
                bad(ConfigError(f"expected {key.type.__name__}, got {type(v).__name__} {v!r}", path, name, line))
                continue
            except ValueError as e:
                bad(ConfigError(str(e), path, name, line))
                continue
            problem = key.check(v) if key.check else None
            if problem:
                bad(ConfigError(f"{problem}, got {v!r}", path, name, line))
                continue
            values[section][k] = v
    return values


def _expand(values: Dict[str, Dict[str, Any]], node: str) -> None:
    for table in values.values():
        for k, v in table.items():
            if isinstance(v, str):
                table[k] = v.replace("{node}", node)


def resolve_path(explicit: Optional[str] = None) -> Optional[str]:
    """The config file to read, or None for built-in defaults."""
    if explicit:
        return explicit
    env = os.environ.get("SLURM_TRIAGE_CONFIG")
    if env:
        return env
    return DEFAULT_PATH if os.path.exists(DEFAULT_PATH) else None


def _read_regular(path: str) -> str:
    """The file's text; a FIFO or device there is refused at once instead of blocking a hook."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"not a regular file: {path}")
        return fh.read(1 << 20).decode("utf-8")


CACHE_DIR = "/run/slurm-triage"
"""Where the hooks keep the parsed config (``$SLURM_TRIAGE_CACHE_DIR`` overrides it): parsing
TOML cost every Prolog and Epilog ~8 ms of CPU on its critical path (tomllib's import, 4.5 ms,
and a pure-Python parse of even a short file, 3 ms), the same for every job until the file
changes. Only a directory and files owned by this user and writable by nobody else count."""
CACHE_SCHEMA = 1
RACY_SECONDS = 2.0
"""A file changed this recently is not cached: a rewrite of the same size within the same
timestamp tick would leave its stat, and so the cache key, unchanged."""


def _stamp(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _cache_path(path: str) -> Optional[str]:
    directory = os.environ.get("SLURM_TRIAGE_CACHE_DIR") or CACHE_DIR
    name = "config-" + os.path.abspath(path).replace("%", "%25").replace("/", "%2F") + ".json"
    return os.path.join(directory, name) if len(name) <= 255 else None


def _owned_by_me(st: os.stat_result, kind: int = stat.S_IFREG) -> bool:
    """Of this kind (a regular file, or a directory that is not a link to one), this user's, and
    writable by nobody else."""
    return stat.S_IFMT(st.st_mode) == kind and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def _cache_key(st: os.stat_result) -> str:
    """The file's identity and this module's: a new file, an edit, or new code miss the cache."""
    return _stamp(st) + "/" + _stamp(os.stat(__file__))


def _cached(path: str, st: os.stat_result) -> Optional[Tuple[Dict[str, Dict[str, Any]], List[str]]]:
    """(values before {node} expansion, warnings) parsed from this very file, or None."""
    import json

    cache = _cache_path(path)
    if cache is None:
        return None
    try:
        if not _owned_by_me(os.lstat(os.path.dirname(cache)), stat.S_IFDIR):
            return None
        fd = os.open(cache, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            if not _owned_by_me(os.fstat(fd)):
                return None
            entry = json.loads(fh.read(1 << 20))
        if entry.get("schema") != CACHE_SCHEMA or entry.get("key") != _cache_key(st):
            return None
        return entry["values"], list(entry["warnings"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _remember(path: str, st: os.stat_result, values: Dict[str, Dict[str, Any]], warnings: List[str]) -> None:
    """Cache a parse (best effort: a directory that cannot be made or written means no cache)."""
    import json
    import time

    cache = _cache_path(path)
    if cache is None or time.time() - max(st.st_mtime, st.st_ctime) < RACY_SECONDS:
        return
    from .sinks.atomic import write_atomic

    directory = os.path.dirname(cache)
    try:
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            pass
        if _owned_by_me(os.lstat(directory), stat.S_IFDIR):
            write_atomic(cache, json.dumps({"schema": CACHE_SCHEMA, "key": _cache_key(st), "values": values,
                                            "warnings": warnings}).encode(), fsync=False)
    except OSError:
        pass  # no cache: the next hook parses again


def load(explicit: Optional[str] = None, fail_open: bool = False, node: Optional[str] = None,
         cache: bool = False) -> Config:
    """Load and validate the config.

    ``fail_open`` (hooks): a bad key falls back to its default, an unreadable or unparsable
    file to all defaults, each with a warning instead of an exception, because a config
    typo must never drain the fleet. ``node`` is this node's name as Slurm gave it to the
    caller (SPANK helpers get no SLURMD_NODENAME); it wins over everything else.
    ``cache`` (hooks, with ``fail_open``): reuse the last parse of this same file (CACHE_DIR).
    """
    path = resolve_path(explicit)
    cfg = Config(defaults())
    if path is not None:
        try:
            st = os.stat(path) if cache and fail_open else None
            hit = _cached(path, st) if st is not None else None
            if hit is not None:
                cfg = Config(hit[0], source=path, warnings=hit[1])
            else:
                text = _read_regular(path)
                errors: List[ConfigError] = []
                cfg = Config(parse(text, path, errors if fail_open else None), source=path)
                cfg.warnings.extend(f"{e}; using the default for it" for e in errors)
                if st is not None:
                    _remember(path, st, cfg.values, cfg.warnings)
        except (OSError, UnicodeDecodeError) as e:
            err: Exception = ConfigError(f"cannot read: {e}", path)
            if not fail_open:
                raise err from None
            cfg.warnings.append(f"{err}; using built-in defaults")
        except ConfigError as e:  # TOML syntax: nothing in the file can be trusted
            if not fail_open:
                raise
            cfg.warnings.append(f"{e}; using built-in defaults")
    cfg.values["node"]["name"] = node or node_name(cfg.values["node"]["name"])
    _expand(cfg.values, cfg.values["node"]["name"])
    return cfg


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return repr(v)


def example() -> str:
    """A config file with every key commented out at its default: etc/config.toml.example."""
    out = ["# slurm-triage configuration (TOML). Every key is optional; shown at its default.",
           "# Search order: --config, $SLURM_TRIAGE_CONFIG, /etc/slurm-triage/config.toml.",
           "# \"{node}\" in any string is replaced by this node's Slurm name.",
           "# Validate with: slurm-triage config check FILE",
           "# The Prolog and Epilog keep their parse of this file in /run/slurm-triage ($SLURM_TRIAGE_CACHE_DIR),",
           "# keyed on the file's inode, size and times: an edit or a replaced file is read again."]
    for section, keys in SCHEMA.items():
        out.append("")
        out.append(f"[{section}]")
        for name, key in keys.items():
            out.append(f"# {key.doc}")
            out.append(f"# {name} = {_toml_value(key.default)}")
    return "\n".join(out) + "\n"
