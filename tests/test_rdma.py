"""RDMA collector and rdma.* checks, from the recorded sysfs tree (tests/data/sysfs, see SOURCES.md)."""
from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any, Dict

import pytest

from slurm_triage.checks import rdma as rdma_checks
from slurm_triage.collect import rdma
from slurm_triage.config import Config, defaults
from slurm_triage.model import Verdict

TREE = Path(__file__).resolve().parent / "data" / "sysfs" / "class" / "infiniband"


def cfg(root: Path, expected_rate_gbps: float = 0.0) -> Config:
    values = defaults()
    values["rdma"].update(sysfs_root=str(root), expected_rate_gbps=expected_rate_gbps)
    return Config(values)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A writable copy of the recorded tree, so a test can take a port down or raise a counter."""
    dst = tmp_path / "infiniband"
    shutil.copytree(TREE, dst)
    return dst


def ports(snap: Dict[str, Any]) -> Dict[Any, Dict[str, Any]]:
    return {(p["device"], p["port"]): p for p in snap["ports"]}


def test_collect_recorded_tree():
    snap = rdma.collect(cfg(TREE))
    got = ports(snap)
    assert sorted(got) == [("i40iw0", 1), ("mlx4_0", 1), ("mlx4_0", 2), ("mlx5_0", 1)]
    p = got[("mlx4_0", 1)]
    assert (p["state"], p["phys_state"], p["rate_gbps"], p["link_layer"]) == ("ACTIVE", "LinkUp", 40.0, "InfiniBand")
    assert p["counters"]["port_xmit_discards"] == 5 and p["counters"]["port_xmit_wait"] == 4294967295
    assert p["hw_counters"] == {}
    assert got[("i40iw0", 1)]["counters"] == {}  # every value is "N/A (no PMA)"
    assert got[("i40iw0", 1)]["rate_gbps"] == 10.0
    m = got[("mlx5_0", 1)]
    assert m["rate_gbps"] == 200.0 and m["rate"] == "200 Gb/sec (4X HDR)"
    assert m["hw_counters"]["local_ack_timeout_err"] == 0 and "out_of_sequence" in m["hw_counters"]


def test_missing_root_gives_no_ports(tmp_path: Path):
    assert rdma.collect(cfg(tmp_path / "absent")) == {"ports": []}


def test_all_up_gives_no_findings():
    snap = rdma.collect(cfg(TREE))
    assert len(snap["ports"]) == 4 and all(p["state"] == "ACTIVE" for p in snap["ports"])
    assert rdma_checks.port({"rdma": snap}, cfg(TREE)) == []
    assert rdma_checks.errors({"rdma": snap}, cfg(TREE)) == []


def test_port_down_fails_hardware_and_slow_port_warns(tree: Path):
    (tree / "mlx5_0/ports/1/state").write_text("1: DOWN\n")
    (tree / "mlx5_0/ports/1/phys_state").write_text("2: Polling\n")
    (tree / "mlx4_0/ports/2/phys_state").write_text("3: Disabled\n")  # admin-disabled: not judged
    (tree / "mlx4_0/ports/2/state").write_text("1: DOWN\n")
    c = cfg(tree, expected_rate_gbps=40.0)
    out = rdma_checks.port({"rdma": rdma.collect(c)}, c)
    by = {(f.evidence["device"], f.evidence["port"]): f for f in out}
    assert set(by) == {("mlx5_0", 1), ("i40iw0", 1)}
    down = by[("mlx5_0", 1)]
    assert down.verdict is Verdict.FAIL and down.hardware and "DOWN/Polling" in down.summary
    slow = by[("i40iw0", 1)]
    assert slow.verdict is Verdict.WARN and not slow.hardware and slow.evidence["rate_gbps"] == 10.0


def test_counter_rising_against_baseline(tree: Path):
    c = cfg(tree)
    baseline = rdma.collect(c)
    (tree / "mlx5_0/ports/1/counters/link_downed").write_text("2\n")
    (tree / "mlx5_0/ports/1/hw_counters/local_ack_timeout_err").write_text("57\n")
    (tree / "mlx4_0/ports/1/counters/port_xmit_discards").write_text("6\n")  # +1: below its threshold
    now = rdma.collect(c)
    (f,) = rdma_checks.errors({"rdma": now, "baseline": {"rdma": baseline}}, c)
    assert f.verdict is Verdict.WARN and f.evidence["device"] == "mlx5_0"
    assert f.evidence["rises"] == {"link_downed": 2, "local_ack_timeout_err": 57}
    assert "link_downed +2, local_ack_timeout_err +57 since the baseline" in f.summary
    # A counter reset (driver reload) is a negative delta, never an alarm.
    reset = copy.deepcopy(baseline)
    for p in reset["ports"]:
        if p["device"] == "mlx4_0" and p["port"] == 1:
            p["counters"]["port_xmit_discards"] = 900
    (tree / "mlx5_0/ports/1/counters/link_downed").write_text("0\n")
    (tree / "mlx5_0/ports/1/hw_counters/local_ack_timeout_err").write_text("0\n")
    assert rdma_checks.errors({"rdma": rdma.collect(c), "baseline": {"rdma": reset}}, c) == []


def test_without_baseline_only_absolute_link_errors(tree: Path):
    c = cfg(tree)
    (tree / "mlx4_0/ports/1/counters/link_downed").write_text("3\n")
    (tree / "mlx5_0/ports/1/counters/symbol_error").write_text("99\n")  # below the absolute threshold
    (f,) = rdma_checks.errors({"rdma": rdma.collect(c)}, c)
    assert f.verdict is Verdict.WARN and f.evidence == {"device": "mlx4_0", "port": 1, "values": {"link_downed": 3}}
