"""The terminal report: a one-line "what to do now", colour only on a terminal (NO_COLOR honoured),
and no escape sequence from a log ever reaching the terminal."""
from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

from conftest import ROOT
from slurm_triage.model import Verdict
from slurm_triage.triage import TriageResult, triage_logs
from slurm_triage.triage.model import TriageFinding
from slurm_triage.triage.report import render_text, what_to_do_now

CASE = ROOT / "tests" / "corpus" / "nccl-1405-ib-retry-exceeded" / "log.txt"


def _finding(category: str, node: str = "node4", summary: str = "GPU 3 fell off the bus") -> TriageFinding:
    return TriageFinding(id="x", category=category, verdict=Verdict.FAIL, confidence=0.9, summary=summary,
                         action="fix the job's config", node=node)


def test_what_to_do_now_names_the_command_for_a_node_local_cause() -> None:
    hw = what_to_do_now(_finding("gpu_hardware", summary='GPU 3 "fell" off\\the bus'))
    assert hw.startswith('scontrol update nodename=node4 state=drain reason="triage: GPU 3 fell off the bus"')
    assert "sbatch --exclude=node4" in hw
    assert what_to_do_now(_finding("network")).startswith("resubmit with sbatch --exclude=node4")
    assert what_to_do_now(_finding("config")) == "fix the job's config"  # not node-local: the action
    assert what_to_do_now(_finding("gpu_hardware", node=None)) == "fix the job's config"


def test_colour_only_when_asked_and_never_from_the_log() -> None:
    hostile = _finding("network", summary="link down \x1b[2J\x1b]0;pwned\x07 on node4")
    r = TriageResult(None, [hostile])
    plain, coloured = render_text(r), render_text(r, colour=True)
    assert "\x1b" not in plain and "what to do now: resubmit with sbatch --exclude=node4" in plain
    assert "\x1b[1;31mROOT CAUSE\x1b[0m" in coloured and "\x1b[31mFAIL\x1b[0m" in coloured
    assert "\x1b[2J" not in coloured and "\x1b]0;" not in coloured and "\\x1b[2J" in coloured


def _cli(*args: str, tty: bool, env_extra: dict) -> str:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env.update(env_extra)
    argv = [sys.executable, "-m", "slurm_triage", "triage", "--log", str(CASE), *args]
    if not tty:
        return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=str(ROOT), timeout=60).stdout
    master, slave = pty.openpty()
    p = subprocess.Popen(argv, stdout=slave, stderr=subprocess.DEVNULL, env=env, cwd=str(ROOT))
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO once the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    p.wait(60)
    os.close(master)
    return out.decode("utf-8", "replace")


def test_cli_colours_a_terminal_but_not_a_pipe_or_no_color(tmp_path: Path) -> None:
    assert "\x1b[1;31mROOT CAUSE" in _cli(tty=True, env_extra={})
    assert "\x1b" not in _cli(tty=True, env_extra={"NO_COLOR": "1"})
    assert "\x1b" not in _cli(tty=False, env_extra={})
    out = tmp_path / "r.txt"
    _cli("--output", str(out), tty=True, env_extra={})
    assert "ROOT CAUSE" in out.read_text() and "\x1b" not in out.read_text()
    assert triage_logs([str(CASE)]).findings  # the case has a root cause to colour
