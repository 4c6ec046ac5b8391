"""Train triage's word prior (slurm_triage/triage/prior.json) from the corpus' DEV cases only, or cross-validate it.

Method (a tf-idf centroid per category): a dev log is the set of its distinct words (read as rules/prior.py
reads a log); a word's idf is log(N / the number of dev logs holding it), kept only for words that logs of
at least ``min_threads`` distinct threads hold (one thread's host names and paths are no vocabulary). Each
log is the unit vector of its words' idf; a category's centroid is the mean of its logs' vectors, cut to
its top ``k`` words and scaled to unit length. rules/prior.py scores a log by cosine with each centroid.

Validation cases are never read here: ``corpus.cases(split="dev")`` is the only source. ``--cv`` reports
k-fold cross-validation within dev (folds by another slice of the source URL's hash, so one thread's cases
share a fold): the prior alone on every held-out case, and on the held-out cases where the pipeline
without the prior found nothing or only an ``unknown`` first error.

Usage: python bench/train_prior.py [--date YYYY-MM-DD] [--out FILE] [--k N] [--min-threads N] [--margin M]
                                   [--cv [--folds 5]]
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Dict, FrozenSet, List, NamedTuple, Optional, Set, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
from slurm_triage.triage.model import FALLBACK  # noqa: E402
from slurm_triage.triage.rules import prior  # noqa: E402

K = 200
MIN_THREADS = 2
MARGIN = 0.04  # 5-fold CV within dev, 594 cases: 9 of the 47 no-finding cases right at 0.04 (19 answered), 5 at 0.06
SPLIT_RULE = ("bench/corpus.py: sha256 of the normalised source URL, first 8 hex digits mod 100 < "
              f"{corpus.VALIDATION_PERCENT} is validation; only dev cases are read")


class Doc(NamedTuple):
    thread: str
    category: str
    words: FrozenSet[str]
    log: str


def dev_docs() -> List[Doc]:
    """Every dev case as (its thread, category, distinct words, log path), in name order."""
    return [Doc(corpus.normalize_url(c["source"]), c["category"], prior.words(prior.read_head(c["log"])), c["log"])
            for c in corpus.cases(split="dev")]


Table = Tuple[Dict[str, float], Dict[str, Dict[str, float]]]


def train(docs: List[Doc], k: int = K, min_threads: int = MIN_THREADS) -> Table:
    """(word -> idf, category -> centroid {word: weight}) from ``docs`` alone (4 decimals: a stable, small file)."""
    held: Counter = Counter()
    threads: Dict[str, Set[str]] = {}
    for d in docs:
        for w in d.words:
            held[w] += 1
            threads.setdefault(w, set()).add(d.thread)
    idf = {w: math.log(len(docs) / n) for w, n in held.items() if len(threads[w]) >= min_threads and n < len(docs)}
    cents: Dict[str, Dict[str, float]] = {}
    for c in sorted({d.category for d in docs}):
        mine = [d for d in docs if d.category == c]
        acc: Dict[str, float] = {}
        for d in mine:
            vec = {w: idf[w] for w in d.words if w in idf}
            norm = math.sqrt(sum(v * v for v in vec.values())) or 1.0
            for w, v in vec.items():
                acc[w] = acc.get(w, 0.0) + v / norm / len(mine)
        top = sorted(acc.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
        norm = math.sqrt(sum(v * v for _, v in top)) or 1.0
        cents[c] = {w: r for w, r in ((w, round(v / norm, 4)) for w, v in top) if r > 0}
    listed = {w for ws in cents.values() for w in ws}
    return {w: round(v, 4) for w, v in idf.items() if w in listed}, cents


def document(table: Table, docs: List[Doc], date: str, k: int, min_threads: int, margin: float) -> str:
    """prior.json's text: header (how it was made), the decision margin, the table; keys sorted, stable."""
    argv = f"--date {date} --k {k} --min-threads {min_threads} --margin {margin:g}"
    doc: Dict[str, Any] = {
        "header": {"made_by": f"python bench/train_prior.py {argv}", "date": date, "dev_cases": len(docs),
                   "dev_threads": len({d.thread for d in docs}), "split": SPLIT_RULE,
                   "method": "tf-idf centroid per category over distinct words per log (idf = ln(N/df), words held "
                             f"by >= {min_threads} dev threads), top {k} words per centroid, cosine; a guess when "
                             "the best cosine leads the next by the margin",
                   "cases_per_category": dict(sorted(Counter(d.category for d in docs).items()))},
        "decision": {"margin": margin},
        "idf": table[0],
        "categories": table[1],
    }
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def fold_of(thread: str, folds: int) -> int:
    """A case's CV fold: a slice of the URL's hash that the dev/validation split does not use."""
    return int(hashlib.sha256(thread.encode()).hexdigest()[8:16], 16) % folds


