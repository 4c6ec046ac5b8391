"""Local spool for pushes the Pushgateway did not take, replayed in order later.

A down gateway must neither block a hook nor lose what it meant to say. Each failed
operation becomes one file named ``<time_ns>-<pid>.json`` (lexical order == creation
order, enforced under the lock even if the wall clock steps back), written atomically.
Replay stops at the first failure so order holds; an entry is deleted only after a 2xx.
A later PUT or DELETE of the *same* group replaces it, so older entries for that group
are dropped unsent as superseded; a job's result has a group of its own (the job id is in
its key), so results never supersede each other and each one reaches Prometheus.
An flock on ``.lock`` keeps two hooks from sending the same entry twice. The directory is
bounded by count and bytes: only at the bound is the oldest dropped, and counted in
``dropped`` so a metric reports the loss. An entry is dropped as poison only on a 4xx
answer, or (Pushgateway 1.11, #766) when the gateway keeps cutting that one request
while it answers its readiness probe; a 5xx or a timeout never makes an entry poison.

After a request that got no answer (a hung or black-holed gateway may apply it later),
an ``unanswered`` marker makes later calls ask ``/-/ready`` first and send nothing
until it answers, so one stuck gateway costs one probe per hook, not duplicate writes.
A result group is deleted ``keep_seconds`` after it was delivered (``delivered-results``
remembers when), once Prometheus has had time to scrape it: the gateway stays bounded.
"""
from __future__ import annotations

import base64
import fcntl
import json
import os
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Tuple

from ..config import Config
from .atomic import write_atomic
from .pushgateway import DEFAULT_JOB, DROPPED, PushError, push, ready
from .pushgateway import delete as delete_group  # "delete" is deliver()'s flag

SCHEMA = 1
LOCK_FILE = ".lock"
DROPPED_FILE = "dropped"
UNANSWERED_FILE = "unanswered"
RESULTS_FILE = "delivered-results"
SUFFIX = ".json"
# An entry whose request the gateway cut this many times while it answers its readiness
# probe is poison (Pushgateway 1.11 drops the connection instead of its 400 for
# inconsistent metrics, prometheus/pushgateway#766): dropped and counted, so it cannot
# wedge the spool. Timeouts and 5xx answers never count: the gateway is sick, not the entry.
POISON_ATTEMPTS = 5
PROBE_SECONDS = 1.0  # /-/ready of a gateway that answers comes back in milliseconds
LOCK_WAIT_SECONDS = 8.0
"""The longest a hook waits for another's flush: the holder sends for at most its push budget
(3 s), and what comes after it must not overtake it by queueing unlocked."""
LATE_WAIT_SECONDS = 2.0
"""How long a hook that queued behind another's lock tries it once more (_after_holder)."""
MIN_ATTEMPT_SECONDS = 1.0
"""No request starts with less budget left: cut short, a slow gateway's answer would come too
late for a PUT it applies anyway, and the replay would send it a second time."""


class Op(NamedTuple):
    """One operation on a group: PUT ``body``, or DELETE when ``body`` is None."""
    grouping: Dict[str, str]
    body: Optional[bytes] = None
    keep_seconds: Optional[float] = None
    """A job's result: its group is deleted this long after it was delivered."""
    own: bool = True
    """False for the spool's own housekeeping (expired result groups)."""

    @property
    def method(self) -> str:
        return "DELETE" if self.body is None else "PUT"


class FlushResult:
    """What one spool flush did; ``dropped``: entries the gateway rejected for good (4xx,
    poison) or that could not be read. (Plain classes here, not dataclasses: every hook
    imports this module, and dataclasses costs ~10 ms of CPU.)"""

    def __init__(self, sent: int = 0, dropped: int = 0, superseded: int = 0, pending: int = 0, error: str = ""):
        self.sent, self.dropped, self.superseded, self.pending, self.error = sent, dropped, superseded, pending, error

    def __repr__(self) -> str:
        return f"FlushResult({self.__dict__!r})"


class DeliveryResult:
    """What one delivery did. ``delivered``: every one of this call's own operations reached
    the gateway; ``sent``: successful requests, replayed entries included; ``dropped``:
    operations lost by this call (spool bound, rejected by the gateway, unwritable spool);
    ``pending``: entries left in the spool afterwards; ``own_sent``: how many of the caller's
    operations were sent (they go first, in order)."""

    def __init__(self, delivered: bool = False, sent: int = 0, spooled: int = 0, dropped: int = 0,
                 pending: int = 0, error: str = "", own_sent: int = 0):
        self.delivered, self.sent, self.spooled, self.dropped = delivered, sent, spooled, dropped
        self.pending, self.error, self.own_sent = pending, error, own_sent

    def __repr__(self) -> str:
        return f"DeliveryResult({self.__dict__!r})"


