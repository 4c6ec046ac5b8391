"""`slurm-triage mcp [--http [--host ADDR] [--port N]]`: the read-only MCP server.

stdio by default (what editor agents register: ``claude mcp add slurm-triage -- slurm-triage mcp``).
``--http`` serves streamable HTTP at ``/mcp``; a bearer token is read from ``--token-file`` or
``$SLURM_TRIAGE_MCP_TOKEN`` (never from the command line, where ``ps`` shows it), and a
non-loopback address is refused without one. The SDK is an optional extra
(``pip install 'slurm-triage[mcp]'``, Python >= 3.10); the rest of slurm-triage works without it.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Optional

from .guard import is_loopback

TOKEN_ENV = "SLURM_TRIAGE_MCP_TOKEN"
EXIT_OK, EXIT_USAGE = 0, 2


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "mcp", help="serve the read-only triage tools to an AI agent (Model Context Protocol)",
        description="A Model Context Protocol server with read-only tools: triage_job, get_evidence, "
                    "node_history, query_metrics, scan_logs, describe. stdio by default; --http for "
                    "streamable HTTP at /mcp (loopback by default; a token is required off loopback).")
    p.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    p.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="HTTP port (default 8765)")
    p.add_argument("--token-file", metavar="PATH",
                   help=f"file holding the bearer token for --http (or set ${TOKEN_ENV})")
    p.set_defaults(func=run)


def read_token(path: Optional[str]) -> Optional[str]:
    """The bearer token from the file, else the environment; None when neither gives one."""
    if path:
        with open(path, encoding="utf-8") as fh:
            token = fh.read().strip()
        if not token:
            raise ValueError(f"{path}: the token file is empty")
        return token
    return os.environ.get(TOKEN_ENV, "").strip() or None


def run(args: argparse.Namespace) -> int:
    if sys.version_info < (3, 10):
        print("slurm-triage mcp: the MCP SDK needs Python >= 3.10 (this is "
              f"{sys.version.split()[0]}); the other commands work here", file=sys.stderr)
        return EXIT_USAGE
    try:
        import mcp.server.mcpserver  # noqa: F401
    except ImportError:
        print("slurm-triage mcp: the MCP SDK is not installed: pip install 'slurm-triage[mcp]'", file=sys.stderr)
        return EXIT_USAGE
    try:
        token = read_token(args.token_file) if args.http else None
    except (OSError, ValueError) as e:
        print(f"slurm-triage mcp: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.http and not is_loopback(args.host) and not token:
        print(f"slurm-triage mcp: refusing to serve on {args.host}, which is not a loopback address, "
              f"without a bearer token (--token-file or ${TOKEN_ENV})", file=sys.stderr)
        return EXIT_USAGE
    if args.http and not 0 < args.port < 65536:
        print(f"slurm-triage mcp: not a port: {args.port}", file=sys.stderr)
        return EXIT_USAGE
    from ..config import load
    from . import guard
    from .server import build, serve_http
    from .tools import Tools

    cfg = load(getattr(args, "config", None))
    guard.install(guard.trusted_dirs([cfg.get("triage", "sacct"), cfg.get("hooks", "scontrol"), cfg.get("drain", "sinfo")]))
    server = build(Tools(cfg))
    if not args.http:
        server.run("stdio")
        return EXIT_OK
    print(f"slurm-triage mcp: streamable HTTP on http://{args.host}:{args.port}/mcp "
          f"({'bearer token required' if token else 'no token: loopback only'})", file=sys.stderr, flush=True)
    serve_http(server, args.host, args.port, token)
    return EXIT_OK
