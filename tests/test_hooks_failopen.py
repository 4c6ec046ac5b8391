"""The hooks' failure-open promise without a cluster: the real prolog/epilog scripts, a real
interpreter, the fake NVML, a killed or crashed Python, a config path that blocks, a full
state directory, and the log line an admin must see (syslog as well as stderr)."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

from conftest import ROOT, SCENARIOS

from slurm_triage.hooks import common

PROLOG = ROOT / "prolog" / "slurm-triage-prolog"
EPILOG = ROOT / "epilog" / "slurm-triage-epilog"


def hook_env(tmp_path: Path, config: Path, scenario: str = "h100x8-idle.json") -> Dict[str, str]:
    """What slurmd gives a Prolog (no PATH), plus the config and the fake GPUs' scenario."""
    return {"SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node1", "SLURM_JOB_UID": str(os.getuid()),
            "SLURM_TRIAGE_CONFIG": str(config), "FAKENVML_SCENARIO": str(SCENARIOS / scenario)}


def write_config(tmp_path: Path, lib: Path, extra: str = "", kernel: str = "") -> Path:
    kernel_log = tmp_path / "kernel.log"
    if not kernel_log.exists():
        kernel_log.write_text(kernel)
    p = tmp_path / "c.toml"
    p.write_text(f'[node]\nstate_dir = "{tmp_path}/state"\nspool_dir = "{tmp_path}/spool"\nsyslog_socket = ""\n'
                 f'[gpu]\nnvml_library = "{lib}"\ndeadline_seconds = 10.0\n'
                 f'[kernel]\nsource = "file"\npath = "{kernel_log}"\n'
                 f'[hooks]\nscontrol = "/bin/false"\n[drain]\nretry_seconds = 0.0\n' + extra)
    return p


def children(pid: int) -> List[int]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(d))
    return out


def test_the_scripts_and_python_agree_on_the_hardware_exit_code():
    for script in (PROLOG, EPILOG):
        text = script.read_text()
        assert f'"$rc" -eq {common.HARDWARE_FAIL_EXIT }' in text and "exec " not in text


