"""A forwarding proxy in front of the lab's real Pushgateway that counts what it applied and
can be made slow: the fault suite (tests/test_faults_lab.py) and the false-drain bench
(bench/bench_false_drains.py) read "delivered N times" and the hooks' own timings from it."""
from __future__ import annotations

import http.server
import re
import threading
import time
from collections import Counter
from typing import Any, Callable, Dict, List, Optional, Tuple

import requests

_DURATION = re.compile(rb"^slurm_triage_hook_duration_seconds(?:\{[^}]*\})? ([0-9.eE+-]+)", re.M)


def group_labels(path: str) -> Dict[str, str]:
    """/metrics/job/J/instance/N/slurm_job_id/7/phase/last_job -> its labels (plain values only:
    the hooks' node names and job ids never need the base64 form)."""
    parts = path.split("?")[0].strip("/").split("/")[1:]
    return dict(zip(parts[0::2], parts[1::2]))


Group = Tuple[Tuple[str, str], ...]


def _group(path: str) -> Group:
    return tuple(sorted(group_labels(path).items()))


class Counting:
    """Forwards every request to ``target`` after ``delay()`` seconds (0: a healthy gateway) and
    counts, per group (its labels, in any order), the PUTs the gateway applied (answered 2xx), however late, plus the
    ``hook_duration_seconds`` each applied Prolog/Epilog push carried."""

    def __init__(self, target: str, delay: Optional[Callable[[], float]] = None):
        applied: Counter = Counter()
        durations: Dict[Group, float] = {}
        lock = threading.Lock()
        self.delay: Callable[[], float] = delay or (lambda: 0.0)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                wait = proxy.delay()
                if wait > 0:
                    time.sleep(wait)
                try:
                    r = requests.request(self.command, target + self.path, data=body, timeout=120,
                                         headers={"Content-Type": self.headers.get("Content-Type", "")})
                except requests.RequestException:
                    self.close_connection = True
                    return
                if self.command == "PUT" and 200 <= r.status_code < 300:
                    group = _group(self.path)  # the spool may replay a group with its labels in another order
                    with lock:
                        applied[group] += 1
                        m = _DURATION.search(body or b"")
                        if m:
                            durations[group] = float(m.group(1))
                try:
                    self.send_response(r.status_code)
                    self.send_header("Content-Length", str(len(r.content)))
                    self.end_headers()
                    self.wfile.write(r.content)
                except OSError:
                    pass  # the hook gave up waiting: the gateway applied it all the same

            do_GET = do_PUT = do_DELETE = _forward

            def log_message(self, *args: object) -> None:
                pass

        self.applied = applied
        self.durations = durations
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def delivered(self, phase: str) -> List[Dict[str, str]]:
        """Labels of every group of ``phase`` applied at least once."""
        return [dict(g) for g in list(self.applied) if dict(g).get("phase") == phase]

    def doubled(self, phase: str = "last_job") -> int:
        """Applications beyond the first, over all groups of ``phase``."""
        return sum(n - 1 for g, n in list(self.applied.items()) if dict(g).get("phase") == phase)

    def hook_seconds(self, phase: str, jobs: Optional[set] = None) -> List[float]:
        """hook_duration_seconds of the applied ``phase`` pushes (of ``jobs`` when given)."""
        return [d for g, d in list(self.durations.items())
                if dict(g).get("phase") == phase and (jobs is None or dict(g).get("slurm_job_id") in jobs)]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def flush_spools(lab: Any, budget: float = 60.0) -> int:
    """Replay every lab node's spool now, as the node's next hook would (the real spool code,
    through the lab config's URL), without starting a job that adds entries of its own;
    the entries still spooled after."""
    from slurm_triage.config import load
    from slurm_triage.sinks.spool import Op, deliver_all

    for node in lab.nodes:
        cfg = load(str(lab.triage_config), fail_open=True, node=node)
        # one DELETE of a group nobody uses: deliver_all flushes the spool before any op
        deliver_all(cfg, [Op({"job": "slurm_triage_spool_flush", "instance": node})], budget=budget)
    return sum(len(list((lab.node_dir(n) / "spool").glob("*.json"))) for n in lab.nodes)
