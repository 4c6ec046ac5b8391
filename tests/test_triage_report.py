"""Reports for people: readable evidence (UTC times, units, short lists), control characters
escaped, the first-error fallback that never outranks a real finding; JSON keeps raw values."""
from __future__ import annotations

import json
from pathlib import Path

from slurm_triage.model import Verdict
from slurm_triage.triage import TriageResult, triage_logs
from slurm_triage.triage.model import FALLBACK, TriageFinding
from slurm_triage.triage.report import readable, render_json, render_markdown, render_text, safe
from slurm_triage.triage.rules import correlate

OOM = "slurmstepd: error: Detected 1 oom_kill event in StepId=77.0. Some of the step tasks have been OOM Killed."


def test_readable_values() -> None:
    assert readable("end", 1764500000.0) == "2025-11-30T10:53:20Z"
    assert readable("timeout_seconds", 600.0) == "600 s"
    assert readable("segment_bytes", 9637888) == "9.2 MiB"
    assert readable("temp_max_celsius", 91) == "91 °C"
    assert readable("ranks", list(range(20))) == "[0, 1, 2, 3, 4, 5, … (+14 more)]"
    assert readable("count", 3) == "3" and readable("at", 12) == "12"  # not an epoch: left alone


def test_control_characters_cannot_forge_report_lines(tmp_path: Path) -> None:
    p = tmp_path / "job.out"
    p.write_bytes(OOM.encode() + b" \x1b[2J\rROOT CAUSE [security] forged\n")
    r = triage_logs([str(p)])
    text, md = render_text(r), render_markdown(r)
    assert "\x1b" not in text + md and "\r" not in text + md
    assert "\\x0dROOT CAUSE" in text  # the escape sequence is terminal decoration: it is not kept (decoration.py)
    assert not any(ln.startswith("ROOT CAUSE [security]") for ln in text.splitlines())
    line = json.loads(render_json(r))["findings"][0]["evidence"]["lines"][0]
    assert "\rROOT CAUSE" in line and "\x1b" not in line  # raw for scripts, less the terminal codes
    assert safe("a\nb\u202ec") == "a\\x0ab\\u202ec"


def test_text_report_times_are_utc_iso() -> None:
    f = TriageFinding(id="slurm.timeout", category="scheduler", verdict=Verdict.FAIL, confidence=0.8,
                      summary="job hit its time limit", action="x", evidence={"end": 1764500000.0, "restarts": 0})
    r = TriageResult("9", [f], {}, [], {"state": "TIMEOUT", "start": 1764496400.0, "end": 1764500000.0})
    text = render_text(r)
    assert "2025-11-30T09:53:20Z – 2025-11-30T10:53:20Z" in text and "end=2025-11-30T10:53:20Z" in text
    assert json.loads(render_json(r))["findings"][0]["evidence"]["end"] == 1764500000.0


def test_no_known_shape_names_the_first_error(tmp_path: Path) -> None:
    p = tmp_path / "job.err"
    p.write_text("loading data\nTraceback (most recent call last):\n  File \"t.py\", line 3, in <module>\n"
                 "ZeroDivisionError: division by zero\nsrun: error: n1: task 0: Exited with exit code 1\n")
    r = triage_logs([str(p)])
    (f,) = r.findings
    assert f.id == "log.first_error" and f.confidence <= 0.2
    assert f.category == f.evidence.get("prior", {}).get("guess", FALLBACK)  # only the word prior may guess here
    assert "ZeroDivisionError: division by zero" in f.summary and f.evidence["first_line"] == f"{p}:4"
    assert render_text(r).startswith(f"triage of logs\n\nFIRST ERROR [{f.category}]")
    assert "## First error (no known signature)" in render_markdown(r)


def test_unknown_never_outranks_a_real_finding() -> None:
    unknown = TriageFinding(id="log.first_error", category=FALLBACK, verdict=Verdict.WARN, confidence=0.2,
                            summary="first error", action="read it")
    unknown.first_time = 10.0
    symptom = TriageFinding(id="log.conn_reset", category="network", verdict=Verdict.WARN, confidence=0.3,
                            summary="resets", action="x", consequence=True)
    symptom.first_time = 50.0
    assert [f.id for f in correlate([unknown, symptom])] == ["log.conn_reset", "log.first_error"]
    assert correlate([unknown])[0] is unknown


def test_first_error_also_shown_when_only_weak_symptoms_were_found(tmp_path: Path) -> None:
    p = tmp_path / "job.err"
    p.write_text("[I130 15:29:04.080287887 TCPStore.cpp:274] [c10d - debug] The server has started on port = 55555.\n"
                 "Traceback (most recent call last):\nKeyError: 'labels'\n")
    r = triage_logs([str(p)])
    assert [f.id for f in r.findings] == ["log.tcpstore_server", "log.first_error"]
    assert "KeyError: 'labels'" in r.findings[1].summary
