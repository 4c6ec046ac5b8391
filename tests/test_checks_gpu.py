"""GPU checks: every scenario end to end (real pynvml + fake), then edge cases from those facts."""
from __future__ import annotations

import copy
import json
import time

import pytest

from conftest import SCENARIOS
from slurm_triage import config, snapshot
from slurm_triage.checks import gpu as gpu_checks
from slurm_triage.checks import REGISTRY, run_checks
from slurm_triage.model import Verdict


def make_cfg(lib, **gpu):
    cfg = config.Config(config.defaults())
    cfg.values["gpu"].update(dict(dict(nvml_library=str(lib), deadline_seconds=1.0, expected_count=8), **gpu))
    return cfg


@pytest.fixture
def judge(fakenvml_lib, monkeypatch):
    """Scenario name -> (findings from gpu checks only, snapshot)."""

    def run(name):
        monkeypatch.setenv("FAKENVML_SCENARIO", str(SCENARIOS / f"{name}.json"))
        cfg = make_cfg(fakenvml_lib)
        snap = snapshot.take(cfg, ["gpu"])
        return [f for f in run_checks(snap, cfg) if f.id.startswith(("gpu.", "probe."))], snap

    return run


def uuid_of(name, index):
    return json.loads((SCENARIOS / f"{name}.json").read_text())["gpus"][index]["uuid"]


@pytest.mark.parametrize("name", ["h100x8-idle", "h100x8-busy", "h200x8-idle", "a100x8-idle", "h100x8-nccl-hang"])
def test_healthy_nodes_have_no_gpu_findings(judge, name):
    findings, snap = judge(name)
    assert snap["gpu"]["count"] == 8
    assert findings == []  # the NCCL hang is a job problem, not a node fault: no node check fires


def test_xid79_lost_gpu_fails_as_hardware(judge):
    findings, _ = judge("h100x8-xid79")
    (f,) = findings
    assert (f.id, f.verdict, f.hardware) == ("gpu.lost", Verdict.FAIL, True)
    assert f.evidence["index"] == 3 and "GPU 3" in f.summary and "Xid 79" in f.action
    assert f.gpu is None  # NVML cannot name a lost GPU; the kernel log's "GPU at PCI:..." line can


def test_thermal_gpu5_fails_naming_slowdown(judge):
    findings, snap = judge("h100x8-thermal")
    gpu5 = uuid_of("h100x8-thermal", 5)
    assert {f.gpu for f in findings} == {gpu5}
    temp = next(f for f in findings if f.id == "gpu.temperature")
    assert temp.verdict == Verdict.FAIL and temp.hardware
    assert (temp.evidence["temp_celsius"], temp.evidence["slowdown_celsius"]) == (91, 89)
    assert temp.evidence["seen_at"] == snap["time"]
    assert "slowdown" in temp.summary and "HW thermal slowdown" in temp.summary
    throttle = next(f for f in findings if f.id == "gpu.throttle")
    assert throttle.verdict == Verdict.WARN and "HW slowdown" in throttle.summary


def test_row_remap_failure_fails(judge):
    findings, _ = judge("h100x8-row-remap-failure")
    remap = [f for f in findings if f.id == "gpu.row_remap"]
    assert [(f.verdict, f.gpu, f.hardware) for f in remap] == [(Verdict.FAIL, uuid_of("h100x8-row-remap-failure", 6), True)]


def test_nvml_hang_is_unknown_within_the_deadline(judge):
    t0 = time.monotonic()
    findings, snap = judge("h100x8-nvml-hang")
    assert time.monotonic() - t0 < 1.0 + 0.5
    assert snap["gpu"] is None and "timed out" in snap["errors"]["gpu"]
    assert [(f.id, f.verdict) for f in findings] == [("probe.gpu", Verdict.UNKNOWN)]


# ---- edge cases, from facts recorded through the fake ----------------------------------

@pytest.fixture(scope="module")
def idle_facts(fakenvml_lib):
    mp = pytest.MonkeyPatch()
    mp.setenv("FAKENVML_SCENARIO", str(SCENARIOS / "h100x8-idle.json"))
    try:
        return snapshot.take(make_cfg(fakenvml_lib), ["gpu"])
    finally:
        mp.undo()


def edit(facts, index=0, **values):
    facts = copy.deepcopy(facts)
    facts["gpu"]["gpus"][index].update(values)
    return facts


def test_temperature_near_own_threshold_warns(idle_facts, fakenvml_lib):
    cfg = make_cfg(fakenvml_lib, temperature_margin_celsius=5.0)
    assert gpu_checks.gpu_temperature(edit(idle_facts, temperature_celsius=83), cfg) == []
    (f,) = gpu_checks.gpu_temperature(edit(idle_facts, temperature_celsius=84), cfg)
    assert f.verdict == Verdict.WARN and not f.hardware
    # a GPU whose own threshold is higher is judged by that threshold, not a fixed number
    assert gpu_checks.gpu_temperature(edit(idle_facts, temperature_celsius=91, slowdown_temp_celsius=100), cfg) == []
    # at slowdown but no HW slowdown reported: WARN, not a drain
    (f,) = gpu_checks.gpu_temperature(edit(idle_facts, temperature_celsius=90), cfg)
    assert f.verdict == Verdict.WARN
    # threshold NOT_SUPPORTED: nothing to compare against
    assert gpu_checks.gpu_temperature(edit(idle_facts, temperature_celsius=99, slowdown_temp_celsius=None), cfg) == []


