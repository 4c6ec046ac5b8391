"""The fake libnvidia-ml.so.1 driven by the real pynvml, each case in a fresh interpreter
(pynvml binds one library per process for its lifetime)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, Optional

from conftest import SCENARIOS

PROBE = r"""
import ctypes, json, sys
lib = ctypes.CDLL(sys.argv[1])
lib.fakenvml_scenario_path.restype = ctypes.c_char_p
import pynvml
out = {}
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as e:
    print(json.dumps({"init_error": e.value})); sys.exit()
n = pynvml.nvmlDeviceGetCount()
out["scenario"] = lib.fakenvml_scenario_path().decode()
out["driver"] = pynvml.nvmlSystemGetDriverVersion()
out["count"] = n
out["gpus"] = []
for i in range(n):
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
    except pynvml.NVMLError as e:
        out["gpus"].append({"handle_error": e.value}); continue
    g = {"uuid": pynvml.nvmlDeviceGetUUID(h), "bus": pynvml.nvmlDeviceGetPciInfo(h).busId}
    g["bus"] = g["bus"].decode() if isinstance(g["bus"], bytes) else g["bus"]
    for name, fn in [("power", lambda: pynvml.nvmlDeviceGetPowerUsage(h)),
                     ("retired", lambda: pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h))]:
        try:
            g[name] = fn()
        except pynvml.NVMLError as e:
            g[name + "_error"] = e.value
    out["gpus"].append(g)
pynvml.nvmlShutdown()
print(json.dumps(out))
"""


def probe(lib: Path, scenario: Optional[Path], extra: Optional[Dict[str, str]] = None) -> dict:
    env = {"PATH": "/usr/bin:/bin"}  # like a Slurm Prolog: nothing inherited
    if scenario is not None:
        env["FAKENVML_SCENARIO"] = str(scenario)
    env.update(extra or {})
    r = subprocess.run([sys.executable, "-c", PROBE, str(lib)], env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    out["stderr"] = r.stderr
    return out


def test_every_scenario_loads_with_distinct_identities(fakenvml_lib):
    files = sorted(SCENARIOS.glob("*.json"))
    assert len(files) == 9
    for f in files:
        scn = json.loads(f.read_text())
        assert scn["_source"], f
        if "hang" in f.read_text():
            continue  # its power call never returns; test_collect_gpu covers it under a deadline
        out = probe(fakenvml_lib, f)
        assert out["count"] == 8 and out["driver"] == scn["driver_version"], f
        seen = [g for g in out["gpus"] if "uuid" in g]
        assert len({g["uuid"] for g in seen}) == len({g["bus"] for g in seen}) == len(seen)


def test_scenario_found_next_to_the_loaded_path_without_environment(fakenvml_lib, tmp_path):
    """The lab's per-node layout: nodes/node2/nvml/{libnvidia-ml.so.1 -> build lib, scenario.json}."""
    node = tmp_path / "nodes" / "node2" / "nvml"
    node.mkdir(parents=True)
    (node / "libnvidia-ml.so.1").symlink_to(fakenvml_lib)
    (node / "scenario.json").write_text((SCENARIOS / "a100x8-idle.json").read_text())
    out = probe(node / "libnvidia-ml.so.1", None)
    assert out["scenario"] == str(node / "scenario.json")
    assert out["driver"] == "525.60.13"
    assert out["gpus"][0]["bus"] == "00000000:07:00.0"


def test_missing_scenario_is_driver_not_loaded(fakenvml_lib, tmp_path):
    out = probe(fakenvml_lib, tmp_path / "absent.json")
    assert out["init_error"] == 9  # NVML_ERROR_DRIVER_NOT_LOADED


def test_unknown_key_fails_init_loudly(fakenvml_lib, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"gpus": [{"temprature": 30}]}')
    out = probe(fakenvml_lib, bad)
    assert out["init_error"] == 999 and "temprature" in out["stderr"]


def test_injected_errors_lost_gpu_and_not_supported(fakenvml_lib, tmp_path):
    scn = tmp_path / "s.json"
    scn.write_text(json.dumps({"defaults": {"power_mw": 68570}, "gpus": [
        {"fail": {"nvmlDeviceGetPowerUsage": 999, "nvmlDeviceGetRetiredPagesPendingStatus": 3}},
        {"lost": True},
        {"retired_pages_pending": True}]}))
    g = probe(fakenvml_lib, scn)["gpus"]
    assert g[0]["power_error"] == 999 and g[0]["retired_error"] == 3
    assert g[1] == {"handle_error": 15}  # GPU_IS_LOST from the handle lookup, like a GPU off the bus
    assert g[2]["power"] == 68570 and g[2]["retired"] == 1


def test_scenario_reread_when_init_refcount_returns_to_zero(fakenvml_lib, tmp_path):
    code = r"""
import ctypes, os, sys
ctypes.CDLL(sys.argv[1])
import pynvml
seen = []
for scn in sys.argv[2:]:
    os.environ["FAKENVML_SCENARIO"] = scn
    pynvml.nvmlInit(); pynvml.nvmlInit()   # refcount 2: no re-read on the second
    seen.append(pynvml.nvmlSystemGetDriverVersion())
    pynvml.nvmlShutdown(); pynvml.nvmlShutdown()
print(",".join(seen))
"""
    r = subprocess.run([sys.executable, "-c", code, str(fakenvml_lib), str(SCENARIOS / "h100x8-idle.json"),
                        str(SCENARIOS / "h200x8-idle.json")], capture_output=True, text=True, timeout=30)
    assert r.stdout.strip() == "580.105.08,570.124.06", r.stderr


