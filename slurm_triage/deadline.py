"""Run probes in forked children under hard deadlines.

A hung driver call (NVML in D-state, a stuck sysfs read) cannot be interrupted inside
the process that made it; it can only be abandoned. Each probe therefore runs in its own
forked child, all children run at once, and any child past its deadline is SIGKILLed and
reported as timed out. Results travel back as JSON over a pipe.

Each top-level probe leads its own process group and the deadline kills the whole group:
a probe that forks helpers of its own (the parallel /proc scan) leaves none running after
the hook is gone. Probes nested inside a probe stay in that probe's group.
"""
from __future__ import annotations

import json
import os
import select
import signal
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

_IN_PROBE = False
"""True inside a probe's child: its own children join its process group."""


_PRCTL: List[Optional[Callable[..., int]]] = []
"""libc's prctl, looked up once in the parent: each child importing ctypes cost ~10 ms of CPU."""


def _libc_prctl() -> Optional[Callable[..., int]]:
    if not _PRCTL:
        try:
            import ctypes

            _PRCTL.append(ctypes.CDLL(None, use_errno=True).prctl)
        except (OSError, AttributeError):
            _PRCTL.append(None)
    return _PRCTL[0]


def _die_with(parent: int, prctl: Optional[Callable[..., int]]) -> None:
    """A probe must not outlive a hook that was SIGKILLed (OOM killer), nor a probe's helper
    its probe: the kernel kills the child when its parent dies (PR_SET_PDEATHSIG)."""
    if prctl is None:
        return
    prctl(1, int(signal.SIGKILL))  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before the call
        os._exit(1)


@dataclass
class ProbeResult:
    name: str
    value: Any = None
    error: str = ""
    timed_out: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.error and not self.timed_out


def _child(fn: Callable[[], Any], wfd: int) -> None:
    try:
        payload = json.dumps({"value": fn()})
    except BaseException as e:  # noqa: BLE001 - everything must reach the parent as text
        tb = traceback.extract_tb(e.__traceback__)[-1:]
        where = f" ({tb[0].filename.rsplit('/', 1)[-1]}:{tb[0].lineno})" if tb else ""
        payload = json.dumps({"error": f"{type(e).__name__}: {e}{where}"})
    data = payload.encode()
    while data:
        n = os.write(wfd, data)
        data = data[n:]
    os._exit(0)


def run_probes(probes: Dict[str, Tuple[Callable[[], Any], float]],
               meanwhile: Optional[Callable[[], None]] = None) -> Dict[str, ProbeResult]:
    """Run each ``name: (fn, deadline_seconds)`` in a child; return results by name.

    ``meanwhile`` runs in the parent while the children work (e.g. imports the sinks
    need), so its cost overlaps theirs instead of adding to it.
    """
    global _IN_PROBE
    start = time.monotonic()
    own_group = not _IN_PROBE
    running: Dict[int, Tuple[str, int, float, bytearray]] = {}  # rfd -> (name, pid, deadline, buf)
    results: Dict[str, ProbeResult] = {}
    parent = os.getpid()
    prctl = _libc_prctl()
    for name, (fn, seconds) in probes.items():
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            _IN_PROBE = True
            if own_group:
                os.setpgid(0, 0)
            _die_with(parent, prctl)
            os.close(rfd)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _child(fn, wfd)
        os.close(wfd)
        if own_group:
            try:
                os.setpgid(pid, pid)  # also here: whichever side runs first, the group exists
            except OSError:
                pass  # the child set it already and exec'd or exited
        running[rfd] = (name, pid, start + seconds, bytearray())
    if meanwhile is not None:
        meanwhile()
    while running:
        now = time.monotonic()
        for rfd, (name, pid, deadline, _) in list(running.items()):
            if now >= deadline:
                if own_group:
                    os.killpg(pid, signal.SIGKILL)  # the probe and every helper it forked
                else:
                    os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os.close(rfd)
                del running[rfd]
                results[name] = ProbeResult(name, timed_out=True, error=f"timed out after {deadline - start:.1f} s",
                                            seconds=now - start)
        if not running:
            break
        wait = max(0.0, min(d for _, _, d, _ in running.values()) - time.monotonic())
        ready, _, _ = select.select(list(running), [], [], wait)
        for rfd in ready:
            name, pid, deadline, buf = running[rfd]
            chunk = os.read(rfd, 1 << 16)
            if chunk:
                buf.extend(chunk)
                continue
            os.close(rfd)
            del running[rfd]
            os.waitpid(pid, 0)
            results[name] = _decode(name, bytes(buf), time.monotonic() - start)
    return results


def _decode(name: str, raw: bytes, seconds: float) -> ProbeResult:
    try:
        msg = json.loads(raw)
    except ValueError:
        return ProbeResult(name, error="probe died without a result", seconds=seconds)
    if "error" in msg:
        return ProbeResult(name, error=msg["error"], seconds=seconds)
    return ProbeResult(name, value=msg["value"], seconds=seconds)


def run_probe(fn: Callable[[], Any], seconds: float, name: str = "probe") -> ProbeResult:
    return run_probes({name: (fn, seconds)})[name]