_HELD: Dict[str, Tuple[int, List[int]]] = {}
"""Spool directories whose lock this process holds for its whole life (a hook's background
publisher, see hold): directory -> (lock fd, [next entry time_ns])."""


def _group(grouping: Dict[str, str]) -> Tuple[Tuple[str, str], ...]:
    return tuple(sorted({"job": DEFAULT_JOB, **{k: str(v) for k, v in grouping.items()}}.items()))


def _left(deadline: float) -> float:
    return deadline - time.monotonic()


def _flock(fd: int, wait: float) -> bool:
    """Take the exclusive flock on ``fd``, polling up to ``wait`` seconds; False if it stayed held."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


class Spool:
    def __init__(self, directory: str, max_files: int, max_bytes: int = 1 << 62):
        self.directory, self.max_files, self.max_bytes = directory, max_files, max_bytes

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
        if self.directory in _HELD:
            yield True
            return
        fd = self._lock_fd()
        try:
            yield _flock(fd, wait)
        finally:
            os.close(fd)  # releases the flock

    def _lock_fd(self) -> int:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        return os.open(self._path(LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)

    def _size(self, name: str) -> int:
        try:
            return os.stat(self._path(name)).st_size
        except FileNotFoundError:
            return 0

    def append(self, method: str, grouping: Dict[str, str], body: Optional[bytes],
               locked: bool = True, keep_seconds: Optional[float] = None) -> int:
        """Spool one operation; returns how many old entries were dropped to make room.

        ``locked=False`` (the lock was busy): write the entry anyway, after everything
        present, and leave the bound to the next locked run.
        """
        names = self.entries()
        entry = {"schema": SCHEMA, "method": method, "grouping": dict(grouping),
                 "body_b64": None if body is None else base64.b64encode(body).decode("ascii"),
                 "created": time.time(), "attempts": 0}
        if keep_seconds is not None:
            entry["keep_seconds"] = keep_seconds
        data = json.dumps(entry, sort_keys=True).encode()
        dropped = 0
        if locked:
            total = sum(self._size(n) for n in names) + len(data)
            while names and (len(names) >= self.max_files or total > self.max_bytes):
                oldest = names.pop(0)
                total -= self._size(oldest)
                os.unlink(self._path(oldest))
                dropped += 1
            self._count_dropped(dropped)
        held = _HELD.get(self.directory)
        if held is not None:  # named when the lock was taken: before what others queued since
            ns = held[1][0]
            held[1][0] += 1
        else:
            ns = time.time_ns()
            if names:
                ns = max(ns, int(names[-1].split("-", 1)[0]) + 1)
        while True:
            name = f"{ns:020d}-{os.getpid()}{SUFFIX}"
            if not os.path.exists(self._path(name)):
                break
            ns += 1
        write_atomic(self._path(name), data)
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

    def hold(self, wait: float = 0.0) -> bool:
        """Take the lock, waiting up to ``wait`` seconds, and keep it until this process exits;
        what this process spools later is ordered as of then. A hook's background publisher
        holds it before the hook exits, so the Epilog's DELETE of the same group cannot
        overtake the Prolog's PUT: it waits for the lock, or queues behind it."""
        fd = self._lock_fd()
        if not _flock(fd, wait):
            os.close(fd)
            return False
        names = self.entries()
        ns = time.time_ns()
        if names:
            ns = max(ns, int(names[-1].split("-", 1)[0]) + 1)
        _HELD[self.directory] = (fd, [ns])
        return True

    # -- a gateway that did not answer -------------------------------------------------
    def mark_unanswered(self) -> None:
        try:
            write_atomic(self._path(UNANSWERED_FILE), f"{time.time()}\n".encode(), fsync=False)
        except OSError:
            pass

    def gateway_answers(self, url: str, timeout: float) -> bool:
        """False while an earlier request went unanswered and ``/-/ready`` still does not
        answer: then nothing is sent, so a hung gateway does not queue duplicates."""
        if not os.path.exists(self._path(UNANSWERED_FILE)):
            return True
        if timeout <= 0 or not ready(url, min(timeout, PROBE_SECONDS)):
            return False
        try:
            os.unlink(self._path(UNANSWERED_FILE))
        except FileNotFoundError:
            pass
        return True

    # -- results kept in the gateway for a while ---------------------------------------
    def _results(self) -> List[Dict[str, Any]]:
        try:
            with open(self._path(RESULTS_FILE), "rb") as fh:
                data = json.load(fh)
            return [r for r in data if isinstance(r, dict) and isinstance(r.get("grouping"), dict)]
        except (OSError, ValueError, TypeError):
            return []

    def remember(self, grouping: Dict[str, str], keep_seconds: float) -> None:
        """Note a delivered result group, to delete it ``keep_seconds`` from now (best effort:
        on a full disk the group just stays in the gateway)."""
        results = [r for r in self._results() if _group(r["grouping"]) != _group(grouping)]
        results.append({"grouping": dict(grouping), "expires": time.time() + keep_seconds})
        try:
            write_atomic(self._path(RESULTS_FILE), json.dumps(results, sort_keys=True).encode(), fsync=False)
        except OSError:
            pass

    def take_expired(self) -> List[Op]:
        """DELETEs of result groups whose time is up (and of the oldest beyond the count
        bound); they leave the list now and are sent or spooled like any operation."""
        results = sorted(self._results(), key=lambda r: float(r.get("expires") or 0))
        now = time.time()
        cut = max(0, len(results) - self.max_files)
        due = [r for i, r in enumerate(results) if i < cut or float(r.get("expires") or 0) <= now]
        if not due:
            return []
        rest = [r for r in results if r not in due]
        try:
            write_atomic(self._path(RESULTS_FILE), json.dumps(rest, sort_keys=True).encode(), fsync=False)
        except OSError:
            return []  # they stay listed and expire on a later run
        return [Op(dict(r["grouping"]), own=False) for r in due]

    # -- replay ------------------------------------------------------------------------
    def flush(self, url: str, timeout: float, retries: int, budget: Optional[float] = None,
              later: Optional[set] = None) -> FlushResult:
        """Replay entries oldest first; call with the lock held. ``later``: groups the caller
        writes right after, whose spooled entries are superseded unsent (a spooled PUT of the
        Prolog's live group replayed just before the Epilog's DELETE of it could, if the gateway
        applied it late, bring the group back after the DELETE).

        Stops at the first retryable failure (entry kept) or when ``budget`` seconds have
        passed; a 4xx answer drops that entry (retrying the same bytes cannot succeed, and
        it must not wedge the spool), and so does an entry whose request the gateway cut
        POISON_ATTEMPTS times while it answers its readiness probe.
        """
        res = FlushResult()
        deadline = time.monotonic() + (budget if budget is not None else float("inf"))
        loaded: List[Tuple[str, Dict[str, Any]]] = []
        for name in self.entries():
            e = self._load(name)
            if e is None:
                os.unlink(self._path(name))
                res.dropped += 1
                res.error = f"unreadable spool entry {name} dropped"
            else:
                loaded.append((name, e))
        replaced: set = set(later or ())
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
            left = _left(deadline)
            if left < min(timeout / 2, MIN_ATTEMPT_SECONDS):
                res.pending = len(todo) - i
                break
            try:
                if e["method"] == "DELETE":
                    delete_group(url, e["grouping"], min(timeout, left), retries)
                else:
                    push(url, e["grouping"], base64.b64decode(e["body_b64"] or ""), min(timeout, left), retries,
                         method=e["method"])
            except PushError as err:
                res.error = str(err)
                if not err.retryable:
                    os.unlink(self._path(name))
                    res.dropped += 1
                    continue
                if err.kind == DROPPED:
                    e["attempts"] = int(e.get("attempts", 0)) + 1
                    if e["attempts"] >= POISON_ATTEMPTS and ready(url, min(timeout, PROBE_SECONDS)):
                        os.unlink(self._path(name))
                        res.dropped += 1
                        res.error = f"dropped after {e['attempts']} cut requests while the gateway is up: {err}"
                        continue
                    try:
                        write_atomic(self._path(name), json.dumps(e, sort_keys=True).encode())
                    except OSError:
                        pass  # a full disk: the count starts again, the entry stays
                if err.ambiguous:
                    self.mark_unanswered()
                res.pending = len(todo) - i
                break
            os.unlink(self._path(name))
            res.sent += 1
            if e.get("keep_seconds") is not None:
                self.remember(e["grouping"], float(e["keep_seconds"]))
        self._count_dropped(res.dropped)
        return res


