"""Hook pieces that need no cluster: environment validation, GPU diff, safe IPC removal."""
from __future__ import annotations

import os

import pytest

from slurm_triage.hooks.env import EnvError, from_environ
from slurm_triage.hooks.cleanup import remove_ipc_files
from slurm_triage.hooks.epilog import gpu_diff
from slurm_triage.hooks.common import drain_reason
from slurm_triage.hooks.prolog import job_gpu_uuids
from slurm_triage.model import Finding, Verdict
from slurm_triage.slurmctl import parse_node

PROLOG_22_05 = {  # the exact Prolog environment observed on Slurm 22.05 (notes/slurm-lab.md §4)
    "SLURMD_NODENAME": "node2", "SLURM_CLUSTER_NAME": "lab", "SLURM_CONF": "/tmp/slurm-lab/etc/slurm.conf",
    "SLURM_JOBID": "12", "SLURM_JOB_ID": "12", "SLURM_JOB_CPUS_PER_NODE": "1(x3)", "SLURM_JOB_GID": "4242",
    "SLURM_JOB_NUM_NODES": "3", "SLURM_JOB_PARTITION": "debug", "SLURM_JOB_RESTART_COUNT": "0",
    "SLURM_JOB_UID": "4242", "SLURM_JOB_USER": "triage-test", "SLURM_JOB_WORK_DIR": "/tmp",
    "SLURM_NODELIST": "node[1-3]", "SLURM_SCRIPT_CONTEXT": "prolog_slurmd", "SLURM_UID": "4242", "PWD": "/",
}


def test_prolog_env_of_slurm_22_05():
    env = from_environ(PROLOG_22_05)
    assert (env.job_id, env.node, env.uid, env.user) == ("12", "node2", 4242, "triage-test")
    assert env.nodelist == "node[1-3]" and env.triage == "" and env.gpus is None


@pytest.mark.parametrize("value,mode,warned", [
    ("on", "on", False), ("", "on", False), ("deep", "deep", False), ("off", "", False),
    ("$(reboot)", "", True), ("../../x", "", True),
])
def test_spank_triage_is_a_closed_set(value, mode, warned):
    env = from_environ({**PROLOG_22_05, "SPANK_TRIAGE": value})
    assert env.triage == mode
    assert bool(env.warnings) == warned


@pytest.mark.parametrize("key,value", [("SLURM_JOB_ID", "12; rm -rf /"), ("SLURM_JOB_ID", "../12"),
                                       ("SLURMD_NODENAME", "../etc"), ("SLURMD_NODENAME", "")])
def test_unusable_job_id_or_node_is_refused(key, value):
    env = dict(PROLOG_22_05)
    env[key] = value
    if key == "SLURM_JOB_ID":
        env.pop("SLURM_JOBID")
    with pytest.raises(EnvError):
        from_environ(env)


def test_job_gpus_are_matched_by_minor_not_index():
    snap = {"gpu": {"gpus": [{"index": 0, "minor": 2, "uuid": "GPU-a"}, {"index": 1, "minor": 0, "uuid": "GPU-b"},
                             {"index": 2, "minor": 1, "uuid": "GPU-c"}]}}
    env = from_environ({**PROLOG_22_05, "SLURM_JOB_GPUS": "0,2"})
    assert job_gpu_uuids(snap, env) == ["GPU-a", "GPU-b"]
    assert job_gpu_uuids(snap, from_environ(PROLOG_22_05)) == ["GPU-a", "GPU-b", "GPU-c"]


def test_gpu_diff_energy_temperature_and_new_remap():
    base = {"gpus": [{"uuid": "GPU-a", "index": 0, "energy_joules": 1000.0, "temperature_celsius": 31,
                      "ecc_uncorrected_volatile": 0, "remap_pending": False}]}
    end = {"gpus": [{"uuid": "GPU-a", "index": 0, "energy_joules": 361000.0, "temperature_celsius": 58,
                     "ecc_uncorrected_volatile": 2, "remap_pending": True}]}
    d = gpu_diff(base, end, ["GPU-a", "GPU-gone"])
    assert d["GPU-a"]["energy_joules"] == 360000.0
    assert d["GPU-a"]["max_temperature_celsius"] == 58
    assert d["GPU-a"]["ecc_uncorrected_volatile_delta"] == 2 and d["GPU-a"]["remap_pending"] is True
    assert d["GPU-gone"] == {"missing_at": "end"}


