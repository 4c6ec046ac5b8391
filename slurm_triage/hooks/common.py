"""What every hook shares: fail-open wrapper, hard deadline, one-line log, error counter.

Our own faults fail open: a bad config, a bug or a missed deadline logs one line, counts
``slurm_triage_internal_errors_total`` and exits 0, because a broken tool must never
drain the fleet. Only evidence (a hardware FAIL) makes a hook exit non-zero, and it says
so with HARDWARE_FAIL_EXIT: the prolog/ and epilog/ scripts run Python as a child and
turn that code, and only that code, into exit 1, so a SIGKILL, an OOM kill or a crashed
interpreter exits 0 and Slurm does not drain the node for our fault.
"""
from __future__ import annotations

import os
import re
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from ..config import SCHEMA, Config, load
from ..printable import printable  # a file name with a newline or ANSI escape must not forge log lines
from ..sinks import counters

if TYPE_CHECKING:  # imported where used: a hook loads only this much before its probes start
    from ..model import Finding
    from .env import JobEnv

LOG_MAX_BYTES = 1 << 20
HARDWARE_FAIL_EXIT = 86
"""The one exit code the hook scripts turn into a non-zero exit (Slurm drains, requeues)."""
PUSH_MARGIN_SECONDS = 0.5
"""Left for the textfile and the log line after the last push, within the deadline."""
_deadline_at = [float("inf")]


def _syslog(path: str, line: str) -> None:
    """One datagram to syslog/journald (daemon.warning): slurmd drops a hook's stderr."""
    if not path:
        return
    import socket

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.settimeout(0.2)
            sock.sendto(f"<28>slurm-triage[{os.getpid()}]: {line}".encode("utf-8", "replace"), path)
    except OSError:
        pass


def log(cfg: Optional[Config], kind: str, msg: str) -> None:
    """One line to stderr (slurmd's log on failure), syslog and <state_dir>/hooks.log."""
    text = f"{kind}: {printable(msg)}"
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} slurm-triage {text}\n"
    try:
        sys.stderr.write(line)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    _syslog(cfg.get("node", "syslog_socket") if cfg is not None else SCHEMA["node"]["syslog_socket"].default, text)
    if cfg is None:
        return
    try:
        d = cfg.get("node", "state_dir")
        os.makedirs(d, mode=0o755, exist_ok=True)
        path = os.path.join(d, "hooks.log")
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
        if os.path.exists(path) and os.lstat(path).st_size > LOG_MAX_BYTES:
            flags |= os.O_TRUNC
        fd = os.open(path, flags, 0o640)
        with os.fdopen(fd, "a") as fh:
            fh.write(line)
    except OSError:
        pass


def time_left() -> float:
    """Seconds until the running hook's hard deadline (inf outside a hook)."""
    return _deadline_at[0] - time.monotonic()


def count_internal_error(cfg: Config) -> int:
    """Increment and return the persistent internal-error counter of this node."""
    return counters.bump(cfg, "internal_errors_total")


def internal_errors(cfg: Config) -> int:
    return counters.read(cfg, "internal_errors_total")


_WHO = re.compile(r"^(?:GPU \d* ?\([^)]*\)[:,]? ?)|(?: on GPU \d* ?\([^)]*\))")


def drain_reason(fails: List[Finding]) -> str:
    """``GPU-… Xid 79: GPU has fallen off the bus (+1 more)``: the kernel's word first.

    The summary's "GPU 3 (uuid, bus id)" is dropped: the UUID leads the reason already.
    """
    fails = sorted(fails, key=lambda f: not f.id.startswith("kernel."))
    f = fails[0]
    text = f"{f.gpu} {_WHO.sub('', f.summary).strip()}" if f.gpu else f.summary
    return text + (f" (+{len(fails) - 1} more)" if len(fails) > 1 else "")


def drain_on_hardware(cfg: Config, env: JobEnv, findings: List[Finding], kind: str = "hook") -> Optional[str]:
    """Drain this node, tagged, when a FAIL means the hardware; what happened when the hook
    must exit non-zero, None when it exits 0 (no such FAIL, drains off, breaker held it).

    The breaker may hold the drain back (too many nodes drained by us already): then the
    FAIL is recorded and counted, the job runs or is cancelled as configured, and the node
    stays in service. The intended reason is saved before scontrol is asked, so a
    slurmctld that does not answer in time gets it later from a detached retrier.
    """
    from ..model import Verdict

    hardware = [f for f in findings if f.verdict == Verdict.FAIL and f.hardware]
    if not hardware:
        return None
    reason = drain_reason(hardware)
    if not cfg.get("hooks", "drain"):
        log(cfg, kind, f"job {env.job_id}: hardware FAIL, not drained (hooks.drain = false): {reason}")
        return None
    from .. import breaker, drains
    from ..slurmctl import SlurmError, drain

    budget = max(0.5, min(10.0, time_left() - PUSH_MARGIN_SECONDS - 1.0))  # 1 s left to push at least
    decision = breaker.check(cfg, env.node, env.partition, min(2.0, budget / 3))
    if not decision.allowed:
        n = breaker.count_suppressed(cfg)
        held = f"drain held back by the circuit breaker ({decision.why}); drain_suppressed_total {n}"
        if cfg.get("drain", "on_breaker") == "fail_job":
            held += "; " + _cancel_job(cfg, env)
        log(cfg, kind, f"job {env.job_id}: hardware FAIL not drained: {reason}: {held}")
        return None
    drains.record(cfg, env.node, reason)
    try:
        out = drain(cfg, env.node, reason, timeout=max(0.5, budget - 1.0))
    except SlurmError as e:
        started = drains.spawn_retrier(cfg, env.node)
        return f"drain failed: {e}; " + ("retrying in the background" if started else "no retrier could start")
    drains.clear(cfg)
    if out.startswith("drained"):
        breaker.note_drained(cfg, env.node)
    return out


