"""The triage corpus (tests/corpus/<case>/{log.txt,meta.json}) and its honest split.

Every case goes to ``dev`` or ``validation`` by a stable hash of its normalised source URL,
fixed before any rule is written for it: rules are written and tuned looking at ``dev`` only,
and ``validation`` says how well they generalise. Cases from one thread (the same URL up to
its fragment or query) always land in the same split.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, Iterator, Optional
from urllib.parse import urlsplit, urlunsplit

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "corpus"
VALIDATION_PERCENT = 30
CONFIDENCES = ("established", "likely", "unresolved")


def normalize_url(url: str) -> str:
    """Scheme and host lower-cased; fragment, query and trailing slash dropped."""
    p = urlsplit(url.strip())
    return urlunsplit((p.scheme.lower(), p.netloc.lower(), p.path.rstrip("/"), "", ""))


def split_of(url: str) -> str:
    """``validation`` for about VALIDATION_PERCENT % of source URLs, else ``dev``."""
    h = int(hashlib.sha256(normalize_url(url).encode()).hexdigest()[:8], 16)
    return "validation" if h % 100 < VALIDATION_PERCENT else "dev"


def cases(root: Path = CORPUS, split: Optional[str] = None) -> Iterator[Dict[str, Any]]:
    """Each case's meta.json plus ``name``, ``log`` (path) and ``split``, in name order."""
    for d in sorted(p for p in root.iterdir() if (p / "meta.json").is_file()):
        meta = json.loads((d / "meta.json").read_text())
        meta.update(name=d.name, log=str(d / "log.txt"), split=split_of(meta["source"]))
        if split is None or meta["split"] == split:
            yield meta


if __name__ == "__main__":  # python bench/corpus.py URL...: which split each URL falls in
    import sys

    for u in sys.argv[1:]:
        print(split_of(u), normalize_url(u))
