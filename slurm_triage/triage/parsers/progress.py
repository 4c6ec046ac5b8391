"""Per-rank progress lines: the last step, iteration or batch number each rank logged.

A rank is named by the launcher's line prefix: torchrun's ``[rank1]:`` (``--tee``/``local_ranks_filter``
output) or ``srun --label``'s ``1: ``; the counter by a word and a number (``step 120``, ``iter: 40``,
``batch 88``). A hang leaves each rank's last such line behind, and ranks that stopped at different
counts fell out of step.
"""
from __future__ import annotations

import re
from typing import Dict, List, Tuple

from ..model import LogEvent
from .base import Doc

_RANK = re.compile(r"^\s*(?:\[rank(?P<torch>\d+)\]:|(?P<srun>\d+): )")
_COUNTER = re.compile(r"\b(?P<word>step|iter(?:ation)?|batch)\b\s*[=:#]?\s*(?P<n>\d+)\b", re.IGNORECASE)


def parse(doc: Doc) -> List[LogEvent]:
    """``rank_progress`` per (rank, counter word): its last value, at the line that logged it."""
    if "rank" not in doc.text and ": " not in doc.text:
        return []
    last: Dict[Tuple[int, str], Tuple[int, int]] = {}
    for n, line in enumerate(doc.lines, 1):
        r = _RANK.match(line)
        c = _COUNTER.search(line, r.end()) if r else None
        if r and c:
            word = c["word"].lower()
            last[(int(r["torch"] or r["srun"]), "iter" if word.startswith("iter") else word)] = (int(c["n"]), n)
    return [doc.event("rank_progress", n, rank=rank, counter=word, value=value)
            for (rank, word), (value, n) in sorted(last.items(), key=lambda kv: kv[1][1])]
