"""The package runs on Python 3.9 (RHEL 9's system Python runs Prologs on many clusters), while this machine and CI
run 3.11/3.13: nothing newer than 3.9 may slip into the grammar or the calls. ``ast.parse(feature_version=(3, 9))``
refuses what 3.9's parser refuses (``match``, ``except*``, ...); the walk refuses 3.10+ keywords of calls that 3.9
has without them (``zip(strict=)``, ``dataclass(slots=, kw_only=)``) and ``X | None`` outside annotations (a runtime
union: TypeError on 3.9)."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import List, Set

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted([*ROOT.joinpath("slurm_triage").rglob("*.py"), *ROOT.joinpath("bench").glob("*.py"),
                  *ROOT.joinpath("lab").rglob("*.py")])
NEWER_KEYWORDS = {"zip": {"strict"}, "dataclass": {"slots", "kw_only", "match_args"}}


def _annotation_nodes(tree: ast.AST) -> Set[int]:
    out: Set[int] = set()
    for n in ast.walk(tree):
        parts = [getattr(n, "annotation", None), getattr(n, "returns", None)]
        if isinstance(n, ast.arguments):
            parts += [a.annotation for a in [*n.posonlyargs, *n.args, *n.kwonlyargs, n.vararg, n.kwarg] if a]
        for part in parts:
            if part is not None:
                out.update(id(m) for m in ast.walk(part))
    return out


def _problems(path: Path) -> List[str]:
    src = path.read_text(encoding="utf-8")
    try:
        tree = ast.parse(src, str(path), feature_version=(3, 9))
    except SyntaxError as e:
        return [f"{path.name}:{e.lineno}: {e.msg}"]
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            name = getattr(n.func, "id", None) or getattr(n.func, "attr", None)
            for kw in n.keywords:
                if kw.arg in NEWER_KEYWORDS.get(name or "", ()):
                    out.append(f"{path.name}:{n.lineno}: {name}({kw.arg}=) is Python 3.10+")
    annotations = _annotation_nodes(tree)
    for n in ast.walk(tree):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr) and id(n) not in annotations:
            if any(isinstance(side, ast.Constant) and side.value is None for side in (n.left, n.right)):
                out.append(f"{path.name}:{n.lineno}: '{ast.unparse(n)}' is a runtime union (Python 3.10+)")
    return out


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_source_is_python_3_9(path: Path) -> None:
    assert _problems(path) == []


def test_the_check_refuses_what_3_9_cannot_run(tmp_path: Path) -> None:
    cases = {"match.py": "match x:\n    case 1:\n        pass\n", "zip.py": "z = zip(a, b, strict=True)\n",
             "dc.py": "from dataclasses import dataclass\n@dataclass(slots=True)\nclass A:\n    x: int\n",
             "union.py": "T = int | None\n"}
    for name, src in cases.items():
        (tmp_path / name).write_text(src)
        assert _problems(tmp_path / name), name
    fine = tmp_path / "fine.py"
    fine.write_text("from __future__ import annotations\ndef f(x: int | None) -> str | None:\n    return {1} | {2} and None\n")
    assert _problems(fine) == []
