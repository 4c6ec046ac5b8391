"""A loud failure next to quieter evidence of its cause in one paste: the cause wins (sources: tests/corpus
dev cases and the tools' own output formats, named per test)."""
from __future__ import annotations

from pathlib import Path
from typing import List

from slurm_triage.triage import parsers, triage_logs
from slurm_triage.triage.model import TriageFinding

CORPUS = Path(__file__).parent / "corpus"
# gpu-node-xid79-gddr6x-heat-soak: a kernel Xid line and the nvidia-smi -q section pasted without its GPU header.
XID79 = "NVRM: Xid (PCI:0000:06:00): 79, pid=..., GPU has fallen off the bus."
XID48 = "NVRM: Xid (PCI:0000:06:00): 48, pid=2419, DBE (double bit error) ECC error"
REASONS = ["Clocks Event Reasons", "    SW Thermal Slowdown               : Active      (bitmask 0x20)"]
# llm-d-352-leftover-nccl-psm-shm-files-fill-dev-shm-crashloop
NCCL_SYS = ("ERROR 10-13 09:06:25 [v1/executor/multiproc_executor.py:597] RuntimeError: NCCL error: unhandled "
            "system error (run with NCCL_DEBUG=INFO for details)")
SEGMENTS = ["# ls -alht /dev/shm", "total 1.3G",
            "-rw-------  1 root root 161M Oct 11 04:32 psm_449c5ca7",
            "-rw-------  1 root root 101M Oct 11 04:32 psm_bc8e4e61",
            "-rw-------  1 root root  32M Oct 11 04:23 nccl-9cfUN2",
            "-rw-------  1 root root  32M Oct 11 04:23 nccl-GdBdNK"]
# open-gpu-kernel-modules-456-uvm-spin-loop-unkillable-hang: a call trace pasted without its report.
UVM_TRACE = ["[<ffffffffc33d41c2>] uvm_spin_loop+0xb2/0xe0 [nvidia_uvm]",
             "[<ffffffffc3418ab3>] wait_for_entry_with_spin+0x63/0x170 [nvidia_uvm]",
             "[<ffffffffc341912c>] uvm_tracker_wait_for_entry+0x4c/0x70 [nvidia_uvm]",
             "[<ffffffffc3416f2c>] uvm_push_end_and_wait+0x4c/0x70 [nvidia_uvm]"]
# The hung-task report's fixed text (kernel/hung_task.c: "INFO: task %s:%d blocked for more than %ld seconds.").
HUNG = ["[ 4956.171263] INFO: task python:41734 blocked for more than 120 seconds.",
        "[ 4956.171270] \"echo 0 > /proc/sys/kernel/hung_task_timeout_secs\" disables this message.",
        "[ 4956.171276] Call Trace:"]
CORE_TRACE = ["[ 4956.171281]  __schedule+0x23d/0x590", "[ 4956.171290]  schedule+0x4e/0xb0",
              "[ 4956.171296]  rpc_wait_bit_killable+0x1e/0xa0 [sunrpc]",
              "[ 4956.171301]  nfs4_proc_getattr+0x7c/0x120 [nfsv4]"]


def triage(tmp_path: Path, *lines: str) -> List[TriageFinding]:
    path = tmp_path / "paste.log"
    path.write_text("\n".join(lines) + "\n")
    return triage_logs([str(path)]).findings


def test_a_clock_reason_with_a_note_after_active_is_read_and_not_active_is_not(tmp_path: Path) -> None:
    path = tmp_path / "smi.txt"
    path.write_text("\n".join(REASONS + ["    HW Slowdown                       : Not Active"]) + "\n")
    (gpu,) = [e for e in parsers.parse_file(str(path)) if e.kind == "smi_q_gpu"]
    assert gpu.fields["reasons_active"] == ["sw_thermal_slowdown"] and gpu.fields["reasons_listed"] == 2


def test_xid79_beside_an_active_thermal_slowdown_follows_from_the_heat(tmp_path: Path) -> None:
    f = triage(tmp_path, XID79, *REASONS)
    assert f[0].id == "smi.thermal.sw_thermal_slowdown" and f[0].category == "thermal_power"
    assert f[0].evidence["explains"] == "log.xid.79.0000:06:00.0"
    assert f[1].id == "log.xid.79.0000:06:00.0" and f[1].caused_by == f[0].id
    assert not f[0].summary.rstrip().endswith(";")


def test_the_real_case_shape_is_thermal(tmp_path: Path) -> None:
    case = CORPUS / "gpu-node-xid79-gddr6x-heat-soak" / "log.txt"
    assert triage_logs([str(case)]).findings[0].category == "thermal_power"


def test_heat_on_another_gpu_or_an_xid_heat_does_not_cause_keeps_the_xid_root(tmp_path: Path) -> None:
    other = ["GPU 00000000:41:00.0"] + ["    " + line for line in REASONS]
    assert triage(tmp_path, XID79, *other)[0].id == "log.xid.79.0000:06:00.0"
    assert triage(tmp_path, XID48, *REASONS)[0].id == "log.xid.48.0000:06:00.0"


