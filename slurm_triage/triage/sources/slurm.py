"""What Slurm knows about a job: nodes, start/end, state, exit code, logs, restarts, reason.

Accounting (``sacct``) outlives the job, ``scontrol show job`` knows the log paths and
restarts of recent jobs; both are asked and merged. ``sacct --json`` is preferred (structured,
shapes differ between 22.05 and 24.11 and are normalized here), ``sacct -P`` is the fallback for
builds without the JSON plugin. pyslurm is used only when it imports AND was built for the
installed Slurm (its API follows Slurm's releases). Commands run by absolute path with a fixed
environment: triage may run as root, and the caller's PATH must not choose the binary.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ...step.gate import HostlistError, expand_hostlist
from ...slurmctl import run_tool as _run

_SACCT_FIELDS = ("JobID", "State", "ExitCode", "Start", "End", "NodeList", "Reason", "Timelimit", "Submit")


@dataclass
class JobFacts:
    job_id: str
    state: str = ""
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    nodelist: str = ""
    nodes: List[str] = field(default_factory=list)
    start: Optional[float] = None
    end: Optional[float] = None
    submit: Optional[float] = None
    time_limit_seconds: Optional[float] = None
    stdout: Optional[str] = None
    stderr: Optional[str] = None
    restarts: Optional[int] = None
    reason: Optional[str] = None
    user: Optional[str] = None
    uid: Optional[int] = None
    steps: List[Dict[str, Any]] = field(default_factory=list)
    sources: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


def parse_time(text: Optional[str]) -> Optional[float]:
    """Slurm's ``2026-11-29T17:09:02`` (local time of the controller, as printed) -> unix seconds."""
    if not text or not re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d$", text):
        return None
    return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))


def parse_duration(text: Optional[str]) -> Optional[float]:
    """``[D-]HH:MM:SS`` / ``MM:SS`` -> seconds; None for UNLIMITED, Partition_Limit, empty."""
    m = re.match(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)$", text or "")
    if not m:
        return None
    d, h, mi, s = (int(x or 0) for x in m.groups())
    return float(((d * 24 + h) * 60 + mi) * 60 + s)


