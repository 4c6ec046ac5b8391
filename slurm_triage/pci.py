"""PCI bus ids in one canonical form, so NVML, the kernel log and sysfs can be joined.

NVML says ``00000000:18:00.0``, the kernel's Xid line ``0000:18:00``, sysfs
``0000:18:00.0``; all become ``0000:18:00.0`` (lower case, 4-digit domain).
"""
from __future__ import annotations

import re

_BUS = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?$")


def normalize(bus_id: str) -> str:
    """Canonical ``dddd:bb:dd.f``; raises ValueError for text that is not a bus id."""
    m = _BUS.match(bus_id.strip())
    if not m:
        raise ValueError(f"not a PCI bus id: {bus_id!r}")
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16) & 0xFFFF:04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn or '0'}"
