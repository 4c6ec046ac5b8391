"""Logs that show a failure without an error line: a GPU table whose values mean a hang or a holder, py-spy dumps
split around a collective, a log that ends while it waits (sources: tests/corpus dev cases named per constant,
and the tools' own output formats)."""
from __future__ import annotations

from pathlib import Path
from typing import List

from slurm_triage.triage import lexicon, parsers, triage_logs
from slurm_triage.triage.model import TriageFinding

# mmdetection-99-hang-gpus-pinned-100pct: nvidia-smi of a stuck job, every GPU 100 % busy at a quarter of its cap.
SMI_HEAD = ["+-----------------------------------------------------------------------------+",
            "| NVIDIA-SMI 387.26                 Driver Version: 387.26                    |",
            "|-------------------------------+----------------------+----------------------+",
            "| GPU  Name        Persistence-M| Bus-Id        Disp.A | Volatile Uncorr. ECC |",
            "| Fan  Temp  Perf  Pwr:Usage/Cap|         Memory-Usage | GPU-Util  Compute M. |",
            "|===============================+======================+======================|"]
GPU0 = "|   0  Tesla V100-SXM2...  Off  | 00000000:1A:00.0 Off |                    0 |"
SPIN = "| N/A   52C    P0    78W / 300W |   7579MiB / 16152MiB |    100%      Default |"
WORK = "| N/A   68C    P0   281W / 300W |   7579MiB / 16152MiB |    100%      Default |"
RULE = "+-------------------------------+----------------------+----------------------+"
# crosse-2-gpu-memory-held-by-invisible-process: 12.8 GB in use, the Processes section empty.
HELD = "| N/A   36C    P0    41W / 300W |  12799MiB / 16280MiB |      0%      Default |"
PROCS = ["+-----------------------------------------------------------------------------+",
         "| Processes:                                                       GPU Memory |",
         "|  GPU       PID   Type   Process name                             Usage      |",
         "|=============================================================================|"]
END = "+-----------------------------------------------------------------------------+"
# trixie-92-stuck-process-holds-gpu0: the same section listing its holder.
PROC_ROW = "|    0   N/A  N/A      1395      C   python                          25081MiB |"
# cbio-cluster-275-torque-gpus-left-exclusive-thread
GTX0 = "|   0  GeForce GTX 680     Off  | 0000:03:00.0     N/A |                  N/A |"
EXCL = "| 30%   38C    P0    N/A /  N/A |     62MiB /  4095MiB |     N/A    E. Thread |"
EPROC = "| 30%   38C    P0    N/A /  N/A |     62MiB /  4095MiB |     N/A   E. Process |"
# bigscience-tr11-prequel-200b-hang-ranks-out-of-sync-broadcast-py-spy
SPY = ['Thread 835990 (active): "MainThread"', "    train (megatron/training.py:915)",
       "    pretrain (megatron/training.py:187)", "    <module> (pretrain_gpt.py:239)",
       'Thread 835995 (active): "MainThread"', "    broadcast (torch/distributed/distributed_c10d.py:1191)",
       "    _aggregate_total_loss (deepspeed/runtime/pipe/engine.py:540)", "    train_step (megatron/training.py:436)"]
# bigscience-jz-megatron-hang-fused-kernels-stale-build-lock; OpenRLHF/OpenRLHF#208
BUILD = ">>> done with dataset index builder. Compilation time: 0.107 seconds"
FUSED = "> compiling and loading fused kernels ..."
EXT_ROOT = "Using  .cache/torch_extensions/py310_cu118 as PyTorch extensions root..."
# ultralytics-24536-ddp-unused-params-reducer-hang-epoch-end
HEADER = "Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size"
BAR = "1/200      23G      1.663     0.9309   0.003412         40       1600: 95% ━━━━━━━━━━━─ 41/43 2.7it/s 15.5s<0.7s"
DONE = "1/200      23G      1.663     0.9309   0.003412         40       1600: 100% ━━━━━━━━━━━━ 43/43 2.7it/s 15.9s"
TQDM = " 45%|████▌     | 45/100 [00:10<00:12,  4.50it/s]"
OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB"


