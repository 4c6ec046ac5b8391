"""Issue 13 item 6: job attribution with Slurm 26.05's SLUID-named cgroup v2 paths and the
pre-26.05 / CgroupJobIdPaths=yes ``job_<id>`` form, from the paths of Slurm's own
documentation (tests/data/procs/README.md). A SLUID becomes a job id only from evidence the
job's user cannot forge: our own SLURM_JOB_SLUID/SLURM_JOB_ID, or the slurmstepd (root) in
the SLUID's ``step_*/slurm`` cgroup."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurm_triage import ids
from slurm_triage.step import watcher
from slurm_triage.collect import jobs

DATA = Path(__file__).parent / "data" / "procs"
SLUID = "s5K1KKYAYG5D00"  # job 3385 in doc/html/cgroup_v2.shtml


@pytest.fixture(autouse=True)
def fresh_cache(monkeypatch):
    monkeypatch.setattr(jobs, "_known", {})
    monkeypatch.setattr(jobs, "_unknown", {})
    monkeypatch.delenv("SLURM_JOB_SLUID", raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)


def doc_tree(root: Path, proc: Path) -> None:
    """The doc's slurmstepd.scope tree: cgroup dirs with cgroup.procs, and /proc entries."""
    job = root / "system.slice" / "slurmstepd.scope" / SLUID
    procs = {"step_0/slurm": (113630, b"slurmstepd: [3385.0]\0"), "step_0/user/task_0": (113635, b"/usr/bin/sleep\0123\0"),
             "step_extern/slurm": (113565, b"slurmstepd: [3385.extern]\0")}
    for rel, (pid, cmdline) in procs.items():
        (job / rel).mkdir(parents=True)
        (job / rel / "cgroup.procs").write_text(f"{pid}\n")
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(cmdline)


def test_every_sluid_in_slurms_docs_is_well_formed_and_numbers_are_not():
    for line in (DATA / "sluids.txt").read_text().splitlines():
        assert ids.is_sluid(line.split("\t")[0]), line
    for bad in ("3385", "job_3385", "s5K1KKYAYG5D0", "s5K1KKYAYG5D000", "S5K1KKYAYG5D00", "s5K1KKYAYG5DO0",
                "sZK1KKYAYG5D00", "s5K1KKYAYG5D00\n"):
        assert not ids.is_sluid(bad), bad


@pytest.mark.parametrize("name,step", [("cgroup_v2_sluid_task.txt", "0"), ("cgroup_v2_sluid_stepd.txt", "0"),
                                       ("cgroup_v2_sluid_extern.txt", "extern"),
                                       ("cgroup_v2_sluid_interactive.txt", "interactive")])
def test_sluid_paths_name_the_job_and_step(name, step):
    text = (DATA / name).read_bytes()
    assert jobs.cgroup_step(text) == (SLUID, step)


@pytest.mark.parametrize("name,job", [("cgroup_v2_slurm.txt", ("1392969", "0")),
                                      ("cgroup_v1_slurm.txt", ("11811379", "0")),
                                      ("cgroup_v1_interactive.txt", ("280678", "interactive")),
                                      ("cgroup_v2_stepd_waiting.txt", None),
                                      ("cgroup_hybrid_not_slurm.txt", None)])
def test_job_id_paths_still_name_the_job_and_step(name, job):
    got = jobs.cgroup_step((DATA / name).read_bytes())
    assert got == job, got


def test_a_sluid_outside_slurms_scope_is_no_job(tmp_path):
    for text in (b"0::/user.slice/s5K1KKYAYG5D00/step_0\n", b"0::/system.slice/slurmstepd.scope/s5K1KKYAYG5D0/step_0\n",
                 b"0::/system.slice/my-slurmstepd.scopes/s5K1KKYAYG5D00/step_0\n"):
        assert jobs.cgroup_step(text) is None, text
        assert jobs.job_from_cgroup(text, str(tmp_path), str(tmp_path)) is None, text
    multi = b"0::/system.slice/node2_slurmstepd.scope/s5K1KKYAYG5D00/step_0/user/task_0\n"  # MULTIPLE_SLURMD
    assert jobs.cgroup_step(multi) == (SLUID, "0")