def _cancel_job(cfg: Config, env: JobEnv) -> str:
    import subprocess

    from ..slurmctl import tool_env

    exe = cfg.get("drain", "scancel")
    try:
        r = subprocess.run([exe, env.job_id], capture_output=True, text=True, timeout=max(0.5, min(5.0, time_left() - 1)),
                           env=tool_env())
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"job not cancelled: {exe}: {e}"
    return "job cancelled" if r.returncode == 0 else f"job not cancelled: {(r.stderr or r.stdout).strip()}"


def publish(cfg: Config, env: JobEnv, kind: str, record: Dict[str, Any], snap: Dict[str, Any],
            findings: List[Finding], t0: float, push: Callable[[float], None],
            background: bool = False) -> Tuple[Optional[str], float]:
    """What both hooks do once they have judged, in this order: save the state (first, so a
    later failure loses nothing), drain on a hardware FAIL, push, write the textfile.
    A state that cannot be saved (full disk) is logged and counted; the push still goes.
    ``background``: a detached publisher (in_background) pushes the saved state and writes
    the textfile, so the hook exits at once. Returns the drain outcome and the hook's
    seconds so far (pushed with the results)."""
    from ..sinks import state

    saved = True
    try:
        state.save(cfg, env.job_id, kind, record)
    except (OSError, ValueError) as e:
        log(cfg, kind, f"job {env.job_id}: state not saved: {e}; pushing anyway")
        count_internal_error(cfg)
        saved = False
    drained = drain_on_hardware(cfg, env, findings, kind)
    seconds = time.monotonic() - t0
    if background and saved and in_background(cfg, kind, env, seconds):
        return drained, seconds
    if cfg.get("pushgateway", "url"):
        push(seconds)
    write_textfile(cfg, snap, findings)
    return drained, seconds


def in_background(cfg: Config, kind: str, env: JobEnv, seconds: float) -> bool:
    """Have a detached publisher (``python -I -m slurm_triage.hooks.publish``) push the saved
    state and write the textfile, so the job does not wait for requests and prometheus_client
    (150+ ms of imports); False when it could not start (the caller does the work itself).

    It is a fresh interpreter, not a fork, so no SLURM_JOB_ID in its environment makes it
    look like a process of the job; its own session, no terminal. This hook takes the spool
    lock first and hands it over (the publisher inherits the locked fd), so a later hook's
    pushes queue behind this one's and order holds. When another publisher holds the lock
    (the last job's Epilog's, still pushing), this one starts without it and waits for it,
    as the hook would have: the job need not wait. A Prolog's publisher that gets the lock
    after its job's Epilog was saved pushes nothing (publish.main). The publisher gets the
    hook's deadline.
    """
    if not (cfg.get("pushgateway", "url") or cfg.get("textfile", "directory")):
        return True  # nothing to publish
    from ..sinks.spool import hold

    held = hold(cfg)
    env_out = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C", "LC_ALL": "C", "SLURMD_NODENAME": env.node}
    if cfg.source != "<defaults>":
        env_out["SLURM_TRIAGE_CONFIG"] = cfg.source
    argv = [sys.executable, "-I", "-m", "slurm_triage.hooks.publish", kind, env.job_id, repr(seconds),
            repr(max(0.0, time_left())), str(held[1]) if held else "-"]
    try:
        null = os.open(os.devnull, os.O_RDWR)
        try:
            actions = [(os.POSIX_SPAWN_DUP2, null, 0), (os.POSIX_SPAWN_DUP2, null, 1), (os.POSIX_SPAWN_DUP2, null, 2)]
            if held:
                os.set_inheritable(held[0], True)
                actions.append((os.POSIX_SPAWN_DUP2, held[0], PUBLISHER_LOCK_FD))
            os.posix_spawn(sys.executable, argv, env_out, file_actions=actions, setsid=True)
        finally:
            os.close(null)
    except OSError as e:
        log(cfg, kind, f"job {env.job_id}: publisher did not start ({e}); pushing from the hook")
        return False
    return True


PUBLISHER_LOCK_FD = 3
"""Where the publisher finds the spool lock its hook handed over."""


