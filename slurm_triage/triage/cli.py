"""`slurm-triage triage [JOBID] [--log PATH ...] [--format text|markdown|json]`.

Exit codes: 0 nothing found, 1 findings, 2 could not triage (no readable evidence, bad JOBID).
The job's own stdout/stderr paths come from ``scontrol show job`` when a JOBID is given.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
from typing import Any, Dict, List, Tuple

EXIT_NONE, EXIT_FOUND, EXIT_CANNOT = 0, 1, 2
_JOBID = re.compile(r"^\d+(?:_\d+)?(?:\+\d+)?$")


def register(subparsers: Any) -> None:
    """Add the ``triage`` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "triage", help="find the root cause of a failed or hung job from its logs",
        description="Rank the failures found in a job's logs, root cause first. "
                    "Exit 0: nothing found, 1: findings, 2: could not triage.")
    p.add_argument("jobid", nargs="?", help="Slurm job id; its StdOut/StdErr are read (scontrol)")
    p.add_argument("--log", nargs="+", action="extend", default=[], metavar="PATH",
                   help="extra log files (plain or gzip); without JOBID only these are triaged")
    p.add_argument("--format", choices=("text", "markdown", "json"), default="text")
    p.add_argument("--list-rules", action="store_true", help="list the log rules and exit")
    p.set_defaults(func=run)


class _Progress:
    """Reports reading progress on stderr, but only once the work has taken more than a second."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.last = self.start

    def __call__(self, path: str, nbytes: int) -> None:
        now = time.monotonic()
        if now - self.start > 1.0 and now - self.last >= 1.0:
            self.last = now
            print(f"triage: reading {path}: {nbytes / 2**20:.0f} MiB", file=sys.stderr, flush=True)


def job_log_paths(jobid: str, timeout: float = 5.0) -> Tuple[List[str], Dict[str, Any]]:
    """StdOut/StdErr of a job per ``scontrol show job -o``; the source record says why when not."""
    exe = shutil.which("scontrol")
    if exe is None:
        return [], {"read": False, "error": "scontrol not found on PATH"}
    try:
        cp = subprocess.run([exe, "show", "job", "-o", jobid], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [], {"read": False, "error": f"scontrol timed out after {timeout:.0f} s"}
    if cp.returncode != 0:
        return [], {"read": False, "error": (cp.stderr or cp.stdout).strip()[:300] or f"exit {cp.returncode}"}
    paths: List[str] = []
    for key in ("StdOut", "StdErr"):
        m = re.search(rf"(?:^|\s){key}=(\S+)", cp.stdout)
        if m and m.group(1) not in paths and m.group(1) != "(null)":
            paths.append(m.group(1))
    return paths, {"read": True, "logs": paths}


def run(args: argparse.Namespace) -> int:
    """Entry point of the subcommand; returns the exit code."""
    if args.list_rules:
        from .rules import RULES

        for r in RULES:
            print(f"{r.id:<20} [{','.join(r.categories)}]  {r.doc}")
        return EXIT_NONE
    if not args.jobid and not args.log:
        print("triage: give a JOBID and/or --log PATH ...", file=sys.stderr)
        return EXIT_CANNOT
    if args.jobid and not _JOBID.match(args.jobid):
        print(f"triage: not a Slurm job id: {args.jobid!r}", file=sys.stderr)
        return EXIT_CANNOT
    from . import triage_logs
    from .report import RENDERERS

    paths = list(args.log)
    slurm: Dict[str, Any] = {}
    if args.jobid:
        found, slurm = job_log_paths(args.jobid)
        paths = found + [p for p in paths if p not in found]
    result = triage_logs(paths, job=args.jobid, progress=_Progress())
    if slurm:
        result.sources["slurm"] = slurm
    readable = [p for p, s in result.sources["logs"].items() if s.get("read")]
    if not readable:
        why = "; ".join(f"{p}: {s.get('error')}" for p, s in result.sources["logs"].items())
        if slurm and not slurm.get("read"):
            why = (why + "; " if why else "") + f"scontrol: {slurm['error']}"
        print(f"triage: could not triage: no readable log ({why or 'no log paths'})", file=sys.stderr)
        if args.format == "json":
            sys.stdout.write(RENDERERS["json"](result))
        return EXIT_CANNOT
    sys.stdout.write(RENDERERS[args.format](result))
    return EXIT_FOUND if result.findings else EXIT_NONE
