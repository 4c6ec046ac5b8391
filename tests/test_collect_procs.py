"""collect/procs.py and collect/jobs.py against real processes, sockets and files.

Job ids are taken from recorded real /proc/PID/cgroup contents (tests/data/procs) and
from real child processes that carry SLURM_JOB_ID, as proctrack/linuxproc leaves it.
"""
from __future__ import annotations

import ctypes.util
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict

import pytest

from slurm_triage.collect import jobs, procs
from slurm_triage.config import Config, defaults

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "procs"
sys.path.insert(0, str(ROOT / "bench"))
from procs_fixture import Fleet, JobProcess, wildcard_listener_facts  # noqa: E402

DEAD_JOB = "987654321"  # no slurmstepd runs it, on any node of the lab


def make_cfg(**procs_keys: Any) -> Config:
    values = defaults()
    values["node"]["name"] = "thisnode"
    values["procs"].update(procs_keys)
    return Config(values)


def by_pid(section: Dict[str, Any], pid: int) -> Dict[str, Any]:
    rows = [p for p in section["processes"] if p["pid"] == pid]
    assert rows, f"pid {pid} not listed"
    return rows[0]


# --- job ids from recorded cgroup files and process titles -------------------------------

@pytest.mark.parametrize("name,job", [("cgroup_v1_slurm.txt", "11811379"), ("cgroup_v2_slurm.txt", "1392969"),
                                      ("cgroup_v1_interactive.txt", "280678"),
                                      ("cgroup_hybrid_not_slurm.txt", None)])
def test_job_from_recorded_cgroup(name: str, job: str) -> None:
    assert jobs.job_from_cgroup((DATA / name).read_bytes()) == job


def test_job_from_cgroup_needs_a_whole_path_component() -> None:
    assert jobs.job_from_cgroup(b"0::/user.slice/job_12abc/x\n") is None
    assert jobs.job_from_cgroup(b"0::/system.slice/slurmstepd.scope/job_77\n") == "77"


def test_job_from_recorded_stepd_titles() -> None:
    for line in (DATA / "stepd_titles.txt").read_text().splitlines():
        title, job = line.split("\t")
        assert jobs.job_from_stepd_title(title.encode() + b"\0") == job
    assert jobs.job_from_stepd_title(b"/usr/sbin/slurmstepd\0") is None
    assert jobs.job_from_stepd_title(b"slurmstepd: [extern]\0") is None


def test_job_cgroup_dirs_walks_only_slurm_subtrees(tmp_path: Path) -> None:
    """Layouts of Slurm's v1 (per controller), v2 and hybrid trees, plus decoys."""
    for d in ("memory/slurm/uid_1000/job_123/step_0/task_0", "freezer/slurm/uid_1000/job_123/step_0",
              "system.slice/slurmstepd.scope/job_7/step_extern",
              "unified/system.slice/node2_slurmstepd.scope/job_8/step_0",
              "user.slice/job_99", "memory/docker/job_55", "system.slice/slurmstepd.scope/job_x"):
        (tmp_path / d).mkdir(parents=True)
    assert jobs.job_cgroup_dirs(str(tmp_path)) == ["7", "8", "123"]


# --- the real /proc -----------------------------------------------------------------------

