"""Drain and resume through scontrol, touching only reasons tagged ``triage:``.

A drain reason without our tag belongs to someone else (an admin, NHC, Slurm itself):
we never overwrite or clear it.
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from typing import Dict, List

from .config import Config

TAG = "triage:"
_MAX_REASON = 200  # scontrol accepts more, but sinfo columns and humans do not


@dataclass
class NodeState:
    state: str
    reason: str

    @property
    def ours(self) -> bool:
        return self.reason.startswith(TAG)


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
    return NodeState(state.group(1) if state else "", reason.group(1).strip() if reason else "")


def node_state(cfg: Config, node: str) -> NodeState:
    return parse_node(_scontrol(cfg, ["show", "node", "-o", node]))


def drain(cfg: Config, node: str, reason: str) -> str:
    """Drain ``node`` with a tagged reason unless a foreign reason is already set."""
    current = node_state(cfg, node)
    if current.reason and not current.ours:
        return f"left foreign reason untouched: {current.reason!r}"
    if current.ours and "DRAIN" in current.state:
        return f"already drained: {current.reason}"  # the first evidence (Prolog's) stays
    text = (TAG + " " + reason)[:_MAX_REASON]
    _scontrol(cfg, ["update", f"nodename={node}", "state=drain", f"reason={text}"])
    return f"drained: {text}"


def resume(cfg: Config, node: str) -> str:
    """Resume ``node`` only when its drain reason is ours."""
    current = node_state(cfg, node)
    if not current.ours:
        raise SlurmError(f"{node}: reason {current.reason!r} is not ours ({TAG}…); not resuming")
    _scontrol(cfg, ["update", f"nodename={node}", "state=resume"])
    return f"resumed {node} (was: {current.reason})"
