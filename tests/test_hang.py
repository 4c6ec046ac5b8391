"""Pure detectors of hang.py over series built from the real fake-NVML scenario values."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from slurm_triage.step import hang
from slurm_triage.collect.gpu import decode_clock_events

SCENARIOS = Path(__file__).resolve().parent / "fakenvml" / "scenarios"


def gpus_of(name: str) -> List[Dict[str, Any]]:
    """The scenario's GPUs as the watcher's compact samples carry them (NVML units converted)."""
    sc = json.loads((SCENARIOS / f"{name}.json").read_text())
    d = sc["defaults"]
    out = []
    for g in sc["gpus"]:
        v = {**d, **g}
        out.append({"uuid": v["uuid"], "minor": v["minor"], "util_gpu_percent": v["util_gpu"],
                    "power_watts": v["power_mw"] / 1000.0, "power_limit_watts": v["power_limit_mw"] / 1000.0,
                    "temperature_celsius": v["temp"], "slowdown_temp_celsius": v["temp_slowdown"],
                    "sm_clock_mhz": v["clock_sm"], "sm_clock_max_mhz": v["max_clock_sm"],
                    "clock_event_names": decode_clock_events(v["event_reasons"]), "lost": False})
    return out


def series(name: str, n: int, interval: float = 5.0,
           edit: Optional[Callable[[int, List[Dict[str, Any]]], None]] = None) -> List[Dict[str, Any]]:
    out = []
    for i in range(n):
        gpus = [dict(g) for g in gpus_of(name)]
        if edit:
            edit(i, gpus)
        out.append({"t": 1700000000.0 + i * interval, "gpus": gpus, "threads": None})
    return out


def test_nccl_hang_scenario_is_flagged_once_it_lasts_the_window():
    s = series("h100x8-nccl-hang", 13)  # 60 s at 5 s
    ep = hang.power_axiom_hang(s, 60.0)
    assert ep is not None
    assert len(ep["gpus"]) == 8 and ep["gpu_count"] == 8
    assert ep["seconds"] == 60.0 and ep["since"] == s[0]["t"]
    assert all(90 <= w <= 110 for w in ep["power_watts"].values())
    assert hang.power_axiom_hang(s[1:], 60.0) is None  # 55 s: not yet


def test_busy_training_is_not_a_hang():
    assert hang.power_axiom_hang(series("h100x8-busy", 30), 60.0) is None
    assert hang.power_axiom_hang(series("h100x8-thermal", 30), 60.0) is None


def test_power_recovering_inside_the_window_restarts_the_clock():
    def recover(i: int, gpus: List[Dict[str, Any]]) -> None:
        if i == 5:
            gpus[0]["power_watts"] = 652.0  # one healthy iteration on one GPU

    s = series("h100x8-nccl-hang", 13, edit=recover)
    assert hang.power_axiom_hang(s, 60.0) is None
    assert hang.power_axiom_hang(s, 30.0) is not None  # samples 6..12 span 30 s
    assert hang.power_axiom_hang(s, 31.0) is None


def test_gpu_fraction_covers_the_stuck_culprit_at_zero_util():
    # huggingface/m4-logs tr_141-hanging: 7 GPUs spin at 100 %, the culprit's GPU sits at 0 %.
    def culprit(i: int, gpus: List[Dict[str, Any]]) -> None:
        gpus[2].update(util_gpu_percent=0, power_watts=68.0)

    s = series("h100x8-nccl-hang", 13, edit=culprit)
    assert hang.power_axiom_hang(s, 60.0, gpu_fraction=1.0) is None
    ep = hang.power_axiom_hang(s, 60.0, gpu_fraction=0.85)
    assert ep is not None and len(ep["gpus"]) == 7 and gpus_of("h100x8-nccl-hang")[2]["uuid"] not in ep["gpus"]


def test_missing_readings_break_the_run_and_lost_gpus_are_ignored():
    s = series("h100x8-nccl-hang", 13)
    s[6]["gpus"] = None  # NVML probe timed out in that interval
    assert hang.power_axiom_hang(s, 60.0) is None

    def lose(i: int, gpus: List[Dict[str, Any]]) -> None:
        gpus[7].update(lost=True, power_watts=None)

    ep = hang.power_axiom_hang(series("h100x8-nccl-hang", 13, edit=lose), 60.0)
    assert ep is not None and ep["gpu_count"] == 7


def test_thresholds_are_parameters():
    s = series("h100x8-nccl-hang", 13)
    assert hang.power_axiom_hang(s, 60.0, power_ratio=0.1) is None  # 96-110 W > 70 W
    assert hang.power_axiom_hang(s, 60.0, util_percent=100.5) is None


def test_thermal_straggler_is_the_hot_gpu_only():
    g = gpus_of("h100x8-thermal")
    out = hang.stragglers(series("h100x8-thermal", 13), 60.0, margin_celsius=5.0)
    assert list(out) == [g[5]["uuid"]]
    assert out[g[5]["uuid"]]["reasons"] == ["hw_slowdown", "hw_thermal_slowdown", "temperature_near_slowdown"]
    assert out[g[5]["uuid"]]["temperature_celsius_max"] == 91 and out[g[5]["uuid"]]["share"] == 1.0
    assert hang.stragglers(series("h100x8-busy", 13), 60.0, margin_celsius=5.0) == {}
    assert hang.stragglers(series("h100x8-thermal", 5), 60.0, margin_celsius=5.0) == {}  # too short


def test_straggler_needs_most_of_the_window_and_honours_the_margin():
    def hot_sometimes(i: int, gpus: List[Dict[str, Any]]) -> None:
        if i % 3 == 0:
            gpus[1]["temperature_celsius"] = 86  # within 5 C of the 89 C slowdown

    s = series("h100x8-busy", 13, edit=hot_sometimes)
    assert hang.stragglers(s, 60.0, margin_celsius=5.0) == {}  # 5 of 13 samples
    assert list(hang.stragglers(s, 60.0, margin_celsius=5.0, share=0.3)) == [gpus_of("h100x8-busy")[1]["uuid"]]
    assert hang.stragglers(s, 60.0, margin_celsius=2.0, share=0.3) == {}


def _threads(counts: List[int]) -> List[Dict[str, Any]]:
    return [{"t": 1700000000.0 + 5 * i, "gpus": [], "threads": c} for i, c in enumerate(counts)]


def test_thread_growth():
    leak = hang.thread_growth(_threads([100, 120, 150, 150, 190, 240]), 25.0, threshold=64)
    assert leak == {"from": 100, "to": 240, "growth": 140, "seconds": 25.0}
    assert hang.thread_growth(_threads([100, 120, 150, 140, 190, 240]), 25.0, 64) is None  # fell once
    assert hang.thread_growth(_threads([100, 110, 120, 130, 140, 150]), 25.0, 64) is None  # below threshold
    assert hang.thread_growth(_threads([100, 200, 300]), 25.0, 64) is None  # window not covered yet
    assert hang.thread_growth(_threads([900, 100, 120, 150, 190, 240, 260]), 25.0, 64) is not None  # old dip ignored
