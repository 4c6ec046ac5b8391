"""The Prolog's background publisher (issue 10): the job does not wait for the push, and
nothing about the push changes: the group arrives, a later hook's DELETE of the same group
cannot overtake it, the publisher is never taken for a process of the job, and a hook that
must say something (WARN, FAIL, --triage) still pushes before it exits."""
from __future__ import annotations

import fcntl
import http.server
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
import requests

from conftest import ROOT, SCENARIOS, serving

from slurm_triage.config import Config, defaults, load
from slurm_triage.sinks import spool

sys.path.insert(0, str(ROOT / "bench"))
from procs_fixture import publisher_pids  # noqa: E402

PROLOG = ROOT / "prolog" / "slurm-triage-prolog"
EPILOG = ROOT / "epilog" / "slurm-triage-epilog"


def _config(tmp_path: Path, lib: Path, url: str, kernel: str = "") -> Path:
    (tmp_path / "kernel.log").write_text(kernel)
    p = tmp_path / "c.toml"
    p.write_text(f'[node]\nstate_dir = "{tmp_path}/state"\nspool_dir = "{tmp_path}/spool"\nsyslog_socket = ""\n'
                 f'[gpu]\nnvml_library = "{lib}"\ndeadline_seconds = 10.0\n'
                 f'[kernel]\nsource = "file"\npath = "{tmp_path}/kernel.log"\n'
                 f'[hooks]\nscontrol = "/bin/false"\nbackground_push = true\n[drain]\nretry_seconds = 0.0\n'
                 f'[pushgateway]\nurl = "{url}"\n'
                 f'[procs]\nenabled = false\n')  # this machine's other processes must not make it WARN
    return p


def _env(config: Path, job: str, triage: str = "") -> Dict[str, str]:
    env = {"SLURM_JOB_ID": job, "SLURMD_NODENAME": "node1", "SLURM_JOB_UID": str(os.getuid()),
           "SLURM_TRIAGE_CONFIG": str(config), "FAKENVML_SCENARIO": str(SCENARIOS / "h100x8-idle.json")}
    if triage:
        env["SPANK_TRIAGE"] = triage
    return env


def _phases(pg, job: str) -> List[str]:
    return sorted(g["labels"].get("phase", "") for g in pg.groups() if g["labels"].get("slurm_job_id") == job)