def _spool_of(cfg: Config) -> Optional[Spool]:
    directory = cfg.get("node", "spool_dir")
    if not directory:
        return None
    return Spool(directory, cfg.get("node", "spool_max_files"), cfg.get("node", "spool_max_bytes"))


def hold(cfg: Config, wait: float = 0.0) -> Optional[Tuple[int, int]]:
    """Spool.hold for the configured spool: (lock fd, order time_ns) to hand to a publisher
    process (adopt), or None when the spool stayed busy, or is absent or unusable."""
    sp = _spool_of(cfg)
    try:
        if sp is None or not sp.hold(wait):
            return None
    except OSError:
        return None
    fd, ns = _HELD[sp.directory]
    return fd, ns[0]


def adopt(cfg: Config, fd: int, ns: int) -> None:
    """Take over the lock a hook held for this process (an inherited fd shares the flock)."""
    sp = _spool_of(cfg)
    if sp is not None:
        _HELD[sp.directory] = (fd, [ns])


def flush_held(cfg: Config, budget: float) -> FlushResult:
    """Replay, within ``budget`` seconds, what other hooks queued behind the lock this
    process holds (a publisher, before it exits): a short job's Epilog that gave up waiting
    for the lock must not leave its result spooled until the node's next hook."""
    sp = _spool_of(cfg)
    url = cfg.get("pushgateway", "url")
    if sp is None or sp.directory not in _HELD or not url or not sp.entries():
        return FlushResult()
    timeout, retries = cfg.get("pushgateway", "timeout_seconds"), cfg.get("pushgateway", "retries")
    try:
        if not sp.gateway_answers(url, budget):
            return FlushResult()
        return sp.flush(url, timeout, retries, budget=budget)
    except OSError as e:
        return FlushResult(error=f"spool {sp.directory}: {e}")


