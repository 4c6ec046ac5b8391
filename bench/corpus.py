"""The triage corpus (tests/corpus/<case>/{log.txt,meta.json}) and its honest split.

Every case goes to ``dev`` or ``validation`` by a stable hash of its normalised source URL,
fixed before any rule is written for it: rules are written and tuned looking at ``dev`` only,
and ``validation`` says how well they generalise. Cases from one thread (the same URL up to
its fragment or query) always land in the same split.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Dict, Iterator, Optional
from urllib.parse import urlsplit, urlunsplit

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "corpus"
# Real logs of runs, nodes and commands their sources call fine (meta.json: source, healthy, input,
# note; no category): they measure false alarms. The same split by source URL applies.
HEALTHY = CORPUS.parent / "corpus_healthy"
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


def thread_key(url: str) -> str:
    """One thread's name whatever the form of its URL: normalised, ``www.`` dropped, a GitHub pull request or
    discussion the same as the issue of its number (GitHub numbers them in one sequence)."""
    n = normalize_url(url).replace("://www.", "://", 1)
    m = re.match(r"https?://github\.com/([^/]+)/([^/]+)/(?:issues|pull|discussions)/(\d+)", n, re.IGNORECASE)
    return f"https://github.com/{m.group(1).lower()}/{m.group(2).lower()}/issues/{m.group(3)}" if m else n


def seen(root: Path = CORPUS, healthy: Path = HEALTHY) -> Dict[str, str]:
    """thread_key -> where the thread is already known: a case of the corpus, a catalog entry written from it
    (a seen thread is no unseen case), a healthy log, or a LEFT_OUT record (read and left out)."""
    from slurm_triage.triage import catalog  # lazy: the split alone needs no package

    out: Dict[str, str] = {}
    for c in cases(root):
        out.setdefault(thread_key(c["source"]), f"in the corpus: {c['name']} ({c['split']})")
    for e in catalog.entries():
        for u in e.sources:
            out.setdefault(thread_key(u), f"cited by the catalog: {e.id}")
    if healthy.is_dir():
        for c in cases(healthy):
            out.setdefault(thread_key(c["source"]), f"a healthy log: {c['name']} ({c['split']})")
    for f in sorted([*root.glob("LEFT_OUT-*.md"), *healthy.glob("LEFT_OUT-*.md")]):
        for u in re.findall(r"https?://[^\s)>\]]+", f.read_text(errors="replace")):
            out.setdefault(thread_key(u.rstrip(".,;")), f"left out: {f.name}")
    return out


if __name__ == "__main__":  # python bench/corpus.py URL...: which split each URL falls in, and if it is known
    import sys

    sys.path.insert(0, str(CORPUS.parent.parent))
    known = seen()
    for u in sys.argv[1:]:
        print(split_of(u), normalize_url(u), known.get(thread_key(u), "new"))
