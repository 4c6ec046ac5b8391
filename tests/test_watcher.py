"""The real watcher daemon: fake NVML, real Pushgateway, real processes standing in for the step.

The step is emulated by a process titled ``slurmstepd: [JOB.STEP]`` (``exec -a``) and one
"rank" carrying the step's SLURM_* and NCCL environment, as srun would set it.
"""
from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurm_triage.step import watcher
from slurm_triage.config import Config, defaults
from slurm_triage.step.watcher import WatchContext, WatchError

SCENARIOS = Path(__file__).resolve().parent / "fakenvml" / "scenarios"
NODE = "wnode1"
_jobs = itertools.count(int(time.time()) % 100000 * 10)
RANK = ("import threading, time\n"
        "for _ in range(3): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "time.sleep(60)\n")


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _wait(cond: Callable[[], Any], seconds: float) -> Any:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(0.1)
    return cond()


def _children(pid: int) -> List[int]:
    out = []
    for n in os.listdir("/proc"):
        if n.isdigit():
            try:
                with open(f"/proc/{n}/stat") as fh:
                    if int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(n))
            except (OSError, IndexError):
                pass
    return out


class Step:
    def __init__(self, tmp: Path, lib: Path, pushgateway_url: str = ""):
        self.job, self.stepid = str(next(_jobs)), "0"
        self.nvml = tmp / "nvml"
        self.nvml.mkdir()
        (self.nvml / "libnvidia-ml.so.1").symlink_to(lib)
        self.ctx = WatchContext(self.job, self.stepid, NODE, os.geteuid(), os.getegid(), "on")
        values = defaults()
        values["node"].update(name=NODE, state_dir=str(tmp / "state"), spool_dir=str(tmp / "spool"))
        values["gpu"]["nvml_library"] = str(self.nvml / "libnvidia-ml.so.1")
        values["rdma"]["sysfs_root"] = str(tmp / "no-infiniband")
        values["pushgateway"]["url"] = pushgateway_url
        values["watcher"].update({"interval_seconds": 0.3, "hang_window_seconds": 1.5, "straggler_window_seconds": 1.5,
                                  "thread_window_seconds": 1.5, "run_dir": str(tmp / "run"),
                                  "evidence_dir": str(tmp / "evidence")})
        (tmp / "run").mkdir()
        (tmp / "evidence").mkdir()
        self.cfg = Config(values)
        self.procs: List[subprocess.Popen] = []
        title = f"slurmstepd: [{self.job}.{self.stepid}]"
        self.stepd = self._spawn(["bash", "-c", f"exec -a '{title}' sleep 60"])
        assert _wait(lambda: Path(f"/proc/{self.stepd.pid}/cmdline").read_bytes().startswith(title.encode()), 5.0)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_JOB_ID": self.job,
               "SLURM_STEP_ID": self.stepid, "SLURM_PROCID": "0", "NCCL_DEBUG": "INFO",
               "NCCL_SOCKET_IFNAME": "lo", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "SECRET": "x"}
        self.rank = self._spawn([sys.executable, "-c", RANK], env=env)
        self.evidence = Path(watcher.evidence_dir(self.cfg, self.ctx))
        assert self.evidence == tmp / "evidence" / f"slurm-triage-{os.geteuid()}" / self.job

    def _spawn(self, argv: List[str], env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
        p = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL)
        self.procs.append(p)
        return p

    def scenario(self, name: str) -> None:
        tmp = self.nvml / "scenario.json.tmp"
        shutil.copy(SCENARIOS / f"{name}.json", tmp)
        os.replace(tmp, self.nvml / "scenario.json")

    def bundles(self) -> List[Path]:
        return sorted(self.evidence.glob("hang-*.json")) if self.evidence.exists() else []

    def close(self) -> None:
        watcher.stop(self.ctx, self.cfg)
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()


@pytest.fixture
def make_step(tmp_path: Path, fakenvml_lib: Path) -> Iterator[Callable[..., Step]]:
    made: List[Step] = []

    def make(url: str = "", scenario: str = "h100x8-busy") -> Step:
        s = Step(tmp_path / f"s{len(made)}", fakenvml_lib, url)
        s.scenario(scenario)
        made.append(s)
        return s

    for i in range(3):
        (tmp_path / f"s{i}").mkdir()
    yield make
    for s in made:
        s.close()


