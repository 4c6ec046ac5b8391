"""`python -I -m slurm_triage.hooks.publish KIND JOB_ID SECONDS DEADLINE LOCK_NS`: the
detached publisher a hook starts (common.in_background) once its state is saved.

It pushes the saved state of KIND (the Prolog's lean group, the Epilog's result and the
DELETE of the live groups), writes the textfile, then
replays what other hooks queued behind its lock (a short job's Epilog), with
the same fail-open rules as the hook: its faults are logged and counted, never raised; it
stops at the hook's deadline (DEADLINE seconds from its start; the spool keeps what was not
sent); LOCK_NS, unless "-", says it inherited the spool lock on fd 3 and orders its spool
entries as of that time. A Prolog's publisher started without the lock (another publisher
had it) waits for the lock first, and pushes nothing if its job's Epilog came meanwhile.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import List

from ..config import Config
from . import common
from .env import JobEnv


def main(argv: List[str]) -> int:
    kind, job_id, seconds, deadline, lock_ns = argv
    cfg = common.load(fail_open=True, cache=True)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, max(os.getpriority(os.PRIO_PROCESS, 0), cfg.get("hooks", "publisher_nice")))
    except OSError:
        pass  # as nice as it was: only slower to yield
    holder = lock_ns != "-"
    if holder:
        from ..sinks.spool import adopt

        adopt(cfg, common.PUBLISHER_LOCK_FD, int(lock_ns))

    def on_alarm(signum: int, frame: object) -> None:
        common.log(cfg, kind, f"job {job_id}: publisher passed the hook's deadline; the rest stays spooled")
        common.count_internal_error(cfg)
        os._exit(0)

    common._deadline_at[0] = time.monotonic() + float(deadline)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(0.001, float(deadline)))
    if not holder and kind == "prolog":  # started while another publisher held the lock
        from ..sinks.spool import LOCK_WAIT_SECONDS, hold

        holder = hold(cfg, min(LOCK_WAIT_SECONDS, max(0.0, common.time_left() - common.PUSH_MARGIN_SECONDS))) is not None
    try:
        from ..model import Finding
        from ..sinks import state

        record = state.load(cfg, job_id, kind)
        if record is None:
            common.log(cfg, kind, f"job {job_id}: publisher found no saved state; nothing pushed")
            common.count_internal_error(cfg)
            return 0
        env = JobEnv(job_id=job_id, node=record.get("node") or os.environ.get("SLURMD_NODENAME", ""))
        snap = record.get("snapshot") or {}
        findings = [Finding.from_dict(d) for d in record.get("findings") or []]
        if kind == "prolog":
            from .prolog import _push
        elif kind == "epilog":
            from .epilog import _push
        else:
            raise ValueError(f"no background publisher for {kind!r}")

        if cfg.get("pushgateway", "url") and not (kind == "prolog" and _job_ended(cfg, job_id)):
            _push(cfg, env, snap, findings, record, float(seconds))
        common.write_textfile(cfg, snap, findings)
        if holder:
            from ..sinks.spool import flush_held

            fr = flush_held(cfg, max(0.0, common.time_left() - common.PUSH_MARGIN_SECONDS))
            if fr.error or fr.pending:
                common.log(cfg, kind, f"job {job_id}: publisher replay of what queued behind it: "
                                      f"{fr.error or 'budget spent'} ({fr.pending} pending)")
    except Exception as e:  # noqa: BLE001 - fail open, as the hook does
        common.log(cfg, kind, f"job {job_id}: publisher internal error {type(e).__name__}: {e}")
        common.count_internal_error(cfg)
    return 0


def _job_ended(cfg: Config, job_id: str) -> bool:
    """The job's Epilog was saved after its Prolog (a short job, this publisher queued behind
    the last one's): the Epilog deletes the live group, and a PUT now would bring it back.
    A requeued job's earlier Epilog is older than this Prolog and does not count."""
    from ..sinks import state

    ended, started = state.saved_at(cfg, job_id, "epilog"), state.saved_at(cfg, job_id, "prolog")
    return ended is not None and started is not None and ended >= started


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.stderr.write("usage: python -I -m slurm_triage.hooks.publish KIND JOB_ID SECONDS DEADLINE LOCK_NS\n")
        sys.exit(0)
    main(sys.argv[1:])
    os._exit(0)