def conclude(cfg: Config, kind: str, summary: str, drained: Optional[str], worth_logging: bool) -> int:
    """The hook's one log line and exit code: HARDWARE_FAIL_EXIT only for a hardware FAIL
    that drains (the script exits 1 then, and Slurm drains too)."""
    if drained is not None:
        log(cfg, kind, f"{summary}; {drained}; exit 1")
        return HARDWARE_FAIL_EXIT
    if worth_logging:
        log(cfg, kind, summary)
    return 0


def push_budget(cfg: Config) -> float:
    """Seconds the hook's pushes may take together: the configured budget, cut to what the
    deadline leaves; a hung or black-holed gateway costs no more (the spool keeps the rest)."""
    return max(0.0, min(cfg.get("pushgateway", "hook_budget_seconds"), time_left() - PUSH_MARGIN_SECONDS))


def deliver_logged(cfg: Config, kind: str, env: JobEnv, ops: List[Any]) -> None:
    """Push or delete groups (spool.Op) within the hook's push budget; a failure is one log
    line and one internal error (what was not sent is spooled)."""
    from ..sinks.spool import deliver_all

    result = deliver_all(cfg, ops, budget=push_budget(cfg), limit=max(0.0, time_left() - PUSH_MARGIN_SECONDS))
    if result.error:
        log(cfg, kind, f"job {env.job_id}: push: {result.error} ({result.spooled} spooled, "
                       f"{result.pending} pending)")
        count_internal_error(cfg)


def write_textfile(cfg: Config, snap: Dict[str, Any], findings: List[Finding]) -> None:
    """The node's full per-GPU series for node_exporter's textfile collector, when configured.

    The file is named and labelled with the Slurm node name: one node_exporter may serve
    several slurmd (multiple-slurmd hosts, the lab), and its files must not collide.
    """
    directory = cfg.get("textfile", "directory")
    if not directory:
        return
    from ..sinks import textfile
    from ..sinks.exposition import render

    node = cfg.get("node", "name")
    try:
        textfile.write(directory, f"slurm_triage_{node}", render(snap, findings, labels={"node": node}))
    except (OSError, ValueError) as e:
        log(cfg, "textfile", f"{directory}: {e}")
        count_internal_error(cfg)


def run_hook(kind: str, deadline_key: str, body: Callable[..., int],
             start: Optional[Callable[[Config], Any]] = None) -> int:
    """Run ``body(cfg, env, started)`` fail-open under the hook's hard deadline; return the exit code.

    The deadline is armed before anything else, at the built-in default, so a config path
    that blocks (a FIFO, a hung NFS mount) cannot outlive it; once the config is read it
    is re-armed at the configured value, counted from the same start.
    ``start(cfg)`` runs right after the config is read, before the job environment is parsed
    and the rest of the hook is imported (the snapshot's probes: they then overlap all of
    that); its result (None without ``start``) is body's third argument, and is cancelled if body
    never used it.
    """
    begin = time.monotonic()
    where: Dict[str, Any] = {"cfg": None, "job": "?", "deadline": SCHEMA["hooks"][deadline_key].default}
    started: Any = None

    def on_alarm(signum: int, frame: object) -> None:
        cfg = where["cfg"]
        log(cfg, kind, f"job {where['job']}: passed its {where['deadline']:g} s deadline; exiting 0 (fail open)")
        if cfg is not None:
            count_internal_error(cfg)
        os._exit(0)

    def arm(seconds: float) -> None:
        where["deadline"] = seconds
        _deadline_at[0] = begin + seconds
        signal.setitimer(signal.ITIMER_REAL, max(0.001, _deadline_at[0] - time.monotonic()))

    signal.signal(signal.SIGALRM, on_alarm)
    arm(where["deadline"])
    try:
        cfg = load(fail_open=True, cache=True)
        where["cfg"] = cfg
        arm(cfg.get("hooks", deadline_key))
        if start is not None:
            started = start(cfg)
        for w in cfg.warnings:
            log(cfg, kind, f"config error: {w}")
            count_internal_error(cfg)
        from .env import EnvError, from_environ

        try:
            env = from_environ()
        except EnvError as e:
            log(cfg, kind, f"not run: {e}")
            count_internal_error(cfg)
            return 0
        where["job"] = env.job_id
        for w in env.warnings:
            log(cfg, kind, f"job {env.job_id}: {w}")
        return body(cfg, env, started)
    except Exception as e:  # noqa: BLE001 - any bug of ours must fail open
        import traceback

        tb = traceback.extract_tb(e.__traceback__)[-1]
        log(where["cfg"], kind, f"job {where['job']}: internal error {type(e).__name__}: {e} "
                                f"({tb.filename.rsplit('/', 1)[-1]}:{tb.lineno}); exiting 0 (fail open)")
        if where["cfg"] is not None:
            count_internal_error(where["cfg"])
        return 0
    finally:
        if started is not None:
            started.cancel()  # a no-op once body has waited for it
        signal.setitimer(signal.ITIMER_REAL, 0)
        _deadline_at[0] = float("inf")
