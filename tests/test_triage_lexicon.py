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
    """(The fallback alone, as on a log whose shape the catalog does not know: the catalog names this one now.)"""
    lines = [line for line in dev_text("private-gpt-1985-gated-repo-401").splitlines() if "gated repo" in line][:1]
    (f,) = [x for x in _fallback_of(write(tmp_path, lines)) if x.id == fallback.ID]
    assert (f.id, f.category) == ("log.first_error", "security")
    assert f.confidence <= fallback.GUESS_CONFIDENCE and "gated repo" in f.evidence["lexicon"]["words"]
    assert "best guess security" in f.summary and lines[0][:60] in f.summary


def test_nothing_pointing_anywhere_stays_unknown(tmp_path: Path) -> None:
    p = tmp_path / "job.err"
    p.write_text("loading data\nTraceback (most recent call last):\n  File \"t.py\", line 3, in <module>\n"
                 "ZeroDivisionError: division by zero\nsrun: error: n1: task 0: Exited with exit code 1\n")
    (f,) = triage_logs([str(p)]).findings
    assert f.evidence["lexicon"]["guess"] is None  # no word of the lexicon points anywhere
    # Only the learned prior (rules/prior.py) may still name a category, below the first error's confidence.
    assert f.category == f.evidence.get("prior", {}).get("guess", FALLBACK) and f.confidence <= fallback.CONFIDENCE


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
    (f,) = [x for x in fallback.first_error(evs) if x.id == fallback.ID]  # the lean beside it waits for a symptom
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
    strong.write_text("step 1200\nRuntimeError: connection refused by ibv_post_send: no route to host\n")
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
    assert f.category == "network" and round(fallback.CONFIDENCE - 0.05, 2) <= f.confidence <= fallback.GUESS_CONFIDENCE - 0.05
    assert f.evidence["lexicon"]["scope"] == "across the whole log" and "mlx4*" in f.evidence["lexicon"]["words"]
    assert "words across the whole log" in f.summary and EXITED in f.summary
    near = write(tmp_path, [EXITED])
    (u,) = _fallback_of(near)
    # The layer word alone gives the lexicon no guess; only the learned prior may name one, below its confidence.
    assert u.evidence["lexicon"]["guess"] is None
    assert u.category == u.evidence.get("prior", {}).get("guess", FALLBACK) and u.confidence <= fallback.CONFIDENCE


def test_a_split_whole_log_stays_unknown(tmp_path: Path) -> None:
    """The whole-log opinion needs a clear lead (WHOLE_LEAD): network words far above, thermal words too."""
    hot = "mce: CPU1: Core temperature above threshold, cpu clock throttled (total events = 2311)"
    p = write(tmp_path, IBSTAT.read_text().splitlines() + [hot] + ["step"] * 60 + [EXITED])
    (f,) = [x for x in _fallback_of(p) if x.id == fallback.ID]  # the lean beside it waits for a symptom
    assert f.evidence["lexicon"]["guess"] is None and f.evidence["lexicon"]["scope"] == "near the first error"
    # Only the learned prior (rules/prior.py, below the lexicon's confidence) may still name a category.
    assert f.category == f.evidence.get("prior", {}).get("guess", FALLBACK) and f.confidence <= fallback.CONFIDENCE


def test_a_stack_dumps_headers_and_frame_paths_are_not_words() -> None:
    """py-spy's thread headers and the file of a frame are layout ("Thread", "threading.py" are not
    thread exhaustion); a frame's function still counts (lines of the dev case accelerate-3104)."""
    text = dev_text("accelerate-3104-zero3-pyspy-one-rank-forward")
    for line in ('Thread 931 (idle): "Thread-1"', "Thread 4068 (active)", "    wait (threading.py:324)"):
        assert line in text and lexicon.words_in(line) == [], line
    frame = "    all_gather_into_tensor (torch/distributed/distributed_c10d.py:2709)"
    assert frame in text and lexicon.words_in(frame) == ["all_gather*"]
    assert lexicon.words_in("RuntimeError: can't start new thread") == ["can't start new thread"]


def test_names_cause_marks_a_fabric_setting_and_is_validated(tmp_path: Path) -> None:
    lex = lexicon.load()
    assert any(t.names_cause for t in lex.by_word["nccl_socket_ifname"])
    assert not any(t.names_cause for t in lex.by_word["cuda_visible_devices"])
    bad = tmp_path / "lexicon.toml"
    bad.write_text(lexicon.PATH.read_text().replace("names_cause = true", 'names_cause = "yes"'))
    with pytest.raises(lexicon.LexiconError, match=r"group \d+:names_cause: not a bool"):
        lexicon.load(bad)


