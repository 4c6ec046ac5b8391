"""The in-step watcher: one daemon per node per ``--triage`` step, running as the job's user.

``start()`` is called by the SPANK helper in slurmstepd's ``user_init`` (privileges already
dropped) and must return at once, so the loop runs in a double-forked, setsid daemon that
records itself in a pidfile in a per-user, per-step directory. Every interval it samples
the step's GPUs (NVML), the step's processes (threads, states), the run queue and RDMA
counters inside a forked child under a hard deadline (a wedged NVML call or a /proc read
blocked on a D-state rank can only be abandoned, never interrupted), pushes a compact
series and runs the pure detectors of ``hang.py``. It ends with its step: on ``stop()``
(SPANK ``exit``), or by itself as soon as the step's ``slurmstepd: [JOB.STEP]`` is gone;
its probe children die with it (PR_SET_PDEATHSIG), so nothing is ever left behind.
"""
from __future__ import annotations

import ctypes
import json
import math
import os
import select
import shutil
import signal
import stat as stat_mod
import subprocess
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Any, Deque, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from . import hang
from ..collect import jobs
from ..config import Config, load
from ..deadline import run_probe
from ..ids import is_sluid
from ..sinks.exposition import to_text

PROC = "/proc"
COMM = "triage-watcher"  # the daemon's /proc/PID/comm, checked by stop() before any signal
PIDFILE = "watcher.pid"
STOP_WAIT_SECONDS = 3.0
RING_MAX = 2000
LOG_MAX_LINES = 200
COMPACT_GPU = ("uuid", "index", "minor", "power_watts", "power_limit_watts", "util_gpu_percent",
               "sm_clock_mhz", "sm_clock_max_mhz", "temperature_celsius", "slowdown_temp_celsius",
               "clock_event_names", "lost")
# Rank environment worth keeping in an evidence bundle (names or prefixes ending in "_").
EVIDENCE_ENV = ("NCCL_", "TORCH_", "CUDA_", "MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                "SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "PYTORCH_")
_STEP_ENV = (b"SLURM_JOB_ID", b"SLURM_JOB_SLUID", b"SLURM_STEP_ID", b"SLURM_STEP_GPUS", b"SLURM_JOB_GPUS")



class WatchError(Exception):
    """The watcher cannot (or must not) run; the message says why, for the SPANK log."""


@dataclass(frozen=True)
class WatchContext:
    job_id: str
    step_id: str
    node: str
    uid: int
    gid: int
    mode: str
    sluid: str = ""
    """The job's SLUID when its cgroup v2 directory is named by it (Slurm >= 26.05), else ""."""

    @property
    def step(self) -> str:
        return f"{self.job_id}.{self.step_id}"


# --------------------------------------------------------------------------- files

def _private_dir(base: str, parts: Iterable[str]) -> str:
    """``base/part/...`` created 0700 by us; refuses a component that is a symlink or belongs
    to someone else, because ``base`` is typically the world-writable /tmp."""
    path = base
    uid = os.geteuid()
    for part in parts:
        path = os.path.join(path, part)
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(path)
        if not stat_mod.S_ISDIR(st.st_mode) or st.st_uid != uid:
            raise WatchError(f"{path} is not a directory owned by uid {uid}: refusing to use it")
    return path


def _step_parts(cfg: Config, ctx: WatchContext) -> Tuple[str, List[str]]:
    # The node is in the name because one machine may host several slurmd (the lab).
    return cfg.get("watcher", "run_dir"), [f"slurm-triage-{ctx.uid}", f"{ctx.step}.{ctx.node}"]


def _evidence_parts(cfg: Config, ctx: WatchContext) -> Tuple[str, List[str]]:
    return cfg.get("watcher", "evidence_dir"), [f"slurm-triage-{ctx.uid}", ctx.job_id]


def step_dir(cfg: Config, ctx: WatchContext) -> str:
    """Where the pidfile lives; removed when the watcher ends."""
    base, parts = _step_parts(cfg, ctx)
    return os.path.join(base, *parts)


def evidence_dir(cfg: Config, ctx: WatchContext) -> str:
    """Where evidence bundles (and the watcher's own log) stay after the step ends."""
    base, parts = _evidence_parts(cfg, ctx)
    return os.path.join(base, *parts)