def test_pcie_gen_downshift_only_counts_when_busy(idle_facts, fakenvml_lib):
    cfg = make_cfg(fakenvml_lib)
    assert gpu_checks.gpu_pcie(edit(idle_facts, pcie_gen=1, util_gpu_percent=0), cfg) == []
    (f,) = gpu_checks.gpu_pcie(edit(idle_facts, pcie_gen=3, util_gpu_percent=100), cfg)
    assert f.verdict == Verdict.WARN and f.evidence["pcie_gen"] == 3
    (f,) = gpu_checks.gpu_pcie(edit(idle_facts, pcie_width=8), cfg)
    assert "x8" in f.summary and "x16" in f.summary


def test_ecc_remap_pending_throttle_and_count(idle_facts, fakenvml_lib):
    cfg = make_cfg(fakenvml_lib)
    (f,) = gpu_checks.gpu_ecc(edit(idle_facts, ecc_uncorrected_volatile=2, ecc_uncorrected_aggregate=2), cfg)
    assert f.verdict == Verdict.FAIL and f.hardware
    (f,) = gpu_checks.gpu_row_remap(edit(idle_facts, remap_pending=True), cfg)
    assert f.verdict == Verdict.WARN and "reset the GPU" in f.action
    assert gpu_checks.gpu_throttle(edit(idle_facts, clock_event_names=["gpu_idle", "sw_power_cap"]), cfg) == []
    (f,) = gpu_checks.gpu_throttle(edit(idle_facts, clock_event_names=["hw_power_brake_slowdown"]), cfg)
    assert "HW power brake" in f.summary
    short = copy.deepcopy(idle_facts)
    short["gpu"]["count"] = 7
    (f,) = gpu_checks.gpu_count(short, cfg)
    assert (f.verdict, f.hardware, f.evidence["expected_count"]) == (Verdict.FAIL, True, 8)
    assert gpu_checks.gpu_count(short, make_cfg(fakenvml_lib, expected_count=-1)) == []


def test_partial_gpu_facts_never_raise_and_still_name_the_lost_gpu():
    """Facts can be partial (a lost GPU known only by index/UUID, a section without "gpus"):
    every GPU check reads them with .get and still reports what they do show."""
    cfg = config.Config(config.defaults())
    cfg.values["gpu"]["expected_count"] = 8
    checks = [s.fn for s in REGISTRY.values() if s.fn.__module__ == gpu_checks.__name__]
    assert len(checks) == 8

    def judged(gpu):
        return [(f.id, f.verdict, f.gpu, f.summary) for fn in checks for f in fn({"time": 1.0, "gpu": gpu}, cfg)]

    (lost,) = judged({"count": 8, "gpus": [{"index": 3, "uuid": "GPU-x", "lost": True}]})
    assert lost[:3] == ("gpu.lost", Verdict.FAIL, "GPU-x") and lost[3].startswith("GPU 3 (GPU-x) is lost")
    (unindexed,) = judged({"count": 8, "gpus": [{"uuid": "GPU-y", "lost": True}]})
    assert unindexed[:3] == ("gpu.lost", Verdict.FAIL, "GPU-y") and unindexed[3].startswith("GPU (GPU-y) is lost")
    assert [x[:2] for x in judged({"count": 7})] == [("gpu.count", Verdict.FAIL)]
    assert judged({}) == [] and judged({"gpus": [{}]}) == [] and judged({"gpus": None}) == []


def test_recovery_action_from_nvml_fails_only_for_node_level_actions():
    from slurm_triage.checks.gpu import gpu_recovery_action

    gpus = [{"index": i, "uuid": f"GPU-{i}", "pci_bus_id": f"0000:{i:02x}:00.0", "recovery_action": a}
            for i, a in enumerate((None, 0, 1, 2, 5, 42))]
    out = {f.gpu: f for f in gpu_recovery_action({"gpu": {"gpus": gpus}, "time": 1.0}, None)}
    assert set(out) == {"GPU-2", "GPU-3", "GPU-4", "GPU-5"}
    assert out["GPU-2"].verdict.value == "FAIL" and out["GPU-2"].hardware and "GPU reset" in out["GPU-2"].summary
    assert out["GPU-3"].hardware and "node reboot" in out["GPU-3"].summary
    assert not out["GPU-4"].hardware and out["GPU-4"].verdict.value == "WARN"  # IMEX domain: not this node
    assert not out["GPU-5"].hardware and "unknown" in out["GPU-5"].summary
