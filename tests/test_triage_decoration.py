"""Logs as terminals, launchers and pastes hand them over: coloured, labelled per rank, quoted.

The lines are real dev cases of the corpus; the decorations are the launchers' own formats
(torchrun's ``[rank3]: ``, ``srun --label``'s right-aligned task id, Open MPI ``--tag-output``'s
``[1,3]<stderr>:``), a log collector's RFC 3339 stamp (``kubectl logs --timestamps``), ECMA-48 colour codes as colorlog and loguru wrap a level name, and a mail or
Markdown reply's ``> ``. A decorated log must be judged as its bare self.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pytest

from slurm_triage.triage import decoration, logs, parsers, triage_logs

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "corpus"
sys.path.insert(0, str(ROOT / "bench"))
import corpus  # noqa: E402

CASES = (
    "alpaca-lora-123-ecc-uncorrectable",  # a catalog entry on a traceback line
    "accelerate-3104-zero3-pyspy-one-rank-forward",  # py-spy dumps
    "gpud-80-remapped-rows-pending",  # nvidia-smi -q
    "godcgm-52-diag-gpu0-busy",  # a dcgmi diag table
    "slurm-mail-63-cancelled-before-start",  # sacct
    "open-gpu-kernel-modules-1229-egpu-pcie-cmplto-aer-unrecoverable-xid31",  # kernel log
    "torchtitan-1617-validation-steps-minus1-ranks-out-of-step",  # torchrun's own [rankN]: labels
)
_LEVEL = re.compile(r"\b(ERROR|Error|error|WARN(?:ING)?|FATAL|failed|Traceback)\b")

DECORATIONS: Dict[str, Callable[[int, str], str]] = {
    "colour": lambda i, line: _LEVEL.sub(lambda m: f"\x1b[1;31m{m[0]}\x1b[0m", line),
    "torchrun": lambda i, line: f"[rank{i % 8}]: {line}",
    "srun --label": lambda i, line: f"{i % 16:>2}: {line}",
    "openmpi --tag-output": lambda i, line: f"[1,{i % 4}]<stderr>:{line}",
    "quoted": lambda i, line: f"> {line}",
    "kubectl logs --timestamps": lambda i, line: f"2025-03-04T05:06:07.{i:09d}Z {line}",
}


def decorate(src: Path, dst: Path, how: Callable[[int, str], str]) -> None:
    lines = src.read_bytes().decode("utf-8", "replace").split("\n")
    dst.write_text("\n".join(how(i, line) for i, line in enumerate(lines)))


def first(path: Path) -> Optional[Tuple[str, str]]:
    found = triage_logs([str(path)]).findings
    return (found[0].id, found[0].category) if found else None


def test_the_cases_are_dev_cases() -> None:
    dev = {c["name"] for c in corpus.cases(split="dev")}
    assert set(CASES) <= dev


@pytest.mark.parametrize("how", sorted(DECORATIONS))
def test_a_decorated_log_is_judged_as_the_bare_one(how: str, tmp_path: Path) -> None:
    for name in CASES:
        bare = CORPUS / name / "log.txt"
        decorated = tmp_path / f"{name}.log"
        decorate(bare, decorated, DECORATIONS[how])
        want = first(bare)
        assert want is not None and first(decorated) == want, (how, name)


def test_a_coloured_log_needs_no_colour_in_its_needles_grep_or_not(tmp_path: Path) -> None:
    """Colour codes inside a needle ("NCCL \\x1b[33mWARN") hide it from grep and the block scanner
    alike unless the codes come off before the needles are looked for."""
    bare = CORPUS / "alpaca-lora-123-ecc-uncorrectable" / "log.txt"
    coloured = tmp_path / "coloured.log"
    decorate(bare, coloured, lambda i, line: line.replace("uncorrectable", "uncorr\x1b[0mectable"))
    assert b"uncorrectable" not in coloured.read_bytes()
    want = sorted((e.kind, e.line) for e in logs.scan(str(bare))[0])
    assert want and sorted((e.kind, e.line) for e in logs.scan(str(coloured))[0]) == want
    assert sorted((e.kind, e.line) for e in logs.scan(str(coloured), prefilter=False)[0]) == want
    events = logs.scan(str(coloured))[0]
    assert all("\x1b" not in e.text for e in events)


def test_labels_name_the_rank_and_come_off_the_line() -> None:
    assert decoration.undecorate("[rank3]: RuntimeError: NCCL error") == ("RuntimeError: NCCL error", 3)
    assert decoration.undecorate(" 7:   File \"train.py\", line 9") == ("  File \"train.py\", line 9", 7)
    assert decoration.undecorate("[1,5]<stderr>:[node2:1234] *** Process received signal ***") == \
        ("[node2:1234] *** Process received signal ***", 5)
    # stacked: srun labels the launcher's task (one per node), torch the rank
    assert decoration.undecorate("> 1: [rank12]: Watchdog caught collective operation timeout") == \
        ("Watchdog caught collective operation timeout", 12)
    assert decoration.undecorate("[default0]:Traceback (most recent call last):") == \
        ("Traceback (most recent call last):", None)
    # what only looks like a label stays: times, dmesg stamps, NCCL's host:pid:tid, bus ids
    for line in ("12:34:56 slurmd[99]: error: Munge decode failed", "[ 1234.567890] NVRM: Xid (PCI:0000:3b:00): 79",
                 "node1:4242:4250 [0] NCCL INFO Bootstrap", "0000:3b:00.0 3D controller: NVIDIA"):
        assert decoration.undecorate(line) == (line, None)


def test_colour_codes_of_every_kind_come_off() -> None:
    line = "\x1b]0;title\x07\x1b[38;5;196mERROR\x1b[0m \x1b[1mCUDA out of memory\x1b[22m\x1b(B"
    assert decoration.strip_ansi(line) == "ERROR CUDA out of memory"
    assert decoration.strip_ansi_bytes(line.encode()) == b"ERROR CUDA out of memory"


def test_an_event_takes_its_rank_from_the_srun_label(tmp_path: Path) -> None:
    bare = CORPUS / "alpaca-lora-123-ecc-uncorrectable" / "log.txt"
    labelled = tmp_path / "labelled.log"
    decorate(bare, labelled, lambda i, line: f"{5:>2}: {line}")
    events = logs.scan(str(labelled))[0]
    assert events and {e.rank for e in events} == {5}
    assert all(e.text.startswith("5: ") for e in events)  # the evidence shows the label as the log did


def test_progress_ranks_from_every_launchers_label(tmp_path: Path) -> None:
    """Open MPI's tags name ranks as torchrun's labels do: the per-rank progress is read from either."""
    src = (CORPUS / "torchtitan-1617-validation-steps-minus1-ranks-out-of-step" / "log.txt").read_text()
    as_mpi = re.sub(r"(?m)^\[rank(\d+)\]: ?", lambda m: f"[1,{m[1]}]<stdout>:", src)
    assert as_mpi != src

    def progress(text: str) -> List[Tuple[int, str, int]]:
        evs = parsers.parse_lines(text.split("\n"), "x")
        return [(e.rank, e.fields["counter"], e.fields["value"]) for e in evs if e.kind == "rank_progress"]

    assert progress(src) and progress(as_mpi) == progress(src)


def test_a_collector_stamp_comes_off_and_still_dates_the_event(tmp_path: Path) -> None:
    stamped = tmp_path / "pod.log"
    src = (CORPUS / "alpaca-lora-123-ecc-uncorrectable" / "log.txt").read_text().split("\n")
    stamped.write_text("\n".join(f"2025-03-04T05:06:07.123456789Z {line}" for line in src))
    events = logs.scan(str(stamped))[0]
    assert events and all(e.time is not None and abs(e.time - 1741064767.123) < 0.001 for e in events)
    # journald's short-iso stamp is the kernel line's own: it is not a collector's and stays
    line = "2025-03-04T05:06:07+0000 gpu7 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234"
    assert decoration.undecorate(line) == (line, None)
