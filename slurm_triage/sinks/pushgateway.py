"""Push to and delete from a Prometheus Pushgateway, with bounded retries.

``requests`` is imported only when a request is actually made: importing it costs
~170 ms, which the Prolog must not pay on nodes that do not push. A down gateway costs
at most ``timeout * (retries + 1)`` seconds per call: every attempt and every jittered
pause is cut to fit that one budget. Only a request that surely did not arrive (no
connection, or an HTTP answer that refused it) is retried: a timed-out one may still be
applied by a hung gateway, and resending it is how one DELETE got delivered 12 times.
"""
from __future__ import annotations

import base64
import random
import re
import time
from typing import Dict, Optional

DEFAULT_JOB = "slurm_triage"
# The text format Pushgateway 1.x parses; prometheus_client's newest default may be newer.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_PLAIN = re.compile(r"[A-Za-z0-9_.-]+")
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


REFUSED, UNANSWERED, DROPPED, HTTP = "refused", "unanswered", "dropped", "http"


class PushError(Exception):
    """A push or delete that did not succeed; ``status`` is None when no HTTP answer came.

    ``kind`` says whether the gateway may have acted on it: ``refused`` (no connection, the
    request never left), ``unanswered`` (sent, no answer in time: a hung or black-holed
    gateway may still apply it later), ``dropped`` (sent, connection closed or garbage
    back), ``http`` (an answer with ``status``).
    """

    def __init__(self, message: str, status: Optional[int] = None, retryable: bool = True,
                 kind: str = HTTP):
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        """False for a 4xx answer: sending the same request again cannot succeed."""
        self.kind = kind

    @property
    def ambiguous(self) -> bool:
        """The gateway may have applied it: sending it again could deliver it twice."""
        return self.kind in (UNANSWERED, DROPPED)


def _kind(e: Exception) -> str:
    import requests

    if isinstance(e, requests.exceptions.ConnectTimeout):
        return REFUSED
    if isinstance(e, requests.exceptions.Timeout):
        return UNANSWERED
    text = str(e)
    if isinstance(e, requests.exceptions.ConnectionError) and (
            "NewConnectionError" in text or "Failed to establish" in text or "Connection refused" in text):
        return REFUSED
    return DROPPED


def grouping_key(node: str, job_id: Optional[str] = None, job: str = DEFAULT_JOB) -> Dict[str, str]:
    """The design's grouping key: {job, instance=<node>[, slurm_job_id=<id>]}."""
    key = {"job": job, "instance": node}
    if job_id is not None:
        key["slurm_job_id"] = str(job_id)
    return key


def _segment(name: str, value: str) -> str:
    if not _LABEL.fullmatch(name):
        raise ValueError(f"invalid grouping label name {name!r}")
    if value == "":
        return f"{name}@base64/="
    # "." and ".." would be removed from the path by URL normalisation.
    if _PLAIN.fullmatch(value) and value not in (".", ".."):
        return f"{name}/{value}"
    enc = base64.urlsafe_b64encode(value.encode("utf-8")).decode("ascii").rstrip("=")
    return f"{name}@base64/{enc}"


def group_path(grouping: Dict[str, str]) -> str:
    """``/metrics/job/<job>/<label>/<value>...``, base64url for values outside [A-Za-z0-9_.-]."""
    labels = dict(grouping)
    job = labels.pop("job", DEFAULT_JOB)
    parts = [_segment("job", job)] + [_segment(k, str(v)) for k, v in labels.items()]
    return "/metrics/" + "/".join(parts)


def _request(method: str, url: str, grouping: Dict[str, str], body: Optional[bytes],
             timeout: float, retries: int) -> int:
    import requests

    target = url.rstrip("/") + group_path(grouping)
    headers = {"Content-Type": CONTENT_TYPE} if body is not None else {}
    deadline = time.monotonic() + timeout * (retries + 1)
    last: Optional[PushError] = None
    with requests.Session() as session:
        session.trust_env = False  # root code: no proxy or netrc chosen by the environment
        for attempt in range(retries + 1):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                resp = session.request(method, target, data=body, headers=headers,
                                       timeout=min(timeout, left), allow_redirects=False)
            except requests.RequestException as e:
                last = PushError(f"{method} {target}: {type(e).__name__}: {e}", kind=_kind(e))
                if last.ambiguous:
                    break  # it may have arrived: a resend now could apply it twice
            else:
                if 200 <= resp.status_code < 300:
                    return resp.status_code
                text = resp.text.strip().replace("\n", " ")[:500]
                retryable = resp.status_code >= 500 or resp.status_code in (408, 429)
                last = PushError(f"{method} {target}: HTTP {resp.status_code}: {text}",
                                 resp.status_code, retryable)
                if not retryable:
                    break
            if attempt < retries:
                # Jitter spreads the retries of many nodes hitting one gateway at once.
                time.sleep(max(0.0, min(random.uniform(0.05, 0.25) * (attempt + 1),
                                        deadline - time.monotonic())))
    raise last or PushError(f"{method} {target}: no time left to try")


def push(url: str, grouping: Dict[str, str], body: bytes, timeout: float = 2.0,
         retries: int = 1, method: str = "PUT") -> int:
    """Send exposition ``body`` to the group; PUT replaces the group, POST merges by name.

    Returns the HTTP status; raises PushError (with ``status`` and the gateway's message,
    e.g. its 400 on metrics inconsistent with other groups).
    """
    if method not in ("PUT", "POST"):
        raise ValueError(f"push method must be PUT or POST, got {method!r}")
    return _request(method, url, grouping, body, timeout, retries)


def delete(url: str, grouping: Dict[str, str], timeout: float = 2.0, retries: int = 1) -> int:
    """Delete the whole group (the gateway answers 202 even when it did not exist)."""
    return _request("DELETE", url, grouping, None, timeout, retries)


def ready(url: str, timeout: float = 2.0) -> bool:
    """True when the gateway answers its readiness endpoint (it is up, whatever a push did)."""
    import requests

    with requests.Session() as session:
        session.trust_env = False
        try:
            return session.get(url.rstrip("/") + "/-/ready", timeout=timeout).status_code == 200
        except requests.RequestException:
            return False