def test_the_hooks_own_sluid_resolves_from_its_environment(tmp_path, monkeypatch):
    """slurmd gives the Prolog/Epilog SLURM_JOB_SLUID with SLURM_JOB_ID (prolog_epilog.shtml)."""
    text = (DATA / "cgroup_v2_sluid_task.txt").read_bytes()
    assert jobs.job_from_cgroup(text, str(tmp_path), str(tmp_path)) == SLUID  # nothing says which job
    monkeypatch.setenv("SLURM_JOB_SLUID", SLUID)
    monkeypatch.setenv("SLURM_JOB_ID", "3385")
    assert jobs.environ_sluid() == (SLUID, "3385")
    assert jobs.job_from_cgroup(text, str(tmp_path), str(tmp_path)) == "3385"
    monkeypatch.setenv("SLURM_JOB_SLUID", "3385")  # malformed: ignored
    assert jobs.environ_sluid() is None


def test_a_running_jobs_sluid_resolves_from_its_slurmstepd(tmp_path, monkeypatch):
    """Another job running on the node (the Prolog of a shared node): its slurmstepd names it."""
    root, proc = tmp_path / "cg", tmp_path / "proc"
    doc_tree(root, proc)
    monkeypatch.setattr(jobs, "STEPD_UID", os.geteuid())
    text = (DATA / "cgroup_v2_sluid_task.txt").read_bytes()
    assert jobs.job_from_cgroup(text, str(root), str(proc)) == "3385"
    assert jobs.job_cgroup_dirs(str(root), proc=str(proc)) == ["3385"]


def test_a_slurmstepd_title_not_owned_by_root_resolves_nothing(tmp_path, monkeypatch):
    """A user's process titled like a slurmstepd (break 3) cannot name a SLUID's job."""
    root, proc = tmp_path / "cg", tmp_path / "proc"
    doc_tree(root, proc)
    monkeypatch.setattr(jobs, "STEPD_UID", os.geteuid() + 1)
    text = (DATA / "cgroup_v2_sluid_task.txt").read_bytes()
    assert jobs.job_from_cgroup(text, str(root), str(proc)) == SLUID
    assert jobs.job_cgroup_dirs(str(root), proc=str(proc)) == [SLUID]


def test_an_ended_jobs_sluid_stays_its_name_and_is_asked_again_only_later(tmp_path, monkeypatch):
    """A leftover of a job that no longer runs: no slurmstepd; the SLUID is the job's name."""
    root, proc = tmp_path / "cg", tmp_path / "proc"
    (root / "system.slice" / "slurmstepd.scope" / SLUID / "step_0" / "user" / "task_0").mkdir(parents=True)
    text = (DATA / "cgroup_v2_sluid_task.txt").read_bytes()
    assert jobs.job_from_cgroup(text, str(root), str(proc)) == SLUID
    doc_tree_later = root / "system.slice" / "slurmstepd.scope" / SLUID / "step_0" / "slurm"
    doc_tree_later.mkdir()
    (doc_tree_later / "cgroup.procs").write_text("113630\n")
    (proc / "113630").mkdir(parents=True)
    (proc / "113630" / "cmdline").write_bytes(b"slurmstepd: [3385.0]\0")
    monkeypatch.setattr(jobs, "STEPD_UID", os.geteuid())
    assert jobs.job_from_cgroup(text, str(root), str(proc)) == SLUID  # within the retry interval: cached
    monkeypatch.setattr(jobs, "_RETRY_SECONDS", 0.0)
    assert jobs.job_from_cgroup(text, str(root), str(proc)) == "3385"


def test_job_ids_and_sluids_sort_together():
    assert sorted(["12", SLUID, "3"], key=jobs.sort_key) == ["3", "12", SLUID]


# --- the watcher's step membership ---------------------------------------------------------

def fake_proc(tmp_path: Path, pid: int, cgroup: bytes, environ: bytes = b"") -> None:
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "cgroup").write_bytes(cgroup)
    (tmp_path / str(pid) / "environ").write_bytes(environ)


