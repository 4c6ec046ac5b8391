"""Local spool for pushes the Pushgateway did not take, replayed in order later.

A down gateway must neither block a hook nor lose what it meant to say. Each failed
operation becomes one file named ``<time_ns>-<pid>.json`` (lexical order == creation
order, enforced under the lock even if the wall clock steps back), written atomically.
Replay stops at the first failure so order holds; an entry is deleted only after a 2xx.
A later PUT or DELETE of the same group replaces the whole group, so older entries for
that group are dropped unsent as superseded. An flock on ``.lock`` keeps two hooks from
sending the same entry twice. The directory is bounded: overflow drops the oldest and
counts it in ``dropped`` so a metric can report the loss.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..config import Config
from .atomic import write_atomic
from .pushgateway import DEFAULT_JOB, PushError, push, ready
from .pushgateway import delete as delete_group  # "delete" is deliver()'s flag

SCHEMA = 1
LOCK_FILE = ".lock"
DROPPED_FILE = "dropped"
SUFFIX = ".json"
# An entry that failed this many flushes while the gateway itself answers is poison (e.g.
# Pushgateway 1.11 drops the connection instead of its 400 for inconsistent metrics,
# prometheus/pushgateway#766): it is dropped and counted so it cannot wedge the spool.
POISON_ATTEMPTS = 5


@dataclass
class FlushResult:
    sent: int = 0
    dropped: int = 0
    """Entries the gateway rejected for good (4xx) or that could not be read."""
    superseded: int = 0
    pending: int = 0
    error: str = ""


@dataclass
class DeliveryResult:
    delivered: bool = False
    """This call's own operation reached the gateway."""
    sent: int = 0
    """Successful requests, replayed entries included."""
    spooled: int = 0
    dropped: int = 0
    """Operations lost by this call: spool overflow, rejected by the gateway, unwritable spool."""
    pending: int = 0
    """Entries left in the spool afterwards."""
    error: str = ""


def _group(grouping: Dict[str, str]) -> Tuple[Tuple[str, str], ...]:
    return tuple(sorted({"job": DEFAULT_JOB, **{k: str(v) for k, v in grouping.items()}}.items()))


