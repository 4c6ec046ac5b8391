"""Per-rank progress lines: the last step, iteration or batch number each rank logged.

A rank is named by the launcher's line label (``Doc.ranks``): torchrun's ``[rank1]:``
(``--tee``/``local_ranks_filter`` output), ``srun --label``'s ``1: `` or Open MPI's ``[1,1]<stdout>:``;
the counter by a word and a number (``step 120``, ``iter: 40``, ``batch 88``). A hang leaves each rank's
last such line behind, and ranks that stopped at different counts fell out of step.
"""
from __future__ import annotations

import re
from typing import Dict, List, Tuple

from ..model import LogEvent
from .base import Doc

_COUNTER = re.compile(r"\b(?P<word>step|iter(?:ation)?|batch)\b\s*[=:#]?\s*(?P<n>\d+)\b", re.IGNORECASE)


def parse(doc: Doc) -> List[LogEvent]:
    """``rank_progress`` per (rank, counter word): its last value, at the line that logged it."""
    last: Dict[Tuple[int, str], Tuple[int, int]] = {}
    for n, (line, rank) in enumerate(zip(doc.lines, doc.ranks), 1):
        c = _COUNTER.search(line) if rank is not None else None
        if c:
            word = c["word"].lower()
            last[(rank, "iter" if word.startswith("iter") else word)] = (int(c["n"]), n)
    return [doc.event("rank_progress", n, rank=rank, counter=word, value=value)
            for (rank, word), (value, n) in sorted(last.items(), key=lambda kv: kv[1][1])]
