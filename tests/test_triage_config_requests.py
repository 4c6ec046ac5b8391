"""A job whose own request or launch is wrong, read from the line that says so (catalog/config.toml,
config_context.toml, rules/slurm.memory_request_refused, rules/nccl.store_barrier_timeouts): the
refusal, the abort or the hang names the job's configuration, not the scheduler or the fabric.
Lines are real (the dev corpus cases and threads the catalog entries cite)."""
from __future__ import annotations

from pathlib import Path
from typing import List

from slurm_triage.triage import catalog, triage_logs
from slurm_triage.triage.model import TriageFinding

BY_ID = {e.id: e for e in catalog.entries()}


def example(entry_id: str, i: int = 0) -> str:
    return BY_ID[entry_id].examples[i]


def run(tmp_path: Path, lines: List[str]) -> List[TriageFinding]:
    log = tmp_path / "job.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return triage_logs([str(log)]).findings


SUBMIT_WITH_MEM = ("usegalaxy.jobs.rules.multi_dynamic_walltime DEBUG 2019-04-30 14:48:11,283 (23319939) Testing job "
                   "submission to determine suitable cluster: sbatch --test-only --clusters=jetstream-iu,jetstream-tacc "
                   "--time=36:00:00 --nodes=1 --partition=multi --mem=32972 /usr/bin/ldd")
CLUSTER_REFUSAL = ("AssertionError: sbatch: error: Problem with submit to cluster jetstream-iu: Requested node "
                   "configuration is not available")
CPU_BIND = ("   srun: error: CPU binding outside of job step allocation, allocated CPUs are: "
            "0x00000000000003000000000000070000000000000300000000000007.")
GTL = ("MPICH ERROR [Rank 0] [job id 410301.1] [Thu Feb 13 12:42:18 2025] [nid005414] - Abort(-1) (rank 0 in comm 0): "
       "MPIDI_CRAY_init: GPU_SUPPORT_ENABLED is requested, but GTL library is not linked")
PLAIN_REFUSAL = "sbatch: error: Batch job submission failed: Requested node configuration is not available"


def test_a_refusal_beside_the_jobs_memory_request_names_the_request(tmp_path: Path) -> None:
    root = run(tmp_path, [SUBMIT_WITH_MEM, CLUSTER_REFUSAL])[0]
    assert (root.id, root.category) == ("log.memory_request_refused", "config")
    assert root.evidence["requests"] == ["--mem=32972"] and root.evidence["clusters"] == ["jetstream-iu"]
    assert root.confidence < 0.8
    # Without the job's memory request the refusal stays the scheduler's; the request alone says nothing.
    findings = run(tmp_path, ["$ sinteractive -t 1:00:00 --gres=gpu:teslap100:1", PLAIN_REFUSAL])
    assert findings[0].category == "scheduler"
    assert all(f.id != "log.memory_request_refused" for f in findings)
    assert all(f.category != "config" for f in run(tmp_path, [SUBMIT_WITH_MEM, "#SBATCH --mem=64G"]))


def test_an_unsatisfiable_memory_specification_goes_before_the_refusal(tmp_path: Path) -> None:
    findings = run(tmp_path, ["sbatch: error: Memory specification can not be satisfied", PLAIN_REFUSAL])
    assert (findings[0].id, findings[0].category) == ("log.slurm_memory_spec_unsatisfiable", "config")


def test_cpu_binding_outside_the_step_is_the_launchs_configuration(tmp_path: Path) -> None:
    root = run(tmp_path, [CPU_BIND,
                          "   srun: error: Task launch for StepId=1932.2 failed on node rzwhippet40: "
                          "Unable to satisfy cpu bind request",
                          "   srun: error: Application launch failed: Unable to satisfy cpu bind request"])[0]
    assert (root.id, root.category) == ("log.slurm_cpu_bind_outside_step", "config")
    assert root.evidence["mask"].startswith("0x")


def test_gpu_aware_mpi_without_gtl_is_a_build_configuration(tmp_path: Path) -> None:
    root = run(tmp_path, [GTL, " (Other MPI error)", "aborting job:",
                          "MPIDI_CRAY_init: GPU_SUPPORT_ENABLED is requested, but GTL library is not linked"])[0]
    assert (root.id, root.category) == ("log.cray_mpich_gtl_not_linked", "config")


def test_an_unresolvable_launch_host_is_the_host_list(tmp_path: Path) -> None:
    root = run(tmp_path, ["ssh: Could not resolve hostname localhost:4: Temporary failure in name resolution"])[0]
    assert (root.id, root.category) == ("log.launcher_host_unresolvable", "config")
    assert root.evidence["host"] == "localhost:4"


def test_an_image_without_rdma_providers_explains_the_nccl_failure(tmp_path: Path) -> None:
    findings = run(tmp_path, ["libibverbs: Warning: no userspace device-specific driver found for /sys/class/infiniband_verbs/uverbs0",
                              "ip-0AB85F07: Test NCCL failure common.cu:775 'internal error'"])
    assert (findings[0].id, findings[0].category) == ("log.setting.ibverbs_no_provider", "config")
    assert findings[0].confidence < 0.8


def test_the_periodic_barrier_wait_with_too_many_workers_is_a_launch_misconfiguration(tmp_path: Path) -> None:
    root = run(tmp_path, [("Waiting in store based barrier to initialize process group for rank: 0, key: store_based_barrier_key:1 "
                          "(world_size=2, worker_count=4, timeout=1 day, 0:00:00)")])[0]
    assert (root.id, root.category) == ("log.store_barrier", "config")
    assert root.evidence["worker_count"] == 4 and root.evidence["world_size"] == 2


def test_a_barrier_wait_short_of_world_size_is_a_weaker_hang_than_a_timeout(tmp_path: Path) -> None:
    waiting = ("Waiting in store based barrier to initialize process group for rank: 0, key: "
               "store_based_barrier_key:1 (world_size=8, num_workers_joined=4, timeout=0:30:00)")
    root = run(tmp_path, [waiting])[0]
    assert (root.id, root.category) == ("log.store_barrier", "collective_hang")
    assert root.confidence < run(tmp_path, [example("barrier_timeout")])[0].confidence
