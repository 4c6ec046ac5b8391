"""PyTorch Flight Recorder (``TORCH_NCCL_TRACE_BUFFER_SIZE``) as people paste it.

Two forms (PyTorch's flight recorder tutorial, ``tools/flight_recorder``):

* the analyzer's report (``torchfrtrace`` / ``fr_trace.py``): ``Not all ranks joining collective 5
  at entry 4`` (newer: ``..., sequence number: 4``) followed by ``group info:``, ``collective:``,
  ``missing ranks: {1}``, ``expected ranks: 2``, ``collective state: scheduled`` lines;
* an unpickled per-rank dump printed as a dict/JSON: ``pg_config``, ``pg_status``
  (``last_enqueued_collective`` ...) and ``entries`` with ``collective_seq_id``,
  ``profiling_name`` (``nccl:all_reduce``), ``state`` and ``process_group``. A dump names its
  rank only through a ``"rank"`` key or the file name it came from (``nccl_trace_rank_3``,
  ``/tmp/trace_1``), so a marker line before it sets the rank.
"""
from __future__ import annotations

import re
from typing import Dict, List, Optional, Tuple

from ..model import LogEvent
from .base import Doc

_MISSING_HEAD = re.compile(r"Not all ranks joining collective(?: (?P<seq>\d+) at entry (?P<entry>\d+)|, sequence "
                           r"number: (?P<seq2>\d+)| for group (?P<group>\S+) collective (?P<op>\S+))")
_KEY = re.compile(r"^\s*(?P<key>[A-Za-z][\w ]*?)\s*:\s*(?P<val>.*?)\s*$")
_RANK_MARK = re.compile(r"(?:rank[_ ]?|trace_)(?P<rank>\d+)\b", re.I)
_Q = r"[\"']"
_SEQ = re.compile(_Q + r"collective_seq_id" + _Q + r"\s*:\s*" + _Q + r"?(?P<v>\d+)")
_RECORD = re.compile(_Q + r"record_id" + _Q + r"\s*:\s*(?P<v>\d+)")
_NAME = re.compile(_Q + r"profiling_name" + _Q + r"\s*:\s*" + _Q + r"(?P<v>[^\"']+)")
_STATE = re.compile(_Q + r"state" + _Q + r"\s*:\s*" + _Q + r"(?P<v>\w+)")
_PG = re.compile(_Q + r"process_group" + _Q + r"\s*:\s*[(\[]\s*" + _Q + r"(?P<name>[^\"']*)" + _Q + r"\s*,\s*"
                 + _Q + r"(?P<desc>[^\"']*)")
_P2P = re.compile(_Q + r"is_p2p" + _Q + r"\s*:\s*(?P<v>true|false|True|False)")
_RANK_KEY = re.compile(_Q + r"rank" + _Q + r"\s*:\s*(?P<v>\d+)")


def _ints(text: str) -> List[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def _reports(doc: Doc) -> List[LogEvent]:
    out: List[LogEvent] = []
    for n, line in enumerate(doc.lines, 1):
        m = _MISSING_HEAD.search(line)
        if not m:
            continue
        info: Dict[str, str] = {}
        inline = re.search(r"Missing ranks are (\{[^}]*\})", line)
        if inline:
            info["missing ranks"] = inline.group(1)
        for follow in doc.lines[n:n + 10]:
            k = _KEY.match(follow)
            if not k or _MISSING_HEAD.search(follow):
                break
            info.setdefault(k["key"].lower(), k["val"])
        seq = m["seq"] or m["seq2"]
        missing = _ints(info.get("missing ranks", ""))
        out.append(doc.event("fr_missing_ranks", n, seq=int(seq) if seq else None,
                             entry=int(m["entry"]) if m["entry"] else None,
                             group=info.get("group info") or m["group"], op=info.get("collective") or m["op"],
                             missing_ranks=missing or None, state=info.get("collective state"),
                             expected_ranks=int(info["expected ranks"]) if info.get("expected ranks", "").isdigit()
                             else None))
    return out


def _dump_spans(doc: Doc) -> List[Tuple[int, int, Optional[int]]]:
    """(first line, last line, rank) of each pasted dump: a dump starts where a ``version`` key or a
    rank marker line appears before the next entries."""
    starts: List[Tuple[int, Optional[int]]] = []
    pending_rank: Optional[int] = None
    for n, line in enumerate(doc.lines, 1):
        if re.search(_Q + r"version" + _Q + r"\s*:", line) or (line.strip().startswith("{") and "entries" in line):
            starts.append((n, pending_rank))
            pending_rank = None
            continue
        if not re.search(_Q, line):
            mark = _RANK_MARK.search(line)
            if mark:
                pending_rank = int(mark["rank"])
    spans = []
    for i, (start, rank) in enumerate(starts):
        end = starts[i + 1][0] - 1 if i + 1 < len(starts) else len(doc.lines)
        spans.append((start, end, rank))
    return spans


def _dumps(doc: Doc) -> List[LogEvent]:
    out: List[LogEvent] = []
    for start, end, rank in _dump_spans(doc):
        body = "\n".join(doc.lines[start - 1:end])
        rk = _RANK_KEY.search(body)
        rank = int(rk["v"]) if rk else rank
        cuts = [m.start() for m in _RECORD.finditer(body)]
        last: Dict[str, Tuple[int, LogEvent]] = {}
        for i, cut in enumerate(cuts):
            chunk = body[body.rfind("{", 0, cut) if body.rfind("{", 0, cut) >= 0 else cut:
                         cuts[i + 1] if i + 1 < len(cuts) else len(body)]
            seq, name, state = _SEQ.search(chunk), _NAME.search(chunk), _STATE.search(chunk)
            if not (seq and name):
                continue
            p2p = _P2P.search(chunk)
            if p2p and p2p["v"].lower() == "true":
                continue  # send/recv pair up differently; they say nothing about collective order
            pg = _PG.search(chunk)
            group = f"{pg['name']}:{pg['desc']}" if pg else "?"
            record = int(_RECORD.search(chunk)["v"])  # type: ignore[index]
            lineno = start + body.count("\n", 0, cut)
            ev = doc.event("fr_last_collective", lineno, f"rank {rank}: {name['v']} seq {seq['v']} "
                           f"({state['v'] if state else '?'}) in {group}", rank=rank, group=group,
                           seq=int(seq["v"]), op=name["v"], state=state["v"] if state else None, record_id=record)
            if group not in last or record >= last[group][0]:
                last[group] = (record, ev)
        out += [ev for _, ev in last.values()]
    return out


def parse(doc: Doc) -> List[LogEvent]:
    """``fr_missing_ranks`` from analyzer reports; ``fr_last_collective`` per rank and group from dumps."""
    text = doc.text
    out: List[LogEvent] = []
    if "Not all ranks joining collective" in text:
        out += _reports(doc)
    if "collective_seq_id" in text and "profiling_name" in text:
        out += _dumps(doc)
    return out
