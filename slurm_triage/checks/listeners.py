"""Public listeners: dashboards and job sockets bound to every interface.

A Ray/TensorBoard/Jupyter dashboard on 0.0.0.0 gives anyone on the cluster network
code execution as the job's user; job processes that listen on the wildcard (NCCL
bootstrap, torch rendezvous) are exposed the same way. System daemons that bind the
wildcard on purpose (sshd, slurmd) carry no job id and are left alone.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

from ..config import Config
from ..model import Finding, Verdict
from . import Facts, check


@check("listener.public", needs=("procs",))
def listener_public(facts: Facts, cfg: Config) -> List[Finding]:
    """A dashboard port, or any port of a job process, bound to 0.0.0.0 or ::."""
    dashboards = set(cfg.get("listeners", "dashboard_ports"))
    seen: Dict[Tuple[object, int], Finding] = {}
    for s in facts["procs"]["listeners"]:
        dashboard = s["port"] in dashboards
        if not (dashboard or s["job_id"]):
            continue
        key = (s["pid"], s["port"])
        if key in seen:  # the same port on 0.0.0.0 and ::
            seen[key].evidence["addrs"].append(s["addr"])
            continue
        what = "dashboard port" if dashboard else "port"
        owner = f"pid {s['pid']}" if s["pid"] is not None else "an unseen process"
        job = f" of job {s['job_id']}" if s["job_id"] else ""
        seen[key] = Finding(
            id="listener.public", verdict=Verdict.WARN, pid=s["pid"],
            summary=f"{what} {s['port']}/{s['proto']} is open on all interfaces ({s['addr']}), {owner}{job}",
            evidence={"port": s["port"], "proto": s["proto"], "addrs": [s["addr"]], "uid": s["uid"],
                      "job_id": s["job_id"], "dashboard": dashboard},
            action="bind it to 127.0.0.1 and reach it through an SSH tunnel")
    return list(seen.values())