def fell_back(log: str) -> bool:
    """True when the pipeline, the prior aside, names no category for this log (nothing, or an unknown first error)."""
    from slurm_triage.triage import triage_logs

    found = triage_logs([log]).findings
    root = found[0] if found else None
    return root is None or root.category == FALLBACK or root.id == prior.ID or "prior" in root.evidence


def cross_validate(docs: List[Doc], folds: int, k: int, min_threads: int, margin: float,
                   fallback: Optional[List[bool]] = None) -> Dict[str, Any]:
    """k-fold CV within dev: (answered, right) for the prior alone on all held-out cases and on those that fell back."""
    tally = {"all": Counter(), "fell_back": Counter()}
    wrong: Counter = Counter()
    for f in range(folds):
        train_docs = [d for d in docs if fold_of(d.thread, folds) != f]
        idf, cents = train(train_docs, k, min_threads)
        tab = prior.PriorTable(idf, cents, margin, {})
        for i, d in enumerate(docs):
            if fold_of(d.thread, folds) != f:
                continue
            g = prior.guess(d.words, tab)
            scopes = ["all"] + (["fell_back"] if fallback and fallback[i] else [])
            for s in scopes:
                tally[s]["cases"] += 1
                tally[s]["answered"] += g is not None
                tally[s]["right"] += bool(g and g[0] == d.category)
            if g and g[0] != d.category:
                wrong[f"{d.category}->{g[0]}"] += 1
    out: Dict[str, Any] = {}
    for s, t in tally.items():
        out[s] = {"cases": t["cases"], "answered": t["answered"], "right": t["right"],
                  "precision_percent": round(100.0 * t["right"] / t["answered"], 1) if t["answered"] else None,
                  "right_percent": round(100.0 * t["right"] / t["cases"], 1) if t["cases"] else None}
    out["wrong_pairs"] = dict(wrong.most_common(8))
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--date", default=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"))
    ap.add_argument("--out", type=Path, default=prior.PATH)
    ap.add_argument("--k", type=int, default=K)
    ap.add_argument("--min-threads", type=int, default=MIN_THREADS)
    ap.add_argument("--margin", type=float, default=MARGIN)
    ap.add_argument("--cv", action="store_true", help="cross-validate within dev instead of writing the table")
    ap.add_argument("--folds", type=int, default=5)
    a = ap.parse_args(argv)
    if not 0 < a.k <= prior.MAX_WORDS:
        ap.error(f"--k must be in 1..{prior.MAX_WORDS}")
    docs = dev_docs()
    if a.cv:
        back = [fell_back(d.log) for d in docs]
        print(json.dumps(cross_validate(docs, a.folds, a.k, a.min_threads, a.margin, back),
                         indent=1))
        return 0
    table = train(docs, a.k, a.min_threads)
    a.out.write_text(document(table, docs, a.date, a.k, a.min_threads, a.margin))
    print(f"train_prior: {a.out}: {len(docs)} dev cases, {len(table[0])} words", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
