"""Root-cause accuracy of ``triage --log`` on the corpus, per split (dev / validation).

For each case, the first finding's category is compared with the category the thread
established. Printed per split: top-1 accuracy for established, established+likely and all
cases, per category, the share of cases with no finding (nothing at all, or only the low-
confidence ``unknown`` first-error finding), and confident-wrong answers (confidence >= 0.8 on a
wrong category). ``--misses`` lists the wrong dev cases; it refuses validation, whose cases are
only ever reported in aggregate (rules are tuned on dev alone).

Healthy logs (tests/corpus_healthy: real output their sources call fine) measure false alarms,
split the same way: a false alarm is a first finding in one of the nine categories; an
``unknown`` first-error finding points at a line without naming a cause.

Usage: python bench/bench_corpus.py [--split dev|validation|all] [--format text|json] [--misses]
                                   [--corpus DIR] [--healthy DIR]
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import corpus  # noqa: E402
from slurm_triage.triage import catalog, triage_logs  # noqa: E402
from slurm_triage.triage.model import FALLBACK  # noqa: E402

CONFIDENT = 0.8
TIERS = {"established": ("established",), "established+likely": ("established", "likely"),
         "all": corpus.CONFIDENCES}


def cited_threads() -> Set[str]:
    """Normalised URLs that catalog entries cite: a validation case from one of them was seen."""
    return {corpus.normalize_url(u) for e in catalog.entries() for u in e.sources}


def _root(log: str) -> Tuple[Any, Optional[str]]:
    """The first finding of ``triage_logs`` on ``log`` and its category (None, None when nothing was found)."""
    found = triage_logs([log]).findings
    return (found[0], found[0].category) if found else (None, None)


def judge(case: Dict[str, Any]) -> Dict[str, Any]:
    """The first finding of ``triage_logs`` on the case's log, against its meta."""
    root, got = _root(case["log"])
    return {"name": case["name"], "split": case["split"], "category": case["category"],
            "cited": corpus.normalize_url(case["source"]) in cited_threads(),
            "confidence": case.get("confidence", "unresolved"), "got": got,
            "got_id": root.id if root else None, "got_confidence": root.confidence if root else None,
            "summary": root.summary if root else None, "right": got == case["category"],
            "nothing": root is None, "fallback_only": got == FALLBACK,
            "confident_wrong": bool(root and got != case["category"] and root.confidence >= CONFIDENT)}


def judge_healthy(case: Dict[str, Any]) -> Dict[str, Any]:
    """The first finding of ``triage_logs`` on a healthy log: none is right."""
    root, got = _root(case["log"])
    return {"name": case["name"], "split": case["split"], "got": got, "got_id": root.id if root else None,
            "got_confidence": root.confidence if root else None,
            "alarm": got not in (None, FALLBACK), "pointed": got == FALLBACK,
            "confident_alarm": bool(root and got != FALLBACK and root.confidence >= CONFIDENT)}


def healthy_figures(judged: List[Dict[str, Any]]) -> Dict[str, Any]:
    alarms = [j for j in judged if j["alarm"]]
    return {"logs": len(judged), "quiet": sum(j["got"] is None for j in judged),
            "unknown_only": sum(j["pointed"] for j in judged), "false_alarms": len(alarms),
            "false_alarm_percent": _share(len(alarms), len(judged)),
            "confident_false_alarms": sum(j["confident_alarm"] for j in judged),
            "by_rule": dict(sorted(Counter(j["got_id"] for j in alarms).items()))}


def _share(n: int, d: int) -> Optional[float]:
    return round(100.0 * n / d, 1) if d else None


