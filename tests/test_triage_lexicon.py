"""The lexicon (slurm_triage/triage/lexicon.toml) and the fallback's best guess from its words.

Every line here is real: the lexicon's own examples, lines of dev corpus cases (tests/corpus, by
bench/corpus.py's split) or of the recorded captures in tests/data/structured.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List

import pytest

from slurm_triage.triage import catalog, lexicon, triage_logs
from slurm_triage.triage.model import CATEGORIES, FALLBACK, LogEvent, TriageFinding
from slurm_triage.model import Verdict
from slurm_triage.triage.rules import correlate, fallback

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import corpus  # noqa: E402

def guess_line(text: str) -> str:
    """The fallback's category for ``text`` read alone as the first error line."""
    e = LogEvent(lexicon.KIND, "x", 1, text, fields={"words": lexicon.words_in(text)})
    return fallback.guess([e], {(0, "x"): [1]})[0] or FALLBACK


def dev_text(case: str) -> str:
    """The log of a dev case (never a validation one)."""
    meta = next(c for c in corpus.cases(split="dev") if c["name"] == case)
    return Path(meta["log"]).read_text(errors="replace")


def write(tmp_path: Path, lines: List[str]) -> Path:
    p = tmp_path / "job.log"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_lexicon_loads_and_covers_every_category() -> None:
    lex = lexicon.load()
    assert {g.category for g in lex.groups} == set(CATEGORIES)
    assert all(0 < g.weight <= 5 and g.sources and g.examples for g in lex.groups)


@pytest.mark.parametrize("group", lexicon.load().groups, ids=lambda g: f"{g.category}-{g.weight:g}")
def test_every_example_guesses_its_group_category_with_its_words(group: lexicon.Group) -> None:
    for ex in group.examples:
        assert guess_line(ex) == group.category, ex
        assert set(lexicon.words_in(ex)) & set(group.terms), ex


def test_examples_are_verbatim_lines_of_the_dev_cases_they_cite() -> None:
    """An example is a real line: it appears in the log of a dev case whose thread the group cites."""
    dev = {corpus.normalize_url(c["source"]): Path(c["log"]) for c in corpus.cases(split="dev")}
    for g in lexicon.load().groups:
        logs = [dev[corpus.normalize_url(u)] for u in g.sources if corpus.normalize_url(u) in dev]
        text = "\n".join(p.read_text(errors="replace") for p in logs)
        missing = [ex for ex in g.examples if ex not in text]
        assert not missing, (g.category, g.weight, missing)


def test_lexicon_never_cites_a_validation_case() -> None:
    """Like the catalog: no group's source is the thread of a validation case (only groups are named)."""
    validation = {corpus.normalize_url(c["source"]) for c in corpus.cases(split="validation")}
    leaked = [f"{g.category}-{g.weight:g}" for g in lexicon.load().groups
              if any(corpus.normalize_url(u) in validation for u in g.sources)]
    assert not leaked


def test_bad_lexicon_names_the_group_and_key(tmp_path: Path) -> None:
    p = tmp_path / "lexicon.toml"
    p.write_text('[[group]]\ncategory = "weather"\nweight = 1.0\nterms = ["rain"]\nsources = ["https://x"]\n'
                 'examples = ["rain"]\n')
    with pytest.raises(lexicon.LexiconError, match="group 1:category"):
        lexicon.load(p)
    p.write_text('[[group]]\ncategory = "memory"\nweight = 1.0\nterms = ["o*m"]\nsources = ["https://x"]\n'
                 'examples = ["x"]\n')
    with pytest.raises(lexicon.LexiconError, match="group 1:terms"):
        lexicon.load(p)


