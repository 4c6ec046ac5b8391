"""A drain slurmctld did not take: kept locally, retried, and re-tagged over Slurm's own reason.

When slurmctld is stopped or slow while a Prolog finds a hardware FAIL, our ``scontrol
update`` times out, the hook exits non-zero anyway, and Slurm later drains the node with
its own "Prolog error": the cause would be lost. So the intended reason is saved first
(``state_dir/node/pending-drain.json``); a detached retrier (``python -I -m
slurm_triage.drains NODE``) re-applies it for ``[drain] retry_seconds``, replacing only
Slurm's "Prolog error"/"Epilog error" or an empty reason, never a foreign one, and
``node resume`` re-applies it too. A record older than ``retry_seconds`` is ignored: a
node an admin resumed is never drained again from old evidence.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any, Dict, Optional

from .config import Config, load
from .slurmctl import SlurmError, node_state, tagged, _scontrol
from .sinks import state

KIND = "pending-drain"
POLL_SECONDS = 5.0
STABLE_POLLS = 3


def record(cfg: Config, node: str, reason: str) -> None:
    """Save the drain we are about to ask for (best effort: a full disk must not stop it)."""
    try:
        state.save(cfg, None, KIND, {"node": node, "reason": tagged(reason), "created": time.time()})
    except (OSError, ValueError):
        pass


def pending(cfg: Config, node: str) -> Optional[Dict[str, Any]]:
    """The still-valid intended drain of ``node``, or None."""
    try:
        r = state.load(cfg, None, KIND)
    except (OSError, ValueError):
        return None
    if not r or r.get("node") != node or not str(r.get("reason", "")).startswith("triage:"):
        return None
    if time.time() - float(r.get("created") or 0) > cfg.get("drain", "retry_seconds"):
        return None
    return r


def clear(cfg: Config) -> None:
    try:
        state.save(cfg, None, KIND, {})
    except (OSError, ValueError):
        pass


def reapply(cfg: Config, node: str, timeout: float = 5.0, applied_before: bool = False) -> str:
    """Put the pending reason on ``node`` where Slurm's stands in for it; what happened.

    Replaces only Slurm's "Prolog error"/"Epilog error"; an undrained node gets the drain
    only while ours was never applied (slurmctld was away the whole time): once it was,
    a node without our reason has been resumed by someone, and that stands.
    Raises SlurmError when slurmctld does not answer."""
    r = pending(cfg, node)
    if r is None:
        return "nothing pending"
    current = node_state(cfg, node, timeout)
    if current.ours:
        return f"ours already: {current.reason}"
    if (current.reason and not current.hook_error) or (not current.reason and applied_before):
        clear(cfg)
        return f"left untouched: {current.reason or current.state}"
    _scontrol(cfg, ["update", f"nodename={node}", "state=drain", f"reason={r['reason']}"], timeout)
    return f"re-applied: {r['reason']} (was: {current.reason or current.state})"


def spawn_retrier(cfg: Config, node: str) -> bool:
    """Start the detached retrier (own session: it outlives the hook); False if it cannot."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C", "LC_ALL": "C", "SLURMD_NODENAME": node}
    for k in ("SLURM_CONF",):
        if os.environ.get(k):
            env[k] = os.environ[k]
    if cfg.source != "<defaults>":
        env["SLURM_TRIAGE_CONFIG"] = cfg.source
    try:
        subprocess.Popen([sys.executable, "-I", "-m", "slurm_triage.drains", node], env=env, cwd="/",
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True, close_fds=True)
    except OSError:
        return False
    return True


def retry(cfg: Config, node: str, poll: float = POLL_SECONDS) -> str:
    """Re-apply until our reason has held for STABLE_POLLS polls or the record expires."""
    from .hooks.common import log

    stable, applied, last = 0, False, "nothing pending"
    while pending(cfg, node) is not None:
        try:
            last = reapply(cfg, node, applied_before=applied)
        except SlurmError as e:
            last, stable = f"slurmctld still not answering: {e}", 0
        else:
            if last.startswith("ours already"):
                applied, stable = True, stable + 1
                if stable >= STABLE_POLLS:
                    clear(cfg)
                    break
            elif last.startswith("re-applied"):
                log(cfg, "drain", f"{node}: {last}")
                applied, stable = True, 0
            else:
                break
        time.sleep(poll)
    return last


def main() -> int:
    if len(sys.argv) != 2:
        return 0
    try:
        cfg = load(fail_open=True, node=sys.argv[1])
        retry(cfg, sys.argv[1])
    except Exception:  # noqa: BLE001 - a background helper of a hook: fail open, silently
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
