"""What the SPANK plugin execs: ``python -I -m slurm_triage.step.spank gate|watch-start|watch-stop``.

The plugin (spank/slurm_triage_spank.c) builds this process's whole environment itself
and passes the step as ``SLURM_TRIAGE_{JOB_ID,STEP_ID,NODE,UID,GID,MODE,NODELIST}``; in
slurmstepd it has already dropped to the job's uid/gid. Every value is still checked
against a closed form here, because the job id and node list reach srun from the user.

Exit codes: ``gate`` 1 = blocked (the plugin stops the step), anything else launches;
the watcher actions always exit 0 (our faults must not fail a step).
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from typing import Dict, Mapping, Optional

from .. import ids


class ContextError(ValueError):
    pass


@dataclass(frozen=True)
class StepContext:
    """The step a helper acts for, as the plugin passed it."""

    job_id: str
    step_id: str
    """Decimal step id, or batch / extern / interactive."""
    node: str
    """This node's Slurm name ('' in srun, which runs on the submit host)."""
    uid: int
    gid: int
    mode: str
    """'on' or 'deep' (--triage=off never gets here)."""
    nodelist: str
    config: Optional[str]
    """The config file the plugin was told to use, else None (defaults apply)."""


def _get(env: Mapping[str, str], key: str, pattern: "re.Pattern[str]", required: bool = True) -> str:
    v = env.get("SLURM_TRIAGE_" + key, "")
    if v == "" and not required:
        return v
    if not pattern.fullmatch(v):
        raise ContextError(f"SLURM_TRIAGE_{key}={v[:40]!r} is malformed")
    return v


def context(env: Mapping[str, str] = os.environ) -> StepContext:
    """Parse and validate the plugin's variables; raise ContextError."""
    mode = env.get("SLURM_TRIAGE_MODE", "")
    if mode not in ids.STEP_MODES:
        raise ContextError(f"SLURM_TRIAGE_MODE={mode[:20]!r} is not one of {', '.join(ids.STEP_MODES)}")
    config = env.get("SLURM_TRIAGE_CONFIG") or None
    if config is not None and not config.startswith("/"):
        raise ContextError(f"SLURM_TRIAGE_CONFIG={config[:80]!r} is not absolute")
    return StepContext(job_id=_get(env, "JOB_ID", ids.JOB_ID), step_id=_get(env, "STEP_ID", ids.STEP_ID),
                       node=_get(env, "NODE", ids.NODE, required=False), uid=int(_get(env, "UID", ids.NUMERIC_ID)),
                       gid=int(_get(env, "GID", ids.NUMERIC_ID)), mode=mode,
                       nodelist=_get(env, "NODELIST", ids.HOSTLIST, required=False), config=config)


def _say(msg: str) -> None:
    sys.stderr.write(f"slurm-triage: {msg}\n")


def gate(ctx: StepContext) -> int:
    """The gang gate before srun launches: 1 blocks the step, 0 launches."""
    from . import gate as gang
    from ..config import ConfigError, load

    try:
        cfg = load(ctx.config, fail_open=True)
        for w in cfg.warnings:
            _say(f"config: {w}")
        return gang.run(cfg, ctx.job_id, ctx.nodelist)
    except (ConfigError, gang.HostlistError) as e:
        _say(f"gang gate not run ({e}); launching")
        return 0


def _watch(ctx: StepContext, action: str) -> int:
    """Start or stop this step's watcher (slurm_triage.step.watcher) on this node."""
    try:
        from . import watcher
    except ModuleNotFoundError as e:
        if e.name != __package__ + ".watcher":
            raise
        _say(f"{action}: slurm_triage.step.watcher is not installed; no watcher for job {ctx.job_id}")
        return 0
    from ..config import load

    wctx = watcher.WatchContext(job_id=ctx.job_id, step_id=ctx.step_id, node=ctx.node, uid=ctx.uid,
                                gid=ctx.gid, mode=ctx.mode)
    cfg = load(ctx.config, fail_open=True, node=ctx.node)  # {node} paths are this node's
    try:
        if action == "watch-start":
            _say(f"watcher pid {watcher.start(wctx, cfg)} for step {wctx.step} on {ctx.node}")
        else:
            watcher.stop(wctx, cfg)
    except watcher.WatchError as e:
        _say(f"{action}: {e}")
    return 0


ACTIONS: Dict[str, object] = {"gate": gate, "watch-start": lambda c: _watch(c, "watch-start"),
                              "watch-stop": lambda c: _watch(c, "watch-stop")}


def main(argv: Optional[list] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] not in ACTIONS:
        _say("usage: python -I -m slurm_triage.step.spank " + "|".join(ACTIONS))
        return 0
    try:
        ctx = context()
    except ContextError as e:
        _say(f"{argv[0]}: {e}; doing nothing")
        return 0
    if ctx.config:
        os.environ["SLURM_TRIAGE_CONFIG"] = ctx.config
    try:
        return int(ACTIONS[argv[0]](ctx))  # type: ignore[operator]
    except Exception as e:  # noqa: BLE001 - our bug must neither block nor fail a step
        _say(f"{argv[0]}: internal error {type(e).__name__}: {e}; doing nothing")
        return 0


if __name__ == "__main__":
    sys.exit(main())