def test_watcher_membership_accepts_both_path_forms(tmp_path, monkeypatch):
    monkeypatch.setattr(watcher, "PROC", str(tmp_path))
    ctx = watcher.WatchContext("3385", "0", "node1", 0, 0, "on", sluid=SLUID)
    fake_proc(tmp_path, 10, (DATA / "cgroup_v2_sluid_task.txt").read_bytes(), b"SLURM_STEP_GPUS=0,1\0")
    fake_proc(tmp_path, 11, b"0::/system.slice/slurmstepd.scope/job_3385/step_0/user/task_0\n")
    fake_proc(tmp_path, 12, (DATA / "cgroup_v2_sluid_extern.txt").read_bytes())  # another step
    fake_proc(tmp_path, 13, b"0::/system.slice/slurmstepd.scope/s4SNKN57XZTE00/step_0/user/task_0\n",
              b"SLURM_JOB_ID=3385\0SLURM_STEP_ID=0\0")  # another job's cgroup: its environ is not believed
    assert watcher._membership(10, ctx) == (True, "0,1")
    assert watcher._membership(11, ctx)[0] is True
    assert watcher._membership(12, ctx)[0] is False
    assert watcher._membership(13, ctx)[0] is False


def test_watcher_without_a_known_sluid_reads_it_from_the_process_environment(tmp_path, monkeypatch):
    """SLURM_JOB_SLUID in the task's environment (src/common/env.c) ties a SLUID cgroup to the step."""
    monkeypatch.setattr(watcher, "PROC", str(tmp_path))
    ctx = watcher.WatchContext("3385", "0", "node1", 0, 0, "on")
    task = (DATA / "cgroup_v2_sluid_task.txt").read_bytes()
    fake_proc(tmp_path, 20, task, b"SLURM_JOB_ID=3385\0SLURM_JOB_SLUID=%s\0SLURM_STEP_ID=0\0" % SLUID.encode())
    fake_proc(tmp_path, 21, task, b"SLURM_JOB_ID=3385\0SLURM_JOB_SLUID=s4SNKN57XZTE00\0SLURM_STEP_ID=0\0")
    fake_proc(tmp_path, 22, task, b"SLURM_JOB_ID=3385\0SLURM_STEP_ID=0\0")
    assert watcher._membership(20, ctx)[0] is True
    assert watcher._membership(21, ctx)[0] is False  # its environment names another SLUID
    assert watcher._membership(22, ctx)[0] is False  # a SLUID cgroup and no SLUID to match it


def test_watcher_learns_its_steps_sluid_from_the_slurmstepd_cgroup(tmp_path, monkeypatch):
    monkeypatch.setattr(watcher, "PROC", str(tmp_path))
    fake_proc(tmp_path, 30, (DATA / "cgroup_v2_sluid_stepd.txt").read_bytes())
    fake_proc(tmp_path, 31, (DATA / "cgroup_v2_slurm.txt").read_bytes())
    ctx = watcher.WatchContext("3385", "0", "node1", 0, 0, "on")
    assert watcher.with_sluid(ctx, 30).sluid == SLUID
    assert watcher.with_sluid(ctx, 31).sluid == ""  # job_<id> paths: nothing to learn
    other = watcher.WatchContext("3385", "1", "node1", 0, 0, "on")
    assert watcher.with_sluid(other, 30).sluid == ""  # not this step's slurmstepd


def test_the_sluid_job_dir_path_is_the_one_under_the_cgroup_root(tmp_path, monkeypatch):
    """resolve_sluid looks for the slurmstepd in <cgroup root><path up to the SLUID>."""
    seen = []
    monkeypatch.setattr(jobs, "_stepd_job", lambda job_dir, proc: seen.append(job_dir))
    jobs.job_from_cgroup(b"1:name=systemd:/x\n0::/system.slice/node2_slurmstepd.scope/s5K1KKYAYG5D00/step_0/user\n",
                         "/sys/fs/cgroup", str(tmp_path))
    assert seen == ["/sys/fs/cgroup/system.slice/node2_slurmstepd.scope/s5K1KKYAYG5D00"]
