"""Rules and "first failure wins" on combinations of real log line shapes (sources: tests/corpus)."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import List

import pytest

from slurm_triage.triage import cli, triage_logs
from slurm_triage.triage.logs import parse_line
from slurm_triage.triage.model import LogEvent
from slurm_triage.triage.rules import RULES, run_rules

XID79 = "Sep 28 23:34:26 gpu-a17 kernel: NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus"
XID45 = "Sep 28 23:34:30 gpu-a17 kernel: NVRM: Xid (PCI:0000:44:00): 45, pid=8156, Ch 00000010"
CUDA_ECC = "[2000-09-28 23:34:31] RuntimeError: CUDA error: uncorrectable ECC error encountered"
OOM = "[2024-05-02 10:00:00] slurmstepd: error: Detected 1 oom_kill event in StepId=77.0. Some of the step tasks have been OOM Killed."
WD = ("[rank{r}]:[E502 10:10:00.1 ProcessGroupNCCL.cpp:607] [Rank {r}] Watchdog caught collective operation timeout: "
      "WorkNCCL(SeqNum={s}, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600013 milliseconds "
      "before timing out.")
RESET = "[2024-05-02 10:10:01] gpu-b02:3468:3905 [4] NCCL INFO misc/socket.cc:47 -> 6 Connection reset by peer"
INIT = ("{host}:984:1257 [{d}] NCCL INFO comm 0x557fe785f7a0 rank {r} nranks {n} cudaDev {d} nvmlDev {d} busId 9b000 "
        "commId 0x5ae77eb5ea4ec1ee - Init COMPLETE")


def events(*lines: str) -> List[LogEvent]:
    out: List[LogEvent] = []
    year = None
    for i, text in enumerate(lines, 1):
        evs, y = parse_line(text, "job.out", i, 0, year)
        year = y or year
        out += evs
    return out


def test_rules_are_listed_with_unique_ids_and_docs() -> None:
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids)) and all(r.doc for r in RULES)


def test_fatal_xid_is_root_and_xid45_and_cuda_error_follow() -> None:
    f = run_rules(events(XID79, XID45, CUDA_ECC))
    assert f[0].id == "log.xid.79.0000:44:00.0" and f[0].category == "gpu_hardware" and f[0].node == "gpu-a17"
    assert {x.id: x.caused_by for x in f[1:]} == {"log.xid.45.0000:44:00.0": f[0].id,
                                                  "log.cuda_error.uncorrectable_ECC_error": f[0].id}


def test_oom_then_watchdog_and_resets_point_to_the_oom() -> None:
    f = run_rules(events(OOM, WD.format(r=0, s=5), WD.format(r=1, s=5), RESET))
    assert f[0].id == "log.oom.host" and f[0].category == "memory"
    assert [(x.id, x.caused_by) for x in f[1:]] == [("log.watchdog", "log.oom.host"),
                                                    ("log.conn_reset", "log.oom.host")]


def test_time_order_beats_file_order() -> None:
    """A CUDA error logged later in the file but earlier in time is still the root."""
    early = "[2024-05-02 09:00:00] [rank3]: RuntimeError: CUDA error: an illegal memory access was encountered"
    late_oom = "[2024-05-02 11:00:00] srun: error: gpu-b02: task 3: Out Of Memory"
    f = run_rules(events(late_oom, early))
    assert f[0].id.startswith("log.cuda_error") and f[0].rank == 3 and f[1].caused_by is None


def test_watchdog_lagging_rank_mapped_to_node() -> None:
    lines = [INIT.format(host="gpu-b01", r=0, n=3, d=0), INIT.format(host="gpu-b02", r=1, n=3, d=0),
             INIT.format(host="gpu-b03", r=2, n=3, d=0),
             WD.format(r=0, s=120), WD.format(r=1, s=97), WD.format(r=2, s=120)]
    f = run_rules(events(*lines))
    assert f[0].id == "log.watchdog" and f[0].rank == 1 and f[0].node == "gpu-b02"
    assert f[0].evidence["last_seq_by_rank"] == {"0": 120, "1": 97, "2": 120}


def test_watchdog_silent_rank_is_the_suspect() -> None:
    lines = [INIT.format(host="gpu-b01", r=0, n=2, d=0), INIT.format(host="gpu-b02", r=1, n=2, d=1),
             WD.format(r=0, s=7)]
    f = run_rules(events(*lines))
    assert f[0].evidence["silent_ranks"] == [1] and f[0].node == "gpu-b02" and f[0].rank == 1


@pytest.mark.parametrize("line,status,name,consequence", [
    ("h1:1:2 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<5> with status=12 opcode=0 len=0 vendor err 129 (Recv)",
     12, "transport retry counter exceeded", False),
    ("h1:1:2 [1] NCCL WARN NET/IB : Got completion from peer fe80::1%ib0<3> with error 4, opcode 32564, len 32564, vendor err 81 (Send)",
     4, "local protection error", False),
    ("h1:1:2 [1] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<5> with error 5, opcode 0, len 0, vendor err 249 (Recv)",
     5, "work request flushed", True),
])
def test_ib_status_decoded(line: str, status: int, name: str, consequence: bool) -> None:
    (f,) = run_rules(events(line))
    assert (f.evidence["status"], f.evidence["status_name"], f.consequence, f.node) == (status, name, consequence, "h1")


def test_preemption_and_node_failure_are_causes() -> None:
    pre = "slurmstepd: error: *** JOB 99 ON gpu-c01 CANCELLED AT 2024-05-02T10:00:00 DUE TO PREEMPTION ***"
    nf = "slurmstepd: error: *** JOB 98 ON gpu-c02 CANCELLED AT 2024-05-02T09:00:00 DUE TO NODE FAILURE ***"
    f = run_rules(events(pre, nf))
    assert [x.id for x in f] == ["log.slurm.node_failure", "log.slurm.preemption"]
    assert f[0].node == "gpu-c02" and f[1].caused_by is None


def _run(*argv: str) -> int:
    p = argparse.ArgumentParser()
    cli.register(p.add_subparsers())
    args = p.parse_args(["triage", *argv])
    return args.func(args)


def test_cli_exit_codes_and_formats(tmp_path: Path, capsys) -> None:
    clean = tmp_path / "clean.out"
    clean.write_text("step 1 loss 2.0\nstep 2 loss 1.9\n")
    bad = tmp_path / "bad.out"
    bad.write_text("\n".join([OOM, WD.format(r=0, s=5), RESET]) + "\n")
    assert _run("--log", str(clean)) == 0
    assert "no known failure" in capsys.readouterr().out
    assert _run("--log", str(bad), "--format", "json") == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == 1 and doc["job"] is None and doc["findings"][0]["category"] == "memory"
    assert set(doc["findings"][0]) == {"id", "category", "verdict", "confidence", "node", "gpu", "rank", "summary",
                                       "evidence", "action", "caused_by"}
    assert doc["findings"][0]["evidence"]["lines"][0].startswith(f"{bad}:1: ")
    assert doc["sources"]["logs"][str(bad)]["read"] is True
    assert _run("--log", str(bad)) == 1
    text = capsys.readouterr().out
    assert text.index("ROOT CAUSE [memory]") < text.index("follows from log.oom.host")
    assert _run("--log", str(bad), "--format", "markdown") == 1
    assert capsys.readouterr().out.startswith("# Triage of logs\n\n## Root cause: host memory exhausted")


def test_cli_cannot_triage(tmp_path: Path, capsys) -> None:
    assert _run() == 2
    assert _run("--log", str(tmp_path / "nope.log")) == 2
    assert "could not triage" in capsys.readouterr().err
    assert _run("12;rm") == 2
    assert _run("--list-rules") == 0 and "log.watchdog" in capsys.readouterr().out


def test_triage_result_json_roundtrip(tmp_path: Path) -> None:
    p = tmp_path / "x.log"
    p.write_text(XID79 + "\n")
    r = triage_logs([str(p)], job="123")
    assert json.loads(json.dumps(r.to_dict()))["findings"][0]["gpu"] == "0000:44:00.0"


def test_cli_relative_log_path_and_directory_from_another_cwd(tmp_path: Path, capsys, monkeypatch) -> None:
    """``triage --log slurm-1.out`` works from the log's directory (the grep prefilter runs with cwd /),
    and ``--log DIR`` reads the directory's logs."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "slurm-1.out").write_text(OOM + "\n")
    monkeypatch.chdir(run)
    assert _run("--log", "slurm-1.out", "--format", "json") == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["findings"][0]["category"] == "memory" and doc["sources"]["logs"][str(run / "slurm-1.out")]["read"]
    monkeypatch.chdir(tmp_path)
    assert _run("--log", "run", "--format", "json") == 1
    assert json.loads(capsys.readouterr().out)["findings"][0]["id"] == "log.oom.host"


