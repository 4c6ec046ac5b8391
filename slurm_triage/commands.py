"""Subcommands contributed by other layers; each entry adds its parsers to the CLI."""
from __future__ import annotations

from typing import Any, Callable, List

REGISTER: List[Callable[[Any], None]] = []
