"""InfiniBand/RoCE port facts from sysfs (/sys/class/infiniband/<dev>/ports/<n>/...).

Plain file reads, no verbs library and no MADs, so it works without OFED and costs a few
milliseconds. Counter files that do not hold an integer (``N/A (no PMA)`` on iWARP
devices) are left out rather than guessed.
"""
from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional

from ..config import Config

_RATE = re.compile(r"^\s*([0-9.]+)\s*Gb/sec")


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(4096).strip()
    except OSError:
        return None


def _name(value: Optional[str]) -> Optional[str]:
    """``4: ACTIVE`` -> ``ACTIVE``; ``5: LinkUp`` -> ``LinkUp``."""
    if value is None:
        return None
    return value.split(":", 1)[1].strip() if ":" in value else value


def _rate_gbps(value: Optional[str]) -> Optional[float]:
    m = _RATE.match(value or "")
    return float(m.group(1)) if m else None


def _counters(directory: str) -> Dict[str, int]:
    out: Dict[str, int] = {}
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return out
    for name in names:
        text = _read(os.path.join(directory, name))
        if text is not None and re.fullmatch(r"\d+", text):
            out[name] = int(text)
    return out


def collect(cfg: Config) -> Dict[str, Any]:
    """Every port of every RDMA device under ``rdma.sysfs_root`` (see docs/architecture.md ``rdma``)."""
    root = cfg.get("rdma", "sysfs_root")
    ports: List[Dict[str, Any]] = []
    try:
        devices = sorted(os.listdir(root))
    except OSError:
        return {"ports": ports}
    for dev in devices:
        pdir = os.path.join(root, dev, "ports")
        try:
            nums = sorted(os.listdir(pdir), key=lambda n: (len(n), n))
        except OSError:
            continue
        for num in nums:
            base = os.path.join(pdir, num)
            rate_text = _read(os.path.join(base, "rate"))
            ports.append({
                "device": dev,
                "port": int(num) if num.isdigit() else num,
                "state": _name(_read(os.path.join(base, "state"))),
                "phys_state": _name(_read(os.path.join(base, "phys_state"))),
                "rate_gbps": _rate_gbps(rate_text),
                "rate": rate_text,
                "link_layer": _read(os.path.join(base, "link_layer")),
                "counters": _counters(os.path.join(base, "counters")),
                "hw_counters": _counters(os.path.join(base, "hw_counters")),
            })
    return {"ports": ports}
