"""Smoke tests of the lab itself: if these fail, integration failures elsewhere mean nothing."""
from __future__ import annotations

import os
import time
import pwd
from pathlib import Path
from typing import Dict, Set

import pytest
import requests

import lab as labmod



@pytest.fixture(scope="module")
def lab() -> labmod.Lab:
    the_lab = labmod.require()
    the_lab.reset()
    return the_lab


def test_four_idle_nodes(lab: labmod.Lab) -> None:
    out = lab.run("sinfo", "-h", "-N", "-o", "%N %T", check=True).stdout.split("\n")
    states = dict(line.split() for line in out if line)
    assert states == {f"node{i}": "idle" for i in range(1, 5)}


def test_srun_as_test_user_reaches_every_node(lab: labmod.Lab) -> None:
    r = lab.srun("-N4", "-l", "sh", "-c", 'echo "$SLURMD_NODENAME $(id -un)"', check=True, timeout=60)
    lines = sorted(line.split(": ", 1)[1] for line in r.stdout.splitlines())
    assert lines == [f"node{i} {labmod.TEST_USER}" for i in range(1, 5)]


def test_sacct_lists_the_finished_job(lab: labmod.Lab) -> None:
    job = lab.sbatch("-N2", "-J", "lab-smoke", "-o", "/dev/null", "--wrap", "srun true")
    assert lab.wait_job(job)["JobState"] == "COMPLETED"
    lab.wait_idle()
    want = {"JobName": "lab-smoke", "User": labmod.TEST_USER, "State": "COMPLETED"}
    job_row: Dict[str, str] = {}
    for _ in range(50):  # slurmctld sends the job records to slurmdbd asynchronously
        job_row = lab.sacct(job)[0]
        if all(job_row[k] == v for k, v in want.items()):
            break
        time.sleep(0.2)
    assert {k: job_row[k] for k in want} == want
    assert len(job_row["NodeList"]) > 0 and job_row["NodeList"].startswith("node")


def test_node_dirs_and_config(lab: labmod.Lab) -> None:
    for node in lab.nodes:
        d = lab.node_dir(node)
        lib = d / "nvml" / "libnvidia-ml.so.1"
        assert os.readlink(lib) == str(lab.checkout / "tests" / "fakenvml" / "build" / "libnvidia-ml.so.1")
        assert lab.scenario(node) == labmod.DEFAULT_SCENARIO
        assert (d / "state").is_dir() and (d / "spool").is_dir() and (d / "kernel.log").is_file()
    # the job user reaches what the lab runs (a copy in LAB_DIR when the checkout is closed)
    assert lab.run("test", "-r", str(lab.checkout / "setup.py")).returncode == 0
    text = lab.triage_config.read_text()
    assert f'nvml_library = "{lab.dir}/nodes/{{node}}/nvml/libnvidia-ml.so.1"' in text
    assert pwd.getpwnam(labmod.TEST_USER).pw_uid == lab.workdir.stat().st_uid


def test_set_scenario_switches_link_and_kernel_log(lab: labmod.Lab, tmp_path: Path) -> None:
    scen = tmp_path / "custom.json"
    scen.write_text("{}\n")
    (tmp_path / "custom.kmsg").write_text("NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus.\n")
    try:
        lab.set_scenario("node3", str(scen))
        assert lab.scenario("node3") == "custom.json"
        assert "Xid" in (lab.node_dir("node3") / "kernel.log").read_text()
    finally:
        lab.reset()
    assert lab.scenario("node3") == labmod.DEFAULT_SCENARIO


def test_pushgateway_and_prometheus_ready(lab: labmod.Lab) -> None:
    assert requests.get(lab.pushgateway_url + "/-/ready", timeout=5).status_code == 200
    assert requests.get(lab.prometheus_url + "/-/ready", timeout=5).status_code == 200


def test_prometheus_scrapes_pushgateway(lab: labmod.Lab) -> None:
    health: Dict[str, str] = {}
    for _ in range(100):  # the first scrape comes within one 5 s interval
        targets = requests.get(lab.prometheus_url + "/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        health = {t["labels"]["job"]: t["health"] for t in targets}
        if health.get("pushgateway") == "up" and health.get("node") == "up":
            break
        time.sleep(0.2)
    assert health == {"pushgateway": "up", "node": "up"}


def _listen_addrs(pid: int) -> Set[str]:
    """Local addresses (hex, as in /proc/net/tcp*) of TCP sockets PID listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    addrs = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # 0A = LISTEN
                addrs.add(f[1].rsplit(":", 1)[0])
    return addrs


def test_no_daemon_listens_on_a_wildcard_address(lab: labmod.Lab) -> None:
    if os.geteuid() != 0:
        pytest.skip("reading other users' /proc/PID/fd needs root")
    pids = lab.daemon_pids()
    expected = {"munged", "mariadbd", "slurmdbd", "slurmctld", "pushgateway", "node-exporter", "prometheus"}
    expected |= {f"slurmd.{n}" for n in lab.nodes}
    assert set(pids) == expected
    loopback = "0100007F"  # 127.0.0.1, little-endian hex
    listening = {name: _listen_addrs(pid) for name, pid in pids.items()}
    for name in expected - {"munged"}:  # munged only has its unix socket
        assert listening[name] == {loopback}, (name, listening[name])
