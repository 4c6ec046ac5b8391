"""Success markers (slurm_triage/triage/healthy.toml): a log that says its run succeeded and shows no error
line gets no guess; the same log with an error line still does."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import corpus  # noqa: E402

from slurm_triage.triage import healthy, triage_logs  # noqa: E402
from slurm_triage.triage.logs import error_lines  # noqa: E402


def _healthy_dev() -> dict:
    return {corpus.normalize_url(c["source"]): c for c in corpus.cases(corpus.HEALTHY, split="dev")}


@pytest.mark.parametrize("marker", healthy.markers(), ids=lambda m: m.id)
def test_every_example_matches_its_marker_only(marker: healthy.Marker) -> None:
    for ex in marker.examples:
        assert healthy.match(ex) == [marker], ex


def test_examples_are_verbatim_lines_of_the_dev_healthy_logs_they_cite() -> None:
    dev = _healthy_dev()
    for m in healthy.markers():
        logs = [Path(dev[corpus.normalize_url(u)]["log"]) for u in m.sources if corpus.normalize_url(u) in dev]
        assert logs, f"{m.id}: no dev healthy log among its sources"
        text = "\n".join(p.read_text(errors="replace") for p in logs)
        assert all(ex in text for ex in m.examples), m.id


def test_markers_never_cite_a_validation_case() -> None:
    validation = {corpus.normalize_url(c["source"]) for root in (corpus.CORPUS, corpus.HEALTHY)
                  for c in corpus.cases(root, split="validation")}
    assert not [m.id for m in healthy.markers() if any(corpus.normalize_url(u) in validation for u in m.sources)]


def test_bad_marker_names_the_marker_and_key(tmp_path: Path) -> None:
    p = tmp_path / "healthy.toml"
    base = 'id = "x"\nwhat = "y"\nneedles = ["ok"]\nsources = ["https://example.org"]\nexamples = ["ok"]\n'
    p.write_text('[[marker]]\n' + base + 'regex = "("\n')
    with pytest.raises(healthy.HealthyError, match=r"marker 1:regex"):
        healthy.load(p)
    p.write_text('[[marker]]\n' + base + 'regex = "ok"\ncategory = "config"\n')
    with pytest.raises(healthy.HealthyError, match=r"marker 1:category: unknown key"):
        healthy.load(p)


def test_a_successful_run_gets_no_guess_until_an_error_line_appears(tmp_path: Path) -> None:
    """A dev healthy log whose words and container bridge address made findings: with its nccl-tests
    result it is quiet; the same log plus one error line is read as a failure again."""
    src = next(c for c in corpus.cases(corpus.HEALTHY, split="dev")
               if c["name"] == "b5paper-nccl-note-allreduce-4gpu-debug-info")
    text = Path(src["log"]).read_text()
    assert "Bootstrap : Using eth0:172.17.0.2" in text and "Out of bounds values : 0 OK" in text
    assert triage_logs([src["log"]]).findings == []
    without = tmp_path / "no-marker.log"
    without.write_text(text.replace("# Out of bounds values : 0 OK", "#"))
    assert triage_logs([str(without)]).findings  # the same words, no marker: the hint stands
    failed = tmp_path / "failed.log"
    failed.write_text(text + "RuntimeError: CUDA error: invalid device ordinal\n")
    assert triage_logs([str(failed)]).findings


def test_nccl_tests_column_header_is_not_an_error_line(tmp_path: Path) -> None:
    """Old nccl-tests name a column 'error' (the values' deviation); a real error line still counts."""
    p = tmp_path / "nccl-tests.log"
    header = "#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error"
    p.write_text(header + "\n")
    assert error_lines(str(p)) == []
    p.write_text(header + "\nNCCL error: unhandled system error\n")
    assert [e.line for e in error_lines(str(p))] == [2]


@pytest.mark.parametrize("benign", [
    "        Correctable Error                 : 0",
    "[1,0]<stdout>:nccl-tests-efa-16-worker-0:25:25 [0] NCCL INFO NET/Plugin: Failed to find ncclCollNetPlugin_v4 symbol.",
])
def test_counters_at_zero_and_plugin_probes_are_no_error_lines(tmp_path: Path, benign: str) -> None:
    """Real lines of dev healthy logs (nvidia-smi -q, NCCL INFO) that say 'error'/'failed' of nothing wrong; a counter
    that is not zero (a real line, the lexicon's gpu_hardware example) still is an error line."""
    p = tmp_path / "x.log"
    p.write_text(benign + "\n" + "Uncorrectable Error               : 4\n")
    assert [e.line for e in error_lines(str(p))] == [2]