@pytest.mark.parametrize("line,category", [
    ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 11.17 GiB total capacity; 7.57 GiB "
     "already allocated; 18.25 MiB free; 7.74 GiB reserved in total by PyTorch)", "memory"),
    ("amdgpu 0000:29:00.0: WARN: GPU thermal throttling temperature reached, expect performance decrease. HBM.",
     "thermal_power"),
    ("Feb 22 17:46:38 ip-10-1-74-228 slurmd[13562]: spank-epilog: error: pyxis: mkdir: cannot create directory "
     "'/opt/dlami/nvme/tmp/enroot/data': Permission denied", "security"),
    ("OSError: [Errno 24] Too many open files", "host_resources"),
    # no word of the field in it: nothing to guess from
    ("2020-06-11 12:33:17.831797: step 10960, loss = 0.98 (9134.5 examples/sec; 0.014 sec/batch)", FALLBACK),
    # a path component and a traceback frame are not what failed
    ('  File "/root/.local/share/virtualenvs/workspace-dqq3IVyd/lib/python3.10/site-packages/torch/serialization.py", '
     'line 441, in save', FALLBACK),
])
def test_real_lines_guess_their_category_or_unknown(line: str, category: str) -> None:
    assert guess_line(line) == category


def test_words_are_whole_words_not_substrings() -> None:
    assert lexicon.words_in("libibverbs library distributed") == []
    assert lexicon.words_in("photo fancy technical") == []
    assert "fan" in lexicon.words_in("fan1:           0 RPM  (min =    0 RPM, max = 3850 RPM)")


def test_guess_stays_far_below_every_catalog_cause() -> None:
    causes = [e.confidence for e in catalog.entries() if e.role == "cause"]
    assert fallback.GUESS_CONFIDENCE < min(causes) and fallback.GUESS_CONFIDENCE < 0.8


def test_guess_names_the_first_error_and_the_words_that_led_to_it(tmp_path: Path) -> None:
    lines = [line for line in dev_text("private-gpt-1985-gated-repo-401").splitlines() if "gated repo" in line][:1]
    (f,) = triage_logs([str(write(tmp_path, lines))]).findings
    assert (f.id, f.category) == ("log.first_error", "security")
    assert f.confidence <= fallback.GUESS_CONFIDENCE and "gated repo" in f.evidence["lexicon"]["words"]
    assert "best guess security" in f.summary and lines[0][:60] in f.summary


def test_nothing_pointing_anywhere_stays_unknown(tmp_path: Path) -> None:
    p = tmp_path / "job.err"
    p.write_text("loading data\nTraceback (most recent call last):\n  File \"t.py\", line 3, in <module>\n"
                 "ZeroDivisionError: division by zero\nsrun: error: n1: task 0: Exited with exit code 1\n")
    (f,) = triage_logs([str(p)]).findings
    assert (f.category, f.confidence) == (FALLBACK, fallback.CONFIDENCE)


def test_a_guess_never_outranks_a_real_finding() -> None:
    guess = TriageFinding(id=fallback.ID, category="memory", verdict=Verdict.WARN, confidence=0.3,
                          summary="first error — best guess memory", action="x")
    guess.first_time = 10.0
    symptom = TriageFinding(id="log.conn_reset", category="network", verdict=Verdict.WARN, confidence=0.3,
                            summary="resets", action="x", consequence=True)
    symptom.first_time = 50.0
    assert [f.id for f in correlate([guess, symptom])] == ["log.conn_reset", fallback.ID]
    assert correlate([guess])[0] is guess


def test_a_log_with_a_catalog_hit_gets_no_guess(tmp_path: Path) -> None:
    p = tmp_path / "job.log"
    p.write_text(dev_text("ssd-pytorch-91-too-many-open-files"))
    ids = [f.id for f in triage_logs([str(p)]).findings]
    assert ids and fallback.ID not in ids


def test_a_paste_without_error_lines_is_weighed_by_its_distinct_words(tmp_path: Path) -> None:
    """Status output (here the thermal lines of an ROCm issue's dmesg) has no error word: the guess comes
    from its words alone, with less confidence than next to an error line."""
    hot = [line for line in dev_text("rocm-1468-mi100-hbm-throttle").splitlines() if "thermal throttling" in line]
    p = write(tmp_path, hot)
    evs = lexicon.hits(str(p))
    assert evs and all(e.kind == lexicon.KIND for e in evs)
    (f,) = fallback.first_error(evs)
    assert f.category == "thermal_power" and f.confidence < fallback.GUESS_CONFIDENCE
    assert "no error line" in f.summary