def test_collect_reports_a_leftover_rank(tmp_path: Path) -> None:
    ipc = f"/dev/shm/nccl-{secrets.token_hex(6)}"
    with JobProcess(DEAD_JOB, ipc_path=ipc, node="thisnode") as rank:
        t0 = time.time()
        facts = procs.collect(make_cfg(ipc_dirs=["/dev/shm"]))
        p = by_pid(facts, rank.pid)
        assert p["job_id"] == DEAD_JOB and p["job_source"] == "environ" and p["node"] == "thisnode"
        assert {"proto": "tcp", "addr": "127.0.0.1", "port": rank.port} in p["listen"]
        assert p["uid"] == os.getuid() and p["ppid"] == os.getpid() and p["state"] in "RS"
        assert abs(p["start_time"] - t0) < 30 and p["threads"] >= 1
        assert p["comm"].startswith("python") and "-c" in p["cmdline"] and len(p["cmdline"]) <= procs.CMDLINE_MAX
        assert p["shm"] == [ipc] and p["dev_nvidia"] == []
        ipc_rows = [f for f in facts["ipc_files"] if f["path"] == ipc]
        assert ipc_rows == [{"path": ipc, "dir": "/dev/shm", "name": os.path.basename(ipc), "kind": "nccl",
                             "uid": os.getuid(), "size_bytes": 4096, "mtime": os.lstat(ipc).st_mtime,
                             "symlink": False}]
        assert DEAD_JOB not in facts["running_jobs"] and facts["jobs_source"] == "slurmstepd"
        assert all(s["port"] != rank.port for s in facts["listeners"])  # loopback: not public
    assert not os.path.lexists(ipc)


def test_collect_never_reports_itself() -> None:
    """Hooks run with SLURM_JOB_ID of the very job they judge: the collector never lists itself."""
    code = ("import json, os, socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
            "from slurm_triage.collect import procs; from slurm_triage.config import load\n"
            "f = procs.collect(load())\n"
            "print(json.dumps([os.getpid(), [p['pid'] for p in f['processes']]]))")
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": DEAD_JOB, "SLURM_TRIAGE_CONFIG": ""}
    out = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    me, listed = json.loads(out)
    assert me not in listed


def test_symlink_is_reported_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "secret"
    target.write_bytes(b"x" * 12345)
    if os.geteuid() == 0:
        os.chown(target, 65534, 65534)  # a following scan would report uid 65534
    link = f"/dev/shm/nccl-evil-{secrets.token_hex(6)}"
    os.symlink(str(target), link)
    try:
        before = os.stat(target).st_atime_ns
        rows = [f for f in procs.scan_ipc(["/dev/shm"]) if f["path"] == link]
        assert len(rows) == 1 and rows[0]["symlink"] is True
        assert rows[0]["size_bytes"] == len(str(target)) != 12345
        assert rows[0]["uid"] == os.lstat(link).st_uid == os.geteuid()
        assert os.stat(target).st_atime_ns == before
    finally:
        os.unlink(link)


def test_ipc_kinds_and_unrelated_files(tmp_path: Path) -> None:
    names = {"nccl-AbC123": "nccl", "vader_segment.node1.1234.0": "mpi", "psm2_shm.abc": "psm2",
             "ucx_shm_posix_1f": "ucx", "torchelastic_x1y2": "torch", "openmpi-sessions-0@node1_0": "mpi",
             "sem.mp-abc": None, "notes.txt": None}
    for n in names:
        (tmp_path / n).write_bytes(b"")
    (tmp_path / "torch_dir").mkdir()
    rows = procs.scan_ipc([str(tmp_path), str(tmp_path / "missing")])
    got = {r["name"]: r["kind"] for r in rows}
    assert got == {**{n: k for n, k in names.items() if k}, "torch_dir": "torch"}


def test_public_listener_has_owner_and_job() -> None:
    """A rank's wildcard listener, opened and scanned in a network namespace of the test's own."""
    got = wildcard_listener_facts(DEAD_JOB, {})
    if got is None:
        pytest.skip("no network namespace here (needs root and unshare); the wildcard address decoding "
                    "is checked on recorded /proc/net lines, the owner and job on a loopback listener")
    facts, pid, port = got
    rows = [s for s in facts["listeners"] if s["port"] == port]
    assert rows == [{"proto": "tcp", "addr": "0.0.0.0", "port": port, "uid": os.getuid(),
                     "pid": pid, "job_id": DEAD_JOB}]


