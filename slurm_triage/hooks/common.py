"""What every hook shares: fail-open wrapper, hard deadline, one-line log, error counter.

Our own faults fail open: a bad config, a bug or a missed deadline logs one line, counts
``slurm_triage_internal_errors_total`` and exits 0, because a broken tool must never
drain the fleet. Only evidence (a hardware FAIL) makes a hook exit non-zero.
"""
from __future__ import annotations

import os
import re
import signal
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..config import Config, load
from ..model import Finding, Verdict
from ..sinks.atomic import write_atomic
from .env import EnvError, JobEnv, from_environ

LOG_MAX_BYTES = 1 << 20


def log(cfg: Optional[Config], kind: str, msg: str) -> None:
    """One line to stderr (slurmd's log on failure) and to <state_dir>/hooks.log."""
    line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} slurm-triage {kind}: {msg}\n"
    sys.stderr.write(line)
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


def count_internal_error(cfg: Config) -> int:
    """Increment and return the persistent internal-error counter of this node."""
    path = os.path.join(cfg.get("node", "state_dir"), "internal_errors_total")
    try:
        with open(path) as fh:
            n = int(fh.read().strip() or 0)
    except (OSError, ValueError):
        n = 0
    n += 1
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, f"{n}\n".encode(), mode=0o644, fsync=False)
    except OSError:
        pass
    return n


def internal_errors(cfg: Config) -> int:
    try:
        with open(os.path.join(cfg.get("node", "state_dir"), "internal_errors_total")) as fh:
            return int(fh.read().strip() or 0)
    except (OSError, ValueError):
        return 0


_WHO = re.compile(r"^(?:GPU \d+ \([^)]*\)[:,]? ?)|(?: on GPU \d+ \([^)]*\))")


def drain_reason(fails: List[Finding]) -> str:
    """``GPU-… Xid 79: GPU has fallen off the bus (+1 more)``: the kernel's word first.

    The summary's "GPU 3 (uuid, bus id)" is dropped: the UUID leads the reason already.
    """
    fails = sorted(fails, key=lambda f: not f.id.startswith("kernel."))
    f = fails[0]
    text = f"{f.gpu} {_WHO.sub('', f.summary).strip()}" if f.gpu else f.summary
    return text + (f" (+{len(fails) - 1} more)" if len(fails) > 1 else "")


def drain_on_hardware(cfg: Config, env: JobEnv, findings: List[Finding]) -> Optional[str]:
    """Drain this node, tagged, when a FAIL means the hardware; what happened, None if no such FAIL."""
    hardware = [f for f in findings if f.verdict == Verdict.FAIL and f.hardware]
    if not hardware:
        return None
    if not cfg.get("hooks", "drain"):
        return "not drained (hooks.drain = false)"
    from ..slurmctl import SlurmError, drain

    try:
        return drain(cfg, env.node, drain_reason(hardware))
    except SlurmError as e:
        return f"drain failed: {e}"


def publish(cfg: Config, env: JobEnv, kind: str, record: Dict[str, Any], snap: Dict[str, Any],
            findings: List[Finding], t0: float, push: Callable[[float], None]) -> Tuple[Optional[str], float]:
    """What both hooks do once they have judged, in this order: save the state (first, so a
    later failure loses nothing), drain on a hardware FAIL, push, write the textfile.
    Returns the drain outcome and the hook's seconds so far (pushed with the results)."""
    from ..sinks import state

    state.save(cfg, env.job_id, kind, record)
    drained = drain_on_hardware(cfg, env, findings)
    seconds = time.monotonic() - t0
    if cfg.get("pushgateway", "url"):
        push(seconds)
    write_textfile(cfg, snap, findings)
    return drained, seconds


def conclude(cfg: Config, kind: str, summary: str, drained: Optional[str], worth_logging: bool) -> int:
    """The hook's one log line and exit code: 1 only for a hardware FAIL (Slurm drains too)."""
    if drained is not None:
        log(cfg, kind, f"{summary}; {drained}; exit 1")
        return 1
    if worth_logging:
        log(cfg, kind, summary)
    return 0


def deliver_logged(cfg: Config, kind: str, env: JobEnv, grouping: Dict[str, str], body: Optional[bytes] = None,
                   delete: bool = False) -> None:
    """Push or delete a group; a failure is one log line and one internal error (it is spooled)."""
    from ..sinks.spool import deliver

    result = deliver(cfg, grouping, body, delete=delete)
    if result.error:
        log(cfg, kind, f"job {env.job_id}: push: {result.error}")
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


def run_hook(kind: str, deadline_key: str, body: Callable[[Config, JobEnv], int]) -> int:
    """Run ``body`` fail-open under the hook's hard deadline; return the exit code."""
    cfg = load(fail_open=True)
    for w in cfg.warnings:
        log(cfg, kind, f"config error: {w}")
        count_internal_error(cfg)
    try:
        env = from_environ()
    except EnvError as e:
        log(cfg, kind, f"not run: {e}")
        count_internal_error(cfg)
        return 0
    for w in env.warnings:
        log(cfg, kind, f"job {env.job_id}: {w}")
    deadline = cfg.get("hooks", deadline_key)

    def on_alarm(signum: int, frame: object) -> None:
        log(cfg, kind, f"job {env.job_id}: passed its {deadline:g} s deadline; exiting 0 (fail open)")
        count_internal_error(cfg)
        os._exit(0)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, deadline)
    try:
        return body(cfg, env)
    except Exception as e:  # noqa: BLE001 - any bug of ours must fail open
        tb = traceback.extract_tb(e.__traceback__)[-1]
        log(cfg, kind, f"job {env.job_id}: internal error {type(e).__name__}: {e} "
                       f"({tb.filename.rsplit('/', 1)[-1]}:{tb.lineno}); exiting 0 (fail open)")
        count_internal_error(cfg)
        return 0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
