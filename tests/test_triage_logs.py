"""The log reader on hostile input: gzip, NUL bytes, invalid UTF-8, huge lines, block boundaries."""
from __future__ import annotations

import gc
import gzip
import os
import subprocess
import warnings
from pathlib import Path

from slurm_triage.triage import logs, triage_logs
from slurm_triage.triage.logs import parse_time, scan, scan_many

# Real line shapes (sources in tests/corpus/*/meta.json).
WATCHDOG = (b"[rank4]:[E321 02:07:08.414640780 ProcessGroupNCCL.cpp:607] [Rank 4] Watchdog caught collective "
            b"operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=466119168, NumelOut=466119168, "
            b"Timeout(ms)=600000) ran for 600067 milliseconds before timing out.")
CANCEL = b"slurmstepd: error: *** JOB 867816 ON c0700a-s1 CANCELLED AT 2021-05-11T12:06:17 DUE TO TIME LIMIT ***"
STEP = b"[2024-05-01 12:00:00,123] INFO step 1234 | loss 2.345 | lr 3.0e-4 | grad_norm 1.23"


def test_plain_file_line_numbers_and_fields(tmp_path: Path) -> None:
    p = tmp_path / "a.log"
    p.write_bytes(b"\n".join([STEP] * 10 + [WATCHDOG] + [STEP] * 5 + [CANCEL]) + b"\n")
    events, st = scan(str(p))
    assert [(e.kind, e.line) for e in events] == [("watchdog_timeout", 11), ("slurm_cancel", 17)]
    w = events[0]
    assert (w.rank, w.fields["seq"], w.fields["op"], w.fields["timeout_ms"]) == (4, 1580, "ALLREDUCE", 600000)
    assert events[1].node == "c0700a-s1" and events[1].fields["reason"] == "TIME LIMIT"
    assert st.lines == 17 and st.bytes == p.stat().st_size


def test_gzip_is_detected_by_magic_not_name(tmp_path: Path) -> None:
    p = tmp_path / "job.out"  # no .gz suffix
    p.write_bytes(gzip.compress(STEP + b"\n" + CANCEL + b"\n"))
    events, _ = scan(str(p))
    assert [(e.kind, e.line) for e in events] == [("slurm_cancel", 2)]


def test_reading_logs_leaves_no_file_or_pipe_to_the_garbage_collector(tmp_path: Path) -> None:
    """Every descriptor a triage opens (a gzip log's file, grep's pipes) is closed by the code that opened
    it: a long-lived MCP server must not leak one per log it reads."""
    gz, plain = tmp_path / "job.out.gz", tmp_path / "job.out"
    gz.write_bytes(gzip.compress(STEP + b"\n" + CANCEL + b"\n"))
    plain.write_bytes(b"\x1b[1m" + STEP + b"\x1b[0m\n" + CANCEL + b"\n")  # coloured: grep reads it from a pipe
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for path in (gz, plain):
            assert [e.kind for e in scan(str(path))[0]] == ["slurm_cancel"]
            assert [e.kind for e in scan(str(path), prefilter=False)[0]] == ["slurm_cancel"]
            assert triage_logs([str(path)]).findings
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_nul_invalid_utf8_and_binary_garbage(tmp_path: Path) -> None:
    garbage = bytes(range(256)) * 64  # contains \n and \x1f\x8b, but not at the start
    p = tmp_path / "g.log"
    p.write_bytes(b"\xff\xfe\x00\x00" + STEP + b"\x00\xc3\x28\n" + garbage + b"\n" + b"\x00" * 10 + CANCEL + b"\n")
    events, _ = scan(str(p))
    assert [e.kind for e in events] == ["slurm_cancel"]
    assert "\x00" not in events[0].text


def test_huge_line_is_capped_and_following_lines_still_found(tmp_path: Path) -> None:
    p = tmp_path / "h.log"
    huge = b"x" * (3 * logs.MAX_CARRY_BYTES) + WATCHDOG + b"y" * (2 * logs.BLOCK_BYTES)
    p.write_bytes(STEP + b"\n" + huge + b"\n" + CANCEL + b"\n")
    events, _ = scan(str(p))
    kinds = [(e.kind, e.line) for e in events]
    assert ("watchdog_timeout", 2) in kinds and ("slurm_cancel", 3) in kinds
    assert all(len(e.text) <= logs.MAX_LINE_BYTES for e in events)