def _wait(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


@pytest.fixture
def slow_puts(pushgateway) -> Iterator[str]:
    """A proxy to the real gateway that holds the Prolog's PUT 0.8 s: it is still in flight
    when the Epilog, started at once, wants to delete the same group."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _forward(self) -> None:
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.command == "PUT" and self.path.endswith("/phase/prolog"):
                time.sleep(0.8)
            r = requests.request(self.command, pushgateway.url + self.path, data=data or None, timeout=10,
                                 headers={"Content-Type": self.headers.get("Content-Type", "text/plain")})
            self.send_response(r.status_code)
            self.send_header("Content-Length", str(len(r.content)))
            self.end_headers()
            self.wfile.write(r.content)

        do_GET = do_PUT = do_DELETE = do_POST = _forward

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        yield url


def test_ok_prolog_exits_before_its_push_and_the_epilogs_delete_still_comes_last(tmp_path, fakenvml_lib, pushgateway,
                                                                                   slow_puts):
    cfg = _config(tmp_path, fakenvml_lib, slow_puts)
    r = subprocess.run([str(PROLOG)], env=_env(cfg, "501"), capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stderr == b"", r.stderr  # OK: nothing logged, pushed in the background
    fd = os.open(tmp_path / "spool" / spool.LOCK_FILE, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):  # handed over before the hook exited, not taken later
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    running = publisher_pids()
    # the publisher holds the spool lock it was handed: the Epilog, started at once, waits for
    # it, so its DELETE of the prolog group lands after the Prolog's PUT, never before
    r = subprocess.run([str(EPILOG)], env=_env(cfg, "501"), capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stderr == b"", r.stderr  # an OK Epilog hands its push over too
    running += publisher_pids()
    assert _wait(lambda: not [p for p in running if os.path.exists(f"/proc/{p}")])
    assert _phases(pushgateway, "501") == ["last_job"]
    assert list((tmp_path / "spool").glob("*.json")) == []
    log = (tmp_path / "state" / "hooks.log").read_text() if (tmp_path / "state" / "hooks.log").exists() else ""
    assert "publisher" not in log, log


def test_the_publisher_pushes_the_prolog_group_and_is_not_a_process_of_the_job(tmp_path, fakenvml_lib, pushgateway):
    cfg = _config(tmp_path, fakenvml_lib, pushgateway.url)
    r = subprocess.run([str(PROLOG)], env=_env(cfg, "502"), capture_output=True, timeout=60)
    assert r.returncode == 0 and r.stderr == b"", r.stderr
    for pid in publisher_pids():  # still running: its environment claims no job
        try:
            assert b"SLURM_JOB_ID" not in Path(f"/proc/{pid}/environ").read_bytes()
        except FileNotFoundError:
            pass
    assert _wait(lambda: _phases(pushgateway, "502") == ["prolog"])
    group = next(g for g in pushgateway.groups() if g["labels"].get("slurm_job_id") == "502")
    assert float(group["slurm_triage_node_verdict"]["metrics"][0]["value"]) in (0.0, 1.0)
    assert "slurm_triage_hook_duration_seconds" in group


def test_a_warn_or_a_triage_job_is_pushed_before_the_prolog_exits(tmp_path, fakenvml_lib, pushgateway):
    xid = ("[ 1843.305121] NVRM: GPU at PCI:0000:5d:00: GPU-0dbc98d5-f864-2c28-5be9-e56faf4ee96b\n"
           "[ 1843.305130] NVRM: Xid (PCI:0000:5d:00): 13, pid=4242, name=python, Graphics Exception\n")  # WARN
    cfg = _config(tmp_path, fakenvml_lib, pushgateway.url, kernel=xid)
    r = subprocess.run([str(PROLOG)], env=_env(cfg, "503"), capture_output=True, timeout=60)
    assert r.returncode == 0 and b"WARN" in r.stderr, r.stderr
    assert _phases(pushgateway, "503") == ["prolog"]  # no waiting: it was there when the hook exited
    ok = tmp_path / "ok"
    ok.mkdir()
    cfg = _config(ok, fakenvml_lib, pushgateway.url)
    r = subprocess.run([str(PROLOG)], env=_env(cfg, "504", triage="on"), capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert _phases(pushgateway, "504") == ["prolog"]  # the gang gate reads it before the job starts


def test_entries_the_lock_holder_spools_come_before_those_queued_behind_it(tmp_path):
    values = defaults()
    values["node"].update({"name": "n", "state_dir": str(tmp_path / "state"), "spool_dir": str(tmp_path / "spool")})
    values["pushgateway"]["url"] = "http://127.0.0.1:9"
    cfg = Config(values)
    held = spool.hold(cfg)
    assert held is not None
    try:
        # another hook, lock busy: it queues its DELETE unlocked, after everything present
        code = ("import sys; from slurm_triage.sinks.spool import Spool; "
                f"Spool({str(tmp_path / 'spool')!r}, 100).append('DELETE', {{'instance': 'n', 'phase': 'prolog'}}, "
                "None, locked=False)")
        subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
        # the holder's PUT of the same group, spooled later, is still ordered as of its lock
        sp = spool.Spool(str(tmp_path / "spool"), 100)
        sp.append("PUT", {"instance": "n", "phase": "prolog"}, b"x 1\n")
        methods = [sp._load(n)["method"] for n in sp.entries()]
        assert methods == ["PUT", "DELETE"]
    finally:
        fd = spool._HELD.pop(str(tmp_path / "spool"))[0]
        os.close(fd)


def _epilog_behind_a_held_lock(tmp_path: Path, lib: Path, url: str, job: str, deadline: float,
                               release_when_queued: bool) -> "tuple[Config, subprocess.CompletedProcess]":
    """Run the real Epilog, pushing itself (as a publisher without the lock does), while this
    process holds the spool lock (as a Prolog's publisher does); with ``release_when_queued``
    the lock is let go once the Epilog has queued."""
    path = _config(tmp_path, lib, url)
    path.write_text(path.read_text().replace("background_push = true", "background_push = false")
                    .replace("[hooks]\n", f"[hooks]\nepilog_deadline_seconds = {deadline}\n"))
    cfg = load(str(path), node="node1")
    held = spool.hold(cfg)
    assert held is not None
    epi = subprocess.Popen([str(EPILOG)], env=_env(path, job), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if release_when_queued:
        assert _wait(lambda: list((tmp_path / "spool").glob("*.json")), timeout=30)
        os.close(spool._HELD.pop(cfg.get("node", "spool_dir"))[0])
    out, err = epi.communicate(timeout=60)  # without it, the caller replays as the holder, then lets go
    return cfg, subprocess.CompletedProcess(epi.args, epi.returncode, out, err)


def test_what_an_epilog_queued_behind_the_publisher_is_replayed_by_it_before_it_exits(tmp_path, fakenvml_lib,
                                                                                      pushgateway):
    # a 3 s Epilog deadline: it waits ~2 s for the lock, queues its ops unlocked, and has no
    # time left for a second try; the holder's replay (what the publisher does last) sends them
    cfg, r = _epilog_behind_a_held_lock(tmp_path, fakenvml_lib, pushgateway.url, "505", 3.0, False)
    try:
        assert r.returncode == 0, r.stderr
        assert b"queued behind" in r.stderr, r.stderr
        assert len(list((tmp_path / "spool").glob("*.json"))) >= 1
        assert _phases(pushgateway, "505") == []
        fr = spool.flush_held(cfg, 5.0)
        assert fr.sent >= 1 and fr.pending == 0 and not fr.error, fr
    finally:
        os.close(spool._HELD.pop(cfg.get("node", "spool_dir"))[0])
    assert _phases(pushgateway, "505") == ["last_job"]
    assert list((tmp_path / "spool").glob("*.json")) == []
    assert spool.flush_held(cfg, 5.0).sent == 0  # not the holder any more: nothing replayed


def test_an_epilog_that_queued_behind_a_lock_sends_its_ops_once_the_holder_lets_go(tmp_path, fakenvml_lib,
                                                                                   pushgateway):
    # a 6 s deadline: after queueing it tries the lock once more, gets it when the holder
    # exits without replaying (what came after the publisher's last look), and sends itself
    _, r = _epilog_behind_a_held_lock(tmp_path, fakenvml_lib, pushgateway.url, "506", 6.0, True)
    assert r.returncode == 0, r.stderr
    assert _phases(pushgateway, "506") == ["last_job"]
    assert list((tmp_path / "spool").glob("*.json")) == []
    assert b"queued behind" not in r.stderr, r.stderr  # delivered: nothing worth a log line


@pytest.mark.parametrize("hook,job,phase", [(EPILOG, "507", "last_job"), (PROLOG, "508", "prolog")],
                         ids=["epilog", "prolog"])
def test_an_ok_hook_exits_at_once_when_the_lock_is_busy_and_its_publisher_pushes_after_the_holder(
        tmp_path, fakenvml_lib, pushgateway, hook, job, phase):
    """The last job's publisher still pushing must not make the next hook import requests and
    wait for the lock (+150-250 ms of a back-to-back job's start or end)."""
    path = _config(tmp_path, fakenvml_lib, pushgateway.url)
    cfg = load(str(path), node="node1")
    assert spool.hold(cfg) is not None  # as the last hook's publisher holds it
    try:
        before = set(publisher_pids())
        t0 = time.monotonic()
        r = subprocess.run([str(hook)], env=_env(path, job), capture_output=True, timeout=60)
        assert r.returncode == 0 and r.stderr == b"", r.stderr  # nothing logged: no push from the hook
        assert time.monotonic() - t0 < 5  # it did not wait for the lock (8 s) itself
        mine = [p for p in publisher_pids() if p not in before]
        assert mine, "no publisher started"
        time.sleep(0.5)
        assert _phases(pushgateway, job) == []  # the publisher waits for the holder
    finally:
        os.close(spool._HELD.pop(cfg.get("node", "spool_dir"))[0])
    assert _wait(lambda: _phases(pushgateway, job) == [phase])
    assert _wait(lambda: not [p for p in mine if os.path.exists(f"/proc/{p}")])
    assert list((tmp_path / "spool").glob("*.json")) == []


def test_a_prolog_publisher_that_gets_the_lock_after_its_jobs_epilog_leaves_no_live_group(
        tmp_path, fakenvml_lib, pushgateway):
    """A job shorter than the queue: its Epilog's publisher deletes the live groups before the
    Prolog's publisher gets the lock; that one's PUT would bring the prolog group back."""
    path = _config(tmp_path, fakenvml_lib, pushgateway.url)
    cfg = load(str(path), node="node1")
    assert spool.hold(cfg) is not None
    try:
        before = set(publisher_pids())
        r = subprocess.run([str(PROLOG)], env=_env(path, "509"), capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        late = [p for p in publisher_pids() if p not in before]
        assert len(late) == 1, late
        os.kill(late[0], signal.SIGSTOP)  # the Prolog's publisher loses the race for the lock
    finally:
        os.close(spool._HELD.pop(cfg.get("node", "spool_dir"))[0])
    try:
        before = set(publisher_pids())
        r = subprocess.run([str(EPILOG)], env=_env(path, "509"), capture_output=True, timeout=60)
        assert r.returncode == 0 and r.stderr == b"", r.stderr
        epi = [p for p in publisher_pids() if p not in before and p not in late]
        assert _wait(lambda: not [p for p in epi if os.path.exists(f"/proc/{p}")])
        assert _phases(pushgateway, "509") == ["last_job"]
    finally:
        os.kill(late[0], signal.SIGCONT)
    assert _wait(lambda: not os.path.exists(f"/proc/{late[0]}"))
    assert _phases(pushgateway, "509") == ["last_job"]
    assert list((tmp_path / "spool").glob("*.json")) == []


def test_a_requeued_jobs_earlier_epilog_does_not_stop_its_prolog_push(tmp_path):
    from slurm_triage.hooks.publish import _job_ended
    from slurm_triage.sinks import state

    values = defaults()
    values["node"].update({"name": "n", "state_dir": str(tmp_path / "state")})
    cfg = Config(values)
    state.save(cfg, "77", "prolog", {})
    assert not _job_ended(cfg, "77")
    state.save(cfg, "77", "epilog", {})
    assert _job_ended(cfg, "77")
    time.sleep(0.01)
    state.save(cfg, "77", "prolog", {})  # the job runs again (requeue): same id, a newer Prolog
    assert not _job_ended(cfg, "77")


@pytest.mark.parametrize("nice,expected", [(7, 7), (0, 0)])
def test_the_publisher_lowers_its_priority_to_publisher_nice(tmp_path, nice, expected):
    """Its ~150 ms of imports must yield to the hooks of other jobs starting on the node."""
    p = tmp_path / "c.toml"
    p.write_text(f'[node]\nstate_dir = "{tmp_path}/state"\nspool_dir = "{tmp_path}/spool"\nsyslog_socket = ""\n'
                 f'[hooks]\npublisher_nice = {nice}\n')
    code = ("import os\nfrom slurm_triage.hooks import publish\n"
            "publish.main(['prolog', '77', '0.1', '5', '-'])\nprint(os.getpriority(os.PRIO_PROCESS, 0))\n")
    r = subprocess.run([sys.executable, "-I", "-c", code], env={**os.environ, "SLURM_TRIAGE_CONFIG": str(p)},
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[-1]) == max(expected, os.getpriority(os.PRIO_PROCESS, 0))
    assert "found no saved state" in r.stderr  # it ran its course
