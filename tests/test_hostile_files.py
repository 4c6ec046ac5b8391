"""A user's files against the node checks: floods and hostile names cost bounded time and
space, and print as one safe line (issue 13, breaks 10 and 12, node side)."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

from slurm_triage.checks import MAX_FINDINGS_PER_CHECK, capped, run_checks
from slurm_triage.checks.leftovers import leftover_ipc
from slurm_triage.collect import kernel, procs
from slurm_triage.config import Config, defaults
from slurm_triage.model import Finding, Verdict

FLOOD = 100_000


def make_cfg() -> Config:
    values = defaults()
    values["node"]["name"] = "thisnode"
    return Config(values)


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    d = Path("/dev/shm") / f"hostile-test-{os.getpid()}"
    d.mkdir()
    yield d
    shutil.rmtree(os.fsencode(d))


def facts_for(ipc_files: List[Dict[str, Any]], omitted: Dict[str, Any]) -> Dict[str, Any]:
    return {"node": "thisnode", "procs": {"processes": [], "running_jobs": [], "listeners": [],
                                          "ipc_files": ipc_files, "ipc_files_omitted": omitted}}


def test_100k_files_in_shm_cost_little_and_are_summarised_with_counts(shm_dir: Path) -> None:
    for i in range(FLOOD):
        os.close(os.open(shm_dir / f"nccl-flood-{i}", os.O_CREAT | os.O_WRONLY, 0o600))
    t0 = time.monotonic()
    rows, omitted = procs.scan_ipc_bounded([str(shm_dir)])
    seconds = time.monotonic() - t0
    seen = min(FLOOD, procs.MAX_IPC_SCAN)
    assert len(rows) == procs.MAX_IPC_FILES and omitted["count"] == seen - procs.MAX_IPC_FILES
    assert omitted["by_dir"] == {str(shm_dir): seen - procs.MAX_IPC_FILES}
    assert omitted["unscanned_dirs"] == ([str(shm_dir)] if FLOOD > procs.MAX_IPC_SCAN else [])
    assert seconds < 2.0, f"scan took {seconds:.2f} s"  # 0.4 s unbounded on the 2-core CI machine
    findings = run_checks(facts_for(rows, omitted), make_cfg())
    ipc = [f for f in findings if f.id == "leftover.ipc"]
    assert len(ipc) == MAX_FINDINGS_PER_CHECK
    listed = [f for f in ipc if "more" not in f.summary]
    capped_rest = [f.evidence["omitted"] for f in ipc if "findings not listed" in f.summary]
    not_examined = [f.evidence["count"] for f in ipc if "not examined" in f.summary]
    assert len(listed) + sum(capped_rest) + sum(not_examined) == seen  # every file accounted for
    size = len(json.dumps({"rows": rows, "findings": [f.to_dict() for f in findings]}))
    assert size < 1_000_000, f"{size} bytes saved per hook"  # was 64 MB


def test_scan_stops_after_max_scan_entries_and_says_so(shm_dir: Path) -> None:
    for i in range(300):
        os.close(os.open(shm_dir / f"other-{i}", os.O_CREAT | os.O_WRONLY, 0o600))
    rows, omitted = procs.scan_ipc_bounded([str(shm_dir)], max_scan=100)
    assert rows == [] and omitted["unscanned_dirs"] == [str(shm_dir)]
    (f,) = leftover_ipc(facts_for(rows, omitted), make_cfg())
    assert f.verdict is Verdict.WARN and "too many entries" in f.summary


def test_cap_keeps_hardware_fails_and_counts_the_rest() -> None:
    many = [Finding(id="x", verdict=Verdict.WARN, summary=f"w{i}") for i in range(200)]
    many.insert(150, Finding(id="x", verdict=Verdict.FAIL, summary="hw", hardware=True))
    out = capped("x", many, limit=10)
    assert len(out) == 10 and out[0].summary == "hw"
    assert out[-1].evidence["omitted"] == 192 and out[-1].verdict is Verdict.WARN and not out[-1].hardware
    assert capped("x", many[:5], limit=10) == many[:5]


HOSTILE = [b"nccl-\xff\xfe", b"nccl-x\n2026-12-01T00:00:00 slurm-triage prolog: job 1: OK (forged)",
           b"nccl-\x1b[2J\x1b[1;31mFAKE\x1b[0m", b"nccl-\xe2\x80\xaeevil"]


def test_hostile_names_make_printable_single_line_findings(shm_dir: Path) -> None:
    for n in HOSTILE:
        os.close(os.open(os.fsencode(shm_dir) + b"/" + n, os.O_CREAT | os.O_WRONLY, 0o600))
    rows, omitted = procs.scan_ipc_bounded([str(shm_dir)])
    findings = run_checks(facts_for(rows, omitted), make_cfg())
    assert len(findings) == len(HOSTILE)
    for f in findings:
        line = f"{f.id} {f.summary}"
        line.encode("utf-8")  # strict: no surrogate left to raise UnicodeEncodeError in a log writer
        assert line.isprintable(), line
    text = json.dumps([f.to_dict() for f in findings], ensure_ascii=False)
    text.encode("utf-8")
    assert {r["raw_name"] for r in rows if "raw_name" in r} == {n.hex() for n in HOSTILE}


def test_kernel_text_with_escapes_is_printable(tmp_path: Path) -> None:
    p = tmp_path / "kern.log"
    p.write_bytes(b"[ 1.0] NVRM: Xid (PCI:0000:18:00): 13, pid=7, name=\x1b[31mx\xff\x07, Ch 1\n")
    (e,) = kernel.collect(Config({**defaults(), "kernel": {**defaults()["kernel"], "source": "file",
                                                             "path": str(p)}}))["events"]
    assert e["xid"] == 13 and e["text"].isprintable() and "\\x1b[31m" in e["text"]