def test_leftover_nccl_and_psm_segments_explain_an_nccl_system_error(tmp_path: Path) -> None:
    f = triage(tmp_path, NCCL_SYS, *SEGMENTS)
    assert f[0].id == "shm.segments" and f[0].category == "host_resources"
    assert f[0].evidence == {"segments": 4, "total_mib": 326.0, "lines": f[0].evidence["lines"]}
    assert any(x.id == "log.nccl_system_error" and x.caused_by == "shm.segments" for x in f[1:])


def test_df_of_a_full_or_small_dev_shm_is_the_cause_and_a_roomy_one_is_nothing(tmp_path: Path) -> None:
    header = "Filesystem      Size  Used Avail Use% Mounted on"
    full = triage(tmp_path, NCCL_SYS, "$ df -h /dev/shm", header, "shm              64M   64M     0 100% /dev/shm")
    assert f"{full[0].id} {full[0].category}" == "shm.full host_resources"
    small = triage(tmp_path, NCCL_SYS, "$ df /dev/shm", "Filesystem     1K-blocks  Used Available Use% Mounted on",
                   "shm                65536     0     65536   0% /dev/shm")
    assert small[0].id == "shm.small" and small[0].evidence["size_mib"] == [64.0]
    roomy = triage(tmp_path, NCCL_SYS, header, "tmpfs            63G  1.2G   62G   2% /dev/shm")
    assert roomy[0].id == "log.nccl_system_error"


def test_a_call_trace_through_the_gpu_driver_pasted_alone_is_a_stuck_driver(tmp_path: Path) -> None:
    f = triage(tmp_path, *UVM_TRACE)
    assert f[0].id == "kmsg.gpu_driver_trace" and f[0].category == "gpu_hardware"
    assert "uvm_spin_loop [nvidia_uvm]" in f[0].summary
    assert not [x for x in triage(tmp_path, *CORE_TRACE) if x.id.startswith("kmsg.")]


def test_a_hung_task_waits_in_the_gpu_driver_or_in_a_file_system_by_its_trace(tmp_path: Path) -> None:
    gpu = triage(tmp_path, *HUNG, *("[ 4956.171281]  " + line.split("] ", 1)[1] for line in UVM_TRACE))
    assert gpu[0].id == "kmsg.gpu_driver_trace" and gpu[0].category == "gpu_hardware"
    assert any(x.id == "log.hung_task" and x.caused_by == gpu[0].id for x in gpu[1:])
    nfs = triage(tmp_path, *HUNG, *CORE_TRACE)
    assert nfs[0].id == "log.hung_task" and nfs[0].category == "host_resources"


def test_gpu_tools_stuck_in_d_state_are_a_driver_that_does_not_answer(tmp_path: Path) -> None:
    """nvidia-docker-377-nvidia-smi-d-state-after-vm-shutdown; a sleeping nvidia-smi (S) or a process in D
    state that is no GPU tool says nothing of the GPU."""
    rows = ["root        935  0.0  0.0  16488  4056 ?        D    May04   0:00 /usr/bin/nvidia-smi",
            "nvidia-+    953  0.0  0.0  17100  1740 ?        Ds   May04   0:00 /usr/bin/nvidia-persistenced --user "
            "nvidia-persistenced"]
    f = triage(tmp_path, "ps aux | grep nvidia", "", *rows)
    assert f[0].id == "ps.gpu_tools_stuck" and f[0].category == "gpu_hardware"
    assert f[0].evidence["processes"] == ["nvidia-smi:935", "nvidia-persistenced:953"]
    calm = [rows[0].replace(" D  ", " S  "), rows[1].replace("/usr/bin/nvidia-persistenced", "/usr/sbin/rsyslogd")]
    assert not [x for x in triage(tmp_path, *calm) if x.id == "ps.gpu_tools_stuck"]


def test_a_gres_count_below_the_configured_one_is_config(tmp_path: Path) -> None:
    """slinky-containers-14-slurmd-image-without-nvml-gres-count-lower: Slurm's own reason, cut by sinfo -R."""
    f = triage(tmp_path, "REASON               USER      TIMESTAMP           NODELIST",
               "gres/gpu count repor slurm     2026-04-14T06:39:53 slinky-0")
    assert f[0].id == "slurm.reason.gres_gpu_count_repor" and f[0].category == "config"


def test_ranks_whose_last_progress_lines_disagree_fell_out_of_step(tmp_path: Path) -> None:
    """torchtitan-1617-validation-steps-minus1-ranks-out-of-step: a silent hang whose ranks stopped at
    different batches; ranks at one count are nothing, and a real cause beside it stays the root."""
    lines = ["[rank1]:[titan] 2025-08-21 11:19:52,993 - root - INFO - [Validation Debug]  Rank 1 batch 89 start",
             "[rank0]:[titan] 2025-08-21 11:19:52,951 - root - INFO - [Validation Debug]  Rank 0 batch 87 start"]
    f = triage(tmp_path, *lines)
    assert f[0].id == "progress.out_of_step.batch" and f[0].category == "collective_hang"
    assert f[0].evidence["last"] == {"0": 87, "1": 89} and "rank(s) 0 fell behind" in f[0].summary
    assert not triage(tmp_path, lines[0], lines[1].replace("batch 87", "batch 89"))
    oom = "[2024-05-02 10:00:00] slurmstepd: error: Detected 1 oom_kill event in StepId=77.0."
    assert triage(tmp_path, *lines, oom)[0].category == "memory"
