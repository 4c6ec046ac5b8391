"""`slurm-triage check` end to end: a fresh interpreter, the real pynvml on the fake NVML,
real processes, a real Pushgateway. These are the acceptance checks of the foundation."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Dict, Optional

import pytest

from conftest import ROOT, SCENARIOS, cli

sys.path.insert(0, str(ROOT / "bench"))
from procs_fixture import JobProcess  # noqa: E402

GPU3 = "GPU-0dbc98d5-f864-2c28-5be9-e56faf4ee96b"
GPU5 = "GPU-5291fbdf-f219-fa52-b105-db419085eaf2"


def _config(tmp_path: Path, lib: Path, extra: str = "", gpu_deadline: float = 10.0) -> Path:
    """A generous NVML deadline, so that a loaded CI machine does not turn OK into UNKNOWN."""
    p = tmp_path / "c.toml"
    p.write_text(f'[node]\nstate_dir = "{tmp_path}/state"\nspool_dir = "{tmp_path}/spool"\n'
                 f'[gpu]\nnvml_library = "{lib}"\ndeadline_seconds = {gpu_deadline}\n'
                 f'[kernel]\nsource = "file"\npath = "{tmp_path}/kernel.log"\n' + extra)
    (tmp_path / "kernel.log").touch()
    return p


def _check(cfg: Path, scenario: str, *more: str, env: Optional[Dict[str, str]] = None):
    r = cli("--config", str(cfg), "check", "--format", "json", *more,
            env={"FAKENVML_SCENARIO": str(SCENARIOS / scenario), **(env or {})})
    assert r.returncode in (0, 1), r.stderr
    return r, json.loads(r.stdout)


def _bad(report):
    return [f for f in report["findings"] if f["verdict"] in ("WARN", "FAIL")]


@pytest.mark.parametrize("scenario", ["h100x8-idle.json", "h100x8-busy.json", "h200x8-idle.json",
                                      "a100x8-idle.json"])
def test_healthy_scenarios_are_ok(tmp_path, fakenvml_lib, scenario):
    r, rep = _check(_config(tmp_path, fakenvml_lib), scenario)
    assert r.returncode == 0 and rep["verdict"] == "OK", _bad(rep)
    assert rep["schema"] == 1 and len(rep["snapshot"]["gpu"]["gpus"]) == 8
    g = rep["snapshot"]["gpu"]["gpus"][0]
    assert {"index", "uuid", "pci_bus_id", "minor", "temperature_celsius", "power_watts"} <= set(g)


def test_xid79_fails_on_gpu3_naming_xid79(tmp_path, fakenvml_lib):
    cfg = _config(tmp_path, fakenvml_lib)
    (tmp_path / "kernel.log").write_bytes((SCENARIOS / "h100x8-xid79.kmsg").read_bytes())
    r, rep = _check(cfg, "h100x8-xid79.json")
    assert r.returncode == 1 and rep["verdict"] == "FAIL"
    on_gpu3 = [f for f in rep["findings"] if f["verdict"] == "FAIL" and f["gpu"] == GPU3]
    assert any("Xid 79" in f["summary"] for f in on_gpu3), rep["findings"]
    assert all(f["hardware"] for f in on_gpu3)


def test_lost_gpu_is_named_from_the_last_inventory_without_a_kernel_log(tmp_path, fakenvml_lib):
    cfg = _config(tmp_path, fakenvml_lib)
    _check(cfg, "h100x8-idle.json")  # an earlier healthy run on this node records the identities
    r, rep = _check(cfg, "h100x8-xid79.json")
    lost = [f for f in rep["findings"] if f["id"] == "gpu.lost"]
    assert r.returncode == 1 and len(lost) == 1 and lost[0]["gpu"] == GPU3
    assert "Xid 79" in lost[0]["summary"]


def test_thermal_names_gpu5_slowdown(tmp_path, fakenvml_lib):
    r, rep = _check(_config(tmp_path, fakenvml_lib), "h100x8-thermal.json")
    hot = [f for f in _bad(rep) if f["gpu"] == GPU5]
    assert hot and any("slowdown" in f["summary"].lower() for f in hot)


def test_row_remap_failure_fails(tmp_path, fakenvml_lib):
    r, rep = _check(_config(tmp_path, fakenvml_lib), "h100x8-row-remap-failure.json")
    assert r.returncode == 1 and any(f["id"] == "gpu.row_remap" and f["verdict"] == "FAIL" for f in rep["findings"])


def test_nvml_hang_is_unknown_within_the_deadline(tmp_path, fakenvml_lib):
    t0 = time.monotonic()
    r, rep = _check(_config(tmp_path, fakenvml_lib, gpu_deadline=2.0), "h100x8-nvml-hang.json")
    elapsed = time.monotonic() - t0
    assert r.returncode == 0 and rep["verdict"] == "UNKNOWN"
    assert "timed out" in rep["snapshot"]["errors"]["gpu"]
    assert elapsed < 2.0 + 4.0, elapsed  # the deadline + interpreter start, other probes, a loaded CI box


def test_leftover_listener_and_shm_of_a_dead_job_are_reported_with_pid(tmp_path, fakenvml_lib):
    shm = f"/dev/shm/nccl-test-{uuid.uuid4().hex[:8]}"
    with JobProcess("990001", ipc_path=shm) as rank:
        r, rep = _check(_config(tmp_path, fakenvml_lib), "h100x8-idle.json")
    mine = [f for f in rep["findings"] if f.get("pid") == rank.pid]
    assert mine and all(f["verdict"] in ("WARN", "FAIL") for f in mine), rep["findings"]
    text = json.dumps(mine)
    assert "990001" in text and str(rank.port) in text
    assert any(shm in json.dumps(f) for f in rep["findings"])


def test_planted_symlink_in_dev_shm_is_never_followed(tmp_path, fakenvml_lib):
    target = tmp_path / "secret"
    target.write_text("x" * 4096)
    os.chmod(target, 0o600)
    before = os.stat(target)
    link = f"/dev/shm/nccl-evil-{uuid.uuid4().hex[:8]}"
    os.symlink(target, link)
    try:
        r, rep = _check(_config(tmp_path, fakenvml_lib), "h100x8-idle.json")
    finally:
        os.unlink(link)
    entry = [f for f in rep["snapshot"]["procs"]["ipc_files"] if f["path"] == link]
    assert entry and entry[0]["symlink"] is True and entry[0]["size_bytes"] != 4096
    assert os.stat(target).st_atime == before.st_atime and target.read_text() == "x" * 4096


def test_pushgateway_down_costs_at_most_the_timeout_then_the_spool_delivers(tmp_path, fakenvml_lib, pushgateway):
    cfg = _config(tmp_path, fakenvml_lib,
                  f'[pushgateway]\nurl = "{pushgateway.url}"\ntimeout_seconds = 1.0\nretries = 1\n')
    pushgateway.stop()
    t0 = time.monotonic()
    r, rep = _check(cfg, "h100x8-idle.json", "--push")
    down = time.monotonic() - t0
    assert r.returncode == 0 and "not delivered" in rep["delivery"]
    assert len(list((tmp_path / "spool").glob("*"))) >= 1
    t0 = time.monotonic()
    _check(cfg, "h100x8-idle.json")
    no_push = time.monotonic() - t0
    assert down < no_push + 2 * 1.0 + 0.5, (down, no_push)  # timeout × (retries + 1), plus slack
    pushgateway.start()
    r, rep = _check(cfg, "h100x8-idle.json", "--push")
    # the spooled PUT of this node's group is superseded by the new one: sent once, spool empty
    assert rep["delivery"].startswith("delivered") and "1 sent" in rep["delivery"], rep["delivery"]
    assert list((tmp_path / "spool").glob("*.json")) == []
    groups = [g for g in pushgateway.groups() if g["labels"].get("job") == "slurm_triage"]
    assert len(groups) == 1 and "slurm_triage_node_verdict" in groups[0]


def test_json_reports_nvml_init_seconds_and_null_when_nvml_hangs(tmp_path, fakenvml_lib):
    _, rep = _check(_config(tmp_path, fakenvml_lib), "h100x8-idle.json")
    assert 0 <= rep["nvml_init_seconds"] < 5 and rep["snapshot"]["gpu"]["nvml_init_seconds"] == rep["nvml_init_seconds"]
    hung = tmp_path / "hung"
    hung.mkdir()
    _, rep = _check(_config(hung, fakenvml_lib, gpu_deadline=1.0), "h100x8-nvml-hang.json")
    assert rep["nvml_init_seconds"] is None


def test_a_core_command_does_not_import_the_other_layers():
    """Registering gate, triage and mcp only to list them cost every `check` ~20 ms."""
    code = ("import sys; from slurm_triage import cli; cli.build_parser('check'); "
            "print(sorted(m for m in ('slurm_triage.step.gate', 'slurm_triage.triage.cli', 'slurm_triage.mcp.cli') "
            "if m in sys.modules)); cli.build_parser(None); "
            "print('slurm_triage.step.gate' in sys.modules and 'slurm_triage.triage.cli' in sys.modules)")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=str(ROOT)).stdout.split("\n")
    assert out[:2] == ["[]", "True"], out