def test_a_failing_parser_or_structured_rule_never_breaks_triage(tmp_path: Path, monkeypatch) -> None:
    from slurm_triage.triage import parsers, rules

    def boom(*_a, **_k):
        raise RuntimeError("parser bug")

    p = tmp_path / "job.out"
    p.write_text(OOM + "\n")
    monkeypatch.setattr(parsers, "parse_file", boom)
    monkeypatch.setattr(rules, "structured_rules", lambda: (rules.Rule("structured.boom", ("memory",), boom),))
    r = triage_logs([str(p)])
    assert r.findings[0].id == "log.oom.host" and r.sources["logs"][str(p)]["read"] is True


def test_xid_line_naming_its_cause_makes_that_xid_the_root() -> None:
    """Only Xid 45 lines in the log, each saying "caused by previous Xid 149" (source:
    NVIDIA/open-gpu-kernel-modules#1150): the NVLink Xid they name is the root, the 45s follow."""
    line = "kernel: NVRM: Xid (PCI:0000:dc:00): 45, pid=1818990, name=python3, Ch 00000001 caused by previous Xid 149"
    f = run_rules(events(line, line.replace("Ch 00000001", "Ch 00000002")))
    assert [(x.id, x.caused_by) for x in f] == [("log.xid.149.0000:dc:00.0", None),
                                                ("log.xid.45.0000:dc:00.0", "log.xid.149.0000:dc:00.0")]
    assert f[0].verdict.value == "FAIL" and f[0].evidence["inferred_from"] == "caused by previous Xid"
    assert f[1].evidence["caused_by_xid"] == [149] and f[1].consequence


