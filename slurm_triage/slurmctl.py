"""Drain and resume through scontrol, touching only reasons tagged ``triage:``.

A drain reason without our tag belongs to someone else (an admin, NHC, Slurm itself):
we never overwrite or clear it.
"""
from __future__ import annotations

import os
import re
import subprocess
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .config import Config

TAG = "triage:"
# What Slurm itself writes when our hook exits non-zero: the cause is ours to restore.
HOOK_ERRORS = ("Prolog error", "Epilog error")
_MAX_REASON = 200  # scontrol accepts more, but sinfo columns and humans do not


@dataclass
class NodeState:
    state: str
    reason: str
    reason_time: Optional[float] = None
    """When the reason was set (unix time, from its ``[user@time]`` stamp), None: unknown."""
    by: Optional[str] = None
    """Who set it (the stamp's user), None: unknown."""

    @property
    def ours(self) -> bool:
        return self.reason.startswith(TAG)

    @property
    def hook_error(self) -> bool:
        """Slurm's own reason for a failed Prolog/Epilog: it replaced ours (slurmctld was away)."""
        return self.reason in HOOK_ERRORS


class SlurmError(Exception):
    pass


def _scontrol(cfg: Config, args: List[str], timeout: float = 5.0) -> str:
    exe = cfg.get("hooks", "scontrol")
    try:
        r = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout,
                           env=tool_env())
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmError(f"{exe} {' '.join(args)}: {e}") from None
    if r.returncode != 0:
        raise SlurmError(f"{exe} {' '.join(args)}: {(r.stderr or r.stdout).strip()}")
    return r.stdout


def run_tool(argv: List[str], timeout: float) -> Tuple[Optional[str], str]:
    """A read-only Slurm query: (stdout, "") or (None, why), never raising. Output is user text
    (job names, comments, reasons): a byte that is not UTF-8 is replaced, never fatal."""
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, encoding="utf-8", errors="replace",
                            timeout=timeout, env=tool_env(), cwd="/")
    except FileNotFoundError:
        return None, f"{argv[0]} not found"
    except subprocess.TimeoutExpired:
        return None, f"{os.path.basename(argv[0])} timed out after {timeout:.0f} s"
    except OSError as e:
        return None, f"{argv[0]}: {e}"
    if cp.returncode != 0:
        lines = (cp.stderr or cp.stdout).strip().splitlines()
        return None, (lines[-1][:300] if lines else f"{argv[0]} exit {cp.returncode}")
    return cp.stdout, ""


def tool_env() -> Dict[str, str]:
    """The fixed environment of Slurm commands (scontrol, sacct): PATH, the C locale and the
    caller's SLURM_CONF; a hook or helper must never pass the job's environment on."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C", "LC_ALL": "C"}
    if os.environ.get("SLURM_CONF"):
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    return env


def parse_node(text: str) -> NodeState:
    """Parse ``scontrol show node -o`` output (Reason may hold spaces; it ends at `[user@time]`)."""
    state = re.search(r"\bState=(\S+)", text)
    reason = re.search(r"\bReason=(.*?)(?: \[[^\]]*\])?(?= \w+=|$)", text.strip())
    stamp = re.search(r"\bReason=.*? \[([^@\]]*)@(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\]", text)
    when = None
    if stamp:
        try:
            when = time.mktime(time.strptime(stamp.group(2), "%Y-%m-%dT%H:%M:%S"))  # slurmctld's local time
        except (ValueError, OverflowError):
            when = None
    return NodeState(state.group(1) if state else "", reason.group(1).strip() if reason else "", when,
                     stamp.group(1) if stamp else None)


def node_state(cfg: Config, node: str, timeout: float = 5.0) -> NodeState:
    return parse_node(_scontrol(cfg, ["show", "node", "-o", node], timeout))


def tagged(reason: str) -> str:
    return reason if reason.startswith(TAG) else (TAG + " " + reason)[:_MAX_REASON]


def drain(cfg: Config, node: str, reason: str, timeout: float = 10.0) -> str:
    """Drain ``node`` with a tagged reason unless a foreign reason is already set; Slurm's
    own "Prolog error" (our hook's failure standing in for our reason) is replaced.
    ``timeout`` bounds both scontrol calls together."""
    t_end = time.monotonic() + timeout
    current = node_state(cfg, node, timeout / 2)
    if current.reason and not current.ours and not current.hook_error:
        return f"left foreign reason untouched: {current.reason!r}"
    if current.ours and "DRAIN" in current.state:
        return f"already drained: {current.reason}"  # the first evidence (Prolog's) stays
    text = tagged(reason)
    _scontrol(cfg, ["update", f"nodename={node}", "state=drain", f"reason={text}"],
              max(0.1, t_end - time.monotonic()))
    return f"drained: {text}"


def resume(cfg: Config, node: str) -> str:
    """Resume ``node`` only when its drain reason is ours."""
    current = node_state(cfg, node)
    if not current.ours:
        raise SlurmError(f"{node}: reason {current.reason!r} is not ours ({TAG}…); not resuming")
    _scontrol(cfg, ["update", f"nodename={node}", "state=resume"])
    return f"resumed {node} (was: {current.reason})"