def test_the_signal_named_on_a_line_decides_what_killed_means(tmp_path: Path) -> None:
    """"Killed" is the kernel's or Slurm's SIGKILL only while the line names no other signal: SIGINT
    (Ctrl-C on a hung launcher, dev case mxnet-3685) is no memory kill, nor is a bus error."""
    line = "Killed by signal 2."
    text = dev_text("mxnet-3685-ps-lite-scheduler-port-firewall-hang")
    assert line in text and lexicon.words_in(line) == []
    (f,) = [x for x in _fallback_of(write(tmp_path, text.splitlines())) if x.id == fallback.ID]
    assert f.category != "memory"
    bus = "RuntimeError: DataLoader worker (pid 56811) is killed by signal: Bus error."
    assert bus in dev_text("megatron-878-shm-no-space-bus-error") and lexicon.words_in(bus) == ["bus error"]
    killed = "RuntimeError: DataLoader worker (pid 19597) is killed by signal: Killed."
    assert killed in dev_text("dcpdn-12-dataloader-killed") and lexicon.words_in(killed) == ["killed"]


def test_a_field_whose_value_says_absent_is_no_word(tmp_path: Path) -> None:
    """A status table's ``Thermal HW: false`` and a zero-degree reading (a sensor that reads nothing,
    dev case gpu-fryer-10) report no heat; a label followed by an error text still counts."""
    text = dev_text("gpu-fryer-10-broken-gpus-zero-gflops-reported-healthy")
    for line in ("Throttling HW: false, Thermal SW: false, Thermal HW: false",
                 "Temperature: 0.00°C (min: 18446744073709551616.00, max: 0.00)"):
        assert line in text and lexicon.words_in(line) == [], line
    assert not [x for x in _fallback_of(write(tmp_path, text.splitlines())) if x.category == "thermal_power"]
    assert "no route to host" in lexicon.words_in("NCCL WARN NET/IB : No route to host")
    assert "hw slowdown" in lexicon.words_in("HW Slowdown : Active")


def test_a_denial_counts_for_the_thing_denied(tmp_path: Path) -> None:
    """``shm_open failed : Permission denied`` is the host's shared memory (dev case nccl-328); a
    denial of a credential's socket stays security (dev case magic-castle-177)."""
    text = dev_text("nccl-328-dev-shm-permission-denied")
    shm = "node08:27106:27302 [0] include/shm.h:27 NCCL WARN Call to shm_open failed : Permission denied"
    assert shm in text and lexicon.words_in(shm) == ["nccl", "shm"]
    assert guess_line(shm) == "host_resources"
    munge = 'squeue: error: Munge encode failed: Failed to access "/var/run/munge/munge.socket.2": Permission denied'
    assert munge in dev_text("magic-castle-177-munge-socket-selinux")
    assert "permission denied" in lexicon.words_in(munge) and guess_line(munge) == "security"


def test_a_dump_frame_counts_its_function_also_when_stripped() -> None:
    """The second pass strips lines: ``wait (threading.py:302)`` (dev case pytorch-87995) is a frame still."""
    line = "wait (threading.py:302)"
    assert line in dev_text("pytorch-87995-rank0-dataloader-pyspy-others-allreduce-unresolved")
    assert lexicon.words_in(line) == []


def test_warnings_speak_in_a_log_without_errors(tmp_path: Path) -> None:
    """A log without any error line says what worried it in its warnings (dev case excavator-329: GPU
    temperature warnings): their words count fully, the guess stays far below the anchored one."""
    text = dev_text("excavator-329-device-too-hot-low-temp-limit")
    (f,) = [x for x in _fallback_of(write(tmp_path, text.splitlines())) if x.id == fallback.ID]
    assert f.category == "thermal_power" and f.confidence < fallback.GUESS_CONFIDENCE - 0.05
    assert f.evidence["lexicon"]["words"] == ["temp"]  # one distinct word: at UNANCHORED it would be no guess
    assert 1.5 * fallback.UNANCHORED < fallback.MIN_SCORE <= 1.5 * fallback.WARNED


def test_fields_that_report_nothing_wrong_give_no_words() -> None:
    """A result cell that says its test passed (dcgmi's table), nvidia-smi's CSV query header and a CamelCase
    field name of Slurm's records name no failure; the same words where something failed still count."""
    assert lexicon.words_in("| Page Retirement           | Pass                                           |") == []
    assert "page retirement" in lexicon.words_in("| Page Retirement | Fail - GPU: 0 |")
    assert lexicon.words_in("index, name, temperature.gpu, power.draw [W], power.limit [W], "
                            "ecc.errors.corrected.volatile.total, ecc.errors.uncorrected.volatile.total") == []
    assert "thread*" not in lexicon.words_in("State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=40 Owner=N/A")
    assert "thread*" in lexicon.words_in("threads leaked after restore: 12")