def watch_metrics(pg: Any, job: str) -> Dict[str, Dict[tuple, float]]:
    """The pushed watch group's samples: {name: {labels: value}}."""
    import requests

    text = requests.get(pg.url + "/metrics", timeout=5).text
    out: Dict[str, Dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.labels.get("slurm_job_id") == job and s.labels.get("phase") == "watch":
                labels = tuple(sorted((k, v) for k, v in s.labels.items() if k == "gpu_uuid"))
                out.setdefault(s.name, {})[labels] = s.value
    return out


def _hang_value(pg: Any, job: str) -> Optional[float]:
    m = watch_metrics(pg, job).get("slurm_triage_hang_suspected")
    return None if not m else m[()]


def test_nccl_hang_pushes_hang_suspected_and_writes_evidence(make_step, pushgateway):
    s = make_step(pushgateway.url, "h100x8-nccl-hang")
    t0 = time.monotonic()
    pid = watcher.start(s.ctx, s.cfg)
    assert time.monotonic() - t0 < 1.0  # start() must not hold up the step
    assert _wait(lambda: _hang_value(pushgateway, s.job) == 1.0, 8.0), watch_metrics(pushgateway, s.job)
    m = watch_metrics(pushgateway, s.job)
    assert len(m["slurm_triage_watch_gpu_power_watts"]) == 8
    assert all(90 <= w <= 110 for w in m["slurm_triage_watch_gpu_power_watts"].values())
    assert set(m["slurm_triage_watch_gpu_utilization_ratio"].values()) == {1.0}
    assert m["slurm_triage_watch_threads"][()] >= 4  # the rank: main thread + 3
    assert m["slurm_triage_watch_procs_running"][()] >= 1
    assert abs(m["slurm_triage_watch_last_sample_timestamp_seconds"][()] - time.time()) < 5

    bundles = _wait(s.bundles, 5.0)
    assert len(bundles) == 1
    assert bundles[0].stat().st_uid == os.geteuid() and bundles[0].stat().st_mode & 0o077 == 0
    b = json.loads(bundles[0].read_text())
    assert b["kind"] == "power_axiom_hang" and b["job_id"] == s.job and b["node"] == NODE
    assert len(b["hang"]["gpus"]) == 8 and b["hang"]["seconds"] >= 1.5
    rank = str(s.rank.pid)
    assert b["threads"][rank]["threads"] == 4
    env = b["environment"][rank]
    assert env["NCCL_DEBUG"] == "INFO" and env["MASTER_PORT"] == "29500" and "SECRET" not in env
    assert len(b["samples"]) >= 5
    assert str(s.stepd.pid) not in b["threads"]  # the stepd is not a rank

    time.sleep(1.0)
    assert len(s.bundles()) == 1  # once per episode, not once per sample
    assert watcher.stop(s.ctx, s.cfg) is True
    assert _gone(pid)
    assert not Path(watcher.step_dir(s.cfg, s.ctx)).exists()


def test_busy_is_not_a_hang_until_the_scenario_switches(make_step, pushgateway):
    s = make_step(pushgateway.url, "h100x8-busy")
    watcher.start(s.ctx, s.cfg)
    assert _wait(lambda: len(watch_metrics(pushgateway, s.job).get("slurm_triage_watch_threads", {})), 5.0)
    end = time.monotonic() + 2.5  # longer than the 1.5 s window
    while time.monotonic() < end:
        assert _hang_value(pushgateway, s.job) in (None, 0.0)
        time.sleep(0.2)
    m = watch_metrics(pushgateway, s.job)
    assert all(600 <= w <= 690 for w in m["slurm_triage_watch_gpu_power_watts"].values())
    assert s.bundles() == []
    s.scenario("h100x8-nccl-hang")  # lab/set-scenario mid-step: the next nvmlInit re-reads it
    assert _wait(lambda: _hang_value(pushgateway, s.job) == 1.0, 6.0)
    assert len(_wait(s.bundles, 5.0)) == 1


def test_thermal_straggler_is_flagged(make_step, pushgateway):
    s = make_step(pushgateway.url, "h100x8-thermal")
    watcher.start(s.ctx, s.cfg)

    def flagged() -> Dict[tuple, float]:
        m = watch_metrics(pushgateway, s.job).get("slurm_triage_watch_straggler", {})
        return m if 1.0 in m.values() else {}

    m = _wait(flagged, 6.0)
    hot = json.loads((SCENARIOS / "h100x8-thermal.json").read_text())["gpus"][5]["uuid"]
    assert [k for k, v in m.items() if v == 1.0] == [(("gpu_uuid", hot),)]
    assert _hang_value(pushgateway, s.job) == 0.0


def test_watcher_ends_with_its_step_and_leaves_nothing(make_step):
    s = make_step()
    pid = watcher.start(s.ctx, s.cfg)
    assert watcher.start(s.ctx, s.cfg) == pid  # a second start reuses the running watcher
    with open(f"/proc/{pid}/comm") as fh:
        assert fh.read().strip() == watcher.COMM
    pidfile = Path(watcher.step_dir(s.cfg, s.ctx)) / watcher.PIDFILE
    assert json.loads(pidfile.read_text())["pid"] == pid
    time.sleep(0.8)
    s.stepd.kill()  # the step ends (or is scancel-ed) without anyone calling stop()
    s.stepd.wait()
    assert _wait(lambda: _gone(pid), 3.0)
    assert not pidfile.exists()
    assert watcher.stop(s.ctx, s.cfg) is False


def test_stop_kills_a_watcher_wedged_in_nvml_and_its_probe_child(make_step):
    s = make_step(scenario="h100x8-nvml-hang")  # nvmlDeviceGetPowerUsage never returns
    s.cfg.values["gpu"]["deadline_seconds"] = 30.0
    pid = watcher.start(s.ctx, s.cfg)
    kids = _wait(lambda: _children(pid), 3.0)
    assert kids, "the probe child should be stuck in NVML"
    time.sleep(0.5)
    assert all(not _gone(k) for k in kids)
    assert watcher.stop(s.ctx, s.cfg) is True
    assert _gone(pid)
    assert _wait(lambda: all(_gone(k) for k in kids), 3.0)


def test_stop_never_signals_a_process_that_is_not_the_watcher(make_step):
    s = make_step()
    d = Path(watcher.step_dir(s.cfg, s.ctx))
    d.mkdir(parents=True)
    with open(f"/proc/{s.rank.pid}/stat") as fh:
        ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
    (d / watcher.PIDFILE).write_text(json.dumps({"pid": s.rank.pid, "start_ticks": ticks}))
    assert watcher.stop(s.ctx, s.cfg) is False
    time.sleep(0.2)
    assert s.rank.poll() is None  # still running: the comm did not match
    assert not d.exists()


def test_start_refuses_without_step_or_as_another_user(make_step):
    s = make_step()
    other = WatchContext(s.job, "7", NODE, os.geteuid(), os.getegid(), "on")
    with pytest.raises(WatchError, match=r"slurmstepd: \[%s\.7\]" % s.job):
        watcher.start(other, s.cfg)
    foreign = WatchContext(s.job, s.stepid, NODE, os.geteuid() + 4242, os.getegid(), "on")
    with pytest.raises(WatchError, match="privileges"):
        watcher.start(foreign, s.cfg)


def test_start_refuses_a_run_dir_planted_by_someone_else(make_step, tmp_path):
    s = make_step()
    base = Path(s.cfg.values["watcher"]["run_dir"])
    (base / f"slurm-triage-{os.geteuid()}").symlink_to(tmp_path)
    with pytest.raises(WatchError, match="not a directory owned"):
        watcher.start(s.ctx, s.cfg)


def test_render_is_typed_and_parsable():
    ctx = WatchContext("1", "0", NODE, 0, 0, "on")
    sample = {"t": 1700000000.5, "gpus": [{"uuid": "GPU-a", "power_watts": 96.0, "util_gpu_percent": 100,
                                           "sm_clock_mhz": 1980, "temperature_celsius": 33}],
              "procs": [{"pid": 1, "threads": 4}], "threads": 4, "procs_running": 2}
    text = watcher.render(ctx, sample, True, {}, False).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["slurm_triage_hang_suspected"].samples[0].value == 1.0
    assert fams["slurm_triage_watch_gpu_sm_clock_hertz"].samples[0].value == 1.98e9
    assert fams["slurm_triage_watch_gpu_utilization_ratio"].samples[0].value == 1.0
    assert text.count("# TYPE") == len(fams)