class Spool:
    def __init__(self, directory: str, max_files: int):
        self.directory, self.max_files = directory, max_files

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def entries(self) -> List[str]:
        """Entry file names, oldest first."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n.endswith(SUFFIX) and n[0].isdigit())

    def dropped_total(self) -> int:
        try:
            with open(self._path(DROPPED_FILE), encoding="ascii") as fh:
                return int(fh.read().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    def _count_dropped(self, n: int) -> None:
        if n:
            write_atomic(self._path(DROPPED_FILE), f"{self.dropped_total() + n}\n".encode())

    @contextmanager
    def locked(self, wait: float) -> Iterator[bool]:
        """Hold the spool lock; yields False if another run kept it longer than ``wait``.

        Raises OSError when the directory cannot be created or the lock file opened.
        """
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        fd = os.open(self._path(LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            deadline = time.monotonic() + wait
            got = False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    got = True
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.02)
            yield got
        finally:
            os.close(fd)  # releases the flock

    def append(self, method: str, grouping: Dict[str, str], body: Optional[bytes],
               locked: bool = True) -> int:
        """Spool one operation; returns how many old entries were dropped to make room.

        ``locked=False`` (the lock was busy): write the entry anyway, after everything
        present, and leave the bound to the next locked run.
        """
        names = self.entries()
        dropped = 0
        if locked:
            while len(names) >= self.max_files:
                os.unlink(self._path(names.pop(0)))
                dropped += 1
            self._count_dropped(dropped)
        ns = time.time_ns()
        if names:
            ns = max(ns, int(names[-1].split("-", 1)[0]) + 1)
        while True:
            name = f"{ns:020d}-{os.getpid()}{SUFFIX}"
            if not os.path.exists(self._path(name)):
                break
            ns += 1
        entry = {"schema": SCHEMA, "method": method, "grouping": dict(grouping),
                 "body_b64": None if body is None else base64.b64encode(body).decode("ascii"),
                 "created": time.time(), "attempts": 0}
        write_atomic(self._path(name), json.dumps(entry, sort_keys=True).encode())
        return dropped

    def _load(self, name: str) -> Optional[Dict[str, Any]]:
        try:
            with open(self._path(name), "rb") as fh:
                e = json.load(fh)
            if e.get("method") in ("PUT", "POST", "DELETE") and isinstance(e.get("grouping"), dict):
                return e
        except (OSError, ValueError):
            pass
        return None

    def flush(self, url: str, timeout: float, retries: int, budget: Optional[float] = None) -> FlushResult:
        """Replay entries oldest first; call with the lock held.

        Stops at the first retryable failure (entry kept, its attempt count raised) or
        when ``budget`` seconds have passed; a 4xx answer drops that entry (retrying the
        same bytes cannot succeed, and it must not wedge the spool), and so does an entry
        that failed POISON_ATTEMPTS times while the gateway answers its readiness probe.
        """
        res = FlushResult()
        start = time.monotonic()
        loaded: List[Tuple[str, Dict[str, Any]]] = []
        for name in self.entries():
            e = self._load(name)
            if e is None:
                os.unlink(self._path(name))
                res.dropped += 1
                res.error = f"unreadable spool entry {name} dropped"
            else:
                loaded.append((name, e))
        replaced: set = set()
        todo: List[Tuple[str, Dict[str, Any]]] = []
        for name, e in reversed(loaded):
            key = _group(e["grouping"])
            if key in replaced:
                os.unlink(self._path(name))
                res.superseded += 1
                continue
            if e["method"] in ("PUT", "DELETE"):
                replaced.add(key)
            todo.append((name, e))
        todo.reverse()
        for i, (name, e) in enumerate(todo):
            if budget is not None and time.monotonic() - start >= budget:
                res.pending = len(todo) - i
                break
            try:
                if e["method"] == "DELETE":
                    delete_group(url, e["grouping"], timeout, retries)
                else:
                    push(url, e["grouping"], base64.b64decode(e["body_b64"] or ""), timeout, retries,
                         method=e["method"])
            except PushError as err:
                res.error = str(err)
                if not err.retryable:
                    os.unlink(self._path(name))
                    res.dropped += 1
                    continue
                e["attempts"] = int(e.get("attempts", 0)) + 1
                if e["attempts"] >= POISON_ATTEMPTS and ready(url, timeout):
                    os.unlink(self._path(name))
                    res.dropped += 1
                    res.error = f"dropped after {e['attempts']} failures while the gateway is up: {err}"
                    continue
                write_atomic(self._path(name), json.dumps(e, sort_keys=True).encode())
                res.pending = len(todo) - i
                break
            os.unlink(self._path(name))
            res.sent += 1
        self._count_dropped(res.dropped)
        return res


def _spool_of(cfg: Config) -> Optional[Spool]:
    directory = cfg.get("node", "spool_dir")
    return Spool(directory, cfg.get("node", "spool_max_files")) if directory else None


def stats(cfg: Config) -> Dict[str, int]:
    """Spool gauges for exposition.render(extra=...): pending entries and drops so far."""
    sp = _spool_of(cfg)
    if sp is None:
        return {"spooled_pushes": 0, "spool_dropped": 0}
    try:
        return {"spooled_pushes": len(sp.entries()), "spool_dropped": sp.dropped_total()}
    except OSError:
        return {"spooled_pushes": 0, "spool_dropped": 0}


def _send(url: str, method: str, grouping: Dict[str, str], body: Optional[bytes],
          timeout: float, retries: int) -> None:
    if method == "DELETE":
        delete_group(url, grouping, timeout, retries)
    else:
        push(url, grouping, body or b"", timeout, retries, method=method)


def deliver(cfg: Config, grouping: Dict[str, str], body: Optional[bytes] = None,
            delete: bool = False) -> DeliveryResult:
    """PUT ``body`` to (or DELETE) the group, replaying the spool first; never raises for
    network or spool trouble: the result says what happened (fail open).

    While older entries remain spooled, the new operation is spooled behind them rather
    than sent, so a group never goes back to older content. A down gateway costs about
    ``timeout * (retries + 1)`` once per call, not once per entry.
    """
    if (body is None) != delete:
        raise ValueError("deliver needs a body to push, or delete=True without one")
    res = DeliveryResult()
    url = cfg.get("pushgateway", "url")
    if not url:
        return res
    timeout, retries = cfg.get("pushgateway", "timeout_seconds"), cfg.get("pushgateway", "retries")
    method = "DELETE" if delete else "PUT"
    sp = _spool_of(cfg)
    errors: List[str] = []
    if sp is not None:
        inside = False
        try:
            with sp.locked(wait=timeout) as got:
                inside = True
                if got:
                    fr = sp.flush(url, timeout, retries, budget=timeout * (retries + 1))
                    res.sent, res.dropped = fr.sent, fr.dropped
                    errors.append(fr.error)
                    if fr.pending == 0:
                        try:
                            _send(url, method, grouping, body, timeout, retries)
                            res.delivered, res.sent = True, res.sent + 1
                            return _finish(res, errors)
                        except PushError as e:
                            errors.append(str(e))
                            if not e.retryable:
                                res.dropped += 1
                                return _finish(res, errors)
                else:
                    errors.append(f"spool {sp.directory} busy: queued behind the running flush")
                res.dropped += sp.append(method, grouping, body, locked=got)
                res.spooled = 1
                res.pending = len(sp.entries())
                return _finish(res, errors)
        except OSError as e:
            if inside:  # the spool broke midway: sending now could overtake older entries
                res.dropped += 1
                errors.append(f"spool {sp.directory}: {e}")
                return _finish(res, errors)
            errors.append(f"spool {sp.directory} unusable ({e}); sending without it")
    try:
        _send(url, method, grouping, body, timeout, retries)
        res.delivered, res.sent = True, res.sent + 1
    except PushError as e:
        res.dropped += 1
        errors.append(str(e))
    return _finish(res, errors)


def _finish(res: DeliveryResult, errors: List[str]) -> DeliveryResult:
    res.error = "; ".join(e for e in errors if e)
    return res
