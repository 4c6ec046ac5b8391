"""Subcommands contributed by other layers; each entry adds its parsers to the CLI."""
from __future__ import annotations

from typing import Any, Callable, List


def _triage(sub: Any) -> None:
    from .triage.cli import register

    register(sub)


def _gate(sub: Any) -> None:
    from .step.gate import register

    register(sub)


def _mcp(sub: Any) -> None:
    from .mcp.cli import register

    register(sub)


REGISTER: List[Callable[[Any], None]] = [_gate, _triage, _mcp]