def test_mapped_communication_libraries(tmp_path: Path) -> None:
    """A real shared object (zlib) loaded under NCCL's and PSM2's file names shows up in maps."""
    zlib = ctypes.util.find_library("z")
    if zlib is None:
        pytest.skip("zlib not installed")
    src = next(Path(d) / zlib for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/usr/lib64",
                                        "/lib64", "/usr/lib/aarch64-linux-gnu") if (Path(d) / zlib).exists())
    libs = [tmp_path / "libnccl.so.2", tmp_path / "libpsm2.so.2"]
    for lib in libs:
        shutil.copy(src, lib)
    with JobProcess(DEAD_JOB, libs=[str(x) for x in libs]) as rank:
        p = by_pid(procs.collect(make_cfg()), rank.pid)
    assert p["libs"] == ["nccl", "psm2"]


def test_only_processes_of_interest_are_listed() -> None:
    sleeper = subprocess.Popen(["sleep", "60"], env={"PATH": "/usr/bin:/bin"})
    try:
        with JobProcess(None) as plain, JobProcess("424242") as rank:
            facts = procs.collect(make_cfg())
    finally:
        sleeper.kill()
        sleeper.wait()
    listed = {p["pid"] for p in facts["processes"]}
    # a loopback listener outside any job (an sshd, a local dashboard) is not a leftover candidate
    assert sleeper.pid not in listed and plain.pid not in listed
    p = by_pid(facts, rank.pid)
    assert p["job_id"] == "424242" and p["job_source"] == "environ" and p["libs"] == [] and "node" not in p
    assert p["listen"] == [{"proto": "tcp", "addr": "127.0.0.1", "port": rank.port}]


def test_decode_addr_from_recorded_proc_net_lines() -> None:
    # /proc/net/tcp and tcp6 local_address columns on this VM (x86-64, little endian)
    assert procs.decode_addr("0100007F:1F90") == ("127.0.0.1", 8080)
    assert procs.decode_addr("00000000:07E8") == ("0.0.0.0", 2024)
    assert procs.decode_addr("00000000000000000000000001000000:0016") == ("::1", 22)
    assert procs.decode_addr("00000000000000000000000000000000:20FB") == ("::", 8443)


def test_sock_diag_lists_what_proc_net_tcp_lists_as_listening() -> None:
    """The kernel's own answer (netlink) against its text one, for IPv4 and IPv6 listeners opened here."""
    import socket as sk

    from slurm_triage.collect import sockdiag

    opened = []
    for family, addr in ((sk.AF_INET, "127.0.0.1"), (sk.AF_INET6, "::1")):
        try:
            s = sk.socket(family)
            s.bind((addr, 0))
        except OSError:
            continue  # no IPv6 on this machine
        s.listen(1)
        opened.append(s)
    try:
        slow, _ = procs._listening("/proc/.")  # another path to the same /proc: the text tables (the fallback)
        for s in opened:
            ino = os.fstat(s.fileno()).st_ino
            assert slow[ino][1:] == (s.getsockname()[0], s.getsockname()[1], os.getuid())
        fast = sockdiag.listening()
        if fast is None:  # e.g. a container on a host without inet_diag loaded: the scan reads /proc/net/tcp
            pytest.skip("no sock_diag for TCP on this kernel; the /proc/net/tcp fallback was checked above")
        assert fast == slow
    finally:
        for s in opened:
            s.close()


def test_without_sock_diag_the_scan_reads_listeners_from_proc_net_tcp(monkeypatch) -> None:
    from slurm_triage.collect import sockdiag

    monkeypatch.setattr(sockdiag, "listening", lambda timeout=1.0: None)  # what a kernel without inet_diag answers
    with JobProcess(DEAD_JOB) as rank:
        p = by_pid(procs.collect(make_cfg()), rank.pid)
    assert {"proto": "tcp", "addr": "127.0.0.1", "port": rank.port} in p["listen"]


