"""What a hook does before its probes start (issue 10): as little as possible.

srun polls for the Prolog's end at 0.1, 0.3, 0.6 s after the allocation, so every
millisecond before the GPU probe is forked is on every job's start. The probes start right
after the config is read; the rest of the hook (checks, model, state, spool, the job
environment) is imported while they run, and none of it may pull in ``dataclasses`` (its
``inspect`` import cost ~10 ms of CPU per hook) or ``socket``.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT, SCENARIOS

from slurm_triage import config, deadline, snapshot

PY = [sys.executable, "-I", "-c"]


def _run(code: str, env: dict = None) -> subprocess.CompletedProcess:
    return subprocess.run(PY + [textwrap.dedent(code)], capture_output=True, text=True, timeout=60, cwd=str(ROOT),
                          env={**os.environ, **(env or {})})


def test_what_a_hook_imports_before_its_probes_start_is_small():
    r = _run("""
        import json, sys
        import slurm_triage.hooks.prolog, slurm_triage.hooks.epilog
        print(json.dumps(sorted(sys.modules)))
    """)
    assert r.returncode == 0, r.stderr
    mods = set(json.loads(r.stdout))
    for heavy in ("slurm_triage.checks", "slurm_triage.model", "slurm_triage.hooks.env", "slurm_triage.sinks.spool",
                  "dataclasses", "inspect", "socket", "requests", "prometheus_client", "pynvml", "tomllib"):
        assert heavy not in mods, f"{heavy} is imported before the probes start"


def test_the_gpu_probes_pynvml_comes_without_ctypes_util_and_find_library_still_works():
    """pynvml imports ctypes.util (shutil, subprocess, tempfile: ~6-11 ms of CPU) for a function that it calls
    only on Windows; collect.nvml imports it without them, and leaves the real ctypes.util to whoever asks."""
    r = _run("""
        import json, sys
        from slurm_triage.collect.nvml import pynvml
        before = sorted(m for m in ("ctypes.util", "shutil", "subprocess", "tempfile") if m in sys.modules)
        found = pynvml.find_library("c")  # as pynvml would call it: the real ctypes.util, loaded now
        import ctypes.util
        print(json.dumps([before, found, ctypes.util.find_library("c"), hasattr(ctypes.util, "test"),
                          getattr(ctypes.util, "__stand_in__", False), hasattr(pynvml, "nvmlInit")]))
    """)
    assert r.returncode == 0, r.stderr
    before, found, real, full_module, stand_in, binding = json.loads(r.stdout)
    assert before == [] and found and found == real and full_module and not stand_in and binding


def test_the_rest_of_an_ok_hook_does_not_import_dataclasses_or_socket():
    r = _run("""
        import json, sys
        from slurm_triage.hooks import prolog, epilog, env, cleanup
        from slurm_triage import checks, model
        from slurm_triage.sinks import spool, state
        checks.load_all()
        print(json.dumps(sorted(sys.modules)))
    """)
    assert r.returncode == 0, r.stderr
    mods = set(json.loads(r.stdout))
    assert "slurm_triage.checks.xid" in mods  # the check modules did load
    for heavy in ("dataclasses", "inspect", "socket", "requests", "prometheus_client"):
        assert heavy not in mods, f"{heavy} is imported on an OK hook's path"


def test_probes_start_before_the_job_environment_is_read_and_are_cancelled_when_it_is_refused(tmp_path):
    """A refused environment (no job id) must not leave the early probe running."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[node]\nstate_dir = "{tmp_path}/state"\nsyslog_socket = ""\n')
    r = _run("""
        import os, sys, time
        from slurm_triage import deadline
        from slurm_triage.hooks import common
        seen = {}
        def start(cfg):
            seen["env_module_loaded"] = "slurm_triage.hooks.env" in sys.modules
            seen["probe"] = deadline.start_probes({"slow": (lambda: time.sleep(30), 60.0)})
            seen["pid"] = next(iter(seen["probe"].running.values()))[1]
            return seen["probe"]
        rc = common.run_hook("prolog", "prolog_deadline_seconds", lambda cfg, env, p: 86, start=start)
        try:
            os.kill(seen["pid"], 0)
            alive = True
        except ProcessLookupError:
            alive = False
        print(rc, seen["env_module_loaded"], alive)
    """, env={"SLURM_TRIAGE_CONFIG": str(cfg), "SLURM_JOB_ID": "", "SLURM_JOBID": ""})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["0", "False", "False"], (r.stdout, r.stderr)


