"""The node's last known GPU identities, so a GPU that fell off the bus is still named.

Real NVML refuses even the handle of a lost GPU (GPU_IS_LOST from
nvmlDeviceGetHandleByIndex), so its UUID and bus id cannot be asked for at the moment
they matter most. Every complete snapshot records index → (UUID, bus id, minor) in the
state directory; a later snapshot fills a lost GPU's identity from it, marked as such.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

from .sinks.atomic import write_atomic

IDENTITY = ("uuid", "pci_bus_id", "minor", "name")


def path(state_dir: str) -> str:
    return os.path.join(state_dir, "gpu-inventory.json")


def from_facts(gpu: Dict[str, Any], seen_at: float) -> Optional[Dict[str, Any]]:
    """The inventory of a snapshot in which every GPU answered with its identity, else None."""
    gpus = gpu.get("gpus") or []
    if not gpus or any(g.get("lost") or not g.get("uuid") for g in gpus):
        return None
    return {"seen_at": seen_at, "count": gpu.get("count"),
            "gpus": {str(g["index"]): {k: g.get(k) for k in IDENTITY} for g in gpus}}


def fill_lost(gpu: Dict[str, Any], inv: Dict[str, Any]) -> int:
    """Give lost GPUs without a UUID the identity last seen at their index; returns how many."""
    known = inv.get("gpus") or {}
    filled = 0
    for g in gpu.get("gpus") or []:
        if g.get("uuid") or not g.get("lost"):
            continue
        last = known.get(str(g.get("index")))
        if last:
            for k in IDENTITY:
                g.setdefault(k, None)
                if g[k] is None:
                    g[k] = last.get(k)
            g["identity_seen_at"] = inv.get("seen_at")
            filled += 1
    return filled


def load(state_dir: str) -> Dict[str, Any]:
    try:
        with open(path(state_dir), encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def update(state_dir: str, gpu: Dict[str, Any], seen_at: float) -> None:
    """Fill lost GPUs from the stored inventory, or store this snapshot's if it is complete."""
    inv = from_facts(gpu, seen_at)
    if inv is None:
        fill_lost(gpu, load(state_dir))
        return
    if load(state_dir).get("gpus") == inv["gpus"]:
        return
    try:
        os.makedirs(state_dir, exist_ok=True)
        write_atomic(path(state_dir), json.dumps(inv).encode(), mode=0o644, fsync=False)
    except OSError:
        pass  # a read-only state dir only costs the naming of a future lost GPU