def figures(judged: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Aggregate figures of one split (no per-case detail)."""
    out: Dict[str, Any] = {"cases": len(judged)}
    for tier, confs in TIERS.items():
        sel = [j for j in judged if j["confidence"] in confs]
        right = sum(j["right"] for j in sel)
        out[tier] = {"cases": len(sel), "right": right, "accuracy_percent": _share(right, len(sel))}
    per: Dict[str, List[bool]] = defaultdict(list)
    for j in judged:
        per[j["category"]].append(j["right"])
    out["per_category"] = {c: {"cases": len(v), "right": sum(v), "accuracy_percent": _share(sum(v), len(v))}
                           for c, v in sorted(per.items())}
    nothing = sum(j["nothing"] for j in judged)
    fallback = sum(j["fallback_only"] for j in judged)
    out["no_finding"] = {"nothing_at_all": nothing, "unknown_only": fallback,
                         "percent": _share(nothing + fallback, len(judged)),
                         "nothing_at_all_percent": _share(nothing, len(judged))}
    wrong = [j for j in judged if j["confident_wrong"]]
    out["confident_wrong"] = {"all": len(wrong),
                              "unresolved": sum(j["confidence"] == "unresolved" for j in wrong)}
    return out


def _text(split: str, f: Dict[str, Any]) -> List[str]:
    lines = [f"== {split}: {f['cases']} cases"]
    for tier in TIERS:
        t = f[tier]
        lines.append(f"  top-1 {tier:<19} {t['right']:>3}/{t['cases']:<3} {t['accuracy_percent']}%")
    nf = f["no_finding"]
    lines.append(f"  no finding                {nf['nothing_at_all'] + nf['unknown_only']:>3}/{f['cases']:<3} "
                 f"{nf['percent']}%  (nothing at all {nf['nothing_at_all']}, unknown only {nf['unknown_only']})")
    cw = f["confident_wrong"]
    lines.append(f"  confident-wrong (>= {CONFIDENT})  {cw['all']}  (on unresolved cases {cw['unresolved']})")
    for c, v in f["per_category"].items():
        lines.append(f"    {c:<16} {v['right']:>3}/{v['cases']:<3} {v['accuracy_percent']}%")
    return lines


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", choices=("dev", "validation", "all"), default="all")
    ap.add_argument("--format", choices=("text", "json"), default="text")
    ap.add_argument("--misses", action="store_true", help="list the dev cases answered wrong (dev only)")
    ap.add_argument("--corpus", type=Path, default=corpus.CORPUS, metavar="DIR",
                    help="a corpus folder of the same layout (default: tests/corpus), e.g. a batch of new cases")
    ap.add_argument("--healthy", type=Path, default=corpus.HEALTHY, metavar="DIR",
                    help="healthy logs of the same layout, for false alarms (default: tests/corpus_healthy)")
    a = ap.parse_args(argv)
    if a.misses and a.split != "dev":
        print("bench_corpus: --misses needs --split dev: validation cases are reported in aggregate only",
              file=sys.stderr)
        return 2
    splits = ("dev", "validation") if a.split == "all" else (a.split,)
    judged = {s: [judge(c) for c in corpus.cases(a.corpus, split=s)] for s in splits}
    doc: Dict[str, Any] = {s: figures(j) for s, j in judged.items()}
    if "validation" in judged:
        # A validation case whose thread the catalog cites was seen when the rules were written:
        # the figures without those cases are the honest ones (the count says how many).
        seen = [j for j in judged["validation"] if j["cited"]]
        doc["validation"]["cited_by_catalog"] = len(seen)
        if seen:
            doc["validation_unseen"] = figures([j for j in judged["validation"] if not j["cited"]])
    if a.healthy.is_dir():
        doc["healthy"] = {s: healthy_figures([judge_healthy(c) for c in corpus.cases(a.healthy, split=s)])
                          for s in splits}
    if a.misses:
        doc["dev_misses"] = [j for j in judged["dev"] if not j["right"]]
    if a.format == "json":
        print(json.dumps(doc, indent=1))
        return 0
    for s in splits:
        print("\n".join(_text(s, doc[s])))
        if s == "validation" and doc[s].get("cited_by_catalog"):
            print(f"  ({doc[s]['cited_by_catalog']} validation cases come from threads the catalog cites; without them:)")
            print("\n".join(_text("validation, unseen threads only", doc["validation_unseen"])))
    for s, h in doc.get("healthy", {}).items():
        print(f"== healthy logs, {s}: {h['logs']}")
        print(f"  quiet {h['quiet']}, unknown only {h['unknown_only']}, false alarms {h['false_alarms']} "
              f"({h['false_alarm_percent']}%), confident (>= {CONFIDENT}) {h['confident_false_alarms']}")
        for rule, n in h["by_rule"].items():
            print(f"    {rule:<40} {n}")
    for j in doc.get("dev_misses", []):
        print(f"MISS {j['name']} [{j['confidence']}] want {j['category']} got {j['got']} "
              f"({j['got_id']}, {j['got_confidence']}): {j['summary']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
