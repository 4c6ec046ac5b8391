"""Reading the knowledge files (``lexicon.toml``, ``healthy.toml``): TOML of one kind of table only."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Type

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib  # type: ignore[no-redef]


def tables(path: Path, name: str, error: Type[ValueError]) -> List[Dict[str, Any]]:
    """The ``[[name]]`` tables of ``path``; ``error`` (naming the file) when it is no TOML or holds anything else."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise error(f"{path.name}: not valid TOML: {e}") from None
    if set(data) - {name}:
        raise error(f"{path.name}: only [[{name}]] tables are allowed")
    return list(data.get(name, []))
