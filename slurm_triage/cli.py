"""The `slurm-triage` command line: one entry point, one subcommand per job.

Exit codes: 0 OK/WARN/UNKNOWN (or success), 1 FAIL (or findings), 2 usage or config error.
Heavy modules are imported inside the subcommand that needs them, so `--help` and the
hooks stay fast.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, List, Optional, Sequence

from . import __version__
from .config import Config, ConfigError, load, parse

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


_FAST_EXIT = [False]
"""Set by a command that leaves nothing to finalise (`check`): finish() skips the teardown."""


def finish(rc: int) -> None:
    """Exit `python -m slurm_triage` with ``rc``; after `check` by os._exit once stdout and
    stderr are flushed (interpreter teardown was ~17 ms of every check)."""
    if _FAST_EXIT[0]:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a reader that went away, as main's BrokenPipeError
                pass
        os._exit(rc)
    sys.exit(rc)


def _load_config(args: argparse.Namespace) -> Config:
    return load(getattr(args, "config", None))


def cmd_check(args: argparse.Namespace) -> int:
    from .model import worst
    from .node import check_node, render_text

    cfg = _load_config(args)
    report = check_node(cfg, push=args.push)
    if args.format == "json":
        out = report.to_dict(include_snapshot=True)
        # NVML init is the one cost a site can cut (persistence mode): shown on its own, None
        # when the GPU probe failed or timed out before it returned
        out["nvml_init_seconds"] = (report.snapshot.get("gpu") or {}).get("nvml_init_seconds")
        json.dump(out, sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(render_text(report))
    _FAST_EXIT[0] = True
    return EXIT_FAIL if worst(f.verdict for f in report.findings).value == "FAIL" else EXIT_OK


def cmd_checks(args: argparse.Namespace) -> int:
    from .checks import load_all

    specs = load_all()
    if args.format == "json":
        json.dump([{"id": s.id, "needs": list(s.needs), "doc": s.doc} for s in specs.values()], sys.stdout, indent=1)
        sys.stdout.write("\n")
        return EXIT_OK
    width = max((len(i) for i in specs), default=0)
    for s in specs.values():
        print(f"{s.id:<{width}}  [{','.join(s.needs)}]  {s.doc}")
    return EXIT_OK


def cmd_config_check(args: argparse.Namespace) -> int:
    path = args.file or getattr(args, "config", None)
    if path is None:
        from .config import resolve_path

        path = resolve_path(None)
    if path is None:
        print("no config file found (--config, $SLURM_TRIAGE_CONFIG, /etc/slurm-triage/config.toml): "
              "built-in defaults are in use")
        return EXIT_OK
    try:
        with open(path, encoding="utf-8") as fh:
            parse(fh.read(), path)
    except OSError as e:
        raise ConfigError(f"cannot read: {e.strerror}", path) from None
    print(f"{path}: OK")
    return EXIT_OK


def cmd_config_show(args: argparse.Namespace) -> int:
    cfg = _load_config(args)
    json.dump({"source": cfg.source, "values": cfg.values}, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
    return EXIT_OK


def cmd_config_example(args: argparse.Namespace) -> int:
    from .config import example

    sys.stdout.write(example())
    return EXIT_OK


def cmd_node_resume(args: argparse.Namespace) -> int:
    """Resume a node we drained, after its checks pass again on this node."""
    import os

    from .config import node_name
    from .node import resume_node

    here = node_name()  # where this runs: NODE itself checks itself, elsewhere NODE's pushed result decides
    os.environ["SLURMD_NODENAME"] = args.node  # so {node} in the config names this node's paths
    return EXIT_OK if resume_node(_load_config(args), args.node, args.force, here) else EXIT_FAIL


CORE_COMMANDS = ("check", "checks", "config", "node")
"""Subcommands defined here; every other one comes from an extension (commands.REGISTER)."""


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    """The parser; for a core ``command`` the extensions are not registered: importing
    gate, triage and the MCP server only to list them cost every `check` ~20 ms."""
    p = argparse.ArgumentParser(
        prog="slurm-triage",
        description="Node health checks, Prolog/Epilog hooks and job triage for Slurm GPU clusters.",
        epilog="Exit codes: 0 OK (or WARN/UNKNOWN), 1 FAIL or findings, 2 usage or config error.")
    p.add_argument("--version", action="version", version=f"slurm-triage {__version__}")
    p.add_argument("--config", metavar="FILE",
                   help="config file (default: $SLURM_TRIAGE_CONFIG, else /etc/slurm-triage/config.toml)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    c = sub.add_parser("check", help="collect this node's facts, run the checks, print the verdict")
    c.add_argument("--format", choices=("text", "json"), default="text")
    c.add_argument("--push", action="store_true", help="also push the result to the configured Pushgateway")
    c.set_defaults(func=cmd_check)

    c = sub.add_parser("checks", help="list the registered node checks")
    c.add_argument("--format", choices=("text", "json"), default="text")
    c.set_defaults(func=cmd_checks)

    c = sub.add_parser("config", help="validate or show the configuration")
    csub = c.add_subparsers(dest="config_command", metavar="ACTION")
    cc = csub.add_parser("check", help="validate a config file (exit 2 with file:line: key: problem)")
    cc.add_argument("file", nargs="?", help="file to validate (default: the one in use)")
    cc.set_defaults(func=cmd_config_check)
    cs = csub.add_parser("show", help="print the effective configuration as JSON")
    cs.set_defaults(func=cmd_config_show)
    ce = csub.add_parser("example", help="print a commented config with every key at its default")
    ce.set_defaults(func=cmd_config_example)
    c.set_defaults(func=lambda a, p=c: (p.print_help(), EXIT_USAGE)[1])

    c = sub.add_parser("node", help="act on a node's drain state")
    nsub = c.add_subparsers(dest="node_command", metavar="ACTION")
    nr = nsub.add_parser("resume", help="resume NODE if we drained it and evidence about NODE now passes (its checks on NODE, else its fresh pushed result)")
    nr.add_argument("node", metavar="NODE")
    nr.add_argument("--force", action="store_true", help="resume even if the checks still FAIL")
    nr.set_defaults(func=cmd_node_resume)
    c.set_defaults(func=lambda a, p=c: (p.print_help(), EXIT_USAGE)[1])

    if command not in CORE_COMMANDS:
        for register in _extensions():
            register(sub)
    return p


def _extensions() -> List[Callable[[Any], None]]:
    """Subcommands that live with their own layer (hooks, gate, triage)."""
    from . import commands

    return commands.REGISTER


def _command_word(argv: Sequence[str]) -> Optional[str]:
    """The subcommand named in ``argv`` (None: none, or --help/--version asked first)."""
    words = list(argv)
    while words:
        w = words.pop(0)
        if w == "--config":
            words = words[1:]
        elif w.startswith("--config="):
            continue
        elif w.startswith("-"):
            return None
        else:
            return w
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(_command_word(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args.func(args))
    except ConfigError as e:
        print(f"slurm-triage: config error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK


def triage_main(argv: Optional[Sequence[str]] = None) -> int:
    """The `triage` alias: `triage JOBID` == `slurm-triage triage JOBID`; `triage mcp` serves the agent tools."""
    argv = list(sys.argv[1:] if argv is None else argv)
    return main(argv if argv[:1] == ["mcp"] else ["triage", *argv])