def triage(tmp_path: Path, *lines: str) -> List[TriageFinding]:
    path = tmp_path / "paste.log"
    path.write_text("\n".join(lines) + "\n")
    return triage_logs([str(path)]).findings


def test_gpus_busy_at_low_power_are_a_hang_and_busy_at_full_power_are_work(tmp_path: Path) -> None:
    f = triage(tmp_path, *SMI_HEAD, GPU0, SPIN, RULE)
    assert f[0].id == "table.busy_wait" and f[0].category == "collective_hang" and f[0].confidence <= 0.3
    assert "78 / 300 W" in f[0].summary
    assert not any(x.id == "table.busy_wait" for x in triage(tmp_path, *SMI_HEAD, GPU0, WORK, RULE))


def test_gpu_memory_with_an_empty_process_list_is_held_by_someone_unseen(tmp_path: Path) -> None:
    f = triage(tmp_path, *SMI_HEAD, GPU0, HELD, RULE, "", *PROCS, END)
    assert f[0].id == "smi.unowned" and f[0].category == "host_resources" and f[0].confidence <= 0.35
    assert not any(x.id == "smi.unowned" for x in triage(tmp_path, *SMI_HEAD, GPU0, HELD, RULE, "", *PROCS,
                                                          PROC_ROW, END))


def test_the_process_section_is_counted_only_once_closed(tmp_path: Path) -> None:
    path = tmp_path / "smi.txt"
    path.write_text("\n".join(PROCS + [PROC_ROW, PROC_ROW, END, ""] + PROCS) + "\n")  # the second one is cut off
    sections = [e for e in parsers.parse_file(str(path)) if e.kind == "smi_processes"]
    assert [e.fields["count"] for e in sections] == [2]
    assert not any(x.id == "smi.unowned" for x in triage(tmp_path, *SMI_HEAD, GPU0, HELD, RULE, "", *PROCS))


def test_an_exclusive_thread_or_prohibited_compute_mode_is_a_config_hint_and_exclusive_process_is_not(
        tmp_path: Path) -> None:
    f = triage(tmp_path, *SMI_HEAD, GTX0, EXCL, RULE)
    assert f[0].id == "smi.compute_mode" and f[0].category == "config" and f[0].confidence <= 0.3
    assert not any(x.id == "smi.compute_mode" for x in triage(tmp_path, *SMI_HEAD, GTX0, EPROC, RULE))


def test_the_table_headers_carry_no_lexicon_words() -> None:
    for line in SMI_HEAD[1:5] + PROCS[1:3] + ["GPU  Temp   AvgPwr  SCLK    MCLK   Fan   Perf  PwrCap  VRAM%  GPU%"]:
        assert lexicon.words_in(line) == [], line
    assert "ecc" in lexicon.words_in("| Volatile Uncorr. ECC : 4 uncorrectable ECC errors |")


def test_py_spy_dumps_split_evenly_around_a_collective_are_a_low_confidence_hang(tmp_path: Path) -> None:
    f = triage(tmp_path, *SPY)
    assert f[0].id == "pyspy.split" and f[0].category == "collective_hang" and f[0].confidence <= 0.3
    assert "broadcast" in f[0].summary and "train (megatron/training.py:915)" in f[0].summary


def test_a_log_that_ends_at_an_extension_build_waits_on_a_stale_lock(tmp_path: Path) -> None:
    for last in (FUSED, EXT_ROOT, "Loading extension module fused_adam..."):
        f = triage(tmp_path, BUILD, last, "")
        assert f[0].id == "stall.extension_build" and f[0].category == "host_resources", last
    assert not any(x.id.startswith("stall.") for x in triage(tmp_path, FUSED, "> done compiling fused kernels"))


def test_a_log_that_ends_mid_progress_bar_stopped_and_a_finished_bar_did_not(tmp_path: Path) -> None:
    for bar in (BAR, TQDM):
        f = triage(tmp_path, HEADER, bar)
        assert f[0].id == "stall.progress" and f[0].category == "collective_hang" and f[0].confidence <= 0.2, bar
    assert not any(x.id.startswith("stall.") for x in triage(tmp_path, HEADER, DONE))
    assert not any(x.id.startswith("stall.") for x in triage(tmp_path, TQDM, "epoch 1 done"))


