"""GPU out-of-memory lines judged by the figures PyTorch prints with them.

PyTorch's caching allocator says how large the GPU is, how much of it is free, and how much
this process holds (c10/cuda/CUDACachingAllocator.cpp): "GPU N has a total capacity of T of
which F is free. [Process P has M memory in use.] Including non-PyTorch memory, this process
has H memory in use. Of the allocated memory A is allocated by PyTorch, and R is reserved by
PyTorch but unallocated."; releases before 2.1 print "(GPU N; T total capacity; A already
allocated; F free; R reserved in total by PyTorch)" (or "... C cached)"). When most of the GPU
was held by something other than this process, a smaller batch is not the fix: what holds it
is the cause (a leftover of an earlier job, another job on the same GPU, ranks that all chose
the same GPU), so the out-of-memory follows from it. A modest confidence: from one line we
cannot tell a leftover (host_resources) from a rank placement mistake (config).
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional

from ...model import Verdict
from ..model import LogEvent, TriageFinding, from_events
from ..parsers.base import size_bytes
from .catalog import entries

_SIZE = r"([\d.]+) ?(bytes|[KMGT]i?B)"
_NEW = re.compile(r"GPU (\d+) has a total capac(?:i)?ty of " + _SIZE + r" of which " + _SIZE + r" is free")
_THIS = re.compile(r"this process has " + _SIZE + r" memory in use")
_OTHER = re.compile(r"Process (\d+) has " + _SIZE + r" memory in use")
_ALLOCATED = re.compile(r"Of the allocated memory " + _SIZE + r" is allocated by PyTorch, and " + _SIZE
                        + r" is reserved by PyTorch but unallocated")
_OLD = re.compile(r"\(GPU (\d+); " + _SIZE + r" total capacity; " + _SIZE + r" already allocated; " + _SIZE
                  + r" free; " + _SIZE + r" (reserved in total by PyTorch|cached)")
CONTEXT_GIB = 0.5
"""What this process holds beyond PyTorch's own figures (its CUDA context, cuBLAS workspaces)."""
HELD_SHARE = 0.5
"""The share of the GPU others must hold for the out-of-memory to be theirs, not the batch's."""
FINDING = "log.oom.cuda"


def _gib(number: str, unit: str) -> float:
    return size_bytes(number, unit) / (1 << 30)


def figures(text: str) -> Optional[Dict[str, object]]:
    """GPU, total, free and this process's GiB from one out-of-memory line; None without them."""
    m = _NEW.search(text)
    if m:
        gpu, total, free = m.group(1), _gib(m.group(2), m.group(3)), _gib(m.group(4), m.group(5))
        this = _THIS.search(text)
        if this:
            mine = _gib(this.group(1), this.group(2))
        else:
            a = _ALLOCATED.search(text)
            if a is None:
                return None
            mine = _gib(a.group(1), a.group(2)) + _gib(a.group(3), a.group(4)) + CONTEXT_GIB
        others = {int(p.group(1)): round(_gib(p.group(2), p.group(3)), 2) for p in _OTHER.finditer(text)}
    else:
        m = _OLD.search(text)
        if m is None:
            return None
        gpu, total, free = m.group(1), _gib(m.group(2), m.group(3)), _gib(m.group(6), m.group(7))
        allocated, held = _gib(m.group(4), m.group(5)), _gib(m.group(8), m.group(9))
        mine = (held if m.group(10).startswith("reserved") else allocated + held) + CONTEXT_GIB
        others = {}
    return {"gpu": gpu, "total_gib": round(total, 2), "free_gib": round(free, 2), "this_process_gib": round(mine, 2),
            "held_elsewhere_gib": round(max(0.0, total - free - mine), 2), "other_processes_gib": others}


def held_elsewhere(events: List[LogEvent]) -> List[TriageFinding]:
    """CUDA out of memory while most of the GPU was held by other processes: they are the cause."""
    kinds = {e.id for e in entries() if e.finding_id == FINDING}
    out: List[TriageFinding] = []
    seen = set()
    for ev in events:
        if ev.kind not in kinds:
            continue
        f = figures(ev.text)
        if f is None or not f["total_gib"] or f["held_elsewhere_gib"] < HELD_SHARE * f["total_gib"]:
            continue
        key = (ev.node, f["gpu"])
        if key in seen:
            continue
        seen.add(key)
        pids = sorted(f["other_processes_gib"])
        out.append(from_events(
            [ev], id="log.gpu_memory_held_elsewhere", category="host_resources", verdict=Verdict.FAIL,
            confidence=0.6, node=ev.node, gpu=str(f["gpu"]), rank=ev.rank, tier=0,
            summary=(f"GPU {f['gpu']} ran out of memory with {f['held_elsewhere_gib']:g} of its {f['total_gib']:g} GiB "
                     f"held by other processes" + (f" (pid {', '.join(map(str, pids))})" if pids else "")
                     + f"; this process held {f['this_process_gib']:g} GiB"),
            action=("find what holds that GPU (`nvidia-smi --query-compute-apps=pid,used_memory --format=csv` on "
                    "the node): a leftover of an earlier job (kill it; the Epilog's leftover check), another job on "
                    "the same GPU, or ranks that all chose the same GPU (CUDA_VISIBLE_DEVICES, LOCAL_RANK)"),
            evidence=dict(f)))
    return out

