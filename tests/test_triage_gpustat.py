"""gpustat rows, and a GPU whose memory no listed process owns (a leftover the job cannot see)."""
from __future__ import annotations

from pathlib import Path

from slurm_triage.triage import triage_logs
from slurm_triage.triage.model import TriageFinding
from slurm_triage.triage.parsers import gpustat
from slurm_triage.triage.parsers.base import Doc
from slurm_triage.triage.rules import correlate
from slurm_triage.triage.rules.structured import gpustat_orphans

# https://github.com/qizhou000/VisEdit/issues/5 (a dev case): 10 GB held after the run was killed.
NULL_OWNER = "[6] NVIDIA A100 80GB PCIe | 52'C, 100 % | 10151 / 81920 MB | (null)"
# A public gpustat paste (an ansible run of gpustat over a lab's servers, found by code search):
OWNED = "[0] NVIDIA RTX A6000 | 67'C, 100 % | 45168 / 49140 MB | xxxxx(44705M) gdm(4M)"
IDLE = "[0] NVIDIA RTX A5000 | 31'C,   0 % |   308 / 24564 MB |"
# gpustat -i without the process column (a public paste of a training run): nothing to say about owners.
NO_COLUMN = "[0] Tesla V100-SXM2-32GB | 65'C,  99 % | 30338 / 32510 MB"


def test_rows_are_read_with_their_owners() -> None:
    evs = gpustat.parse(Doc("x", [NULL_OWNER, OWNED, IDLE, NO_COLUMN, "step 10 loss 0.3"]))
    got = [(e.line, e.fields["index"], e.fields["util_pct"], e.fields["mem_used_mib"], e.fields["owners"]) for e in evs]
    assert got == [(1, 6, 100.0, 10151.0, 0), (2, 0, 100.0, 45168.0, 2), (3, 0, 0.0, 308.0, 0)]
    assert evs[0].fields["name"] == "NVIDIA A100 80GB PCIe" and evs[0].gpu == "6"


def test_memory_that_no_listed_process_owns_is_a_leftover_note() -> None:
    evs = gpustat.parse(Doc("x", [NULL_OWNER, OWNED, IDLE]))
    [f] = gpustat_orphans(evs)
    assert (f.id, f.category, f.confidence, f.consequence, f.gpu) == ("gpustat.unowned", "host_resources", 0.45, True, "6")
    assert "10151 / 81920 MB used" in f.summary and "(null)" in f.summary


def test_owned_idle_or_columnless_rows_say_nothing() -> None:
    assert gpustat_orphans(gpustat.parse(Doc("x", [OWNED, IDLE, NO_COLUMN]))) == []


def test_the_note_ranks_after_any_cause_and_is_found_from_a_log(tmp_path: Path) -> None:
    p = tmp_path / "paste.txt"
    p.write_text(NULL_OWNER + "\n")
    [f] = triage_logs([str(p)]).findings[:1]
    assert (f.id, f.category) == ("gpustat.unowned", "host_resources")
    cause = TriageFinding(id="log.oom.cuda", category="memory", verdict=f.verdict, confidence=0.9,
                          summary="CUDA out of memory", action="-")
    cause.first_time = 99.0
    assert correlate([f, cause])[0] is cause