def _exit(text: Optional[str]) -> Tuple[Optional[int], Optional[int]]:
    m = re.match(r"^(\d+):(\d+)$", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def _nodes(nodelist: str) -> List[str]:
    if not nodelist or nodelist in ("None assigned", "(null)"):
        return []
    try:
        return expand_hostlist(nodelist)
    except HostlistError:
        return []


def _num(v: Any) -> Optional[float]:
    """A JSON number: plain (22.05) or ``{"set": true, "number": N}`` (23.02+); None when unset/infinite."""
    if isinstance(v, dict):
        if not v.get("set", True) or v.get("infinite"):
            return None
        v = v.get("number")
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _state(v: Any) -> str:
    """``state.current``: a string (22.05) or a list of flags (23.02+) -> ``CANCELLED`` / ``FAILED+...``."""
    if isinstance(v, list):
        return "+".join(str(x) for x in v)
    return str(v or "")


def _exit_json(v: Any) -> Tuple[Optional[int], Optional[int]]:
    if not isinstance(v, dict):
        return None, None
    rc = _num(v.get("return_code"))
    sig = v.get("signal") or {}
    signo = _num(sig.get("id", sig.get("signal_id"))) if isinstance(sig, dict) else None
    return (int(rc) if rc is not None else None), (int(signo) if signo else None)


_NO_VAL = 0xFFFFFFFE
"""Slurm's "unset": 24.11's ``sacct --json`` gives it as the start of a job that never ran (22.05: 0)."""


def _epoch(v: Any) -> Optional[float]:
    t = _num(v)
    return t if t and t < _NO_VAL else None


def from_sacct_json(data: Dict[str, Any], job_id: str) -> Optional[JobFacts]:
    """Pure: the job from ``sacct --json`` output (Slurm 22.05 … 24.11 shapes)."""
    jobs = [j for j in data.get("jobs") or [] if isinstance(j, dict)]
    base = job_id.split("_")[0].split("+")[0]
    job = next((j for j in jobs if str(j.get("job_id")) == base), jobs[0] if jobs else None)
    if job is None:
        return None
    t = job.get("time") or {}
    state = job.get("state") or {}
    rc, sig = _exit_json(job.get("exit_code"))
    nodelist = str(job.get("nodes") or "")
    f = JobFacts(job_id=job_id, state=_state(state.get("current")), exit_code=rc, signal=sig,
                 nodelist=nodelist, nodes=_nodes(nodelist), start=_epoch(t.get("start")), end=_epoch(t.get("end")),
                 submit=_epoch(t.get("submission")), reason=_reason(state.get("reason")),
                 restarts=int(_num(job.get("restart_cnt")) or 0) if job.get("restart_cnt") is not None else None,
                 stdout=job.get("stdout_expanded") or job.get("stdout") or None,
                 stderr=job.get("stderr_expanded") or job.get("stderr") or None,
                 user=str(job["user"]) if job.get("user") else None, sources=["sacct-json"])
    limit = _num(t.get("limit"))
    f.time_limit_seconds = limit * 60 if limit else None  # sacct reports minutes
    for s in job.get("steps") or []:
        st = s.get("time") or {}
        step = s.get("step") or {}
        srcs, ssig = _exit_json(s.get("exit_code"))
        sid = str(step.get("name") if step.get("id") is None else step.get("id"))
        f.steps.append({"id": sid.split(".", 1)[1] if sid.startswith(f"{job.get('job_id')}.") else sid,  # 24.11: "J.S"
                        "name": step.get("name"), "state": _state(s.get("state")), "exit_code": srcs,
                        "signal": ssig, "start": _epoch(st.get("start")), "end": _epoch(st.get("end"))})
    return f


def from_sacct_parsable(text: str, job_id: str) -> Optional[JobFacts]:
    """Pure: the job (first row) and its steps from ``sacct -n -P -o`` + _SACCT_FIELDS."""
    rows = [dict(zip(_SACCT_FIELDS, ln.split("|"))) for ln in text.splitlines() if ln.count("|") == len(_SACCT_FIELDS) - 1]
    attempts = [r for r in rows if "." not in r["JobID"]]  # -D lists every run of a requeued job
    if not attempts:
        return None
    j = attempts[-1]
    rc, sig = _exit(j["ExitCode"])
    f = JobFacts(job_id=job_id, state=j["State"].split(" by ")[0], exit_code=rc, signal=sig, nodelist=j["NodeList"],
                 nodes=_nodes(j["NodeList"]), start=parse_time(j["Start"]), end=parse_time(j["End"]),
                 submit=parse_time(j["Submit"]), reason=_reason(j["Reason"]),
                 time_limit_seconds=parse_duration(j["Timelimit"]), restarts=len(attempts) - 1, sources=["sacct"])
    for r in (r for r in rows if "." in r["JobID"]):
        src, ssig = _exit(r["ExitCode"])
        f.steps.append({"id": r["JobID"].split(".", 1)[-1], "name": None, "state": r["State"].split(" by ")[0],
                        "exit_code": src, "signal": ssig, "start": parse_time(r["Start"]), "end": parse_time(r["End"])})
    return f


def parse_scontrol(text: str) -> Dict[str, str]:
    """``scontrol show job -o`` as Key -> Value (values with spaces, e.g. Reason, are kept whole)."""
    out: Dict[str, str] = {}
    key = ""
    for word in text.strip().split(" "):
        m = re.match(r"^([A-Za-z][\w/:]*)=(.*)$", word)
        if m:
            key = m.group(1)
            out[key] = m.group(2)
        elif key:
            out[key] += " " + word
    return out


def from_scontrol(text: str, job_id: str) -> Optional[JobFacts]:
    """Pure: the job from ``scontrol show job -o`` (one line per job; the first is used)."""
    line = next((ln for ln in text.splitlines() if ln.startswith("JobId=")), "")
    if not line:
        return None
    d = parse_scontrol(line)
    rc, sig = _exit(d.get("ExitCode"))
    nodelist = d.get("NodeList", "")
    who = re.match(r"^([^()\s]+)\((\d+)\)$", d.get("UserId", ""))
    return JobFacts(job_id=job_id, state=d.get("JobState", ""), exit_code=rc, signal=sig,
                    user=who.group(1) if who else None, uid=int(who.group(2)) if who else None,
                    nodelist="" if nodelist == "(null)" else nodelist, nodes=_nodes(nodelist),
                    start=parse_time(d.get("StartTime")), end=parse_time(d.get("EndTime")),
                    submit=parse_time(d.get("SubmitTime")), time_limit_seconds=parse_duration(d.get("TimeLimit")),
                    stdout=_path(d.get("StdOut")), stderr=_path(d.get("StdErr")),
                    restarts=int(d["Restarts"]) if d.get("Restarts", "").isdigit() else None,
                    reason=_reason(d.get("Reason")), sources=["scontrol"])


def _reason(v: Any) -> Optional[str]:
    return None if v in (None, "", "None") else str(v)


def _path(v: Optional[str]) -> Optional[str]:
    return v if v and v.startswith("/") and v != "/dev/null" else None


def merge(acct: Optional[JobFacts], live: Optional[JobFacts]) -> Optional[JobFacts]:
    """Accounting wins for times/state of a finished job; scontrol adds log paths and restarts."""
    if acct is None or live is None:
        return acct or live
    for k in ("stdout", "stderr", "restarts", "time_limit_seconds", "reason", "user", "uid"):
        if getattr(acct, k) in (None, "") and getattr(live, k) not in (None, ""):
            setattr(acct, k, getattr(live, k))
    if live.state in ("RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED"):
        acct.state, acct.end = live.state, live.end if live.end and live.end > time.time() - 1 else None
    if not acct.nodes and live.nodes:
        acct.nodelist, acct.nodes = live.nodelist, live.nodes
    acct.sources += live.sources
    return acct


def pyslurm_matches(pyslurm_version: str, slurm_version: str) -> bool:
    """pyslurm X.Y.* is built for Slurm X.Y only (``23.2.2`` matches ``slurm 23.02.7``)."""
    a = re.match(r"^(\d+)\.(\d+)", pyslurm_version or "")
    b = re.search(r"(\d+)\.(\d+)", slurm_version or "")
    return bool(a and b) and (int(a.group(1)), int(a.group(2))) == (int(b.group(1)), int(b.group(2)))


def _from_pyslurm(job_id: str, scontrol: str, timeout: float) -> Optional[JobFacts]:
    """The job through pyslurm's database API when it matches the installed Slurm; else None."""
    try:
        import pyslurm  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - an optional extra: absent or broken means "use the CLI"
        return None
    out, _ = _run([scontrol, "--version"], timeout)
    if not out or not pyslurm_matches(str(getattr(pyslurm, "__version__", "")), out):
        return None
    try:  # pyslurm >= 23.2: the live job record (slurm_load_job), the same facts scontrol prints
        job = pyslurm.Job.load(int(job_id.split("_")[0]))
        nodelist = str(job.allocated_nodes or "")
        return JobFacts(job_id=job_id, state=str(job.state or ""), exit_code=job.exit_code,
                        signal=job.exit_code_signal, nodelist=nodelist, nodes=_nodes(nodelist),
                        start=_epoch(job.start_time), end=_epoch(job.end_time), submit=_epoch(job.submit_time),
                        stdout=_path(job.standard_output), stderr=_path(job.standard_error),
                        restarts=job.requeue_count, reason=str(job.state_reason or "") or None,
                        sources=["pyslurm"])
    except Exception:  # noqa: BLE001 - any pyslurm failure falls back to sacct/scontrol
        return None


def fetch(job_id: str, sacct: str = "/usr/bin/sacct", scontrol: str = "/usr/bin/scontrol",
          timeout: float = 10.0) -> Tuple[Optional[JobFacts], Dict[str, Any]]:
    """The job's facts and the source record; (None, {"read": False, "error": ...}) when Slurm cannot say."""
    from concurrent.futures import ThreadPoolExecutor

    errors: List[str] = []
    with ThreadPoolExecutor(max_workers=1) as pool:  # scontrol beside sacct: a dead controller costs one timeout
        live_call = pool.submit(_run, [scontrol, "show", "job", "-o", job_id], timeout)
        acct = _from_pyslurm(job_id, scontrol, timeout)
        if acct is None:
            acct = _from_sacct(sacct, job_id, timeout, errors)
        out, err = live_call.result()
    live = from_scontrol(out, job_id) if out is not None else None
    facts = merge(acct, live)
    if facts is None:
        why = "; ".join(errors + ([f"scontrol: {err}"] if err else [])) or "Slurm does not know this job"
        return None, {"read": False, "error": why}
    return facts, {"read": True, "via": facts.sources, "state": facts.state, "nodes": facts.nodelist,
                   **({"notes": errors} if errors else {})}


def _from_sacct(sacct: str, job_id: str, timeout: float, errors: List[str]) -> Optional[JobFacts]:
    """``sacct --json``, with ``sacct -P`` as the fallback (and for 22.05's exit codes)."""
    acct = None
    out, err = _run([sacct, "--json", "-j", job_id], timeout)
    exit_codes_wrong = False
    if out is not None:
        try:
            data = json.loads(out)
            acct = from_sacct_json(data, job_id)
            exit_codes_wrong = "0.0.38" in str(((data.get("meta") or {}).get("plugin") or {}).get("name"))
        except (ValueError, AttributeError, TypeError) as e:
            errors.append(f"sacct --json: {type(e).__name__}: {e}")
    else:
        errors.append(f"sacct --json: {err}")
        if "timed out" in err:
            return None
    if acct is None or exit_codes_wrong:
        out, err = _run([sacct, "-n", "-P", "-D", "-j", job_id, "-o", ",".join(_SACCT_FIELDS)], timeout)
        plain = from_sacct_parsable(out, job_id) if out is not None else None
        if out is None:
            errors.append(f"sacct: {err}")
        if acct is None:
            return plain
        if plain is not None:
            # Slurm 22.05's JSON (dbv0.0.38) reports return_code 0 for a job that exited 3
            # (seen in the lab: sacct -P says 3:0 for the same job): trust the plain output.
            acct.exit_code, acct.signal = plain.exit_code, plain.signal
    return acct