def test_drain_reason_names_gpu_kernel_word_first_and_counts_the_rest():
    fails = [Finding("gpu.lost", Verdict.FAIL, "GPU 3 (GPU-3f2a, 0000:5d:00.0) is lost: NVML answers GPU_IS_LOST",
                     gpu="GPU-3f2a"),
             Finding("kernel.xid", Verdict.FAIL, "Xid 79 on GPU 3 (GPU-3f2a, 0000:5d:00.0): GPU has fallen off the bus",
                     gpu="GPU-3f2a")]
    assert drain_reason(fails) == "GPU-3f2a Xid 79: GPU has fallen off the bus (+1 more)"
    assert drain_reason(fails[:1]) == "GPU-3f2a is lost: NVML answers GPU_IS_LOST"


def test_parse_scontrol_reason_with_spaces_and_stamp():
    s = parse_node("NodeName=node2 Arch=x86_64 State=IDLE+DRAIN ThreadsPerCore=1 "
                   "Reason=triage: GPU-3f Xid 79 fell off [root@2026-11-29T15:47:40] Comment=(null)")
    assert s.state == "IDLE+DRAIN" and s.reason == "triage: GPU-3f Xid 79 fell off" and s.ours
    foreign = parse_node("NodeName=node3 State=IDLE+DRAIN Reason=bad DIMM, ticket 4711 [admin@2026-11-29T10:00:00]")
    assert foreign.reason == "bad DIMM, ticket 4711" and not foreign.ours
    assert parse_node("NodeName=node1 State=IDLE Partitions=debug").reason == ""


def test_remove_ipc_files_never_follows_links_or_touches_other_owners(tmp_path):
    uid = os.getuid()
    victim = tmp_path / "victim"
    victim.write_text("keep me")
    shm = tmp_path / "shm"
    shm.mkdir()
    (shm / "nccl-abc").write_text("x")
    (shm / "nccl-link").symlink_to(victim)
    entries = [{"dir": str(shm), "name": n} for n in ("nccl-abc", "nccl-link", "../victim")]
    removed, errors = remove_ipc_files(entries, uid)
    assert removed == [str(shm / "nccl-abc")] and errors == []
    assert victim.read_text() == "keep me" and (shm / "nccl-link").is_symlink()
    (shm / "nccl-other").write_text("y")
    assert remove_ipc_files([{"dir": str(shm), "name": "nccl-other"}], uid + 1) == ([], [])
    assert (shm / "nccl-other").exists()


def test_pushed_result_judgement_for_a_remote_resume():
    """Issue 11: a resume decided elsewhere needs the node's own fresh result after the drain,
    and a GPU drain is not undone by a result whose GPU probe did not answer."""
    from slurm_triage.node import judge_pushed

    def group(t: float, verdict: str = "OK", gpu_up: float = 1.0, node: str = "node2"):
        return {"labels": {"job": "slurm_triage", "instance": node},
                "slurm_triage_check_timestamp_seconds": {"metrics": [{"labels": {}, "value": str(t)}]},
                "slurm_triage_node_verdict": {"metrics": [{"labels": {"verdict": v}, "value": "1" if v == verdict
                                                           else "0"} for v in ("OK", "WARN", "FAIL", "UNKNOWN")]},
                "slurm_triage_probe_up": {"metrics": [{"labels": {"probe": "gpu"}, "value": str(gpu_up)}]}}

    gpu_reason = "triage: GPU-0dbc Xid 79: GPU has fallen off the bus"
    assert judge_pushed([group(1000.0)], "node2", 900.0, gpu_reason, 1100.0, 900.0).allowed
    assert not judge_pushed([], "node2", 900.0, gpu_reason, 1100.0, 900.0).allowed
    assert not judge_pushed([group(1000.0, node="node3")], "node2", 900.0, gpu_reason, 1100.0, 900.0).allowed
    assert "not newer" in judge_pushed([group(800.0)], "node2", 900.0, gpu_reason, 1100.0, 900.0).why
    assert "older than" in judge_pushed([group(1000.0)], "node2", 900.0, gpu_reason, 5000.0, 900.0).why
    assert "FAIL" in judge_pushed([group(1000.0, "FAIL")], "node2", 900.0, gpu_reason, 1100.0, 900.0).why
    no_gpu = judge_pushed([group(1000.0, "UNKNOWN", gpu_up=0.0)], "node2", 900.0, gpu_reason, 1100.0, 900.0)
    assert not no_gpu.allowed
    assert "GPU probe" in judge_pushed([group(1000.0, "WARN", gpu_up=0.0)], "node2", 900.0, gpu_reason,
                                       1100.0, 900.0).why
    # the newest of several results decides
    assert not judge_pushed([group(1000.0), group(1050.0, "FAIL")], "node2", 900.0, gpu_reason, 1100.0, 900.0).allowed
