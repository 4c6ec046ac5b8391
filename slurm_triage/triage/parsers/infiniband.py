"""InfiniBand/RoCE port status as ``ibstat``, ``ibv_devinfo`` and ``ibstatus`` print it.

* ``ibstat``: ``CA 'mlx5_0'``, then per port ``Port 1:``, ``State: Active``, ``Physical state: LinkUp``,
  ``Rate: 200``, ``Link layer: InfiniBand``.
* ``ibv_devinfo``: ``hca_id: mlx5_0``, ``port: 1``, ``state: PORT_ACTIVE (4)``, with ``-v`` also
  ``phys_state: LINK_UP (5)``, and ``link_layer: Ethernet``.
* ``ibstatus``: ``Infiniband device 'mlx5_1' port 1 status:``, ``state: 4: ACTIVE``,
  ``phys state: 5: LinkUp``, ``rate: 100 Gb/sec (4X EDR)``, ``link_layer: InfiniBand``.

One ``ib_port`` event per port, on its state line, with the states normalised to the IB spec's
names (logical: Down, Initializing, Armed, Active; physical: Polling, Disabled, LinkUp, ...).
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional

from ..model import LogEvent
from .base import Doc, number

_CA = re.compile(r"^\s*CA '(?P<ca>[^']+)'\s*$")
_HCA = re.compile(r"^\s*hca_id:\s*(?P<ca>\S+)\s*$")
_IBSTATUS = re.compile(r"^\s*Infiniband device '(?P<ca>[^']+)' port (?P<port>\d+) status:\s*$")
_PORT = re.compile(r"^\s*(?:Port (?P<a>\d+):|port:\s*(?P<b>\d+))\s*$")
_FIELD = re.compile(r"^\s*(?P<key>State|Physical state|Rate|Link layer|state|phys_state|phys state|rate|"
                    r"link_layer|active_mtu|active_width|active_speed):\s*(?P<value>.+?)\s*$")
# ibv_devinfo names (PORT_ACTIVE (4), LINK_UP (5)) and ibstatus' "4: ACTIVE" to ibstat's words.
_LOGICAL = {"down": "Down", "port_down": "Down", "init": "Initializing", "initializing": "Initializing",
            "port_init": "Initializing", "armed": "Armed", "port_armed": "Armed", "active": "Active",
            "port_active": "Active", "active_defer": "Active", "port_active_defer": "Active"}
_PHYSICAL = {"sleep": "Sleep", "polling": "Polling", "disabled": "Disabled",
             "portconfigurationtraining": "PortConfigurationTraining", "linkup": "LinkUp", "link_up": "LinkUp",
             "linkerrorrecovery": "LinkErrorRecovery", "link_error_recovery": "LinkErrorRecovery",
             "phytest": "PhyTest", "phy_test": "PhyTest"}


def _word(value: str) -> str:
    """``PORT_DOWN (1)`` / ``1: DOWN`` / ``Down`` -> ``port_down`` / ``down`` / ``down``."""
    v = re.sub(r"\(\d+\)", "", value)
    v = re.sub(r"^\d+:\s*", "", v.strip())
    return v.strip().lower().replace(" ", "")


class _Port:
    def __init__(self, ca: str, port: int, line: int):
        self.ca, self.port, self.line = ca, port, line
        self.fields: Dict[str, object] = {}


def parse(doc: Doc) -> List[LogEvent]:
    """``ib_port`` events (fields: ca, port, state, phys_state, rate_gbps, link_layer, tool)."""
    text = doc.text
    if "CA '" not in text and "hca_id:" not in text and "Infiniband device '" not in text:
        return []
    out: List[LogEvent] = []
    ca: Optional[str] = None
    tool = ""
    cur: Optional[_Port] = None

    def close() -> None:
        if cur is not None and "state" in cur.fields:
            out.append(doc.event("ib_port", cur.line, node=None, ca=cur.ca, port=cur.port, tool=tool, **cur.fields))

    for n, line in enumerate(doc.lines, 1):
        m = _CA.match(line) or _HCA.match(line)
        if m:
            close()
            cur, ca = None, m["ca"]
            tool = "ibstat" if line.lstrip().startswith("CA") else "ibv_devinfo"
            continue
        m = _IBSTATUS.match(line)
        if m:
            close()
            ca, tool = m["ca"], "ibstatus"
            cur = _Port(ca, int(m["port"]), n)
            continue
        m = _PORT.match(line)
        if m and ca is not None:
            close()
            cur = _Port(ca, int(m["a"] or m["b"]), n)
            continue
        f = _FIELD.match(line)
        if not f or cur is None:
            continue
        key, value = f["key"].lower(), f["value"]
        if key == "state":
            cur.fields["state"] = _LOGICAL.get(_word(value), value)
            cur.line = n
        elif key in ("physical state", "phys_state", "phys state"):
            cur.fields["phys_state"] = _PHYSICAL.get(_word(value), value)
        elif key == "rate":
            cur.fields["rate_gbps"] = number(value)
        elif key in ("link layer", "link_layer"):
            cur.fields["link_layer"] = "Ethernet" if "ether" in value.lower() else value
    close()
    return out