def test_a_listed_process_counts_its_connected_tcp_sockets() -> None:
    """Connections are not in the listening table: they are read from /proc/net/tcp for listed processes only."""
    code = ("import socket, sys; l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen(1); "
            "c = socket.create_connection(l.getsockname()); a, _ = l.accept(); "
            "sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()")
    p = subprocess.Popen([sys.executable, "-I", "-c", code], env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": DEAD_JOB},
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        row = by_pid(procs.collect(make_cfg()), p.pid)
        assert row["tcp_connections"] == 2 and len(row["listen"]) == 1  # both ends of its own connection
    finally:
        p.stdin.close()
        p.wait(timeout=30)


def test_fleet_every_process_listed_with_job_and_port() -> None:
    """The benchmark fleet, small: every member is found with its job and listener."""
    with Fleet(40, job_id=DEAD_JOB) as fleet:
        facts = procs.collect(make_cfg())
    rows = {p["pid"]: p for p in facts["processes"] if p["pid"] in set(fleet.pids)}
    assert set(rows) == set(fleet.pids)
    assert all(r["job_id"] == DEAD_JOB and len(r["listen"]) == 1 and r["unix_sockets"] == 2
               for r in rows.values())


# --- hostile input: a user's process titled like slurmstepd (issue 13, break 3) ----------------

FAKE_STEPD = ("import ctypes, sys; ctypes.CDLL(None).prctl(15, b'slurmstepd', 0, 0, 0)\n"  # PR_SET_NAME
              "sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()")


def _fake_stepd(job: str, uid: int) -> subprocess.Popen:
    """comm "slurmstepd" and the title "slurmstepd: [JOB.0]", as any user can set them."""
    def drop() -> None:
        if uid != os.getuid():
            os.setgid(uid)
            os.setuid(uid)

    p = subprocess.Popen([f"slurmstepd: [{job}.0]", "-I", "-c", FAKE_STEPD], executable=sys.executable,
                         env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": job}, preexec_fn=drop,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline() == "ready\n"
    return p


@pytest.mark.parametrize("as_user", [False, True])
def test_process_titled_slurmstepd_is_not_a_step_and_hides_nothing(as_user: bool) -> None:
    if as_user and os.geteuid() != 0:
        pytest.skip("needs root to run the fake step as another user")
    uid = 4242 if as_user else os.getuid()  # root: the executable gives it away; a user: the uid
    fake = _fake_stepd(DEAD_JOB, uid)
    try:
        with JobProcess(DEAD_JOB, node="thisnode") as rank:
            assert Path(f"/proc/{fake.pid}/comm").read_text().strip() == "slurmstepd"
            facts = procs.collect(make_cfg(ipc_dirs=[]))
            assert DEAD_JOB not in facts["running_jobs"]
            if as_user:  # listed, as the leftover it is (a root process without sockets is not a candidate)
                assert by_pid(facts, fake.pid)["job_id"] == DEAD_JOB
            assert by_pid(facts, rank.pid)["job_id"] == DEAD_JOB
    finally:
        fake.kill()
        fake.wait(10)


# --- another job's hook beside this one: Slurm's process, not the job's leftover ----------------

HOOK_LIKE = ("import socket, sys; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(1)\n"
             "sys.stdout.write('ready\\n'); sys.stdout.flush(); sys.stdin.read()")


@pytest.mark.parametrize("as_user", [False, True])
def test_another_jobs_hook_is_not_a_leftover_but_a_user_posing_as_one_is(as_user: bool) -> None:
    """A root `python -m slurm_triage.hooks prolog` of job J still running (its publisher, its exit)
    when the next job's Prolog scans carries SLURM_JOB_ID=J; a user's process with the same command
    line is an ordinary leftover."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a hook runs as root, and the user variant needs setuid")
    uid = 4242 if as_user else 0

    def drop() -> None:
        if as_user:
            os.setgid(uid)
            os.setuid(uid)

    p = subprocess.Popen([sys.executable, "-I", "-c", HOOK_LIKE, "-m", "slurm_triage.hooks", "prolog"],
                         env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": DEAD_JOB}, preexec_fn=drop,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
        listed = {r["pid"]: r for r in procs.collect(make_cfg(ipc_dirs=[]))["processes"]}
        if as_user:
            assert listed[p.pid]["job_id"] == DEAD_JOB
        else:
            assert p.pid not in listed
    finally:
        p.kill()
        p.wait(10)
