"""The gang gate: hostlists, the pure decision, evidence from a real Pushgateway and state."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from slurm_triage.step import gate
from slurm_triage.config import SCHEMA, Config, defaults, load
from slurm_triage.step.gate import NodeEvidence, Policy, decide, expand_hostlist
from slurm_triage.model import Finding, Verdict
from slurm_triage.step.sampling import peer_figures
from slurm_triage.sinks import exposition, peer_metrics
from slurm_triage.sinks.pushgateway import push

from conftest import cli, free_port

HOSTLISTS = ["node[1-3]", "gpu[01-03,7]", "rack[1-2]-n[1-2]", "a,b[1-2],c", "n[008-011]", "x[9-10]",
             "node1", "n[1,3-4],m[2]"]


@pytest.mark.parametrize("text", HOSTLISTS)
def test_expand_hostlist_matches_scontrol(text: str) -> None:
    want = {
        "node[1-3]": ["node1", "node2", "node3"],
        "gpu[01-03,7]": ["gpu01", "gpu02", "gpu03", "gpu7"],
        "rack[1-2]-n[1-2]": ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"],
        "a,b[1-2],c": ["a", "b1", "b2", "c"],
        "n[008-011]": ["n008", "n009", "n010", "n011"],
        "x[9-10]": ["x9", "x10"],
        "node1": ["node1"],
        "n[1,3-4],m[2]": ["n1", "n3", "n4", "m2"],
    }[text]
    assert expand_hostlist(text) == want
    scontrol = shutil.which("scontrol")
    if scontrol:  # the real thing parses locally: no controller, but it needs a slurm.conf
        out = subprocess.run([scontrol, "show", "hostnames", text], capture_output=True, text=True,
                             env={"PATH": "/usr/bin:/bin"}, timeout=10)
        if out.returncode == 0:
            assert out.stdout.split() == want


def test_expand_hostlist_large_empty_and_suffixed() -> None:
    assert len(expand_hostlist("gpu[0000-1023]")) == 1024
    # 22.05's scontrol refuses a suffix after the brackets; names like this exist elsewhere.
    assert expand_hostlist("dgx-[01-02].ib") == ["dgx-01.ib", "dgx-02.ib"]
    assert expand_hostlist("") == []


@pytest.mark.parametrize("bad", ["node[1-", "node[3-1]", "node]1[", "n[1-100000]", "n[a-b]", "bad name!",
                                 "n[1-300]-m[1-300]", "n[[1]]"])
def test_expand_hostlist_rejects(bad: str) -> None:
    with pytest.raises(gate.HostlistError):
        expand_hostlist(bad)


PEER = {"gpu_count": 8, "gpu_name": "NVIDIA H100 80GB HBM3", "driver_version": "580.105.08",
        "idle_temp_celsius": 30.0, "max_sm_clock_mhz": 1980, "power_limit_watts": 700.0, "pcie_width": 16}
NODES = ["node1", "node2", "node3", "node4"]


def ev(node: str, verdict: str = "OK", **peer: Any) -> NodeEvidence:
    return NodeEvidence(node, verdict, time.time(), [], {**PEER, **peer})


def test_all_ok_launches_silently() -> None:
    d = decide("7", NODES, {n: ev(n) for n in NODES}, Policy())
    assert not d.blocked and d.rows == []
    assert "all OK" in gate.render_text(d)


def test_missing_node_blocks_and_is_named() -> None:
    d = decide("7", NODES, {n: ev(n) for n in NODES if n != "node2"}, Policy())
    assert d.blocked
    assert [(r.node, r.verdict) for r in d.rows] == [("node2", Verdict.FAIL)]
    assert "no Prolog verdict" in d.rows[0].reason
    text = gate.render_text(d)
    assert "BLOCKED" in text and "node2" in text and "--exclude=node2" in text


def test_fail_blocks_with_the_failing_checks() -> None:
    evidence = {n: ev(n) for n in NODES}
    evidence["node3"] = NodeEvidence("node3", "FAIL", time.time(),
                                     [("kernel.xid", "FAIL"), ("gpu.temperature", "WARN")], PEER)
    d = decide("7", NODES, evidence, Policy())
    assert d.blocked and d.rows[0].node == "node3"
    assert d.rows[0].reason == "Prolog FAIL: kernel.xid"


@pytest.mark.parametrize("block_on,blocked", [("fail", False), ("warn", True)])
def test_warn_blocks_only_when_configured(block_on: str, blocked: bool) -> None:
    evidence = {n: ev(n) for n in NODES}
    evidence["node4"] = NodeEvidence("node4", "WARN", time.time(), [("gpu.throttle", "WARN")], PEER)
    d = decide("7", NODES, evidence, Policy(block_on=block_on))
    assert d.blocked is blocked
    assert [(r.node, r.reason) for r in d.rows] == [("node4", "Prolog WARN: gpu.throttle")]


def test_unknown_never_blocks() -> None:
    evidence = {n: ev(n) for n in NODES}
    evidence["node1"] = NodeEvidence("node1", "UNKNOWN", time.time(), [("probe.gpu", "UNKNOWN")], {})
    d = decide("7", NODES, evidence, Policy(block_on="warn"))
    assert not d.blocked and d.rows[0].verdict == Verdict.UNKNOWN


def test_stale_verdict_is_another_jobs() -> None:
    evidence = {n: ev(n) for n in NODES}
    evidence["node2"].reported_at = time.time() - 3600
    d = decide("7", NODES, evidence, Policy(), not_before=time.time() - 10)
    assert d.blocked and [(r.node, "stale" in r.reason) for r in d.rows] == [("node2", True)]


@pytest.mark.parametrize("key,value,words", [
    ("power_limit_watts", 500.0, "power limit 500 W, peers 700 W"),
    ("driver_version", "535.54.03", "driver 535.54.03, peers 580.105.08"),
    ("gpu_count", 7, "GPU count 7, peers 8"),
    ("pcie_width", 8, "PCIe width 8 lanes, peers 16 lanes"),
    ("max_sm_clock_mhz", 1755, "max SM clock 1755 MHz, peers 1980 MHz"),
    ("gpu_name", "NVIDIA H200", "GPU model NVIDIA H200, peers NVIDIA H100 80GB HBM3"),
])
def test_peer_outlier_named(key: str, value: Any, words: str) -> None:
    evidence = {n: ev(n) for n in NODES}
    evidence["node3"] = ev("node3", **{key: value})
    d = decide("7", NODES, evidence, Policy())
    assert [(r.node, r.verdict, r.reason) for r in d.rows] == [("node3", Verdict.WARN, words)]
    assert not d.blocked
    assert decide("7", NODES, evidence, Policy(block_on="warn")).blocked


def test_peer_tie_names_every_node() -> None:
    evidence = {n: ev(n, power_limit_watts=700.0 if n in ("node1", "node2") else 500.0) for n in NODES}
    rows = decide("7", NODES, evidence, Policy()).rows
    assert sorted(r.node for r in rows) == NODES
    assert all("differs across the gang (700 W x2, 500 W x2)" in r.reason for r in rows)


def test_idle_temperature_outlier() -> None:
    evidence = {n: ev(n, idle_temp_celsius=t) for n, t in zip(NODES, (30.0, 31.0, 52.0, 29.0))}
    rows = decide("7", NODES, evidence, Policy(idle_temp_outlier_celsius=10)).rows
    assert [(r.node, r.reason) for r in rows] == [("node3", "idle at 52 C, peers' median 30.5 C (> +10 C)")]
    assert decide("7", NODES, evidence, Policy(idle_temp_outlier_celsius=25)).rows == []


def test_nodes_without_peer_figures_are_not_compared() -> None:
    evidence = {n: NodeEvidence(n, "OK", time.time(), [], {}) for n in NODES}
    evidence["node1"] = ev("node1", power_limit_watts=100.0)
    assert decide("7", NODES, evidence, Policy()).rows == []


def test_unreachable_policy() -> None:
    warn = gate.unreachable("7", NODES, "connection refused", Policy())
    block = gate.unreachable("7", NODES, "connection refused", Policy(on_unreachable="block"))
    assert not warn.blocked and block.blocked
    assert "connection refused" in gate.render_text(warn) and "launching" in gate.render_text(warn)


def test_decision_json_round_trips() -> None:
    d = decide("7", NODES, {n: ev(n) for n in NODES[:3]}, Policy())
    data = json.loads(json.dumps(d.to_dict()))
    assert data["blocked"] is True and data["rows"][0]["node"] == "node4" and data["rows"][0]["verdict"] == "FAIL"


# ---- evidence from a real Pushgateway ----------------------------------------------------------

def snapshot(node: str, power_limit: float = 700.0, temp: int = 30) -> Dict[str, Any]:
    gpus = [{"index": i, "uuid": f"GPU-{node}-{i}", "pci_bus_id": f"0000:{0x18 + i:02x}:00.0", "minor": i,
             "name": "NVIDIA H100 80GB HBM3", "temperature_celsius": temp, "power_limit_watts": power_limit,
             "sm_clock_max_mhz": 1980, "pcie_width": 16, "lost": False} for i in range(2)]
    return {"time": time.time(), "node": node, "errors": {},
            "gpu": {"driver_version": "580.105.08", "nvml_version": "13", "count": 2, "gpus": gpus}}


def push_prolog(url: str, node: str, job: str, findings: List[Finding], snap: Dict[str, Any],
                phase: str = "prolog") -> None:
    body = exposition.render(snap, findings, gpus=False, more=peer_metrics.families(peer_figures(snap)))
    push(url, {"job": "slurm_triage", "instance": node, "slurm_job_id": job, "phase": phase}, body)


def test_peer_metrics_round_trip_through_pushgateway(pushgateway) -> None:
    snap = snapshot("node1", power_limit=612.5, temp=33)
    push_prolog(pushgateway.url, "node1", "41", [], snap)
    evidence = gate.fetch_pushgateway(pushgateway.url, "41", 5)
    assert evidence["node1"].peer == peer_figures(snap)
    assert evidence["node1"].verdict == "OK"


def test_families_of_no_peer_are_empty_and_labels_are_escaped() -> None:
    assert peer_metrics.families(None) == []
    more = peer_metrics.families({"gpu_count": 8, "gpu_name": 'we"ird\\name', "driver_version": None})
    text = exposition.render({}, None, more=more)
    assert b'gpu_name="we\\"ird\\\\name"' in text and b"slurm_triage_peer_gpus 8.0" in text


def test_fetch_filters_job_and_phase_and_decides(pushgateway) -> None:
    url = pushgateway.url
    for n in ("node1", "node2", "node4"):
        push_prolog(url, n, "42", [], snapshot(n))
    push_prolog(url, "node3", "42", [Finding("gpu.ecc", Verdict.FAIL, "uncorrectable ECC", hardware=True)],
                snapshot("node3", power_limit=500.0))
    push_prolog(url, "node9", "43", [], snapshot("node9"))            # another job
    push_prolog(url, "node9", "42", [], snapshot("node9"), "epilog")  # another phase
    evidence = gate.fetch_pushgateway(url, "42", 5)
    assert sorted(evidence) == NODES
    assert evidence["node3"].verdict == "FAIL" and evidence["node3"].checks == [("gpu.ecc", "FAIL")]
    assert abs(evidence["node1"].reported_at - time.time()) < 60
    d = decide("42", NODES, evidence, Policy())
    assert d.blocked
    assert [(r.node, r.reason) for r in d.rows] == [("node3", "Prolog FAIL: gpu.ecc"),
                                                    ("node3", "power limit 500 W, peers 700 W")]


def cfg_for(url: str, state_dir: str = "/nonexistent") -> Config:
    values = defaults()
    values["pushgateway"]["url"] = url
    values["node"]["state_dir"] = state_dir
    return Config(values)


def test_gather_waits_for_late_nodes(pushgateway) -> None:
    """A node whose Prolog pushes after the gate started is still counted before the deadline."""
    import threading

    for n in NODES[:3]:
        push_prolog(pushgateway.url, n, "44", [], snapshot(n))
    timer = threading.Timer(0.6, push_prolog, (pushgateway.url, "node4", "44", [], snapshot("node4")))
    timer.start()
    try:
        d = gate.gather(cfg_for(pushgateway.url), "44", NODES, Policy(deadline_seconds=8))
    finally:
        timer.join()
    assert not d.blocked and d.rows == [] and 0.5 < d.seconds < 8


def test_gather_deadline_names_missing_node(pushgateway) -> None:
    for n in NODES[:3]:
        push_prolog(pushgateway.url, n, "45", [], snapshot(n))
    d = gate.gather(cfg_for(pushgateway.url), "45", NODES, Policy(deadline_seconds=0.6))
    assert d.blocked and [r.node for r in d.rows] == ["node4"] and d.seconds < 3


def test_unreachable_gateway_without_state_follows_policy() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    warn = gate.gather(cfg_for(url), "46", NODES, Policy(deadline_seconds=0.3))
    block = gate.gather(cfg_for(url), "46", NODES, Policy(deadline_seconds=0.3, on_unreachable="block"))
    assert warn.source == "none" and not warn.blocked
    assert block.blocked and "Connection refused" in block.rows[0].reason


def test_state_files_are_the_fallback(tmp_path: Path) -> None:
    """Per-node state (the Prolog's jobs/<id>/prolog.json) when the gateway is down."""
    from slurm_triage.sinks import state

    conf = tmp_path / "config.toml"
    conf.write_text(f'[node]\nstate_dir = "{tmp_path}/{{node}}/state"\n')
    for n in NODES:
        node_cfg = cfg_for("", f"{tmp_path}/{n}/state")
        snap = snapshot(n, power_limit=450.0 if n == "node2" else 700.0)
        state.save(node_cfg, "47", "prolog", {"job_id": "47", "node": n, "verdict": "OK", "findings": [],
                                              "peer": peer_figures(snap), "snapshot": snap})
    cfg = load(str(conf))
    cfg.values["pushgateway"]["url"] = f"http://127.0.0.1:{free_port()}"
    d = gate.gather(cfg, "47", NODES, Policy(deadline_seconds=0.5))
    assert d.source == "state"
    assert [(r.node, r.reason) for r in d.rows] == [("node2", "power limit 450 W, peers 700 W")]


@pytest.mark.skipif("gate" not in SCHEMA, reason="config.SCHEMA has no [gate] section yet (lead: add the keys)")
def test_gang_check_cli(pushgateway, write_config) -> None:
    for n in NODES[:3]:
        push_prolog(pushgateway.url, n, "48", [], snapshot(n))
    conf = write_config(f'[pushgateway]\nurl = "{pushgateway.url}"\n[gate]\ndeadline_seconds = 0.5\n')
    r = cli("--config", str(conf), "gang-check", "--job", "48", "--nodes", "node[1-4]", "--format", "json")
    assert r.returncode == 1, r.stderr
    assert [row["node"] for row in json.loads(r.stdout)["rows"]] == ["node4"]
    r = cli("--config", str(conf), "gang-check", "--job", "48", "--nodes", "node[1-3]")
    assert r.returncode == 0 and "all OK" in r.stderr