def test_started_probes_overlap_what_the_parent_does_meanwhile():
    t0 = time.monotonic()
    running = deadline.start_probes({"a": (lambda: time.sleep(0.4) or 1, 5.0), "b": (lambda: 2, 5.0)})
    time.sleep(0.4)  # the parent's own work (imports) while the children run
    res = running.wait()
    assert {k: v.value for k, v in res.items()} == {"a": 1, "b": 2}
    assert time.monotonic() - t0 < 0.75  # 0.8 s if the probe had waited for the parent
    assert running.running == {}


def _gpu_cfg(lib, monkeypatch, scenario: str = "h100x8-idle.json") -> config.Config:
    monkeypatch.setenv("FAKENVML_SCENARIO", str(SCENARIOS / scenario))
    cfg = config.Config(config.defaults())
    cfg.values["gpu"].update(nvml_library=str(lib), deadline_seconds=5.0)
    return cfg


def _stable(gpu: dict) -> dict:
    """The facts without what moves between two reads (init time; the fake's energy counter grows)."""
    return {**gpu, "nvml_init_seconds": None, "gpus": [{**g, "energy_joules": None} for g in gpu["gpus"]]}


def test_a_pre_forked_gpu_spare_reports_what_a_forked_probe_does(fakenvml_lib, monkeypatch):
    cfg = _gpu_cfg(fakenvml_lib, monkeypatch)
    spare = deadline.Spare.fork(*snapshot.GPU_SPARE)
    assert spare is not None
    time.sleep(0.3)  # it imports pynvml while the hook would read its config
    via_spare = snapshot.start(cfg, ["gpu"], spares={"gpu": spare}).result()
    forked = snapshot.take(cfg, ["gpu"])
    assert via_spare["errors"] == {} and via_spare["gpu"]["count"] == 8
    assert _stable(via_spare["gpu"]) == _stable(forked["gpu"])
    with pytest.raises(ChildProcessError):
        os.waitpid(spare.pid, os.WNOHANG)  # reaped by the snapshot


def test_an_unused_spare_is_dismissed_and_a_dead_one_falls_back_to_a_fork(fakenvml_lib, monkeypatch):
    cfg = _gpu_cfg(fakenvml_lib, monkeypatch)
    unused = deadline.Spare.fork(*snapshot.GPU_SPARE)
    snap = snapshot.start(cfg, ["procs"], spares={"gpu": unused}).result()  # the GPU section is not wanted
    assert snap["gpu"] is None and snap["procs"] is not None
    with pytest.raises(ChildProcessError):
        os.waitpid(unused.pid, os.WNOHANG)
    dead = deadline.Spare.fork(*snapshot.GPU_SPARE)
    os.kill(dead.pid, signal.SIGKILL)
    os.waitpid(dead.pid, 0)
    snap = snapshot.start(cfg, ["gpu"], spares={"gpu": dead}).result()
    assert snap["errors"] == {} and snap["gpu"]["count"] == 8  # forked as usual


def test_a_spare_is_held_to_its_probes_deadline():
    spare = deadline.Spare.fork(time.sleep)
    t0 = time.monotonic()
    res = deadline.start_probes({"slow": (lambda: 1, 0.5)}, spares={"slow": (spare, 30)}).wait()
    assert res["slow"].timed_out and time.monotonic() - t0 < 5
    with pytest.raises(ProcessLookupError):
        os.kill(spare.pid, 0)
