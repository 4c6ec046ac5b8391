"""The Epilog's clean-up against real processes and files, as a hostile user would set them up
(issue 13, breaks 2, 4, 5, 14 and the clean-up side of 12).

Needs root (it runs processes as other users and picks PIDs through ns_last_pid);
skipped otherwise.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from slurm_triage.collect import procs
from slurm_triage.config import Config, defaults
from slurm_triage.hooks import cleanup
from slurm_triage.hooks.env import JobEnv
from slurm_triage.hooks.epilog import clean_up, job_leftovers

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: processes of other users, ns_last_pid")

USER, STRANGER = 4242, 65534
JOB = "987654321"  # no slurmstepd runs it


def make_cfg(**hooks: Any) -> Config:
    values = defaults()
    values["node"]["name"] = "thisnode"
    values["procs"]["ipc_dirs"] = []
    values["hooks"].update({"cleanup": True, "cleanup_grace_seconds": 0.5, **hooks})
    return Config(values)


def spawn(argv: List[str], uid: int, job: Optional[str] = JOB) -> subprocess.Popen:
    def drop() -> None:
        os.setgid(uid)
        os.setuid(uid)

    env = {"PATH": "/usr/bin:/bin", **({"SLURM_JOB_ID": job} if job else {})}
    return subprocess.Popen(argv, env=env, preexec_fn=drop, stdin=subprocess.PIPE, stdout=subprocess.PIPE)


def exec_done(p: subprocess.Popen, timeout: float = 10) -> None:
    """Until the child runs its own program (before exec it still shows our environment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{p.pid}/cmdline").read_bytes().startswith(p.args[0].encode()):
                return
        except OSError:
            pass
        time.sleep(0.01)
    raise AssertionError(f"{p.args} did not start")


def wait_ready(p: subprocess.Popen) -> None:
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"


def row(pid: int) -> Dict[str, Any]:
    """The process as the Epilog's snapshot lists it."""
    facts = procs.collect(make_cfg())
    (r,) = [p for p in facts["processes"] if p["pid"] == pid]
    return r


def spawn_at(pid: int, argv: List[str], uid: int) -> Optional[subprocess.Popen]:
    """A new process that gets ``pid`` (the next PID after ns_last_pid), as a fork loop would."""
    for _ in range(50):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        p = spawn(argv, uid, job=None)
        if p.pid == pid:
            return p
        p.kill()
        p.wait()
    return None


def alive(p: subprocess.Popen) -> bool:
    return p.poll() is None


# --- break 2: a recycled PID is never signalled ---------------------------------------------

@pytest.mark.parametrize("pidfd", [True, False])
def test_pid_recycled_during_the_grace_period_is_not_killed(pidfd: bool, monkeypatch) -> None:
    if not pidfd:
        monkeypatch.delattr(os, "pidfd_open")  # old kernel/Python: uid + start time re-checks
    left = spawn(["/bin/sleep", "1000"], USER)  # dies on SIGTERM, freeing its PID
    exec_done(left)
    target = row(left.pid)
    result: Dict[str, Any] = {}
    worker = threading.Thread(target=lambda: result.update(
        cleanup.kill_leftovers([target], USER, grace=2.0, kill_wait=1.0)))
    worker.start()
    left.wait(10)  # reaped: the PID is free for anyone
    stranger = spawn_at(left.pid, ["/bin/sleep", "1000"], USER)  # same user, even
    try:
        if stranger is None:
            pytest.skip("could not get the freed PID back (busy machine)")
        worker.join(10)
        assert alive(stranger), "the clean-up killed the process that reused the leftover's PID"
        assert result["killed"] == [left.pid] and result["survivors"] == []
    finally:
        worker.join(10)
        if stranger is not None:
            stranger.kill()
            stranger.wait()


def test_pid_reused_before_the_clean_up_starts_is_not_signalled() -> None:
    left = spawn(["/bin/sleep", "1000"], USER)
    exec_done(left)
    target = row(left.pid)
    left.kill()
    left.wait()
    stranger = spawn_at(left.pid, ["/bin/sleep", "1000"], USER)
    if stranger is None:
        pytest.skip("could not get the freed PID back (busy machine)")
    try:
        out = cleanup.kill_leftovers([target], USER, grace=0.2, kill_wait=0.2)
        assert alive(stranger) and out["killed"] == [] and out["gone"] == [left.pid]
    finally:
        stranger.kill()
        stranger.wait()


# --- break 4: slow to die is not unkillable -------------------------------------------------

BIG = ("import signal, sys; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
       "b = bytearray(b'\\x01') * (6 << 30)\n"  # 6 GiB touched: its exit takes ~0.3 s here
       "sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()")


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def test_large_leftover_that_takes_time_to_die_is_killed_not_unkillable() -> None:
    if _mem_available() < 12 << 30:
        pytest.skip("needs 12 GiB of free memory for a 6 GiB leftover")
    big = spawn([sys.executable, "-I", "-c", BIG], USER)
    try:
        assert big.stdout is not None
        if big.stdout.readline() != b"ready\n":
            pytest.skip("the 6 GiB leftover could not allocate its memory")
        out = cleanup.kill_leftovers([row(big.pid)], USER, grace=0.1)
        assert out["killed"] == [big.pid] and out["survivors"] == [], out
    finally:
        big.kill()
        big.wait()


# --- break 5: only what was signalled and died; a forged SLURM_JOB_ID is not the job's ------

def test_forged_job_id_of_another_user_is_neither_blamed_nor_listed_as_killed() -> None:
    env = JobEnv(job_id=JOB, node="thisnode", uid=USER)
    mine = spawn(["/bin/sleep", "1000"], USER)
    forger = spawn(["/bin/sleep", "1000"], STRANGER)  # exports the job's id as its own
    try:
        exec_done(mine)
        exec_done(forger)
        facts = procs.collect(make_cfg())
        listed = {p["pid"]: p for p in facts["processes"]}
        assert listed[forger.pid]["job_id"] == JOB  # what the environment claims
        leftovers = job_leftovers(facts, env)
        assert [p["pid"] for p in leftovers] == [mine.pid]
        findings: List[Any] = []
        done = clean_up(make_cfg(), env, facts, leftovers + [listed[forger.pid]], 0, findings)
        assert done["killed"] == [mine.pid] and findings == []
        assert alive(forger)
        mine.wait(5)
    finally:
        for p in (mine, forger):
            p.kill()
            p.wait()


# --- break 14: one file's errno is that file's finding -------------------------------------

SWAPPER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = sys.argv[1].encode(), sys.argv[2].encode()
sys.stdout.write("ready\n"); sys.stdout.flush()
while True:  # renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE)
    libc.syscall(316, -100, a, -100, b, 2)
"""


def test_file_directory_swap_during_clean_up_never_ends_it(tmp_path: Path) -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("the swapper calls renameat2 by its x86_64 syscall number")
    d = tmp_path / "shm"
    d.mkdir()
    name, other = d / "nccl-swap", d / "nccl-swap-dir"
    other.mkdir()
    swapper = subprocess.Popen([sys.executable, "-I", "-c", SWAPPER, str(name), str(other)], stdout=subprocess.PIPE)
    errors: List[Dict[str, Any]] = []
    try:
        wait_ready(swapper)
        deadline = time.monotonic() + 10
        while not errors and time.monotonic() < deadline:
            if not os.path.lexists(name) or not os.path.lexists(other):
                missing = name if not os.path.lexists(name) else other
                try:
                    os.close(os.open(missing, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except OSError:
                    pass
            _, errs = cleanup.remove_ipc_files([{"dir": str(d), "name": "nccl-swap"}], os.getuid())
            errors.extend(errs)
    finally:
        swapper.kill()
        swapper.wait()
    assert errors and errors[0]["error"].startswith("EISDIR"), "the swap never raced the unlink"


def test_immutable_file_is_a_finding_and_the_others_are_still_removed(tmp_path: Path) -> None:
    d = Path("/dev/shm") / f"cleanup-test-{os.getpid()}"
    d.mkdir()
    stuck, fine = d / "nccl-stuck", d / "nccl-fine"
    stuck.write_text("x")
    fine.write_text("y")
    for f in (stuck, fine):
        os.lchown(f, USER, USER)
    try:
        if subprocess.run(["chattr", "+i", str(stuck)], capture_output=True).returncode != 0:
            pytest.skip("chattr +i not supported here")
        env = JobEnv(job_id=JOB, node="thisnode", uid=USER)
        facts = {"processes": [], "running_jobs": [], "ipc_files": procs.scan_ipc([str(d)])}
        findings: List[Any] = []
        done = clean_up(make_cfg(), env, facts, [], 0, findings)
        assert done["removed"] == [str(fine)] and not fine.exists()
        assert [e["path"] for e in done["remove_errors"]] == [str(stuck)]
        assert done["remove_errors"][0]["error"].startswith("EPERM")
        (f,) = findings
        assert f.id == "leftover.cleanup" and f.verdict.value == "WARN" and not f.hardware
    finally:
        subprocess.run(["chattr", "-i", str(stuck)], capture_output=True)
        for f in (stuck, fine):
            if f.exists():
                f.unlink()
        d.rmdir()


# --- break 12 (clean-up side): names with byte 0xff, newlines, escapes ------------------------

def test_hostile_names_are_printable_and_still_removed_by_their_exact_bytes() -> None:
    d = Path("/dev/shm") / f"cleanup-test-{os.getpid()}"
    d.mkdir()
    raw = [b"nccl-\xff\xfe", b"nccl-x\n2026-12-01T00:00:00 slurm-triage prolog: FORGED", b"nccl-\x1b[2J\x1b[31mred"]
    try:
        for n in raw:
            fd = os.open(os.fsencode(d) + b"/" + n, os.O_CREAT | os.O_WRONLY, 0o600)
            os.fchown(fd, USER, USER)
            os.close(fd)
        rows = procs.scan_ipc([str(d)])
        assert len(rows) == 3
        for r in rows:
            r["path"].encode("utf-8")  # no surrogates: any UTF-8 writer takes it
            assert r["path"].isprintable() and "\n" not in r["path"] and "\x1b" not in r["path"]
        assert {r["name"] for r in rows} >= {"nccl-\\xff\\xfe", "nccl-\\x1b[2J\\x1b[31mred"}
        env = JobEnv(job_id=JOB, node="thisnode", uid=USER)
        done = clean_up(make_cfg(), env, {"processes": [], "running_jobs": [], "ipc_files": rows}, [], 0, [])
        assert len(done["removed"]) == 3 and os.listdir(d) == []
    finally:
        for n in os.listdir(os.fsencode(d)):
            os.unlink(os.fsencode(d) + b"/" + n)
        d.rmdir()