def test_hits_across_block_boundaries(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(logs, "BLOCK_BYTES", 100)  # every line straddles a block edge
    p = tmp_path / "b.log"
    p.write_bytes(b"\n".join([STEP, WATCHDOG, STEP, CANCEL, STEP]))  # no final newline
    events, st = scan(str(p))
    assert [(e.kind, e.line) for e in events] == [("watchdog_timeout", 2), ("slurm_cancel", 4)]
    assert st.lines == 5


def test_unreadable_sources_are_reported_not_raised(tmp_path: Path) -> None:
    good = tmp_path / "ok.log"
    good.write_bytes(CANCEL + b"\n")
    bad_gz = tmp_path / "bad.gz"
    bad_gz.write_bytes(b"\x1f\x8b\x08\x00garbage")
    events, sources = scan_many([str(tmp_path / "missing.log"), str(good), str(bad_gz)])
    assert len(events) == 1 and events[0].file_index == 1
    assert sources[str(tmp_path / "missing.log")]["read"] is False
    assert "FileNotFoundError" in sources[str(tmp_path / "missing.log")]["error"]
    assert sources[str(bad_gz)]["read"] is False and sources[str(good)]["read"] is True


def test_parse_time_formats() -> None:
    assert parse_time("2021-10-27T19:35:36 x", None) == (1635363336.0, 2021)
    # PyTorch's glog stamp does not zero-pad the month: E321 = March 21, E1206 = December 6.
    assert parse_time("[rank0]:[E321 02:07:08.5 ProcessGroupNCCL.cpp:607]", 2024) == (1710986828.5, None)
    assert parse_time("[rank0]:[E1206 18:44:12.715298746 ProcessGroupNCCL.cpp:607]", 2024)[0] == 1733510652.715298746
    assert parse_time("Sep 28 23:34:26 host kernel: NVRM", 2023)[0] == 1695944066.0
    assert parse_time("no time here", None) == (None, None)


def test_grep_pattern_matches_the_same_lines(tmp_path: Path) -> None:
    """The benchmark's grep -E pattern selects exactly the candidate lines of the scanner."""
    p = tmp_path / "m.log"
    lines = [STEP, WATCHDOG, STEP, CANCEL, b"srun: error: n1: task 0: Out Of Memory", STEP]
    p.write_bytes(b"\n".join(lines) + b"\n")
    out = subprocess.run(["grep", "-c", "-E", logs.grep_pattern(), str(p)], capture_output=True, text=True,
                         env={**os.environ, "LC_ALL": "C"})
    _, st = scan(str(p))
    assert int(out.stdout) == st.candidate_lines == 3


def test_relative_paths_and_directories(tmp_path: Path, monkeypatch) -> None:
    """``--log slurm-1.out`` from the log's directory, and a directory standing for its logs."""
    d = tmp_path / "run"
    d.mkdir()
    (d / "slurm-1.out").write_bytes(STEP + b"\n" + CANCEL + b"\n")
    (d / "slurm-1.err").write_bytes(WATCHDOG + b"\n")
    (d / "notes.txt").write_bytes(CANCEL + b"\n")  # not a log suffix: not read
    (d / "sub.log").mkdir()  # a directory with a log suffix: not a file
    monkeypatch.chdir(d)
    events, sources = scan_many(logs.expand_paths(["slurm-1.out"]))
    assert sources[str(d / "slurm-1.out")]["read"] is True and [e.kind for e in events] == ["slurm_cancel"]
    monkeypatch.chdir(tmp_path)
    paths = logs.expand_paths(["run"])
    assert paths == [str(d / "slurm-1.err"), str(d / "slurm-1.out")]
    events, sources = scan_many(paths)
    assert sorted(e.kind for e in events) == ["slurm_cancel", "watchdog_timeout"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert scan_many(logs.expand_paths(["empty"]))[1][str(empty)] == {
        "read": False, "error": "a directory without *.out, *.err, *.log or *.gz files"}


def test_error_lines_first_traceback_exception_and_first_error(tmp_path: Path) -> None:
    p = tmp_path / "job.err"
    p.write_text("\n".join([
        "step 1 loss 2.0 (error_rate 0.1)",
        "[rank3]: Traceback (most recent call last):",
        '[rank3]:   File "train.py", line 9, in <module>',
        "[rank3]:     except KeyError:",
        "[rank3]: ValueError: shapes (3,) and (4,) not aligned",
        "Traceback (most recent call last):",
        "RuntimeError: a later, second traceback",
        "srun: error: n1: task 3: Exited with exit code 1",
    ]) + "\n")
    evs = logs.error_lines(str(p))
    assert [(e.kind, e.line) for e in evs] == [("first_exception", 5), ("first_error", 8)]
    assert evs[0].fields == {"exception": "ValueError"} and evs[0].rank == 3


def test_gzip_through_grep_matches_the_python_scanner(tmp_path: Path) -> None:
    p = tmp_path / "job.out.gz"
    body = b"\n".join([STEP] * 1000 + [WATCHDOG] + [STEP] * 10 + [CANCEL, b"\xff\x00junk"])  # no final newline
    p.write_bytes(gzip.compress(body))
    a, sa = scan(str(p))
    b, sb = scan(str(p), prefilter=False)
    assert [(e.kind, e.line, e.fields) for e in a] == [(e.kind, e.line, e.fields) for e in b]
    assert [(e.kind, e.line) for e in a] == [("watchdog_timeout", 1001), ("slurm_cancel", 1012)]
    assert (sa.lines, sa.bytes, sa.candidate_lines) == (sb.lines, sb.bytes, sb.candidate_lines) == (1013, len(body), 2)


def test_an_exception_line_pasted_without_its_traceback_is_the_first_error(tmp_path: Path) -> None:
    """People often paste only the last line of a traceback (here a dev case's CUDA OOM line)."""
    p = tmp_path / "job.err"
    p.write_text("step 1 loss 2.0\n"
                 "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 11.17 GiB total capacity; "
                 "7.57 GiB already allocated; 18.25 MiB free; 7.74 GiB reserved in total by PyTorch)\n")
    [e] = logs.error_lines(str(p))
    assert (e.kind, e.line) == ("first_error", 2)
