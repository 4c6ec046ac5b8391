"""Drain circuit breaker: automation may take only so many nodes out of service.

One job's Xid storm once flagged 77 nodes in 11 racks; sites ask for an absolute cap
("1 % of 288 is 3 nodes"). Before a hook drains, it counts the nodes that carry our
``triage:`` reason now (one ``sinfo`` call under a deadline) or carried it within the
window (remembered in this node's census cache), and holds the drain back above
``[drain] max_nodes`` or ``max_fraction`` of the partition. The census is cached for
``cache_seconds`` so a burst of Prologs on one node asks slurmctld once.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from .config import Config
from .sinks import counters
from .sinks.atomic import write_atomic

TAG = "triage:"  # slurmctl.TAG; not imported: every Prolog reads suppressed_total(), few need scontrol

CACHE_FILE = "drain-census.json"
SUPPRESSED_FILE = "drain_suppressed_total"
SINFO_FORMAT = "%N|%P|%T|%H|%E"


@dataclass
class Census:
    """Nodes per partition, and when each node was last seen with our drain reason."""
    partitions: Dict[str, List[str]]
    ours: Dict[str, float]
    """node -> unix time its ``triage:`` reason was set (or last seen)."""
    taken: float


@dataclass
class Decision:
    allowed: bool
    why: str


def parse_sinfo(text: str, now: float) -> Tuple[Dict[str, List[str]], Dict[str, float]]:
    """``sinfo -h -N -o '%N|%P|%T|%H|%E'`` -> (partition -> nodes, node -> time of our reason)."""
    from datetime import datetime

    partitions: Dict[str, List[str]] = {}
    ours: Dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split("|", 4)
        if len(parts) != 5:
            continue
        node, part, state, stamp, reason = (p.strip() for p in parts)
        partitions.setdefault(part.rstrip("*"), [])
        if node not in partitions[part.rstrip("*")]:
            partitions[part.rstrip("*")].append(node)
        if reason.startswith(TAG) and ("drain" in state.lower() or "down" in state.lower()):
            try:
                ours[node] = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S").timestamp()
            except ValueError:
                ours[node] = now
    return partitions, ours


def _cache_path(cfg: Config) -> str:
    return os.path.join(cfg.get("node", "state_dir"), "node", CACHE_FILE)


def _load_cache(cfg: Config) -> Optional[Census]:
    try:
        with open(_cache_path(cfg), "rb") as fh:
            d = json.load(fh)
        return Census({k: list(v) for k, v in d["partitions"].items()},
                      {k: float(v) for k, v in d["ours"].items()}, float(d["taken"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _save_cache(cfg: Config, c: Census) -> None:
    try:
        os.makedirs(os.path.dirname(_cache_path(cfg)), mode=0o700, exist_ok=True)
        write_atomic(_cache_path(cfg), json.dumps({"partitions": c.partitions, "ours": c.ours,
                                                   "taken": c.taken}).encode(), fsync=False)
    except OSError:
        pass


def census(cfg: Config, timeout: float) -> Optional[Census]:
    """The cached census if fresh, else one sinfo call merged with the window's memory;
    None when sinfo did not answer and nothing is cached."""
    from .slurmctl import run_tool

    now = time.time()
    cached = _load_cache(cfg)
    if cached is not None and now - cached.taken < cfg.get("drain", "cache_seconds"):
        return cached
    out, _ = run_tool([cfg.get("drain", "sinfo"), "-h", "-N", "-o", SINFO_FORMAT], max(0.1, timeout))
    if out is None:
        return cached
    partitions, ours = parse_sinfo(out, now)
    window = cfg.get("drain", "window_seconds")
    for node, t in (cached.ours.items() if cached else ()):
        if now - t <= window and node not in ours:
            ours[node] = t  # resumed since, but drained by us within the window
    c = Census(partitions, ours, now)
    _save_cache(cfg, c)
    return c


def judge(cfg: Config, node: str, partition: str, c: Optional[Census]) -> Decision:
    """May ``node`` be drained now? Pure over the census."""
    max_nodes, fraction = cfg.get("drain", "max_nodes"), cfg.get("drain", "max_fraction")
    if not max_nodes and not fraction:
        return Decision(True, "no cap configured")
    if c is None:
        return Decision(True, "no census (sinfo did not answer): the evidence decides")
    window, now = cfg.get("drain", "window_seconds"), time.time()
    others = sorted(n for n, t in c.ours.items() if n != node and now - t <= window)
    if max_nodes and len(others) >= max_nodes:
        return Decision(False, f"{len(others)} nodes already drained by slurm-triage within "
                              f"{window:g} s ({', '.join(others[:5])}{' …' if len(others) > 5 else ''}) "
                              f">= drain.max_nodes = {max_nodes}")
    members = c.partitions.get(partition) or sorted({n for ns in c.partitions.values() for n in ns})
    if fraction and members:
        allowed = max(1, math.ceil(fraction * len(members)))
        mine = [n for n in others if n in members]
        if len(mine) >= allowed:
            return Decision(False, f"{len(mine)} of {len(members)} nodes of partition {partition or '?'} already "
                                  f"drained by slurm-triage >= drain.max_fraction = {fraction:g} ({allowed} nodes)")
    return Decision(True, f"{len(others)} other nodes drained by slurm-triage within the window")


def check(cfg: Config, node: str, partition: str, timeout: float) -> Decision:
    """judge() over the census, asking sinfo only when a cap is configured."""
    if not cfg.get("drain", "max_nodes") and not cfg.get("drain", "max_fraction"):
        return Decision(True, "no cap configured")
    return judge(cfg, node, partition, census(cfg, timeout))


def note_drained(cfg: Config, node: str) -> None:
    """Count our own drain in the cached census at once (the next judge sees it)."""
    c = _load_cache(cfg)
    if c is not None:
        c.ours[node] = time.time()
        _save_cache(cfg, c)


def count_suppressed(cfg: Config) -> int:
    """Increment and return this node's persistent ``drain_suppressed_total``."""
    return counters.bump(cfg, SUPPRESSED_FILE)


def suppressed_total(cfg: Config) -> int:
    return counters.read(cfg, SUPPRESSED_FILE)