def _stat_fields(pid: int) -> Optional[Tuple[str, str, int]]:
    """(comm, state, start ticks) of a process, None when it is gone."""
    try:
        with open(f"{PROC}/{pid}/stat", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    r = data.rfind(b")")
    f = data[r + 2:].split()
    return data[data.find(b"(") + 1:r].decode(errors="replace"), f[0].decode(), int(f[19])


def process_alive(pid: int, start_ticks: int) -> bool:
    """The same process (not a reused pid) still runs; a zombie counts as gone."""
    st = _stat_fields(pid)
    return st is not None and st[2] == start_ticks and st[1] not in ("Z", "X")


def _read_pidfile(path: str) -> Optional[Dict[str, Any]]:
    try:
        st = os.lstat(path)
        if not stat_mod.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return None
        with open(path, encoding="utf-8") as fh:
            rec = json.load(fh)
        return rec if isinstance(rec.get("pid"), int) and isinstance(rec.get("start_ticks"), int) else None
    except (OSError, ValueError, AttributeError):
        return None


def _is_watcher(rec: Dict[str, Any]) -> bool:
    st = _stat_fields(rec["pid"])
    return st is not None and st[0] == COMM and st[2] == rec["start_ticks"] and st[1] not in ("Z", "X")


def _remove_step_dir(d: str) -> None:
    """The pidfile and its directory; nothing else is ever deleted."""
    for fn, path in ((os.unlink, os.path.join(d, PIDFILE)), (os.rmdir, d)):
        try:
            fn(path)
        except OSError:
            pass


# --------------------------------------------------------------------------- step

def _cmdline(pid: int) -> bytes:
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as fh:
            return fh.read(256)
    except OSError:
        return b""


def find_stepd(ctx: WatchContext) -> Optional[Tuple[int, int]]:
    """(pid, start ticks) of ``slurmstepd: [JOB.STEP]``: our parent when called from the
    SPANK helper (exactly our node's stepd, even with several slurmd per machine), else
    the first one found in /proc."""
    title = f"slurmstepd: [{ctx.step}]".encode()
    candidates = [os.getppid()] + [int(n) for n in os.listdir(PROC) if n.isdigit()]
    for pid in candidates:
        cmd = _cmdline(pid)
        if cmd.split(b"\0", 1)[0].rstrip() == title:
            st = _stat_fields(pid)
            if st is not None:
                return pid, st[2]
    return None


def _env_vars(data: bytes, wanted: Iterable[bytes]) -> Dict[str, str]:
    """Variables of a /proc/PID/environ blob whose name is in (or, for names ending in "_",
    starts with) ``wanted``."""
    names = tuple(wanted)
    out: Dict[str, str] = {}
    for item in data.split(b"\0"):
        name, eq, value = item.partition(b"=")
        if eq and any(name.startswith(w) if w.endswith(b"_") else name == w for w in names):
            out[name.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _read_bytes(path: str, limit: int = 1 << 20) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(limit)


def with_sluid(ctx: WatchContext, stepd_pid: int) -> WatchContext:
    """``ctx`` with the job's SLUID when the step's slurmstepd lives in a SLUID-named cgroup
    (``SLUID/step_N/slurm``: root's, so it cannot be forged by the job's user)."""
    try:
        m = jobs.cgroup_step(_read_bytes(f"{PROC}/{stepd_pid}/cgroup", 1 << 14))
    except OSError:
        return ctx
    if m is None or m[1] != ctx.step_id or not is_sluid(m[0]):
        return ctx
    return replace(ctx, sluid=m[0])


def _membership(pid: int, ctx: WatchContext) -> Tuple[bool, str]:
    """(belongs to the step, its SLURM_STEP_GPUS/SLURM_JOB_GPUS): cgroup first, environ else.

    Both cgroup namings count: ``job_<id>/step_<step>`` and Slurm 26.05's ``<SLUID>/step_<step>``.
    A SLUID cgroup when the step's SLUID is not known is matched by the process's own
    SLURM_JOB_SLUID, with its SLURM_JOB_ID and SLURM_STEP_ID."""
    gpus = ""
    try:
        m = jobs.cgroup_step(_read_bytes(f"{PROC}/{pid}/cgroup", 1 << 14))
    except OSError:
        return False, gpus
    by_cgroup = m is not None and m in ((ctx.job_id, ctx.step_id), (ctx.sluid, ctx.step_id))
    if m is not None and not by_cgroup and (ctx.sluid or not is_sluid(m[0]) or m[1] != ctx.step_id):
        return False, gpus
    try:
        env = _env_vars(_read_bytes(f"{PROC}/{pid}/environ"), _STEP_ENV)
    except OSError:
        env = {}
    gpus = env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS") or ""
    if by_cgroup:
        return True, gpus
    if m is not None and env.get("SLURM_JOB_SLUID") != m[0]:
        return False, gpus
    return (env.get("SLURM_JOB_ID"), env.get("SLURM_STEP_ID")) == (ctx.job_id, ctx.step_id), gpus


def scan_step(ctx: WatchContext, known: Dict[int, List[Any]], exclude: Set[int]) -> Dict[str, Any]:
    """The step's processes (pid, comm, state, threads) among this user's processes.

    ``known`` maps pid -> [start ticks, member, gpus] from earlier scans, so environ is
    read once per process, not once per interval. Returns the processes, the pids seen and
    the entries new since ``known`` (the caller merges them: the scan runs in a child).
    """
    uid = os.geteuid()
    seen: List[int] = []
    new: Dict[int, List[Any]] = {}
    procs: List[Dict[str, Any]] = []
    for name in os.listdir(PROC):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            if pid in exclude or os.stat(f"{PROC}/{name}").st_uid != uid:
                continue
            data = _read_bytes(f"{PROC}/{name}/stat", 4096)
        except OSError:
            continue
        r = data.rfind(b")")
        f = data[r + 2:].split()
        if int(f[1]) in exclude:
            continue  # our own helpers (py-spy)
        start = int(f[19])
        rec = known.get(pid)
        if rec is None or rec[0] != start:
            member, gpus = _membership(pid, ctx)
            rec = new[pid] = [start, member, gpus]
        seen.append(pid)
        if rec[1]:
            comm = data[data.find(b"(") + 1:r].decode(errors="replace")
            threads = int(f[17])
            procs.append({"pid": pid, "comm": comm, "state": f[0].decode(), "threads": threads,
                          "thread_names": thread_names(pid, comm) if threads > 1 else {}})
    return {"procs": procs, "seen": seen, "new": new}


MAX_THREADS_NAMED = 256


def thread_names(pid: int, comm: str) -> Dict[str, int]:
    """How many of the process's threads carry each name other than the process's own (bounded):
    communicator, watchdog and pool threads name themselves, and a leak shows as one name piling up."""
    names: Dict[str, int] = {}
    try:
        tids = os.listdir(f"{PROC}/{pid}/task")[:MAX_THREADS_NAMED]
    except OSError:
        return names
    for tid in tids:
        try:
            name = _read_bytes(f"{PROC}/{pid}/task/{tid}/comm", 64).strip().decode(errors="replace")
        except OSError:
            continue
        if name and name != comm:
            names[name] = names.get(name, 0) + 1
    return names


def procs_running() -> Optional[int]:
    """Runnable tasks on the node right now (/proc/stat): a CPU-starved rank shows here."""
    try:
        for line in _read_bytes(f"{PROC}/stat").split(b"\n"):
            if line.startswith(b"procs_running "):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def step_minors(known: Mapping[int, List[Any]]) -> Set[int]:
    """GPU minor numbers named by the ranks' SLURM_STEP_GPUS (global GPU ids = device minors)."""
    out: Set[int] = set()
    for _, member, gpus in known.values():
        if member:
            out.update(int(x) for x in str(gpus).split(",") if x.strip().isdigit())
    return out


def compact_gpu(g: Dict[str, Any]) -> Dict[str, Any]:
    return {k: g.get(k) for k in COMPACT_GPU}


def _die_with_parent(parent: int) -> None:
    """A probe child must not outlive a SIGKILLed watcher (a wedged NVML call never returns)."""
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _set_comm(name: str) -> None:
    ctypes.CDLL(None).prctl(15, name.encode()[:15])  # PR_SET_NAME


def _collect(cfg: Config, ctx: WatchContext, known: Dict[int, List[Any]], parent: int) -> Dict[str, Any]:
    """One sample, inside the probe child; a failing part costs that part only."""
    _die_with_parent(parent)
    out: Dict[str, Any] = {"t": time.time(), "errors": {}}
    parts = {"procs": lambda: scan_step(ctx, known, {parent, os.getpid()})}
    if cfg.get("gpu", "enabled"):
        from ..collect import gpu
        parts["gpu"] = lambda: [compact_gpu(g) for g in gpu.collect(cfg).get("gpus", [])]
    if cfg.get("rdma", "enabled"):
        from ..collect import rdma
        parts["rdma"] = lambda: rdma.collect(cfg)
    for name, fn in parts.items():
        try:
            out[name] = fn()
        except Exception as e:  # noqa: BLE001 - one broken probe must not cost the others
            out["errors"][name] = f"{type(e).__name__}: {e}"
    out["procs_running"] = procs_running()
    return out


def _rank_evidence(pids: List[int], parent: int) -> Dict[str, Any]:
    """NCCL/PyTorch/CUDA environment of each rank (probe child: environ can block)."""
    _die_with_parent(parent)
    prefixes = [p.encode() for p in EVIDENCE_ENV]
    out: Dict[str, Any] = {}
    for pid in pids:
        try:
            out[str(pid)] = _env_vars(_read_bytes(f"{PROC}/{pid}/environ"), prefixes)
        except OSError as e:
            out[str(pid)] = {"error": str(e)}
    return out


def py_spy_dumps(pids: List[int], timeout: float) -> Dict[str, str]:
    """``py-spy dump --pid`` of every Python rank at once, all under one deadline."""
    exe = shutil.which("py-spy")
    if exe is None or not pids:
        return {}
    running = {pid: subprocess.Popen([exe, "dump", "--pid", str(pid)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     preexec_fn=lambda: ctypes.CDLL(None).prctl(1, signal.SIGKILL))
               for pid in pids}
    out: Dict[str, str] = {}
    deadline = time.monotonic() + timeout
    try:
        for pid, p in running.items():
            try:
                text, _ = p.communicate(timeout=max(0.0, deadline - time.monotonic()))
                out[str(pid)] = text.decode(errors="replace")[-65536:]
            except subprocess.TimeoutExpired:
                out[str(pid)] = f"py-spy did not answer within {timeout:g} s"
    finally:
        for p in running.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def _is_python(pid: int) -> bool:
    try:
        return os.path.basename(os.readlink(f"{PROC}/{pid}/exe")).startswith("python")
    except OSError:
        return False


# --------------------------------------------------------------------------- exposition

def render(ctx: WatchContext, sample: Dict[str, Any], hang_on: bool, stragglers: Mapping[str, Any],
           leak: bool) -> bytes:
    """The compact watch series; always typed (``# TYPE``), as the Pushgateway demands."""
    from prometheus_client.core import GaugeMetricFamily as G

    fams: List[Any] = []
    gpus = sample.get("gpus") or []
    for suffix, key, scale, doc in (
            ("gpu_power_watts", "power_watts", 1.0, "Power draw of the step's GPU."),
            ("gpu_utilization_ratio", "util_gpu_percent", 0.01, "Fraction of time a kernel ran."),
            ("gpu_sm_clock_hertz", "sm_clock_mhz", 1e6, "Current SM clock."),
            ("gpu_temperature_celsius", "temperature_celsius", 1.0, "GPU core temperature.")):
        fam = G("slurm_triage_watch_" + suffix, doc, labels=["gpu_uuid"])
        for g in gpus:
            if g.get(key) is not None and g.get("uuid"):
                fam.add_metric([g["uuid"]], float(g[key]) * scale)
        fams.append(fam)
    fam = G("slurm_triage_watch_straggler", "1 when hardware slowed this GPU for most of the window.",
            labels=["gpu_uuid"])
    for g in gpus:
        if g.get("uuid"):
            fam.add_metric([g["uuid"]], 1.0 if g["uuid"] in stragglers else 0.0)
    fams.append(fam)
    procs = sample.get("procs") or []
    fams.append(G("slurm_triage_watch_step_processes", "Processes of the step on this node.", value=len(procs)))
    if sample.get("threads") is not None:
        fams.append(G("slurm_triage_watch_threads", "Threads of the step's processes on this node.",
                      value=sample["threads"]))
    if sample.get("procs_running") is not None:
        fams.append(G("slurm_triage_watch_procs_running", "Runnable tasks on the node (/proc/stat).",
                      value=sample["procs_running"]))
    named = G("slurm_triage_watch_thread_names", "Threads of a step process carrying one name (top 8).",
              labels=["pid", "comm", "thread"])
    pairs = sorted(((n, p["pid"], p["comm"], name) for p in procs for name, n in (p.get("thread_names") or {}).items()),
                   reverse=True)[:8]
    for n, pid, comm, name in pairs:
        named.add_metric([str(pid), comm, name], float(n))
    fams.append(named)
    fams.append(G("slurm_triage_watch_thread_leak", "1 when the step's thread count grew all window.",
                  value=1.0 if leak else 0.0))
    fams.append(G("slurm_triage_hang_suspected", "1 when the step's GPUs look busy at idle power (hang).",
                  value=1.0 if hang_on else 0.0))
    fams.append(G("slurm_triage_watch_last_sample_timestamp_seconds", "When the last sample was taken.",
                  value=sample["t"]))
    return to_text(fams)


# --------------------------------------------------------------------------- the loop

class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop()


class Watcher:
    """The sampling loop; runs in the daemon, as the job's user."""

    def __init__(self, cfg: Config, ctx: WatchContext, stepd: Tuple[int, int]):
        self.cfg, self.ctx, self.stepd = cfg, ctx, stepd
        self.interval = float(cfg.get("watcher", "interval_seconds"))
        windows = [cfg.get("watcher", k) for k in ("hang_window_seconds", "straggler_window_seconds",
                                               "thread_window_seconds")]
        self.ring: Deque[Dict[str, Any]] = deque(maxlen=min(RING_MAX, int(math.ceil(max(windows) / self.interval)) + 3))
        self.known: Dict[int, List[Any]] = {}
        self.in_episode = False
        self.log_lines = 0
        values = {sec: dict(keys) for sec, keys in cfg.values.items()}
        # A live series is stale by the next interval: never spool it (and the node's spool
        # directory is root's, not the user's).
        values["node"]["spool_dir"] = ""
        self.push_cfg = Config(values, source=cfg.source)
        self.grouping = {"job": "slurm_triage", "instance": ctx.node, "slurm_job_id": ctx.job_id, "phase": "watch"}
        self._preload()

    def _preload(self) -> None:
        """Import (and dlopen) once here what every probe child needs, so each fork starts
        warm instead of paying the imports every interval."""
        if self.cfg.get("gpu", "enabled"):
            from ..collect import gpu  # noqa: F401

            try:
                import pynvml  # noqa: F401
                lib = self.cfg.get("gpu", "nvml_library")
                if lib:
                    ctypes.CDLL(lib)
            except (ImportError, OSError) as e:
                self.log(f"NVML unavailable: {e}")
        if self.cfg.get("rdma", "enabled"):
            from ..collect import rdma  # noqa: F401

    def log(self, msg: str) -> None:
        """A bounded log next to the evidence (the user can read it; stderr goes nowhere)."""
        if self.log_lines >= LOG_MAX_LINES:
            return
        self.log_lines += 1
        try:
            d = _private_dir(*_evidence_parts(self.cfg, self.ctx))
            fd = os.open(os.path.join(d, f"watcher-{self.ctx.node}.{self.ctx.step_id}.log"),
                         os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "a") as fh:
                fh.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {msg}\n")
        except (OSError, WatchError):
            pass

    def sample(self) -> Dict[str, Any]:
        """Run one collection in a probe child and fold it into a compact sample."""
        deadline = float(self.cfg.get("gpu", "deadline_seconds")) + 2.0
        me = os.getpid()
        r = run_probe(lambda: _collect(self.cfg, self.ctx, self.known, me), deadline, "watch")
        s: Dict[str, Any] = {"t": time.time(), "gpus": None, "procs": None, "threads": None,
                             "procs_running": None, "rdma": None, "errors": {}}
        if not r.ok:
            s["errors"]["probe"] = r.error
            return s
        v = r.value
        s.update(t=v["t"], procs_running=v.get("procs_running"), errors=v.get("errors", {}))
        if v.get("procs") is not None:
            new = {int(k): rec for k, rec in v["procs"]["new"].items()}
            self.known = {pid: new.get(pid) or self.known[pid] for pid in v["procs"]["seen"]}
            s["procs"] = v["procs"]["procs"]
            s["threads"] = sum(p["threads"] for p in s["procs"])
        if v.get("gpu") is not None:
            minors = step_minors(self.known)
            s["gpus"] = [g for g in v["gpu"] if not minors or g.get("minor") in minors]
        if v.get("rdma") is not None:
            s["rdma"] = {f"{p['device']}/{p['port']}": {"state": p.get("state"),
                                                         "xmit_data": p["counters"].get("port_xmit_data"),
                                                         "rcv_data": p["counters"].get("port_rcv_data")}
                         for p in v["rdma"].get("ports", [])}
        return s

    def judge(self) -> Tuple[Optional[Dict[str, Any]], Dict[str, Any], Optional[Dict[str, Any]]]:
        samples = list(self.ring)
        cfg = self.cfg
        episode = hang.power_axiom_hang(samples, cfg.get("watcher", "hang_window_seconds"),
                                        cfg.get("watcher", "hang_util_percent"), cfg.get("watcher", "hang_power_ratio"),
                                        cfg.get("watcher", "hang_gpu_fraction"))
        slow = hang.stragglers(samples, cfg.get("watcher", "straggler_window_seconds"),
                               cfg.get("gpu", "temperature_margin_celsius"))
        leak = hang.thread_growth(samples, cfg.get("watcher", "thread_window_seconds"),
                                  int(cfg.get("watcher", "thread_growth_threshold")))
        return episode, slow, leak

    def write_evidence(self, episode: Dict[str, Any], slow: Dict[str, Any], leak: Optional[Dict[str, Any]]) -> str:
        """One JSON bundle per hang episode, owned by the user, that outlives the step."""
        last = self.ring[-1]
        procs = last.get("procs") or []
        pids = [p["pid"] for p in procs]
        me = os.getpid()
        env = run_probe(lambda: _rank_evidence(pids, me), 5.0, "rank_env")
        bundle = {
            "schema": 1, "kind": "power_axiom_hang", "job_id": self.ctx.job_id, "step_id": self.ctx.step_id,
            "node": self.ctx.node, "detected_at": last["t"], "hang": episode, "stragglers": slow,
            "thread_leak": leak, "threads": {str(p["pid"]): p for p in procs},
            "environment": env.value if env.ok else {"error": env.error},
            "py_spy": py_spy_dumps([p for p in pids if _is_python(p)], float(self.cfg.get("watcher", "pyspy_timeout_seconds"))),
            "samples": list(self.ring)}
        d = _private_dir(*_evidence_parts(self.cfg, self.ctx))
        path = os.path.join(d, f"hang-{self.ctx.node}-{self.ctx.step_id}-{int(last['t'])}.json")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(bundle, fh, indent=1, sort_keys=True)
        return path

    def push(self, sample: Dict[str, Any], hang_on: bool, slow: Mapping[str, Any], leak: bool) -> None:
        if not self.cfg.get("pushgateway", "url"):
            return
        from ..sinks import spool

        res = spool.deliver(self.push_cfg, self.grouping, render(self.ctx, sample, hang_on, slow, leak))
        if not res.delivered:
            self.log(f"push failed: {res.error}")

    def step_alive(self) -> bool:
        return process_alive(*self.stepd)

    def run(self) -> None:
        """Sample, judge, push, every interval, until the step or a signal ends it."""
        next_t = time.monotonic()
        while self.step_alive():
            s = self.sample()
            for part, err in s["errors"].items():
                self.log(f"{part}: {err}")
            self.ring.append(s)
            episode, slow, leak = self.judge()
            if episode and not self.in_episode:
                try:
                    self.log(f"hang suspected; evidence in {self.write_evidence(episode, slow, leak)}")
                except (OSError, WatchError) as e:
                    self.log(f"hang suspected; evidence not written: {e}")
            self.in_episode = episode is not None
            self.push(s, self.in_episode, slow, leak is not None)
            next_t += self.interval
            time.sleep(max(0.0, next_t - time.monotonic()))
            next_t = max(next_t, time.monotonic() - self.interval)  # after a slow sample: no burst


def _daemon(cfg: Config, ctx: WatchContext, stepd: Tuple[int, int], sdir: str, ready_fd: int) -> None:
    """The grandchild: detach, record the pidfile, report ready, loop; never returns."""
    code = 0
    try:
        signal.signal(signal.SIGTERM, _raise_stop)
        signal.signal(signal.SIGINT, _raise_stop)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.chdir("/")
        os.umask(0o077)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, ready_fd)
        os.closerange(ready_fd + 1, 1 << 16)
        _set_comm(COMM)
        me = _stat_fields(os.getpid())
        rec = {"pid": os.getpid(), "start_ticks": me[2] if me else 0, "job_id": ctx.job_id,
               "step_id": ctx.step_id, "node": ctx.node}
        from ..sinks.atomic import write_atomic

        write_atomic(os.path.join(sdir, PIDFILE), json.dumps(rec).encode(), mode=0o600, fsync=False)
        os.write(ready_fd, str(os.getpid()).encode())
        os.close(ready_fd)
        Watcher(cfg, ctx, stepd).run()
    except _Stop:
        pass
    except BaseException:  # noqa: BLE001 - a daemon has nobody to raise to
        code = 1
    finally:
        try:
            rec_now = _read_pidfile(os.path.join(sdir, PIDFILE))
            if rec_now is not None and rec_now["pid"] == os.getpid():
                _remove_step_dir(sdir)
        finally:
            os._exit(code)


def start(ctx: WatchContext, cfg: Optional[Config] = None) -> int:
    """Start the step's watcher on this node and return its pid (an already running one is
    reused). Raises WatchError when it must not run: not the job's user, no such step."""
    cfg = cfg or load(fail_open=True)
    if os.geteuid() != ctx.uid or os.getegid() != ctx.gid:
        raise WatchError(f"running as uid {os.geteuid()}/gid {os.getegid()}, not the job's "
                         f"{ctx.uid}/{ctx.gid}: privileges must be dropped first")
    stepd = find_stepd(ctx)
    if stepd is None:
        raise WatchError(f"no 'slurmstepd: [{ctx.step}]' process: nothing to watch")
    ctx = with_sluid(ctx, stepd[0])
    sdir = _private_dir(*_step_parts(cfg, ctx))
    rec = _read_pidfile(os.path.join(sdir, PIDFILE))
    if rec is not None and _is_watcher(rec):
        return int(rec["pid"])
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(rfd)
            os.setsid()
            if os.fork() == 0:
                _daemon(cfg, ctx, stepd, sdir, wfd)
        finally:
            os._exit(0)
    os.close(wfd)
    os.waitpid(pid, 0)
    try:
        data = b""
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            ready, _, _ = select.select([rfd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(rfd, 32) if ready else b""
            if not chunk:
                break
            data += chunk
    finally:
        os.close(rfd)
    if not data.isdigit():
        raise WatchError("the watcher did not start")
    return int(data)


def stop(ctx: WatchContext, cfg: Optional[Config] = None, wait_seconds: float = STOP_WAIT_SECONDS) -> bool:
    """Stop the step's watcher on this node and remove its files; True when one was running.

    The pid is signalled only after /proc confirms it is still our watcher (comm and start
    time recorded in the pidfile), so a reused pid is never hit.
    """
    cfg = cfg or load(fail_open=True)
    sdir = step_dir(cfg, ctx)
    rec = _read_pidfile(os.path.join(sdir, PIDFILE))
    was = rec is not None and _is_watcher(rec)
    if rec is not None and was:
        pid, ticks = rec["pid"], rec["start_ticks"]
        for sig, wait in ((signal.SIGTERM, wait_seconds), (signal.SIGKILL, 2.0)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            end = time.monotonic() + wait
            while process_alive(pid, ticks) and time.monotonic() < end:
                time.sleep(0.02)
            if not process_alive(pid, ticks):
                break
    try:
        st = os.lstat(sdir)
        if stat_mod.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
            _remove_step_dir(sdir)
    except OSError:
        pass
    return was
