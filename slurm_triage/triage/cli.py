"""`slurm-triage triage [JOBID] [--log PATH ...] [--baseline OTHERJOB] [--since/--until T]
[--nodes HOSTLIST] [--format text|markdown|json|html] [--output FILE]`.

Exit codes: 0 nothing found, 1 findings, 2 could not triage (no readable evidence, bad JOBID).
With a JOBID, Slurm says where and when the job ran and where its logs are; Prometheus, the
Pushgateway and the nodes' state files are read for that window; an unreachable source is a
line in the report's sources block, not a failure.
"""
from __future__ import annotations

import argparse
import os
import calendar
import re
import sys
import time
from typing import Any

EXIT_NONE, EXIT_FOUND, EXIT_CANNOT = 0, 1, 2
_JOBID = re.compile(r"^\d+(?:_\d+)?(?:\+\d+)?$")


def _when(text: str) -> float:
    """``--since/--until``: unix seconds, or ``YYYY-MM-DDTHH:MM[:SS]`` (local time; a trailing Z means UTC)."""
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    m = re.fullmatch(r"(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d(?::\d\d)?)(Z?)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a time: {text!r} (unix seconds or 2026-01-31T12:00:00[Z])")
    stamp = f"{m.group(1)}T{m.group(2)}" + (":00" if m.group(2).count(":") == 1 else "")
    tm = time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")
    return float(calendar.timegm(tm) if m.group(3) else time.mktime(tm))


def register(subparsers: Any) -> None:
    """Add the ``triage`` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser(
        "triage", help="find the root cause of a failed, slow or hung job",
        description="Rank what went wrong in a job, root cause first, from Slurm, Prometheus, the "
                    "Pushgateway, the nodes' state and the job's logs. "
                    "Exit 0: nothing found, 1: findings, 2: could not triage.")
    p.add_argument("jobid", nargs="?", help="Slurm job id")
    p.add_argument("--log", nargs="+", action="extend", default=[], metavar="PATH",
                   help="extra log files (plain or gzip) or directories (their *.out, *.err, *.log, *.gz); "
                        "without JOBID only these are triaged")
    p.add_argument("--baseline", metavar="OTHERJOB", help="another run of the same work to compare with")
    p.add_argument("--since", type=_when, metavar="TIME", help="start of the window (default: the job's start)")
    p.add_argument("--until", type=_when, metavar="TIME", help="end of the window (default: the job's end, or now)")
    p.add_argument("--nodes", metavar="HOSTLIST", help="the job's nodes, when Slurm no longer knows the job")
    p.add_argument("--prometheus", metavar="URL", help="Prometheus to read (default: triage.prometheus_url)")
    p.add_argument("--format", choices=("text", "markdown", "json", "html"), default="text",
                   help="html: one self-contained page with per-node timelines (needs matplotlib)")
    p.add_argument("--output", metavar="FILE", help="write the report to FILE (atomically) instead of stdout")
    p.add_argument("--list-rules", action="store_true", help="list the rules and the failure catalog, and exit")
    p.set_defaults(func=run)


class _Progress:
    """Progress on stderr, but only once the work has taken more than a second."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.last = self.start

    def say(self, msg: str) -> None:
        now = time.monotonic()
        if now - self.start > 1.0 and now - self.last >= 1.0:
            self.last = now
            print(f"triage: {msg} ({now - self.start:.0f} s)", file=sys.stderr, flush=True)

    def __call__(self, path: str, nbytes: int) -> None:
        self.say(f"reading {path}: {nbytes / 2**20:.0f} MiB")


def _cannot(result: Any, fmt: str, why: str) -> int:
    from .report import RENDERERS

    print(f"triage: could not triage: {why}", file=sys.stderr)
    if fmt == "json":
        sys.stdout.write(RENDERERS["json"](result))
    return EXIT_CANNOT


def _emit(text: str, path: Any) -> None:
    """The report on stdout, or in ``path``: written beside it, then renamed, so no reader sees half."""
    if not path:
        sys.stdout.write(text)
        return
    import os
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=".triage-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _why(sources: Any) -> str:
    parts = [f"{p}: {s.get('error')}" for p, s in (sources.get("logs") or {}).items() if not s.get("read")]
    parts += [f"{k}: {v.get('error')}" for k, v in sources.items()
              if k != "logs" and isinstance(v, dict) and not v.get("read") and v.get("error")]
    return "; ".join(parts) or "no evidence source (no logs, no Slurm record, no metrics)"


def run(args: argparse.Namespace) -> int:
    """Entry point of the subcommand; returns the exit code."""
    if args.list_rules:
        from .catalog import entries
        from .rules import JOB_RULES, RULES, structured_rules

        for r in RULES + structured_rules() + JOB_RULES:
            print(f"{r.id:<22} [{','.join(r.categories)}]  {r.doc}")
        print("\ncatalog (slurm_triage/triage/catalog/*.toml): one entry per failure shape")
        for e in entries():
            judge = f"-> {e.handled_by}" if e.handled_by else e.finding_id
            print(f"{e.id:<26} [{e.category}] {e.role:<7} {e.confidence:.2f} {judge:<22} {e.summary}")
        return EXIT_NONE
    if not args.jobid and not args.log:
        print("triage: give a JOBID and/or --log PATH ...", file=sys.stderr)
        return EXIT_CANNOT
    for job in (args.jobid, args.baseline):
        if job and not _JOBID.match(job):
            print(f"triage: not a Slurm job id: {job!r}", file=sys.stderr)
            return EXIT_CANNOT
    from .report import RENDERERS

    progress = _Progress()
    if not args.jobid:
        from . import triage_logs

        result = triage_logs(args.log, progress=progress)
        if not any(s.get("read") for s in result.sources["logs"].values()):
            return _cannot(result, args.format, "no readable log (" + _why(result.sources) + ")")
    else:
        from ..config import load
        from ..step.gate import HostlistError, expand_hostlist
        from . import evidence_read, triage_job

        try:
            nodes = expand_hostlist(args.nodes) if args.nodes else []
        except HostlistError as e:
            print(f"triage: {e}", file=sys.stderr)
            return EXIT_CANNOT
        cfg = load(getattr(args, "config", None))
        if args.prometheus:
            cfg.values.setdefault("triage", {})["prometheus_url"] = args.prometheus
        result = triage_job(cfg, args.jobid, args.log, args.baseline, args.since, args.until, nodes,
                            progress=progress.say, log_progress=progress)
        if not evidence_read(result.sources):
            return _cannot(result, args.format, _why(result.sources))
    try:
        if args.format == "html":  # the per-node series are fetched for this format only
            from .html import render_html
            from .timeline import build

            text = render_html(result, build(cfg, result, nodes, args.since, args.until) if args.jobid else None)
        elif args.format == "text":  # colour only for a terminal, and never when NO_COLOR is set
            from .report import render_text

            text = render_text(result, colour=args.output is None and sys.stdout.isatty()
                               and not os.environ.get("NO_COLOR"))
        else:
            text = RENDERERS[args.format](result)
        _emit(text, args.output)
    except ImportError as e:
        print(f"triage: --format html needs matplotlib (pip install 'slurm-triage[html]'): {e}", file=sys.stderr)
        return EXIT_CANNOT
    except OSError as e:
        print(f"triage: cannot write {args.output}: {e}", file=sys.stderr)
        return EXIT_CANNOT
    return EXIT_FOUND if result.findings else EXIT_NONE