def test_a_stall_never_outranks_a_real_failure(tmp_path: Path) -> None:
    f = triage(tmp_path, OOM, HEADER, BAR)
    assert f[0].category == "memory" and any(x.id == "stall.progress" for x in f[1:])


# nemo-13140-cuda-graphs-nccl-hang-after-last-checkpoint
FIT_DONE = "[INFO     | pytorch_lightning.utilities.rank_zero]: `Trainer.fit` stopped: `max_steps=10` reached."
SAVED = ("[NeMo I 2025-04-21 20:56:03 nemo_logging:393] Successfully saved checkpoint from iteration      10 to "
         "/logs/checkpoints/val_loss=0.00-step=9-consumed_samples=1280.0-last.ckpt")


def test_a_log_that_ends_right_after_training_finished_hung_at_teardown_unless_an_error_follows(
        tmp_path: Path) -> None:
    f = triage(tmp_path, FIT_DONE, SAVED)
    assert f[0].id == "stall.after_finish" and f[0].category == "collective_hang" and f[0].confidence <= 0.2
    later = triage(tmp_path, FIT_DONE, SAVED, "RuntimeError: something broke while saving")
    assert not any(x.id.startswith("stall.") for x in later)
    early = triage(tmp_path, FIT_DONE, *[f"step {i}" for i in range(12)])  # training went on after it
    assert not any(x.id.startswith("stall.") for x in early)


# Python's faulthandler layout (Lib/faulthandler: "Thread 0x... (most recent call first):", "  File \"...\", line N in f"),
# as dump_traceback_later prints it; the frames of PASSIONLab/OpenEquivariance#156 (a build-lock wait, headerless).
FH_WAIT = ["Timeout (0:30:00)!", "Thread 0x00007f1c8e7fc700 (most recent call first):",
           '  File "/usr/lib/python3.10/threading.py", line 324 in wait', "",
           "Current thread 0x00007f1ca1b2b740 (most recent call first):",
           '  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/distributed_c10d.py", line 2050 in all_reduce',
           '  File "/work/train.py", line 120 in <module>']
BATON = ["Timeout (0:02:00)!",
         'File "/opt/venv/lib/python3.12/site-packages/torch/utils/file_baton.py", line 50 in wait',
         'File "/opt/venv/lib/python3.12/site-packages/torch/utils/cpp_extension.py", line 2156 in _jit_compile',
         'File "/opt/venv/lib/python3.12/site-packages/torch/utils/cpp_extension.py", line 1681 in load']


def test_a_faulthandler_dump_reads_like_py_spy_and_its_module_level_thread_is_main(tmp_path: Path) -> None:
    path = tmp_path / "dump.txt"
    path.write_text("\n".join(FH_WAIT) + "\n")
    threads = [e for e in parsers.parse_file(str(path)) if e.kind == "pyspy_thread"]
    assert [(e.fields["tid"], e.fields.get("thread_name")) for e in threads] == [
        ("0x00007f1c8e7fc700", None), ("0x00007f1ca1b2b740", "MainThread")]
    assert threads[1].fields["frames"][0].startswith("all_reduce (")
    f = triage(tmp_path, *FH_WAIT)
    assert f[0].id == "pyspy.waits_in_collective" and f[0].category == "collective_hang"


def test_a_crash_dump_and_a_traceback_are_not_read_as_a_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "crash.txt"
    path.write_text("\n".join(["Fatal Python error: Segmentation fault", ""] + FH_WAIT[4:]) + "\n")
    assert not [e for e in parsers.parse_file(str(path)) if e.kind == "pyspy_thread"]
    path.write_text('Traceback (most recent call last):\n  File "/work/train.py", line 120, in <module>\n')
    assert not [e for e in parsers.parse_file(str(path)) if e.kind == "pyspy_thread"]


def test_a_stack_waiting_in_torchs_build_lock_names_the_stale_lock(tmp_path: Path) -> None:
    f = triage(tmp_path, *BATON)
    assert f[0].id == "stall.build_lock_wait" and f[0].category == "host_resources" and f[0].confidence < 0.5