@pytest.mark.parametrize("script", [PROLOG, EPILOG], ids=["prolog", "epilog"])
def test_a_sigkilled_hook_exits_0_so_slurm_does_not_drain(tmp_path, fakenvml_lib, script):
    """Break 6: with `exec python`, SIGKILL (OOM killer, a stuck kill) was the script's exit
    status and Slurm drained the node "Prolog error". Its probe children must not outlive it."""
    fifo = tmp_path / "kernel.log"
    os.mkfifo(fifo)  # the kernel probe blocks on it: Python stays alive to be killed
    cfg = write_config(tmp_path, fakenvml_lib)
    err_path = tmp_path / "stderr"
    with open(err_path, "wb") as err:
        p = subprocess.Popen([str(script)], env=hook_env(tmp_path, cfg), stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 10
    victim, probes = None, []
    while not probes and time.monotonic() < deadline:
        time.sleep(0.05)
        kids = [c for c in children(p.pid) if b"slurm_triage.hooks" in Path(f"/proc/{c}/cmdline").read_bytes()]
        if b"slurm_triage.hooks" in Path(f"/proc/{p.pid}/cmdline").read_bytes():
            kids = [p.pid]  # the old exec'ing script: the script *is* Python
        if kids:
            victim, probes = kids[0], children(kids[0])
    assert victim is not None and probes
    os.kill(victim, signal.SIGKILL)
    try:
        assert p.wait(timeout=20) == 0, err_path.read_text()
        assert "killed or crashed" in err_path.read_text()
        time.sleep(0.2)
        assert [c for c in probes if os.path.exists(f"/proc/{c}") and
                Path(f"/proc/{c}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"] == []
    finally:
        for c in probes:
            try:
                os.kill(c, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_hardware_fail_is_exit_1_through_the_script(tmp_path, fakenvml_lib):
    """The one non-zero exit left: a drain-worthy FAIL (here scontrol fails too: exit 1 still)."""
    cfg = write_config(tmp_path, fakenvml_lib, kernel=(SCENARIOS / "h100x8-xid79.kmsg").read_text())
    r = subprocess.run([str(PROLOG)], env=hook_env(tmp_path, cfg, "h100x8-xid79.json"), capture_output=True,
                       timeout=60)
    assert r.returncode == 1, r.stderr
    assert b"drain failed" in r.stderr and b"Xid 79" in r.stderr


def test_a_fifo_config_is_refused_at_once_and_the_job_runs(tmp_path):
    """Break 7: open() of a FIFO config blocked the Prolog until PrologEpilogTimeout."""
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    env = {"SLURM_JOB_ID": "78", "SLURMD_NODENAME": "node1", "SLURM_TRIAGE_CONFIG": str(fifo)}
    t0 = time.monotonic()
    r = subprocess.run([str(PROLOG)], env=env, capture_output=True, timeout=30)
    assert r.returncode == 0 and time.monotonic() - t0 < 5
    assert b"not a regular file" in r.stderr


HANGS_IN_LOAD = """
import sys, time
from slurm_triage import config
from slurm_triage.hooks import common
key = config.SCHEMA["hooks"]["prolog_deadline_seconds"]
config.SCHEMA["hooks"]["prolog_deadline_seconds"] = key._replace(default=0.5)
common.load = lambda **kw: time.sleep(30)   # a config read that never returns (hung NFS)
sys.exit(common.run_hook("prolog", "prolog_deadline_seconds", lambda cfg, env, started: 86))
"""


def test_the_deadline_is_armed_before_the_config_is_read(tmp_path):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", HANGS_IN_LOAD], cwd=str(ROOT), capture_output=True, text=True,
                       timeout=30, env={"SLURM_JOB_ID": "1", "SLURMD_NODENAME": "n1", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and time.monotonic() - t0 < 5, r.stderr
    assert "passed its 0.5 s deadline" in r.stderr


def test_log_escapes_control_characters_and_reaches_syslog(tmp_path):
    """Break 9: the only line went to stderr, which slurmd discards; break 12's forged lines."""
    path = str(tmp_path / "log.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2)
    from slurm_triage.config import Config, defaults

    values = defaults()
    values["node"].update(state_dir=str(tmp_path / "state"), syslog_socket=path)
    common.log(Config(values), "epilog", "file /dev/shm/a\nFAKE 12:00 drained\x1b[2J \udcff")
    msg = sock.recv(4096).decode()
    assert re.fullmatch(r"<28>slurm-triage\[\d+\]: epilog: file /dev/shm/a\\x0aFAKE 12:00 drained\\x1b\[2J \\xff",
                        msg), msg
    line = (tmp_path / "state" / "hooks.log").read_text()
    assert line.count("\n") == 1 and "\\x0aFAKE" in line
    sock.close()


def test_a_state_that_cannot_be_saved_is_still_pushed(tmp_path, pushgateway):
    """Break 9: a full state dir (here: one that cannot exist) aborted publish before the push."""
    from slurm_triage.config import Config, defaults
    from slurm_triage.hooks.env import JobEnv
    from slurm_triage.hooks.prolog import _push

    (tmp_path / "file").write_text("")
    values = defaults()
    values["node"].update(state_dir=str(tmp_path / "file" / "state"), spool_dir=str(tmp_path / "spool"),
                          syslog_socket="")
    values["pushgateway"]["url"] = pushgateway.url
    cfg = Config(values)
    env = JobEnv(job_id="79", node="node1")
    snap = {"schema": 1, "node": "node1", "time": time.time(), "errors": {}, "probe_seconds": {}}
    drained, _ = common.publish(cfg, env, "prolog", {"job_id": "79"}, snap, [], time.monotonic(),
                                lambda s: _push(cfg, env, snap, [], {}, s))
    assert drained is None
    assert [g["labels"].get("slurm_job_id") for g in pushgateway.groups()] == ["79"]


@pytest.fixture
def full_fs(tmp_path):
    """A real filesystem with no space left (a 256 KiB tmpfs, filled); skip where we may not mount."""
    d = tmp_path / "full"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(d)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    try:
        (d / "state").mkdir()
        (d / "spool").mkdir()
        fd = os.open(d / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def test_a_full_disk_still_pushes_and_logs_to_syslog(tmp_path, fakenvml_lib, pushgateway, full_fs):
    """Break 9 for real: state dir full -> publish aborted, nothing pushed, one line to stderr only."""
    sock_path = str(tmp_path / "log.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(sock_path)
    sock.settimeout(1)
    cfg = write_config(tmp_path, fakenvml_lib, extra=f'[pushgateway]\nurl = "{pushgateway.url}"\n')
    text = cfg.read_text().replace(f'state_dir = "{tmp_path}/state"', f'state_dir = "{full_fs}/state"') \
        .replace(f'spool_dir = "{tmp_path}/spool"', f'spool_dir = "{full_fs}/spool"') \
        .replace('syslog_socket = ""', f'syslog_socket = "{sock_path}"')
    cfg.write_text(text)
    r = subprocess.run([str(PROLOG)], env=hook_env(tmp_path, cfg), capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert [g["labels"].get("slurm_job_id") for g in pushgateway.groups()] == ["77"]
    msgs = []
    try:
        while True:
            msgs.append(sock.recv(65536).decode())
    except socket.timeout:
        pass
    finally:
        sock.close()
    assert any("state not saved" in m and "No space left" in m for m in msgs), msgs
    assert b"state not saved" in r.stderr
