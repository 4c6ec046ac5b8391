"""The fault suite on the real lab: the Pushgateway refused, black-holed (accepts TCP, never
answers), answering 500, answering garbage, or hung (SIGSTOP). Jobs must start within
the deadlines and every job's result must reach the gateway exactly once afterwards, as
its own group; no node may be drained. Then the hooks SIGKILLed at random points, slurmctld
stopped while jobs start, and many jobs at once and in sequence
(SLURM_TRIAGE_FAULT_CONCURRENT / SLURM_TRIAGE_FAULT_SEQUENTIAL, 16 / 40 by default; the
issue's figures are 64 / 200). The figures are printed at the end."""
from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from typing import Dict, Iterator, List, Tuple

import pytest
import requests

import lab as labmod
from conftest import serving
from gateway_proxy import Counting, flush_spools
from test_hooks_lab import srun_job

JOBS_PER_FAULT = 2
FIGURES: Dict[str, Dict[str, float]] = {}


@contextmanager
def black_hole() -> Iterator[str]:
    """Listens, never accepts: connections complete in the backlog and nothing answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    try:
        yield f"http://127.0.0.1:{s.getsockname()[1]}"
    finally:
        s.close()


@contextmanager
def refused() -> Iterator[str]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    yield f"http://127.0.0.1:{port}"


@contextmanager
def answering(status: int = 500, garbage: bool = False) -> Iterator[str]:
    """/-/ready says 200; every push and delete gets ``status`` (or bytes that are not HTTP)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            if garbage:
                self.wfile.write(b"\x00\xffgarbage\r\n\r\n")
                self.close_connection = True
                return
            self.send_response(200 if self.command == "GET" else status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_PUT = do_DELETE = _answer

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        yield url


@contextmanager
def hung(lab: labmod.Lab, proxy: "Counting") -> Iterator[str]:
    """The real gateway SIGSTOPped behind the counting proxy: requests it queued while frozen
    are applied when it wakes, after the hooks gave up on them."""
    pid = int((lab.dir / "run" / "pushgateway.pid").read_text())
    os.kill(pid, signal.SIGSTOP)
    try:
        yield proxy.url
    finally:
        os.kill(pid, signal.SIGCONT)


def gateway_groups(lab: labmod.Lab) -> List[Dict]:
    return requests.get(lab.pushgateway_url + "/api/v1/metrics", timeout=5).json()["data"]


def spooled(lab: labmod.Lab) -> int:
    return sum(len(list((lab.node_dir(n) / "spool").glob("*.json"))) for n in lab.nodes)


FAULTS = {"refused": lambda lab, proxy: refused(), "black-holed": lambda lab, proxy: black_hole(),
          "500": lambda lab, proxy: answering(500), "garbage": lambda lab, proxy: answering(garbage=True),
          "hung (SIGSTOP)": hung}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_gateway_fault_jobs_start_in_time_and_every_result_arrives_once(lab, fault):
    text = lab.triage_config.read_text()
    assert lab.pushgateway_url in text
    drained_before = {n for n in lab.nodes if "DRAIN" in lab.node_state(n)}
    jobs: List[int] = []
    walls, completing = [], []
    recovery: List[int] = []
    proxy = Counting(lab.pushgateway_url)
    try:
        with FAULTS[fault](lab, proxy) as url:
            with lab.config(replace=text.replace(lab.pushgateway_url, url)):
                for _ in range(JOBS_PER_FAULT):
                    t0 = time.monotonic()
                    jobs.append(srun_job(lab))
                    walls.append(time.monotonic() - t0)
                    t1 = time.monotonic()
                    lab.wait_idle(timeout=60, published=False)  # the nodes' release, not the pushes
                    completing.append(time.monotonic() - t1)
                lab.wait_idle(timeout=60)  # the publishers spool what the gateway did not take
        held = spooled(lab)
        with lab.config(replace=text.replace(lab.pushgateway_url, proxy.url)):
            while spooled(lab) and len(recovery) < 3:  # the next jobs' hooks replay the spool, then their own
                recovery.append(srun_job(lab))
                lab.wait_idle()
        time.sleep(1.0)  # the gateway answers a PUT before it has applied it
    finally:
        proxy.close()
    groups = gateway_groups(lab)
    results = [(g["labels"].get("instance"), g["labels"].get("slurm_job_id")) for g in groups
               if g["labels"].get("phase") == "last_job"]
    live = [g for g in groups if g["labels"].get("phase") == "prolog"
            and g["labels"].get("slurm_job_id") in {str(j) for j in jobs + recovery}]
    expected = {(n, str(j)) for n in lab.nodes for j in jobs + recovery}
    lost = len(expected - set(results))
    # a result applied more than once (same group, same content: Prometheus still sees one series)
    doubled = proxy.doubled("last_job")
    false_drains = len({n for n in lab.nodes if "DRAIN" in lab.node_state(n)} - drained_before)
    FIGURES[fault] = {"jobs": len(jobs) + len(recovery), "spooled": held, "lost": lost, "doubled": doubled,
                      "false_drains": false_drains, "max_srun_s": max(walls), "max_completing_s": max(completing)}
    print(f"\n{fault}: {FIGURES[fault]}, recovered after {len(recovery)} jobs")
    assert held >= len(lab.nodes) * len(jobs), "the outage jobs' pushes were not spooled"
    assert spooled(lab) == 0 and lost == 0 and not live and false_drains == 0
    assert doubled == 0, proxy.applied
    assert max(walls) < 8.0, walls  # srun start: one Prolog, within its push budget
    assert max(completing) < 8.0, completing  # Epilog: its push budget (3 s), not 20 s


KILL_RUNS = 8


def test_hooks_sigkilled_at_random_points_drain_nothing_and_corrupt_nothing(lab):
    """Break 6 over N runs: the Prolog or Epilog's Python SIGKILLed at a random moment."""
    import json
    import random

    from test_drain_lab import hook_pids, srun_bg

    rng = random.Random(13)
    killed, drains = 0, 0
    for i in range(KILL_RUNS):
        kind = ("prolog", "epilog")[i % 2]
        p = srun_bg(lab, "node1")
        deadline = time.monotonic() + 20
        pids: List[int] = []
        while not pids and time.monotonic() < deadline:  # the Epilog starts after srun returns
            pids = hook_pids(kind, "node1")
            time.sleep(0.01)
        if pids:
            time.sleep(rng.uniform(0.0, 0.1))  # within the hook's ~0.1 s (it was ~0.4 s before issue 10)
            try:
                os.kill(pids[0], signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        p.communicate(timeout=60)
        lab.wait_node("node1", lambda s: "COMPLETING" not in s, timeout=60)
        if "DRAIN" in lab.node_state("node1"):
            drains += 1
            lab.resume("node1")
    for f in (lab.node_dir("node1") / "spool").glob("[0-9]*.json"):
        json.loads(f.read_text())  # atomic writes: a kill leaves no torn entry
    for f in (lab.node_dir("node1") / "state" / "jobs").glob("*/*.json"):
        json.loads(f.read_text())
    r = lab.srun("-N4", "true", timeout=60)  # the next job runs everywhere
    FIGURES["hook SIGKILL"] = {"jobs": KILL_RUNS + 1, "false_drains": drains, "killed": killed}
    print(f"\nhooks SIGKILLed: {killed} of {KILL_RUNS} runs, {drains} drains")
    assert r.returncode == 0 and drains == 0 and killed >= KILL_RUNS // 2


def _user_srun(lab: labmod.Lab, *args: str) -> subprocess.Popen:
    """srun ARGS as the lab user in the background, its first task printing the job id."""
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "SLURM_CONF": lab.slurm_conf}
    cmd = (["env", "-i"] + [f"{k}={v}" for k, v in env.items()] + ["srun", *args, "sh", "-c",
           'test "$SLURM_NODEID" = 0 && echo "$SLURM_JOB_ID"; true'])
    return subprocess.Popen(["runuser", "-u", labmod.TEST_USER, "--"] + cmd, cwd=str(lab.workdir),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _lifetime(pid: int, until: float) -> Tuple[float, bool]:
    """(seconds process ``pid`` lived, polled until it is gone or ``until``; True if it ended)."""
    hz = os.sysconf("SC_CLK_TCK")
    try:
        stat = open(f"/proc/{pid}/stat").read()
        start = int(stat[stat.rfind(")") + 2:].split()[19]) / hz
    except OSError:
        return 0.0, True
    while time.monotonic() < until and os.path.exists(f"/proc/{pid}"):
        time.sleep(0.02)
    up = float(open("/proc/uptime").read().split()[0])
    return up - start, not os.path.exists(f"/proc/{pid}")


def test_slurmctld_stopped_while_jobs_start_every_prolog_keeps_its_deadline(lab):
    """slurmctld SIGSTOPped as the Prologs of a 4-node job start: the Prologs never wait on it
    (a healthy node needs no controller), each ends within prolog_deadline_seconds, the job
    runs once slurmctld is back, and nothing is drained."""
    from slurm_triage.config import SCHEMA
    from test_drain_lab import hook_pids

    deadline_s = SCHEMA["hooks"]["prolog_deadline_seconds"].default
    ctld = lab.daemon_pids()["slurmctld"]
    p = _user_srun(lab, "-N4")
    lives: Dict[str, float] = {}
    try:
        seen: Dict[str, int] = {}
        t_end = time.monotonic() + 30
        while not seen and time.monotonic() < t_end:
            seen = {n: pids[0] for n in lab.nodes for pids in [hook_pids("prolog", n)] if pids}
            time.sleep(0.01)
        assert seen, "no Prolog started"
        os.kill(ctld, signal.SIGSTOP)
        try:
            until = time.monotonic() + deadline_s + 5
            while time.monotonic() < until and len(seen) < len(lab.nodes):  # the later nodes' Prologs
                seen.update({n: pids[0] for n in lab.nodes if n not in seen for pids in [hook_pids("prolog", n)]
                             if pids})
                time.sleep(0.02)
            for node, pid in seen.items():
                lives[node], ended = _lifetime(pid, until)
                assert ended, f"the Prolog on {node} still runs {lives[node]:.1f} s in, slurmctld stopped"
        finally:
            os.kill(ctld, signal.SIGCONT)
        out, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=30)
    assert p.returncode == 0, err
    lab.wait_idle(timeout=60)
    drains = [n for n in lab.nodes if "DRAIN" in lab.node_state(n)]
    FIGURES["slurmctld SIGSTOP"] = {"jobs": 1, "false_drains": len(drains), "max_prolog_s": max(lives.values())}
    print(f"\nslurmctld stopped: Prologs lived {lives} (deadline {deadline_s} s), srun rc {p.returncode}")
    assert len(seen) == len(lab.nodes) and max(lives.values()) < deadline_s and not drains


CONCURRENT = int(os.environ.get("SLURM_TRIAGE_FAULT_CONCURRENT", "16"))
SEQUENTIAL = int(os.environ.get("SLURM_TRIAGE_FAULT_SEQUENTIAL", "40"))
RECOVERY_JOBS = 3


def _many_jobs_figures(lab: labmod.Lab, proxy: Counting, jobs: List[int], failed: int,
                       walls: List[float]) -> Dict[str, float]:
    """Deliver what the spools hold (the next jobs' hooks replay them: a result still spooled is
    late, not lost), then count lost and doubled results, live groups left and drains.
    "doubled" is a PUT the gateway applied again (same group, same body: Prometheus sees one
    series): a push that timed out while the gateway still applied it is replayed from the spool."""
    recovery: List[int] = []
    while spooled(lab) and len(recovery) < RECOVERY_JOBS:
        recovery.append(srun_job(lab))
        lab.wait_idle(timeout=60)
    flushes = 0
    while spooled(lab) and flushes < 3:  # the backlog of a slow gateway: replayed without new jobs
        flush_spools(lab)
        flushes += 1
    time.sleep(1.0)
    ids = {str(j) for j in jobs + recovery}
    got = {(g.get("instance"), g.get("slurm_job_id")) for g in proxy.delivered("last_job")}
    live = [g for g in gateway_groups(lab) if g["labels"].get("phase") == "prolog"
            and g["labels"].get("slurm_job_id") in ids]
    prolog = proxy.hook_seconds("prolog", ids)
    return {"jobs": len(jobs) + len(recovery), "failed": failed,
            "lost": len({(n, j) for n in lab.nodes for j in ids} - got), "doubled": proxy.doubled("last_job"),
            "live_groups_left": len(live), "spooled": spooled(lab),
            "false_drains": sum("DRAIN" in lab.node_state(n) for n in lab.nodes),
            "max_srun_s": max(walls), "max_prolog_s": max(prolog) if prolog else float("nan"),
            "spool_flushes": flushes}


def _assert_clean(f: Dict[str, float], jobs: int) -> None:
    assert f["failed"] == 0 and f["false_drains"] == 0, f
    assert f["lost"] == 0 and f["live_groups_left"] == 0 and f["spooled"] == 0, f
    assert f["jobs"] >= jobs, f


def test_many_jobs_at_once_drain_nothing_lose_nothing_and_leave_no_live_group(lab):
    """Issue 13 item 4: N 4-node jobs submitted at once (the issue's run: 64)."""
    proxy = Counting(lab.pushgateway_url)
    text = lab.triage_config.read_text()
    jobs: List[int] = []
    failed = 0
    try:
        with lab.config(replace=text.replace(lab.pushgateway_url, proxy.url)):
            t0 = time.monotonic()
            procs = [_user_srun(lab, "-N4") for _ in range(CONCURRENT)]
            walls = []
            for p in procs:
                out, err = p.communicate(timeout=60 + 10 * CONCURRENT)
                walls.append(time.monotonic() - t0)
                if p.returncode == 0 and out.split() and out.split()[-1].isdigit():
                    jobs.append(int(out.split()[-1]))
                else:
                    failed += 1
            lab.wait_idle(timeout=120)
            f = _many_jobs_figures(lab, proxy, jobs, failed, walls)
    finally:
        proxy.close()
    FIGURES[f"{CONCURRENT} at once"] = f
    print(f"\n{CONCURRENT} jobs at once: {f}")
    _assert_clean(f, CONCURRENT)


def test_many_jobs_in_sequence_drain_nothing_lose_nothing_and_leave_no_live_group(lab):
    """Issue 13 item 4: N 4-node jobs one after the other (the issue's run: 200)."""
    proxy = Counting(lab.pushgateway_url)
    text = lab.triage_config.read_text()
    jobs: List[int] = []
    walls: List[float] = []
    try:
        with lab.config(replace=text.replace(lab.pushgateway_url, proxy.url)):
            for _ in range(SEQUENTIAL):
                t0 = time.monotonic()
                jobs.append(srun_job(lab))
                walls.append(time.monotonic() - t0)
            lab.wait_idle(timeout=60)
            f = _many_jobs_figures(lab, proxy, jobs, 0, walls)
    finally:
        proxy.close()
    FIGURES[f"{SEQUENTIAL} in sequence"] = f
    print(f"\n{SEQUENTIAL} jobs in sequence: {f}")
    _assert_clean(f, SEQUENTIAL)


def test_zz_print_fault_suite_figures():
    if not FIGURES:
        pytest.skip("no fault ran")
    print("\nfault suite (Pushgateway faults, 4-node lab jobs):")
    print(f"  {'fault':<18} {'jobs':>4} {'spooled':>7} {'lost':>4} {'doubled':>7} {'false drains':>12} "
          f"{'max srun s':>10} {'max completing s':>16} {'max prolog s':>12}")
    for fault, f in FIGURES.items():
        def col(key: str, width: int, fmt: str = ".0f") -> str:
            return f"{f[key]:>{width}{fmt}}" if key in f else f"{'-':>{width}}"
        print(f"  {fault:<18} {col('jobs', 4)} {col('spooled', 7)} {col('lost', 4)} {col('doubled', 7)} "
              f"{col('false_drains', 12)} {col('max_srun_s', 10, '.2f')} {col('max_completing_s', 16, '.2f')} "
              f"{col('max_prolog_s', 12, '.2f')}")
