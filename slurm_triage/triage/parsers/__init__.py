"""Structured outputs people paste next to a failed job: tables and blocks that span many lines.

:func:`parse_file` reads the first ``MAX_BYTES`` of one file (gzip by magic, via
:func:`slurm_triage.triage.logs.open_log`), decodes it forgivingly (NUL bytes dropped, invalid
UTF-8 replaced, lines cut at ``MAX_LINE_CHARS``) and hands the lines to every format module; a
file may hold several outputs one after another, or mixed with job output. Each module returns
facts as :class:`LogEvent` (kinds ``smi_q_*``, ``smi_*``, ``rocm_row``, ``dcgm_*``, ``slurm_*``,
``sacct_*``, ``kmsg_*``, ``ib_port``, ``gpustat_row``, ``pyspy_*``, ``fr_*``, ``shm_*``, ``ps_row``,
``rank_progress``, ``log_stall``);
:mod:`slurm_triage.triage.rules.structured` judges them.
"""
from __future__ import annotations

import gzip
import zlib
from typing import Callable, List, Tuple

from ..decoration import undecorate
from ..logs import open_log
from ..model import LogEvent
from . import (dcgmi, flight_recorder, gpustat, infiniband, kernel, nvidia_smi, nvidia_smi_q, progress, ps, pyspy,
               rocm_smi, shm, slurm, stall)
from .base import Doc

MAX_BYTES = 4 << 20
MAX_LINE_CHARS = 4096
READ_BYTES = 64 << 10  # small reads keep most of a truncated gzip (a failing read loses its own chunk)

FORMATS: Tuple[Tuple[str, Callable[[Doc], List[LogEvent]]], ...] = (
    ("nvidia_smi_q", nvidia_smi_q.parse),
    ("nvidia_smi", nvidia_smi.parse),
    ("gpustat", gpustat.parse),
    ("rocm_smi", rocm_smi.parse),
    ("dcgmi", dcgmi.parse),
    ("slurm", slurm.parse),
    ("kernel", kernel.parse),
    ("infiniband", infiniband.parse),
    ("pyspy", pyspy.parse),
    ("flight_recorder", flight_recorder.parse),
    ("shm", shm.parse),
    ("ps", ps.parse),
    ("progress", progress.parse),
    ("stall", stall.parse),
)


def read_lines(path: str) -> List[str]:
    """The decoded lines of the first MAX_BYTES of ``path``; a truncated gzip yields what it held.

    Raises OSError only when the file cannot be opened or read at all."""
    chunks: List[bytes] = []
    size = 0
    with open_log(path) as fh:
        while size < MAX_BYTES:
            try:
                chunk = fh.read(min(READ_BYTES, MAX_BYTES - size))
            except (EOFError, zlib.error, gzip.BadGzipFile):
                break  # truncated or corrupt gzip: keep what was decompressed so far
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    data = b"".join(chunks)
    if len(data) >= MAX_BYTES:
        data = data[:data.rfind(b"\n") + 1] or data  # never hand a parser half a line
    text = data.replace(b"\x00", b"").decode("utf-8", "replace")
    return [line.rstrip("\r")[:MAX_LINE_CHARS] for line in text.split("\n")]


def parse_lines(lines: List[str], source: str, file_index: int = 0) -> List[LogEvent]:
    """Every format's events over already decoded ``lines``, in line order; colours and launcher
    labels come off first (the formats' layouts are the programs' own)."""
    bare = [undecorate(line) for line in lines]
    doc = Doc(source, [b for b, _ in bare], file_index, [r for _, r in bare])
    events: List[LogEvent] = []
    for _, fn in FORMATS:
        events.extend(fn(doc))
    events.sort(key=lambda e: e.line)
    return events


def parse_file(path: str, file_index: int = 0) -> List[LogEvent]:
    """Facts from the structured outputs in ``path`` (see the module docstring)."""
    return parse_lines(read_lines(path), path, file_index)
