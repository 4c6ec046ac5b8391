"""When no known failure shape matched: name the first error, and the category its words point to.

The earliest error-looking lines (the exception closing the first traceback, the first
error/fatal line) are what an SRE reads first. The lexicon's words on the lines nearest them
(:mod:`..lexicon`: "throttled", "Permission denied", "ibv_*", ...) are weighed, the anchor line
most, farther lines less; when one category clearly leads, the finding carries it as a best guess
with a low confidence (at most GUESS_CONFIDENCE, far below what a catalog entry says) and names
the words that led to it; when none leads there, the distinct words of the whole log are a second
opinion (the error line is generic, the cause is said elsewhere: a stricter lead, a lower
confidence); when none leads either, the word prior learned from the dev corpus (:mod:`.prior`)
may still name one (confidence prior.CONFIDENCE), else the category stays ``unknown``. A log without
any error-looking line is weighed by its distinct words alone (a pasted table or status output), and
when they lead nowhere either, the prior's own finding (prior.ID) is the last resort.
Either way the finding never outranks a real one (:func:`..rules.correlate` skips it).

A communication symptom (a collective timeout, a reset connection) usually follows a cause the
log does not name; when the whole log holds words that name a cause even far from an error line
(lexicon groups with ``names_cause``: a fabric or interface setting the job chose) and its words
lean to that category, :func:`cause_lean` offers it as the guess behind the symptom (LEAN_ID);
correlate puts it first only over such a symptom.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from ...model import Verdict
from .. import lexicon
from ..model import FALLBACK, LogEvent, TriageFinding, from_events
from . import prior
from .common import of_kind, only

ID = "log.first_error"
CONFIDENCE = 0.2
GUESS_CONFIDENCE = 0.3
MIN_SCORE = 1.0   # any real lean: a best guess labelled as such helps more than "unknown"
LEAD = 1.2        # the guess must outweigh the next category by this factor
SURE_SCORE = 3.0  # one strong word on the anchor line, or several weaker ones: the full guess confidence
UNANCHORED = 0.5  # weight of a word in a file without any error-looking line
WARNED = 1.0      # ... on a warning line there: a file without errors says what worried it in its warnings
_WARNING = re.compile(r"(?:^|[\[\s|:(<])(?:warn|warning)(?:[\]\s:|)>]|$)", re.IGNORECASE)
REPEATS = 3       # a word near the first error counts on at most this many lines
PLACE = 0.5       # weight of words that only name a layer (nccl, srun, gpu): they tip, never decide
WHOLE_LEAD = 2.0  # the whole-log second opinion must lead twice (its guess on dev logs with error lines: 93 of 99 right)
LEAN_ID = "log.cause_words"
LEAN_CONFIDENCE = 0.35  # below any symptom it explains; a guess from words, never a finding
COMMUNICATION = ("collective_hang", "network")  # symptoms whose cause is usually elsewhere


def is_fallback(f: TriageFinding) -> bool:
    """The first-error finding, guessed category or not, and the lean behind a symptom: never a root
    cause over a real finding (correlate puts a lean first only over a communication symptom)."""
    return f.id in (ID, LEAN_ID, prior.ID) or f.category == FALLBACK


def _nearness(distance: int) -> float:
    """The anchor line counts double, its neighbours fully, then linearly less to nothing at lexicon.WINDOW lines."""
    if distance == 0:
        return 2.0
    if distance <= 3:
        return 1.0
    return max(0.0, 1.0 - (distance - 3) / (lexicon.WINDOW - 3))


def weigh(hits: List[LogEvent], anchors: Dict[Tuple[int, str], List[int]]
          ) -> Tuple[Dict[str, float], Dict[str, Dict[str, float]], Dict[str, float]]:
    """(category -> score, category -> {word: its share}, category -> its strongest word's weight)
    over the lexicon hits. Near an anchor of its
    file a word counts by its nearness, on its REPEATS nearest lines only (one message repeated by
    every rank is one piece of evidence); in a file without anchors each distinct word counts once."""
    lex = lexicon.lexicon()
    factors: Dict[str, List[float]] = {}
    loose: Dict[str, float] = {}  # word -> its weight in files without anchors (distinct words count once)
    for e in hits:
        near = anchors.get((e.file_index, e.source))
        for w in e.fields.get("words", []):
            if near:
                factor = _nearness(min(abs(e.line - a) for a in near))
                if factor > 0:
                    factors.setdefault(w, []).append(factor)
            else:
                loose[w] = max(loose.get(w, 0.0), WARNED if _WARNING.search(e.text) else UNANCHORED)
    total: Dict[str, float] = {}
    by_word: Dict[str, Dict[str, float]] = {}
    strongest: Dict[str, float] = {}
    for w in set(factors) | set(loose):
        fs = factors.get(w)
        strength = sum(sorted(fs, reverse=True)[:REPEATS]) if fs else loose[w]
        for t in lex.by_word.get(w, ()):
            if t.near_error and not fs:
                continue
            total[t.category] = total.get(t.category, 0.0) + t.weight * strength
            by_word.setdefault(t.category, {})[w] = t.weight * strength
            strongest[t.category] = max(strongest.get(t.category, 0.0), t.weight)
    return total, by_word, strongest


def guess(hits: List[LogEvent], anchors: Dict[Tuple[int, str], List[int]], lead: float = LEAD
          ) -> Tuple[Optional[str], float, List[str], Dict[str, float]]:
    """(category or None, confidence, the words that led to it, every category's score); the top
    category must outweigh the next one ``lead`` times."""
    total, by_word, strongest = weigh(hits, anchors)
    ranked = sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))
    if not ranked or ranked[0][1] < MIN_SCORE or strongest[ranked[0][0]] <= PLACE:
        return None, CONFIDENCE, [], total
    top, score = ranked[0]
    runner = ranked[1][1] if len(ranked) > 1 else 0.0
    if score < lead * runner:
        return None, CONFIDENCE, [], total
    clarity = min(1.0, (score - runner) / score) * min(1.0, score / SURE_SCORE)
    conf = CONFIDENCE + (GUESS_CONFIDENCE - CONFIDENCE) * clarity - (0.0 if anchors else 0.05)
    words = [w for w, _ in sorted(by_word[top].items(), key=lambda kv: -kv[1])][:5]
    return top, round(conf, 2), words, total


def _short(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


def first_error(events: List[LogEvent]) -> List[TriageFinding]:
    """The earliest exception / error line and the category its nearby words point to, when no catalog
    entry or rule matched anything."""
    exc = of_kind(events, "first_exception")
    err = of_kind(events, "first_error")
    hits = of_kind(events, lexicon.KIND)
    anchors: Dict[Tuple[int, str], List[int]] = {}
    for e in exc + err:
        anchors.setdefault((e.file_index, e.source), []).append(e.line)
    category, conf, words, total = guess(hits, anchors)
    whole = of_kind(events, lexicon.WHOLE_KIND)
    lean = cause_lean(whole or ([] if anchors else hits))
    if not exc and not err:
        if category is None:
            return prior.finding(events) + lean
        shown = [e for e in hits if set(e.fields["words"]) & set(words)][:5]
        return [_finding(shown, shown[0], category, conf, words, total,
                         f"no error line and no known failure shape; the words {', '.join(words)} point to "
                         f"{category}: {_short(shown[0].text, 160)}", "across the whole log")] + lean
    # Per file, the exception of the first traceback says more than a generic error line; the
    # earliest file (in the order given) wins.
    scope = "near the first error"
    second = guess(whole, {}, lead=WHOLE_LEAD) if category is None and whole else None
    if second is not None and second[0] is not None:
        (category, conf, words, total), scope = second, "across the whole log"
    lead = min(exc or err, key=lambda e: e.order)
    shown = sorted(exc + err, key=lambda e: e.order)
    text = _short(lead.text)
    if category is not None:
        text = f"{text} — best guess {category} (words {scope}: {', '.join(words)})"
    found = _finding(shown, lead, category or FALLBACK, conf, words, total, text, scope)
    learned = prior.prior_guess(events, margin=prior.BESIDE_AN_ERROR) if category is None else None
    if learned is not None:
        prior.name(found, *learned[:2])
    return [found] + lean


def cause_lean(hits: List[LogEvent]) -> List[TriageFinding]:
    """The cause category that the whole log's distinct words point to, for a communication symptom:
    named by a word of a ``names_cause`` group, and outweighing every other category but the
    symptoms' own (COMMUNICATION) WHOLE_LEAD times; else nothing."""
    total, by_word, _ = weigh(hits, {})
    rivals = sorted(((c, s) for c, s in total.items() if c not in COMMUNICATION), key=lambda kv: (-kv[1], kv[0]))
    if not rivals:
        return []
    (category, score), runner = rivals[0], (rivals[1][1] if len(rivals) > 1 else 0.0)
    lex = lexicon.lexicon()
    strong = [w for w in by_word[category] if any(t.category == category and t.names_cause for t in lex.by_word[w])]
    if not strong or score < WHOLE_LEAD * runner:
        return []
    words = [w for w, _ in sorted(by_word[category].items(), key=lambda kv: -kv[1])][:5]
    shown = [e for e in hits if set(e.fields["words"]) & set(strong)][:5]
    return [_finding(shown, shown[0], category, LEAN_CONFIDENCE, words, total,
                     f"best guess {category} behind a communication symptom: the log's words {', '.join(words)} "
                     f"point to it: {_short(shown[0].text, 160)}", "across the whole log", fid=LEAN_ID)]


def _finding(shown: List[LogEvent], lead: LogEvent, category: str, conf: float, words: List[str],
             total: Dict[str, float], summary: str, scope: str, fid: str = ID) -> TriageFinding:
    evidence: Dict[str, object] = {"exception": lead.fields.get("exception"), "first_line": lead.where}
    if total:
        evidence["lexicon"] = {"guess": None if category == FALLBACK else category, "words": words, "scope": scope,
                               "scores": {k: round(v, 1) for k, v in sorted(total.items(), key=lambda kv: -kv[1])}}
    action = "if it is a real failure shape, add it to the catalog (slurm_triage/triage/catalog) with its case"
    action = ("read the log around this line; " if category == FALLBACK else
              f"a guess from its words only: confirm {category} in the log around this line; ") + action
    if fid == LEAN_ID:
        action = (f"a guess from the log's words only: a collective timeout or a reset connection usually follows "
                  f"a cause the log does not name; check the {category} this line shows before the fabric")
    return from_events(
        shown, id=fid, category=category, verdict=Verdict.WARN, confidence=conf if category != FALLBACK else CONFIDENCE,
        summary=summary, action=action, node=only(e.node for e in shown), rank=lead.rank, evidence=evidence)
