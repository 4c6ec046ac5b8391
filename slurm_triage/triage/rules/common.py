"""Small helpers shared by the rule modules (pure)."""
from __future__ import annotations

from typing import Callable, Dict, Hashable, Iterable, List, Optional, TypeVar

from ..model import LogEvent

K = TypeVar("K", bound=Hashable)


def of_kind(events: Iterable[LogEvent], *kinds: str) -> List[LogEvent]:
    return [e for e in events if e.kind in kinds]


def group_by(events: Iterable[LogEvent], kind: str, key: Callable[[LogEvent], K]) -> Dict[K, List[LogEvent]]:
    """Events of ``kind`` grouped by ``key``, groups in order of first appearance (one finding each)."""
    groups: Dict[K, List[LogEvent]] = {}
    for e in of_kind(events, kind):
        groups.setdefault(key(e), []).append(e)
    return groups


def rank_nodes(events: Iterable[LogEvent]) -> Dict[int, str]:
    """Global rank -> node, from NCCL_DEBUG=INFO ``Init COMPLETE`` lines (host:pid:tid prefix)."""
    return {e.rank: e.node for e in events if e.kind == "nccl_rank" and e.rank is not None and e.node}


def world_size(events: Iterable[LogEvent]) -> Optional[int]:
    sizes = [int(e.fields["nranks"]) for e in events if e.kind == "nccl_rank"]
    return max(sizes) if sizes else None


def only(values: Iterable[Optional[str]]) -> Optional[str]:
    """The single distinct non-empty value, else None (a finding names a node only when it is sure)."""
    distinct = {v for v in values if v is not None}
    return distinct.pop() if len(distinct) == 1 else None


def ranks_text(ranks: Iterable[int], limit: int = 8) -> str:
    rs = sorted(set(ranks))
    text = ",".join(str(r) for r in rs[:limit])
    return text + (f",… ({len(rs)} ranks)" if len(rs) > limit else "")
