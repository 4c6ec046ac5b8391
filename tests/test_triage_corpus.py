"""Root-cause accuracy on recorded real log excerpts (tests/corpus/<case>/log.txt + meta.json)."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Dict, List

import pytest

from slurm_triage.triage import triage_logs
from slurm_triage.triage.model import CATEGORIES

CORPUS = Path(__file__).resolve().parent / "corpus"
CASES = sorted(p.name for p in CORPUS.iterdir() if (p / "meta.json").exists())


def _judge(case: str) -> Dict[str, object]:
    meta = json.loads((CORPUS / case / "meta.json").read_text())
    result = triage_logs([str(CORPUS / case / "log.txt")])
    root = result.findings[0] if result.findings else None
    return {"meta": meta, "root": root}


def test_corpus_is_broad() -> None:
    cats = {json.loads((CORPUS / c / "meta.json").read_text())["category"] for c in CASES}
    assert len(CASES) >= 12 and len(cats) >= 6
    for c in CASES:
        meta = json.loads((CORPUS / c / "meta.json").read_text())
        assert meta["source"].startswith("https://github.com/") and meta["category"] in CATEGORIES


def test_accuracy_per_category() -> None:
    per: Dict[str, List[bool]] = defaultdict(list)
    wrong = []
    for case in CASES:
        j = _judge(case)
        cat = j["meta"]["category"]
        ok = j["root"] is not None and j["root"].category == cat
        per[cat].append(ok)
        if not ok:
            wrong.append((case, cat, j["root"] and j["root"].category))
    for cat in sorted(per):
        print(f"corpus accuracy {cat:<16} {sum(per[cat])}/{len(per[cat])}")
    total = sum(sum(v) for v in per.values())
    print(f"corpus accuracy {'ALL':<16} {total}/{len(CASES)}")
    assert not wrong, wrong


@pytest.mark.parametrize("case", CASES)
def test_case_root_cause(case: str) -> None:
    j = _judge(case)
    meta, root = j["meta"], j["root"]
    assert root is not None, f"{case}: nothing found"
    assert root.category == meta["category"]
    assert root.caused_by is None
    for key in ("rank", "node", "gpu"):
        if key in meta:
            assert getattr(root, key) == meta[key], (case, key)
    assert root.evidence["lines"] and all(":" in ln for ln in root.evidence["lines"])
