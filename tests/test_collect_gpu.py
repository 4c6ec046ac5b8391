"""collect/gpu.py through snapshot.take: the real pynvml in a forked child, bound to the fake."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from conftest import SCENARIOS
from slurm_triage import config, snapshot
from slurm_triage.collect.gpu import CLOCK_EVENT_REASONS, GPU_KEYS, decode_clock_events


@pytest.fixture
def gpu_snapshot(fakenvml_lib, monkeypatch):
    """Call with a scenario path (and options); returns (snapshot, config)."""

    def take(scenario: Path, deadline: float = 5.0, **options):
        monkeypatch.setenv("FAKENVML_SCENARIO", str(scenario))  # putenv: the fake's getenv sees it
        cfg = config.Config(config.defaults())
        cfg.values["gpu"].update(nvml_library=str(fakenvml_lib), deadline_seconds=deadline)
        return snapshot.take(cfg, ["gpu"], {"gpu": options}), cfg

    return take


def test_idle_h100_facts_match_the_scenario(gpu_snapshot, fakenvml_lib):
    snap, _ = gpu_snapshot(SCENARIOS / "h100x8-idle.json")
    scn = json.loads((SCENARIOS / "h100x8-idle.json").read_text())
    gpu = snap["gpu"]
    assert snap["errors"] == {}
    assert (gpu["driver_version"], gpu["nvml_version"], gpu["count"]) == ("580.105.08", "13.580.105.08", 8)
    assert gpu["library"] == str(fakenvml_lib)
    g = gpu["gpus"][0]
    assert set(GPU_KEYS) | {"lost", "unsupported", "errors"} == set(g)
    assert g["uuid"] == scn["gpus"][0]["uuid"] and g["pci_bus_id"] == "0000:18:00.0"
    assert g["pci_device_id"] == 0x233010DE and g["name"] == "NVIDIA H100 80GB HBM3"
    assert g["power_watts"] == pytest.approx(68.57) and g["power_limit_watts"] == 700.0
    assert (g["temperature_celsius"], g["slowdown_temp_celsius"], g["shutdown_temp_celsius"]) == (29, 89, 95)
    assert g["mem_total_bytes"] == 81559 << 20 and g["mem_used_bytes"] == 0  # v2: reserved not counted
    assert (g["sm_clock_mhz"], g["sm_clock_max_mhz"]) == (345, 1980)
    assert g["clock_event_reasons"] == 1 and g["clock_event_names"] == ["gpu_idle"]
    assert (g["pcie_gen"], g["pcie_width"], g["persistence_mode"], g["lost"]) == (5, 16, True, False)
    assert len(g["nvlink"]) == 18 and all(link["active"] for link in g["nvlink"])
    # retired pages are N/A on Hopper: NOT_SUPPORTED -> None and named, not an error
    assert g["retired_pages_pending"] is None and g["unsupported"] == ["retired_pages_pending"]
    assert g["errors"] == {}


def test_indices_restrict_to_the_jobs_gpus(gpu_snapshot):
    snap, _ = gpu_snapshot(SCENARIOS / "h100x8-busy.json", indices=[5, 1, 42])
    gpu = snap["gpu"]
    assert gpu["count"] == 8 and [g["index"] for g in gpu["gpus"]] == [1, 5]
    assert gpu["gpus"][1]["processes"] == [{"pid": 412305, "used_bytes": 74880 << 20}]


def test_lost_gpu_is_marked_and_others_still_read(gpu_snapshot):
    snap, _ = gpu_snapshot(SCENARIOS / "h100x8-xid79.json")
    gpus = snap["gpu"]["gpus"]
    assert gpus[3]["lost"] is True and gpus[3]["errors"] == {"handle": "NVML_ERROR_GPU_IS_LOST"}
    assert [g["lost"] for g in gpus].count(True) == 1
    assert gpus[4]["pci_bus_id"] == "0000:9a:00.0" and gpus[4]["power_watts"] is not None


def test_per_call_error_is_recorded_by_field(gpu_snapshot, tmp_path):
    scn = tmp_path / "s.json"
    scn.write_text(json.dumps({"gpus": [{"fail": {"nvmlDeviceGetPowerUsage": 999,
                                                  "nvmlDeviceGetTotalEccErrors": 15}}]}))
    g = gpu_snapshot(scn)[0]["gpu"]["gpus"][0]
    assert g["power_watts"] is None
    assert g["errors"] == {"power_watts": "NVML_ERROR_UNKNOWN", "ecc_uncorrected_volatile": "NVML_ERROR_GPU_IS_LOST"}
    assert g["lost"] is True and g["processes"] is None  # nothing more is asked of a lost GPU
    assert g["temperature_celsius"] == 0  # fields read before the loss are kept


def test_hung_nvml_call_is_killed_at_the_deadline(gpu_snapshot):
    t0 = time.monotonic()
    snap, _ = gpu_snapshot(SCENARIOS / "h100x8-nvml-hang.json", deadline=1.0)
    took = time.monotonic() - t0
    assert snap["gpu"] is None and "timed out" in snap["errors"]["gpu"]
    assert took < 1.0 + 0.5, took


def test_clock_event_bits_match_pynvml():
    import pynvml

    names = {"gpu_idle": "nvmlClocksEventReasonGpuIdle", "sw_power_cap": "nvmlClocksEventReasonSwPowerCap",
             "hw_slowdown": "nvmlClocksEventReasonHwSlowdown",
             "hw_thermal_slowdown": "nvmlClocksEventReasonHwThermalSlowdown",
             "hw_power_brake_slowdown": "nvmlClocksEventReasonHwPowerBrakeSlowdown",
             "sw_thermal_slowdown": "nvmlClocksEventReasonSwThermalSlowdown",
             "sync_boost": "nvmlClocksEventReasonSyncBoost",
             "applications_clocks_setting": "nvmlClocksEventReasonApplicationsClocksSetting",
             "display_clock_setting": "nvmlClocksEventReasonDisplayClockSetting"}
    table = dict((n, b) for b, n in CLOCK_EVENT_REASONS)
    for ours, theirs in names.items():
        assert table[ours] == getattr(pynvml, theirs), ours
    assert decode_clock_events(0x48) == ["hw_slowdown", "hw_thermal_slowdown"]
    # nebius npd check_gpu_throttle.sh used 0x4 for HW thermal: that bit is the SW power cap
    assert decode_clock_events(0x4) == ["sw_power_cap"]


def test_recovery_action_field_is_read_and_unsupported_is_named(gpu_snapshot, tmp_path):
    """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION through nvmlDeviceGetFieldValues (issue 13): the
    value where the driver answers it, "unsupported" (not an error) where it does not."""
    scn = json.loads((SCENARIOS / "h100x8-idle.json").read_text())
    scn["gpus"][2]["recovery_action"] = 2
    scn["gpus"][3]["recovery_action"] = -1  # an older driver: the field is not supported
    path = tmp_path / "recovery.json"
    path.write_text(json.dumps(scn))
    snap, _ = gpu_snapshot(path)
    gpus = snap["gpu"]["gpus"]
    assert [g["recovery_action"] for g in gpus] == [0, 0, 2, None, 0, 0, 0, 0]
    assert "recovery_action" in gpus[3]["unsupported"] and gpus[3]["errors"] == {}
