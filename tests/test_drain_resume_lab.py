"""Issue 11 on the lab: `node resume NODE` run from the host (not NODE) decides on NODE's
own fresh pushed check result, never on the checks of the machine it runs on."""
from __future__ import annotations

import time

import requests

import lab as labmod
from test_hooks_lab import push_check

CLI = [str(labmod.ROOT / ".venv/bin/slurm-triage"), "node", "resume"]


def resume(lab: labmod.Lab, node: str):
    return lab.run(*CLI, node, user=None, extra_env={"SLURM_TRIAGE_CONFIG": str(lab.triage_config)})


def forget_results(lab: labmod.Lab, node: str) -> None:
    """Delete every group NODE pushed, so only what the test pushes is evidence."""
    from slurm_triage.sinks.pushgateway import delete

    for g in requests.get(lab.pushgateway_url + "/api/v1/metrics", timeout=5).json()["data"]:
        if g["labels"].get("instance") == node:
            delete(lab.pushgateway_url, g["labels"])


def drain(lab: labmod.Lab, node: str, reason: str) -> None:
    lab.scontrol("update", f"nodename={node}", "state=drain", f"reason={reason}")


def test_resume_from_the_host_needs_a_fresh_result_of_that_node(lab):
    forget_results(lab, "node2")
    drain(lab, "node2", "triage: GPU-0dbc98d5-f864-2c28-5be9-e56faf4ee96b Xid 79: GPU has fallen off the bus")
    r = resume(lab, "node2")
    assert r.returncode == 1 and "no check result of node2" in r.stderr
    assert "Run on node2: slurm-triage check --push" in r.stderr
    assert "DRAIN" in lab.node_state("node2")
    time.sleep(1.1)  # the drain's stamp has one-second resolution
    push_check(lab, "node2")
    r = resume(lab, "node2")
    assert r.returncode == 0, r.stdout + r.stderr
    # the evidence is node2's own GPUs, seen through node2's fake NVML
    assert "node2's own check result pushed from node2" in r.stdout and "8 GPUs" in r.stdout, r.stdout
    lab.wait_node("node2", lambda s: "DRAIN" not in s)


def test_a_result_older_than_the_drain_is_refused(lab):
    forget_results(lab, "node3")
    push_check(lab, "node3")
    time.sleep(1.1)
    drain(lab, "node3", "triage: GPU-0dbc98d5 Xid 79: GPU has fallen off the bus")
    r = resume(lab, "node3")
    assert r.returncode == 1 and "not newer than its drain" in r.stderr, r.stderr
    assert "DRAIN" in lab.node_state("node3")


def test_a_foreign_drain_reason_is_untouched_even_with_a_fresh_ok_result(lab):
    drain(lab, "node4", "bad DIMM ticket 4711")
    time.sleep(1.1)
    push_check(lab, "node4")
    r = resume(lab, "node4")
    assert r.returncode == 1 and "not ours" in r.stderr
    assert lab.node_info("node4")["Reason"].startswith("bad DIMM ticket 4711")
