"""The MCP server against the real lab, driven by the SDK's client over stdio: the agent's view of
a hung job (root cause, hook records, the power series of the hang window) and of a drained node."""
from __future__ import annotations

import sys
from typing import Any, Dict, List, Tuple

import pytest

import lab as labmod
from test_triage_lab import FAST, triage_step

pytest.importorskip("mcp", reason="the MCP SDK (pip install '.[mcp]', Python >= 3.10) is not installed")
import anyio  # noqa: E402


def _calls(lab: labmod.Lab, calls: List[Tuple[str, Dict[str, Any]]]) -> List[Any]:
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    env = {"PATH": "/usr/bin:/bin", "SLURM_CONF": lab.slurm_conf, "SLURM_TRIAGE_CONFIG": str(lab.triage_config)}
    params = StdioServerParameters(command=sys.executable, args=["-m", "slurm_triage", "mcp"],
                                   cwd=str(labmod.ROOT), env=env)

    async def main() -> List[Any]:
        async with Client(params) as c:
            return [await c.call_tool(name, args) for name, args in calls]

    return anyio.run(main)


def test_agent_investigates_a_hung_job(lab):
    with lab.config(FAST):
        job = triage_step(lab, "node2", "h100x8-nccl-hang.json")
    tri, hooks, power, report = _calls(lab, [
        ("triage_job", {"job_id": job}), ("get_evidence", {"job_id": job, "source": "hooks"}),
        ("query_metrics", {"job_id": job, "metric": "gpu_power", "node": "node2"}),
        ("get_evidence", {"job_id": job, "source": "slurm"})])
    assert not tri.is_error, tri.content
    root = tri.structured_content["findings"][0]
    assert root["category"] == "collective_hang" and root["node"] == "node2", root
    assert "node2" in tri.content[0].text and tri.structured_content["next"].startswith("query_metrics(")
    # the Prolog/Epilog records of both nodes, with the Epilog's per-GPU job diff
    data = hooks.structured_content["data"]
    assert set(data) == {"node1", "node2"} and all(d.get("gpu_diff") for d in data.values()), data
    # the power series of node2's GPUs over the job: the hang drops them to idle power
    series = power.structured_content["series"]
    assert len(series) == 8 and all(s["labels"]["instance"] == "node2" for s in series), power.structured_content
    lows = [min(p[1] for p in s["points"] if p[1] is not None) for s in series]
    assert max(lows) < 200, lows  # H100 idle power in the nccl-hang scenario, vs ~600 W busy
    assert report.structured_content["data"]["state"] == "COMPLETED"
    for r in (tri, hooks, power, report):
        assert len(r.model_dump_json()) < 2 * (32 << 10)  # bounded answers (structured + text)


def test_agent_sees_a_drained_nodes_xid(lab):
    lab.set_scenario("node3", "h100x8-xid79.json")
    r = lab.srun("-N1", "-w", "node3", "true", timeout=60)
    assert r.returncode != 0
    lab.wait_node("node3", lambda s: "DRAIN" in s)
    (hist,) = _calls(lab, [("node_history", {"node": "node3"})])
    assert not hist.is_error, hist.content
    h = hist.structured_content
    assert h["drain"]["ours"] and "Xid 79" in h["drain"]["reason"], h["drain"]
    assert any(f["id"] == "kernel.xid" or "Xid 79" in (f.get("summary") or "") for f in h["hardware_findings"]), h