def test_hits_read_only_the_lines_near_the_first_error(tmp_path: Path) -> None:
    p = tmp_path / "job.out"
    p.write_text("OSError: [Errno 24] Too many open files\n" + "step\n" * 200
                 + "RuntimeError: CUDA error: invalid device ordinal\n")
    near = lexicon.hits(str(p), near=[202], window=lexicon.WINDOW)
    assert [e.line for e in near] == [202]
    assert [e.line for e in lexicon.hits(str(p))] == [1, 202]


def test_gzip_log_is_read_by_the_python_path(tmp_path: Path) -> None:
    import gzip

    p = tmp_path / "job.out.gz"
    p.write_bytes(gzip.compress(b"step 1\nOSError: [Errno 24] Too many open files\n"))
    assert [(e.line, e.fields["words"]) for e in lexicon.hits(str(p))] == [(2, ["too many open files"])]


def test_a_weak_lean_is_still_a_guess_but_less_sure_than_a_strong_one(tmp_path: Path) -> None:
    """One mid-weight word next to the first error line is a guess (better than "unknown"), at a
    lower confidence than a strong word gives; a layer name alone stays unknown (the test above)."""
    weak, strong = tmp_path / "weak.err", tmp_path / "strong.err"
    weak.write_text("step 1200\nRuntimeError: worker 3 exited\n  last message: connection refused\n")
    strong.write_text("step 1200\nRuntimeError: connection refused by ibv_post_send\n")
    (w,) = triage_logs([str(weak)]).findings
    (s,) = triage_logs([str(strong)]).findings
    assert (w.category, s.category) == ("network", "network")
    assert fallback.CONFIDENCE < w.confidence < s.confidence <= fallback.GUESS_CONFIDENCE


IBSTAT = Path(__file__).resolve().parent / "data" / "structured" / "infiniband" / "archwiki-ibstat-port2-polling.txt"
EXITED = "srun: error: n1: task 0: Exited with exit code 1"


def _fallback_of(p: Path) -> List[TriageFinding]:
    from slurm_triage.triage import first_error_events

    return fallback.first_error(first_error_events([str(p)], {str(p): {"read": True}}))


def test_a_generic_error_line_takes_the_whole_log_as_second_opinion(tmp_path: Path) -> None:
    """The error line names only a layer (srun) and the cause is said far above it (an ibstat paste
    60 lines up, beyond lexicon.WINDOW): the whole log's words lead, so the guess is theirs, less sure."""
    p = write(tmp_path, IBSTAT.read_text().splitlines() + ["step"] * 60 + [EXITED])
    (f,) = _fallback_of(p)
    assert f.category == "network" and fallback.CONFIDENCE <= f.confidence <= fallback.GUESS_CONFIDENCE - 0.05
    assert f.evidence["lexicon"]["scope"] == "across the whole log" and "mlx4*" in f.evidence["lexicon"]["words"]
    assert "words across the whole log" in f.summary and EXITED in f.summary
    near = write(tmp_path, [EXITED])
    (u,) = _fallback_of(near)
    assert u.category == FALLBACK


def test_a_split_whole_log_stays_unknown(tmp_path: Path) -> None:
    """The whole-log opinion needs a clear lead (WHOLE_LEAD): network words far above, thermal words too."""
    hot = "mce: CPU1: Core temperature above threshold, cpu clock throttled (total events = 2311)"
    p = write(tmp_path, IBSTAT.read_text().splitlines() + [hot] + ["step"] * 60 + [EXITED])
    (f,) = _fallback_of(p)
    assert f.category == FALLBACK and f.confidence == fallback.CONFIDENCE
    assert f.evidence["lexicon"]["scope"] == "near the first error"