def stats(cfg: Config) -> Dict[str, int]:
    """Spool gauges for exposition.render(extra=...): pending entries and drops so far."""
    sp = _spool_of(cfg)
    if sp is None:
        return {"spooled_pushes": 0, "spool_dropped": 0}
    try:
        return {"spooled_pushes": len(sp.entries()), "spool_dropped": sp.dropped_total()}
    except OSError:
        return {"spooled_pushes": 0, "spool_dropped": 0}


def _send(url: str, op: Op, timeout: float, retries: int) -> None:
    if op.body is None:
        delete_group(url, op.grouping, timeout, retries)
    else:
        push(url, op.grouping, op.body, timeout, retries)


def deliver(cfg: Config, grouping: Dict[str, str], body: Optional[bytes] = None,
            delete: bool = False, keep_seconds: Optional[float] = None,
            budget: Optional[float] = None) -> DeliveryResult:
    """PUT ``body`` to (or DELETE) the group; see deliver_all."""
    if (body is None) != delete:
        raise ValueError("deliver needs a body to push, or delete=True without one")
    return deliver_all(cfg, [Op(dict(grouping), body, keep_seconds)], budget)


def deliver_all(cfg: Config, ops: List[Op], budget: Optional[float] = None,
                limit: Optional[float] = None) -> DeliveryResult:
    """Replay the spool, then send ``ops`` in order, all within ``budget`` seconds (default
    ``timeout * (retries + 1)``); what is not sent by then is spooled. Never raises for
    network or spool trouble: the result says what happened (fail open). ``limit``: seconds
    from now nothing may pass (a hook's deadline); with it, the hook waits for the spool lock
    up to LOCK_WAIT_SECONDS (within ``limit``), and that wait does not count against ``budget``.

    While older entries remain spooled, new operations are spooled behind them rather
    than sent, so a group never goes back to older content.
    """
    res = DeliveryResult()
    url = cfg.get("pushgateway", "url")
    if not url or not ops:
        return res
    timeout, retries = cfg.get("pushgateway", "timeout_seconds"), cfg.get("pushgateway", "retries")
    deadline = time.monotonic() + (budget if budget is not None else timeout * (retries + 1))
    sp = _spool_of(cfg)
    errors: List[str] = []
    own = len(ops)
    if sp is not None:
        try:
            waiting = time.monotonic()
            wait = min(timeout, max(0.0, _left(deadline)))
            if limit is not None:  # a hook: the holder (the Prolog's publisher) ends within its budget
                wait = max(wait, min(limit - _left(deadline), LOCK_WAIT_SECONDS))
            with sp.locked(wait=wait) as got:
                if got and limit is not None:
                    # the wait for another hook's flush (the Prolog's publisher) is not gateway
                    # time: the budget starts once the lock is ours, within ``limit``
                    deadline = min(deadline + time.monotonic() - waiting, waiting + limit)
                _through_spool(sp, url, timeout, retries, deadline, ops, got, res, errors)
            if not got and limit is not None:
                _after_holder(sp, url, timeout, retries, waiting + limit, res, errors)
            return _finish(res, errors, own)
        except OSError as e:
            if res.sent or res.spooled:  # the spool broke midway; the rest goes out directly
                errors.append(f"spool {sp.directory}: {e}")
            else:
                errors.append(f"spool {sp.directory} unusable ({e}); sending without it")
            ops = ops[res.own_sent:]  # what was not sent goes out directly, even if a copy is spooled
    _send_direct(url, timeout, retries, deadline, ops, res, errors, None)
    return _finish(res, errors, own)


