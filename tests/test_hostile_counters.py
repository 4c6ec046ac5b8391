"""Counters that go backwards between the Prolog and the Epilog (issue 13, break 16): a driver
reload or GPU reset restarts NVML's energy and volatile ECC counters; the job summary says
"counter reset" and gives no figure, never a negative one."""
from __future__ import annotations

from slurm_triage.hooks.epilog import gpu_diff

U = "GPU-4893667d-2f62-f00c-9a99-8376e18479cf"


def gpu(**kw):
    return {"gpus": [{"uuid": U, "index": 0, "temperature_celsius": 40, **kw}]}


def test_energy_counter_that_fell_is_a_reset_not_a_negative_figure():
    d = gpu_diff(gpu(energy_joules=1_340_341.8, ecc_uncorrected_volatile=3, ecc_uncorrected_aggregate=9),
                 gpu(energy_joules=140_964.9, ecc_uncorrected_volatile=0, ecc_uncorrected_aggregate=9), [U])[U]
    assert d["energy_joules"] is None and d["ecc_uncorrected_volatile_delta"] is None
    assert d["counter_reset"] == ["energy_joules", "ecc_uncorrected_volatile"]
    assert d["ecc_uncorrected_aggregate_delta"] == 0


def test_counters_that_grew_give_their_figure_and_no_reset():
    d = gpu_diff(gpu(energy_joules=100.0, ecc_uncorrected_volatile=0), gpu(energy_joules=350.5,
                                                                          ecc_uncorrected_volatile=2), [U])[U]
    assert d["energy_joules"] == 250.5 and d["ecc_uncorrected_volatile_delta"] == 2 and "counter_reset" not in d
