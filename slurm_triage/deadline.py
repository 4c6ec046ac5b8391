"""Run probes in forked children under hard deadlines.

A hung driver call (NVML in D-state, a stuck sysfs read) cannot be interrupted inside
the process that made it; it can only be abandoned. Each probe therefore runs in its own
forked child, all children run at once, and any child past its deadline is SIGKILLed and
reported as timed out. Results travel back as JSON over a pipe.

Each top-level probe leads its own process group and the deadline kills the whole group:
a probe that forks helpers of its own (the parallel /proc scan) leaves none running after
the hook is gone. Probes nested inside a probe stay in that probe's group.

``start_probes`` forks and returns at once, so a hook starts its probes as soon as it has
its config and imports the rest of its code while they run (``run_probes`` does both). A
``Spare`` is a probe child forked even earlier, before the config is read: it imports its
probe's heavy modules (pynvml: ~15 ms of CPU) meanwhile and runs the probe once it is handed
the job as JSON.
"""
from __future__ import annotations

import importlib
import json
import os
import select
import signal
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

_IN_PROBE = False
"""True inside a probe's child: its own children join its process group."""


_PRCTL: List[Optional[Callable[..., int]]] = []
"""libc's prctl, looked up once in the parent: each child importing ctypes cost ~10 ms of CPU.
The parent looks it up only after forking its first child (a hook's GPU spare, or the first
probe), so that one starts ~3 ms sooner; the later children inherit it."""


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


class ProbeResult:
    """One probe's outcome (a plain class: dataclasses costs the hooks ~8 ms of imports)."""

    __slots__ = ("name", "value", "error", "timed_out", "seconds")

    def __init__(self, name: str, value: Any = None, error: str = "", timed_out: bool = False,
                 seconds: float = 0.0):
        self.name, self.value, self.error, self.timed_out, self.seconds = name, value, error, timed_out, seconds

    @property
    def ok(self) -> bool:
        return not self.error and not self.timed_out

    def __repr__(self) -> str:
        return f"ProbeResult({self.name!r}, error={self.error!r}, timed_out={self.timed_out}, seconds={self.seconds:.3f})"


def _become_probe(parent: int, own_group: bool) -> None:
    """In a freshly forked probe child: mark it, lead its own process group (a top-level probe),
    die with the parent, and let SIGTERM end it."""
    global _IN_PROBE
    _IN_PROBE = True
    if own_group:
        os.setpgid(0, 0)
    _die_with(parent, _libc_prctl())
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _lead_group(pid: int) -> None:
    """The parent's half of the child's setpgid: whichever side runs first, the group exists."""
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # the child set it already and exec'd or exited


def _child(fn: Callable[[], Any], wfd: int) -> None:
    try:
        payload = json.dumps({"value": fn()})
    except BaseException as e:  # noqa: BLE001 - everything must reach the parent as text
        import traceback

        tb = traceback.extract_tb(e.__traceback__)[-1:]
        where = f" ({tb[0].filename.rsplit('/', 1)[-1]}:{tb[0].lineno})" if tb else ""
        payload = json.dumps({"error": f"{type(e).__name__}: {e}{where}"})
    data = payload.encode()
    while data:
        n = os.write(wfd, data)
        data = data[n:]
    os._exit(0)


class Running:
    """Probes forked by ``start_probes``: ``wait`` collects them, ``cancel`` abandons them."""

    def __init__(self, start: float, own_group: bool,
                 running: Dict[int, Tuple[str, int, float, bytearray]]):
        self.start, self.own_group = start, own_group
        self.running = running  # rfd -> (name, pid, deadline, buf)

    def _kill(self, pid: int) -> None:
        try:
            if self.own_group:
                os.killpg(pid, signal.SIGKILL)  # the probe and every helper it forked
            else:
                os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # gone already (its group too): only the reaping is left
        os.waitpid(pid, 0)

    def cancel(self) -> None:
        """Kill and reap every probe still running (the hook will not use them)."""
        for rfd, (_, pid, _, _) in list(self.running.items()):
            self._kill(pid)
            os.close(rfd)
        self.running.clear()

    def wait(self, meanwhile: Optional[Callable[[], None]] = None) -> Dict[str, ProbeResult]:
        """Results by name, each probe within its deadline; ``meanwhile`` runs here first
        (e.g. imports the caller needs next), so its cost overlaps the probes'."""
        if meanwhile is not None:
            meanwhile()
        running, start = self.running, self.start
        results: Dict[str, ProbeResult] = {}
        while running:
            now = time.monotonic()
            for rfd, (name, pid, deadline, _) in list(running.items()):
                if now >= deadline:
                    self._kill(pid)
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