def _through_spool(sp: Spool, url: str, timeout: float, retries: int, deadline: float, ops: List[Op],
                   got: bool, res: DeliveryResult, errors: List[str]) -> DeliveryResult:
    if not got:
        errors.append(f"spool {sp.directory} busy: queued behind the running flush")
        _spool_rest(sp, ops, res, errors, locked=False)
        return res
    ops = ops + sp.take_expired()
    if not sp.gateway_answers(url, _left(deadline)):
        errors.append(f"{url} did not answer earlier and /-/ready does not answer now: spooled unsent")
        _spool_rest(sp, ops, res, errors)
        return res
    fr = sp.flush(url, timeout, retries, budget=max(0.0, _left(deadline)),
                  later={_group(op.grouping) for op in ops})
    res.sent, res.dropped = fr.sent, fr.dropped
    errors.append(fr.error)
    if fr.pending:
        _spool_rest(sp, ops, res, errors)
        return res
    _send_direct(url, timeout, retries, deadline, ops, res, errors, sp)
    return res


def _after_holder(sp: Spool, url: str, timeout: float, retries: int, until: float,
                  res: DeliveryResult, errors: List[str]) -> None:
    """A hook that queued behind another's lock tries it once more, for at most
    LATE_WAIT_SECONDS before ``until``, and replays the spool itself: the holder (a
    publisher) replays what queued behind it before it exits, but not what came after its
    last look."""
    wait = min(LATE_WAIT_SECONDS, until - time.monotonic() - MIN_ATTEMPT_SECONDS)
    if wait <= 0:
        return
    with sp.locked(wait=wait) as got:
        if not got or not sp.entries() or not sp.gateway_answers(url, until - time.monotonic()):
            return
        fr = sp.flush(url, timeout, retries, budget=max(0.0, until - time.monotonic()))
    res.sent += fr.sent
    res.dropped += fr.dropped
    res.pending = fr.pending
    if fr.pending == 0 and not fr.dropped and not fr.error:
        res.own_sent = res.spooled  # this call's operations were the newest entries: all sent
        errors[:] = [e for e in errors if "queued behind" not in e]
    else:
        errors.append(fr.error)


def _send_direct(url: str, timeout: float, retries: int, deadline: float, ops: List[Op],
                 res: DeliveryResult, errors: List[str], sp: Optional[Spool]) -> None:
    """Send ops in order; with a spool, the first that fails and all after it are spooled."""
    for i, op in enumerate(ops):
        left = _left(deadline)
        try:
            if left < min(timeout / 2, MIN_ATTEMPT_SECONDS):
                raise PushError(f"{op.method} {url}: push budget spent")
            _send(url, op, min(timeout, left), retries)
        except PushError as e:
            errors.append(str(e))
            if not e.retryable:
                res.dropped += 1
                continue
            if e.ambiguous and sp is not None:
                sp.mark_unanswered()
            if sp is not None:
                _spool_rest(sp, ops[i:], res, errors)
                return
            res.dropped += 1
            continue
        res.sent += 1
        res.own_sent += op.own
        if sp is not None and op.keep_seconds is not None:
            sp.remember(op.grouping, op.keep_seconds)


def _spool_rest(sp: Spool, ops: List[Op], res: DeliveryResult, errors: List[str], locked: bool = True) -> None:
    for op in ops:
        try:
            res.dropped += sp.append(op.method, op.grouping, op.body, locked=locked, keep_seconds=op.keep_seconds)
            res.spooled += 1
        except OSError as e:
            res.dropped += 1
            errors.append(f"spool {sp.directory}: {e}")
    res.pending = len(sp.entries())


def _finish(res: DeliveryResult, errors: List[str], own: int) -> DeliveryResult:
    res.delivered = res.own_sent == own
    res.error = "; ".join(e for e in errors if e)
    return res