def test_xid79_kernel_log_names_gpu3(fakenvml_lib):
    gpu3 = json.loads((SCENARIOS / "h100x8-xid79.json").read_text())["gpus"][3]
    text = (SCENARIOS / "h100x8-xid79.kmsg").read_text()
    bus = gpu3["pci_bus_id"].lower()[4:14]  # "00000000:5D:00.0" -> "0000:5d:00"
    m = re.search(r"^\[\s*\d+\.\d{6}\] NVRM: Xid \(PCI:([0-9a-f:]+)\): 79, pid=", text, re.M)
    assert m and m.group(1) == bus
    assert f"NVRM: GPU at PCI:{bus}: {gpu3['uuid']}" in text


def test_exports_cover_collect_gpu(fakenvml_lib):
    """Every NVML symbol slurm_triage.collect.gpu reaches through pynvml is exported."""
    syms = set(subprocess.run(["nm", "-D", "--defined-only", str(fakenvml_lib)], capture_output=True,
                              text=True, check=True).stdout.split())
    src = (Path(__file__).resolve().parent.parent / "slurm_triage" / "collect" / "gpu.py").read_text()
    wrappers = set(re.findall(r"nv\.(nvml(?:Device|System)\w+)\(", src))
    c_names = {"nvmlDeviceGetCount": "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex": "nvmlDeviceGetHandleByIndex_v2",
               "nvmlDeviceGetPciInfo": "nvmlDeviceGetPciInfo_v3",
               "nvmlDeviceGetMemoryInfo": "nvmlDeviceGetMemoryInfo_v2",
               "nvmlDeviceGetComputeRunningProcesses": "nvmlDeviceGetComputeRunningProcesses_v3"}
    needed = {c_names.get(w, w) for w in wrappers} | {"nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString",
                                                      "nvmlDeviceGetTemperatureV", "nvmlDeviceGetCurrentClocksEventReasons"}
    assert len(wrappers) > 20
    assert needed <= syms, needed - syms
    assert os.path.basename(fakenvml_lib) == "libnvidia-ml.so.1"



ENERGY = r"""
import ctypes, json, sys, time
ctypes.CDLL(sys.argv[1])
import pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
e0, t0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h), time.monotonic()
time.sleep(0.5)
e1, t1 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h), time.monotonic()
print(json.dumps({"e0": e0, "e1": e1, "seconds": t1 - t0, "power": pynvml.nvmlDeviceGetPowerUsage(h)}))
"""


def test_energy_is_a_counter_that_grows_with_power(fakenvml_lib):
    """Total energy rises by about power x elapsed time between two reads (mJ = mW x s)."""
    env = {"PATH": "/usr/bin:/bin", "FAKENVML_SCENARIO": str(SCENARIOS / "h100x8-busy.json")}
    r = subprocess.run([sys.executable, "-c", ENERGY, str(fakenvml_lib)], env=env, capture_output=True,
                       text=True, timeout=30)
    out = json.loads(r.stdout)
    assert out["e1"] > out["e0"]
    assert abs((out["e1"] - out["e0"]) - out["power"] * out["seconds"]) <= out["power"] * 0.05


READ_ENERGY = r"""
import ctypes, json, sys
ctypes.CDLL(sys.argv[1])
import pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
print(json.dumps([pynvml.nvmlDeviceGetTotalEnergyConsumption(h), pynvml.nvmlDeviceGetPowerUsage(h)]))
"""


def test_energy_never_falls_when_the_scenario_switches(fakenvml_lib, tmp_path):
    """Issue 13, break 16: busy (652 W) then idle (69 W) on the same GPU UUID, read by separate
    processes (a Prolog, then an Epilog): the counter keeps integrating, it never drops."""
    state = tmp_path / "energy.state"

    def read(scenario: str):
        env = {"PATH": "/usr/bin:/bin", "FAKENVML_SCENARIO": str(SCENARIOS / scenario),
               "FAKENVML_ENERGY_STATE": str(state)}
        r = subprocess.run([sys.executable, "-c", READ_ENERGY, str(fakenvml_lib)], env=env, capture_output=True,
                           text=True, timeout=30, check=True)
        return json.loads(r.stdout)

    e_busy, _ = read("h100x8-busy.json")
    e_idle, p_idle = read("h100x8-idle.json")
    assert e_idle >= e_busy, f"energy fell from {e_busy} to {e_idle} mJ on a scenario switch"
    e_back, _ = read("h100x8-busy.json")
    assert e_back >= e_idle
    assert e_idle - e_busy < 652_000 * 30  # integrated over the seconds between reads, not since boot
    assert "GPU-4893667d-2f62-f00c-9a99-8376e18479cf" in state.read_text()