class Spare:
    """A probe child forked before its job is known (see the module doc).

    ``runner`` is called in the child with the job once it arrives (the child is a fork, so any
    function of the parent will do); the modules in ``warm`` are imported while the child waits. A spare that is never handed a
    job exits when its parent closes the job pipe (or dies: PR_SET_PDEATHSIG).
    """

    def __init__(self, pid: int, job_fd: int, result_fd: int):
        self.pid, self.job_fd, self.result_fd = pid, job_fd, result_fd

    @classmethod
    def fork(cls, runner: Callable[[Any], Any], warm: Sequence[str] = ()) -> Optional["Spare"]:
        """The spare, or None when no child can be forked (the probe is then forked as usual)."""
        parent = os.getpid()
        try:
            job_r, job_w = os.pipe()
            res_r, res_w = os.pipe()
            pid = os.fork()
        except OSError:
            return None
        if pid == 0:  # child
            os.close(job_w)
            os.close(res_r)
            _become_probe(parent, own_group=True)
            for name in warm:
                try:
                    importlib.import_module(name)
                except Exception:  # noqa: BLE001 - the job reports it, if it needs the module
                    pass
            job = _read_all(job_r)
            if not job:
                os._exit(0)  # not needed after all
            _child(lambda: runner(json.loads(job)), res_w)
        os.close(job_r)
        os.close(res_w)
        _lead_group(pid)
        _libc_prctl()  # now, while the spare imports: the probes forked later inherit it
        return cls(pid, job_w, res_r)

    def hand(self, job: Any) -> Optional[Tuple[int, int]]:
        """Send the job; (result fd, pid) to wait on, None when the spare is gone (then it is
        reaped and the caller forks the probe itself)."""
        view = memoryview(json.dumps(job).encode())
        os.set_blocking(self.job_fd, False)  # a spare stuck in its imports must not hold the hook here
        try:
            while view:
                view = view[os.write(self.job_fd, view):]
        except OSError:  # gone (EPIPE), or its pipe is full and it does not read (EAGAIN)
            self.cancel()
            return None
        os.close(self.job_fd)
        self.job_fd = -1
        return self.result_fd, self.pid

    def cancel(self) -> None:
        """Dismiss a spare that was not handed a job: kill and reap it."""
        if self.job_fd < 0:
            return
        os.close(self.job_fd)
        self.job_fd = -1
        os.close(self.result_fd)
        try:
            os.killpg(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass  # gone, and reaped already


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def start_probes(probes: Dict[str, Tuple[Callable[[], Any], float]],
                 spares: Optional[Dict[str, Tuple[Spare, Any]]] = None) -> Running:
    """Fork a child for each ``name: (fn, deadline_seconds)``; deadlines count from now.

    ``spares`` gives some probes a ``(Spare, job)``: that spare runs the probe instead (its
    result must be what ``fn`` would return); a spare that is gone falls back to ``fn``.
    """
    start = time.monotonic()
    own_group = not _IN_PROBE
    running: Dict[int, Tuple[str, int, float, bytearray]] = {}
    parent = os.getpid()
    for name, (spare, job) in (spares or {}).items():
        if name not in probes:
            spare.cancel()
            continue
        handed = spare.hand(job)
        if handed is not None:
            running[handed[0]] = (name, handed[1], start + probes[name][1], bytearray())
    handed_names = {v[0] for v in running.values()}
    for name, (fn, seconds) in probes.items():
        if name in handed_names:
            continue
        rfd, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # child
            os.close(rfd)
            _become_probe(parent, own_group)
            _child(fn, wfd)
        os.close(wfd)
        if own_group:
            _lead_group(pid)
        running[rfd] = (name, pid, start + seconds, bytearray())
        _libc_prctl()  # after the first fork; the later children inherit it
    return Running(start, own_group, running)


def run_probes(probes: Dict[str, Tuple[Callable[[], Any], float]],
               meanwhile: Optional[Callable[[], None]] = None) -> Dict[str, ProbeResult]:
    """Run each ``name: (fn, deadline_seconds)`` in a child; return results by name."""
    return start_probes(probes).wait(meanwhile)


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


