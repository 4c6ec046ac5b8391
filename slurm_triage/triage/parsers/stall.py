"""Where a log stops: its last line, when that line shows the job waiting at a known point.

A hung job leaves no error behind; its log just ends. Three endings say where it hung:

- an extension build step (``Using <dir> as PyTorch extensions root...``, ``Building extension module
  X...``, ``Loading extension module X...``, Megatron's ``> compiling and loading fused kernels ...``):
  torch.utils.cpp_extension builds under a lock file (``FileBaton``) that a build killed midway
  (OOM, scancel, Ctrl-C) leaves behind, and every later job waits on it forever without a word
  (pytorch/pytorch#189245, OpenRLHF/OpenRLHF#208);
- a progress bar short of its total (tqdm's ``45%|████▌     | 45/100 [...]``, rich's
  ``95% ━━━━━━━━━━━─ 41/43``): the loop stopped in the middle of an epoch;
- the training loop's own "done" (Lightning's ``Trainer.fit` stopped: `max_steps=10` reached.``, HF
  Trainer's ``Training completed.``) among the last lines, with no error after it: a job that failed
  after that point hung or died at teardown (process-group shutdown, pending checkpoint saves).

A file read only up to the parsers' byte limit has no known end, so it gives nothing.
"""
from __future__ import annotations

import re
from typing import List

from ..model import LogEvent
from .base import Doc

_BUILD = re.compile(r"as PyTorch extensions root\.\.\.|(?:Building|Loading) extension module \S+\.\.\.|"
                    r"Emitting ninja build file \S+|compiling and loading fused kernels|"
                    r"Setting up PyTorch plugin \S+\.\.\.")
_BAR = re.compile(r"(?P<pct>\d{1,3})%\s*(?:\|[^|]*\||[━─█▏▎▍▌▋▊▉╸╺ ]+)\s*(?P<done>\d+)/(?P<total>\d+)")
_FINISHED = re.compile(r"`Trainer\.fit` stopped: `max_(?:steps|epochs)=\d+` reached|\bTraining completed\. Do not forget"
                       r"|\b[Tt]raining (?:is )?(?:finished|completed?|done)\b")
_ERRORISH = re.compile(r"error|exception|traceback|fatal|killed|abort|fail", re.IGNORECASE)
TAIL_LINES = 10  # how near the end a "training finished" line must be
LIMIT_CHARS = (4 << 20) - 4096  # parse_file reads MAX_BYTES: a file this long may go on past what was read


def parse(doc: Doc) -> List[LogEvent]:
    """``log_stall`` (``at`` = ``extension_build`` or ``progress``) at a file's last non-empty line, or
    (``after_finish``) at a "training finished" line among the last TAIL_LINES with no error-looking line after it."""
    n = len(doc.lines)
    while n and not doc.lines[n - 1].strip():
        n -= 1
    if not n or sum(len(line) + 1 for line in doc.lines) >= LIMIT_CHARS:
        return []
    last = doc.lines[n - 1]
    if _BUILD.search(last):
        return [doc.event("log_stall", n, at="extension_build")]
    bar = _BAR.search(last)
    if bar and int(bar["pct"]) < 100 and int(bar["done"]) < int(bar["total"]):
        return [doc.event("log_stall", n, at="progress", done=int(bar["done"]), total=int(bar["total"]))]
    tail = [i for i in range(n, 0, -1) if doc.lines[i - 1].strip()][:TAIL_LINES]
    for i in tail:  # from the last line up: an error-looking line after the marker means it did not end there
        if _FINISHED.search(doc.lines[i - 1]):
            return [doc.event("log_stall", i, at="after_finish")]
        if _ERRORISH.search(doc.lines[i - 1]):
            break
    return []