# Real PyTorch out-of-memory lines (corpus cases horovod-2719, lightning-12694, mgfn-35).
OOM_HELD = ("RuntimeError: CUDA out of memory. Tried to allocate 14.00 MiB (GPU 1; 15.78 GiB total capacity; "
            "2.68 GiB already allocated; 53.75 MiB free; 77.13 MiB cached; 0 bytes inactive)")
OOM_BATCH = ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 11.17 GiB total capacity; "
             "7.57 GiB already allocated; 18.25 MiB free; 7.74 GiB reserved in total by PyTorch)")
OOM_BATCH_2 = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB. GPU 0 has a total capacty "
               "of 6.00 GiB of which 0 bytes is free. Of the allocated memory 2.93 GiB is allocated by PyTorch, and "
               "2.30 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
               "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF")


def test_an_oom_on_a_gpu_mostly_held_by_others_names_the_holder_not_the_batch():
    found = run_rules(events(OOM_HELD))
    root = found[0]
    assert (root.id, root.category, root.gpu) == ("log.gpu_memory_held_elsewhere", "host_resources", "1")
    assert root.confidence < 0.8  # a leftover and ranks sharing GPU 0 read the same
    assert root.evidence["held_elsewhere_gib"] > 12 and root.evidence["this_process_gib"] < 4
    oom = next(f for f in found if f.id == "log.oom.cuda")
    assert oom.caused_by == root.id


@pytest.mark.parametrize("line", [OOM_BATCH, OOM_BATCH_2])
def test_an_oom_where_this_process_held_the_gpu_stays_a_memory_problem(line):
    found = run_rules(events(line))
    assert found[0].id == "log.oom.cuda" and found[0].category == "memory"
    assert not any(f.id == "log.gpu_memory_held_elsewhere" for f in found)


def test_without_times_a_fatal_xid_pasted_after_a_process_error_still_explains_it():
    """nvidia-docker#849: the container's init error pasted first, the kernel's Xid 48 (DBE) below it;
    with no comparable times, the order of a paste says nothing: the hardware fault is the root."""
    log = [
        "\\\\nnvidia-container-cli: initialization error: cuda error: initialization error\\\\n\\\"\"\": unknown.",
        "[Mon Oct 29 12:07:39 2018] NVRM: Xid (PCI:0000:8a:00): 48, An uncorrectable double bit error (DBE) has been "
        "detected on GPU in the framebuffer at partition 4, subpartition 1.",
    ]
    found = run_rules(events(*log))
    assert found[0].id.startswith("log.xid.48") and found[0].category == "gpu_hardware"
    assert any(f.caused_by == found[0].id and f.category == "config" for f in found[1:])
