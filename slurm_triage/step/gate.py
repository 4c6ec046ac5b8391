"""The gang gate: launch a step only when every node of its allocation is fit and alike.

A gang job runs at the pace of its worst node, so one FAIL, one node whose Prolog never
reported, or one node that differs from its peers (another driver, a lower power limit, a
narrower PCIe link, a GPU running hot while idle) costs the whole allocation. The gate
reads this job's Prolog verdicts with ONE Pushgateway query (the per-node state files are
the fallback), decides with a pure function, and prints a short table: node | reason |
action. srun runs it through the SPANK plugin (exit 1 = nothing launches); batch scripts
run ``slurm-triage gang-check``.
"""
from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from .. import ids
from ..config import Config
from ..model import Verdict

MAX_HOSTS = 65536
"""Expanding a hostlist beyond this is refused: no real allocation is that large."""
STALE_SLACK_SECONDS = 60.0
"""A verdict pushed this long before the job started is another job's (a reused id)."""
POLL_SECONDS = 0.25
_HOST = re.compile(r"[A-Za-z0-9._-]+")
EXIT_PASS, EXIT_BLOCKED, EXIT_USAGE = 0, 1, 2


class HostlistError(ValueError):
    pass


def _split_top(text: str) -> List[str]:
    """Split on commas outside brackets."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested '[' in hostlist {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in hostlist {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise HostlistError(f"unbalanced '[' in hostlist {text!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _range(spec: str, whole: str) -> List[str]:
    out: List[str] = []
    for item in spec.split(","):
        lo, sep, hi = item.strip().partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise HostlistError(f"bad range {item!r} in hostlist {whole!r}")
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            raise HostlistError(f"descending range {item!r} in hostlist {whole!r}")
        if b - a >= MAX_HOSTS:
            raise HostlistError(f"range {item!r} is larger than {MAX_HOSTS} hosts")
        width = len(lo) if lo.startswith("0") else 0
        out.extend(str(n).zfill(width) for n in range(a, b + 1))
    return out


def expand_hostlist(text: str) -> List[str]:
    """Slurm's hostlist syntax, e.g. ``gpu[01-03,7],rack[1-2]-n[1-2]`` -> host names, in order.

    Pure (no ``scontrol show hostnames`` fork); zero padding follows the lower bound;
    several bracket groups in one name give their product, as Slurm does.
    """
    hosts: List[str] = []
    for part in _split_top(text.strip()):
        names = [""]
        for literal, spec in re.findall(r"([^\[\]]*)(?:\[([^\]]*)\])?", part):
            if not literal and not spec:
                continue
            if literal and not _HOST.fullmatch(literal):
                raise HostlistError(f"bad host name characters in {part!r}")
            options = _range(spec, text) if spec else [""]
            if len(names) * len(options) > MAX_HOSTS:
                raise HostlistError(f"hostlist {text!r} expands to more than {MAX_HOSTS} hosts")
            names = [n + literal + o for n in names for o in options]
        hosts.extend(names)
        if len(hosts) > MAX_HOSTS:
            raise HostlistError(f"hostlist {text!r} expands to more than {MAX_HOSTS} hosts")
    return hosts


@dataclass
class NodeEvidence:
    """What this job's Prolog said about one node."""

    node: str
    verdict: str
    reported_at: Optional[float]
    """Unix time of the push (Pushgateway) or of the snapshot (state file)."""
    checks: List[Tuple[str, str]] = field(default_factory=list)
    """(check id, verdict) of every finding that is not OK."""
    peer: Dict[str, Any] = field(default_factory=dict)
    source: str = "pushgateway"


@dataclass(frozen=True)
class Policy:
    deadline_seconds: float = 10.0
    on_unreachable: str = "warn"
    idle_temp_outlier_celsius: float = 10.0
    block_on: str = "fail"

    @classmethod
    def from_config(cls, cfg: Config) -> "Policy":
        return cls(deadline_seconds=cfg.get("gate", "deadline_seconds"),
                   on_unreachable=cfg.get("gate", "on_unreachable"),
                   idle_temp_outlier_celsius=cfg.get("gate", "idle_temp_outlier_celsius"),
                   block_on=cfg.get("gate", "block_on"))

    def blocks(self, verdict: Verdict) -> bool:
        return verdict == Verdict.FAIL or (self.block_on == "warn" and verdict == Verdict.WARN)


@dataclass
class Row:
    node: str
    verdict: Verdict
    reason: str
    action: str


@dataclass
class Decision:
    job_id: str
    nodes: int
    blocked: bool
    rows: List[Row]
    source: str
    seconds: float = 0.0

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["rows"] = [dict(asdict(r), verdict=r.verdict.value) for r in self.rows]
        return d


# (peer key, what to call it, unit) of the figures that must be equal across a gang.
PEER_EQUAL: Tuple[Tuple[str, str, str], ...] = (
    ("gpu_count", "GPU count", ""),
    ("gpu_name", "GPU model", ""),
    ("driver_version", "driver", ""),
    ("power_limit_watts", "power limit", " W"),
    ("max_sm_clock_mhz", "max SM clock", " MHz"),
    ("pcie_width", "PCIe width", " lanes"),
)


def _fmt(v: Any, unit: str) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    return f"{v}{unit}"


def peer_outliers(peers: Dict[str, Dict[str, Any]], idle_temp_outlier_celsius: float) -> List[Row]:
    """Nodes whose figures differ from the majority of the gang, or idle hotter than its median.

    Without a strict majority a difference cannot be pinned on one side: every node of
    every minority value is named, with the split.
    """
    rows: List[Row] = []
    if len(peers) < 2:
        return rows
    for key, what, unit in PEER_EQUAL:
        values = {n: (round(v, 1) if isinstance(v, float) else v) for n, p in peers.items()
                  if (v := p.get(key)) is not None}
        counts = Counter(values.values())
        if len(counts) < 2:
            continue
        common, n_common = counts.most_common(1)[0]
        strict = n_common * 2 > len(values)
        split = ", ".join(f"{_fmt(v, unit)} x{c}" for v, c in counts.most_common())
        for node, v in values.items():
            if strict and v == common:
                continue
            reason = (f"{what} {_fmt(v, unit)}, peers {_fmt(common, unit)}" if strict
                      else f"{what} differs across the gang ({split})")
            rows.append(Row(node, Verdict.WARN, reason,
                            f"--exclude={node}, or ask the admins why it differs"))
    temps = {n: float(p["idle_temp_celsius"]) for n, p in peers.items()
             if isinstance(p.get("idle_temp_celsius"), (int, float))}
    if len(temps) >= 2:
        median = statistics.median(temps.values())
        for node, t in temps.items():
            if t > median + idle_temp_outlier_celsius:
                rows.append(Row(node, Verdict.WARN,
                                f"idle at {t:g} C, peers' median {median:g} C (> +{idle_temp_outlier_celsius:g} C)",
                                f"--exclude={node}; cooling may make it a straggler"))
    return rows


def _check_list(checks: List[Tuple[str, str]], verdict: str) -> str:
    ids = sorted({c for c, v in checks if v == verdict})
    return ", ".join(ids[:4]) + (f" (+{len(ids) - 4})" if len(ids) > 4 else "") if ids else "see triage"


def decide(job_id: str, nodes: Sequence[str], evidence: Dict[str, NodeEvidence], policy: Policy,
           not_before: Optional[float] = None, source: str = "pushgateway") -> Decision:
    """Pure: the gate's verdict for ``nodes`` from the Prolog evidence of this job."""
    rows: List[Row] = []
    peers: Dict[str, Dict[str, Any]] = {}
    for node in nodes:
        ev = evidence.get(node)
        if ev is None:
            rows.append(Row(node, Verdict.FAIL, "no Prolog verdict for this job",
                            f"--exclude={node}; admins: check its slurmd log and Prolog"))
            continue
        if not_before is not None and ev.reported_at is not None and \
                ev.reported_at < not_before - STALE_SLACK_SECONDS:
            rows.append(Row(node, Verdict.FAIL, "Prolog verdict predates the job (stale)",
                            f"--exclude={node}; admins: check its Prolog push"))
            continue
        v = Verdict(ev.verdict) if ev.verdict in Verdict.__members__ else Verdict.UNKNOWN
        if v == Verdict.FAIL:
            rows.append(Row(node, v, "Prolog FAIL: " + _check_list(ev.checks, "FAIL"),
                            f"--exclude={node}; run `triage {job_id}` for the evidence"))
        elif v == Verdict.WARN:
            rows.append(Row(node, v, "Prolog WARN: " + _check_list(ev.checks, "WARN"),
                            f"run `triage {job_id}`; --exclude={node} if it matters"))
        elif v == Verdict.UNKNOWN:
            rows.append(Row(node, v, "Prolog could not evaluate: " + _check_list(ev.checks, "UNKNOWN"),
                            "none needed; it does not block"))
        if ev.peer:
            peers[node] = ev.peer
    rows.extend(peer_outliers(peers, policy.idle_temp_outlier_celsius))
    rows.sort(key=lambda r: (-r.verdict.severity, r.node))
    blocked = any(policy.blocks(r.verdict) for r in rows)
    return Decision(job_id, len(nodes), blocked, rows, source)


def unreachable(job_id: str, nodes: Sequence[str], error: str, policy: Policy) -> Decision:
    """No evidence at all: the configured policy decides (default: warn and launch)."""
    block = policy.on_unreachable == "block"
    row = Row("*", Verdict.FAIL if block else Verdict.WARN, f"no evidence: {error}",
              "launching anyway (gate.on_unreachable = \"warn\")" if not block
              else "fix the Pushgateway, or set gate.on_unreachable = \"warn\"")
    return Decision(job_id, len(nodes), block, [row], "none")


# ---- evidence -----------------------------------------------------------------------------------

class Unreachable(Exception):
    pass


def _label_value_one(family: Optional[Dict[str, Any]], label: str) -> Optional[str]:
    for m in (family or {}).get("metrics") or []:
        if m.get("value") in ("1", "1.0", "1e+00"):
            return (m.get("labels") or {}).get(label)
    return None


def evidence_from_groups(groups: Iterable[Dict[str, Any]], job_id: str) -> Dict[str, NodeEvidence]:
    """Pure: this job's Prolog groups from a ``/api/v1/metrics`` answer, by node."""
    from ..sinks.peer_metrics import parse_group

    out: Dict[str, NodeEvidence] = {}
    for g in groups:
        labels = g.get("labels") or {}
        if labels.get("slurm_job_id") != job_id or labels.get("phase") != "prolog" \
                or labels.get("job") != "slurm_triage" or not labels.get("instance"):
            continue
        if g.get("last_push_successful") is False:
            continue
        verdict = _label_value_one(g.get("slurm_triage_node_verdict"), "verdict")
        if verdict is None:
            continue
        checks = []
        for m in (g.get("slurm_triage_findings") or {}).get("metrics") or []:
            ml = m.get("labels") or {}
            if ml.get("verdict") and ml.get("verdict") != "OK":
                checks.append((str(ml.get("check", "?")), ml["verdict"]))
        try:
            pushed = float(g["push_time_seconds"]["metrics"][0]["value"])
        except (KeyError, IndexError, TypeError, ValueError):
            pushed = None
        node = labels["instance"]
        out[node] = NodeEvidence(node, verdict, pushed, checks, parse_group(g), "pushgateway")
    return out


def fetch_pushgateway(url: str, job_id: str, timeout: float) -> Dict[str, NodeEvidence]:
    """One GET of the whole gateway (it has no server-side filter); raises Unreachable."""
    import urllib.error
    import urllib.request

    # No proxy chosen by the environment: the gateway is the site's, the caller may be anyone.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url.rstrip("/") + "/api/v1/metrics", timeout=timeout) as resp:
            body = resp.read()
        data = json.loads(body)
    except (OSError, ValueError, urllib.error.URLError) as e:
        raise Unreachable(f"Pushgateway {url}: {e}") from None
    if not isinstance(data, dict) or data.get("status") != "success" or not isinstance(data.get("data"), list):
        raise Unreachable(f"Pushgateway {url}: unexpected answer")
    return evidence_from_groups(data["data"], job_id)


def state_dir_template(cfg: Config) -> str:
    """node.state_dir before ``{node}`` was replaced by this host's name."""
    from ..config import SCHEMA, parse

    if cfg.source and cfg.source.startswith("/"):
        try:
            with open(cfg.source, encoding="utf-8") as fh:
                return parse(fh.read(), cfg.source)["node"]["state_dir"]
        except Exception:  # noqa: BLE001 - load() already reported a broken file; use what it used
            return cfg.get("node", "state_dir")
    return SCHEMA["node"]["state_dir"].default


def evidence_from_state(cfg: Config, job_id: str, nodes: Sequence[str]) -> Dict[str, NodeEvidence]:
    """The Prolog records in the nodes' state dirs, where this process can read them."""
    from ..sinks import state

    template = state_dir_template(cfg)
    out: Dict[str, NodeEvidence] = {}
    for path in dict.fromkeys(template.replace("{node}", n) for n in nodes):
        node_cfg = cfg.with_values({**cfg.values, "node": {**cfg.values["node"], "state_dir": path}})
        try:
            rec = state.load(node_cfg, job_id, "prolog")
        except (OSError, ValueError):
            continue
        if not rec or not rec.get("node"):
            continue
        checks = [(str(f.get("id", "?")), f["verdict"]) for f in rec.get("findings") or []
                  if isinstance(f, dict) and f.get("verdict") not in (None, "OK")]
        t = (rec.get("snapshot") or {}).get("time")
        out[rec["node"]] = NodeEvidence(rec["node"], str(rec.get("verdict", "UNKNOWN")),
                                        float(t) if isinstance(t, (int, float)) else None,
                                        checks, rec.get("peer") or {}, "state")
    return out


def job_info(cfg: Config, job_id: str, timeout: float = 5.0) -> Tuple[str, Optional[float]]:
    """(NodeList, StartTime as unix seconds) from ``scontrol show job -o``; ("", None) when unknown."""
    from ..slurmctl import tool_env

    try:
        r = subprocess.run([cfg.get("hooks", "scontrol"), "show", "job", "-o", job_id], capture_output=True,
                           text=True, timeout=timeout, env=tool_env(), cwd="/")
    except (OSError, subprocess.TimeoutExpired):
        return "", None
    nodes = re.search(r"(?:^| )NodeList=(\S+)", r.stdout)
    start = re.search(r"(?:^| )StartTime=(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)", r.stdout)
    when = time.mktime(time.strptime(start.group(1), "%Y-%m-%dT%H:%M:%S")) if start else None
    return (nodes.group(1) if nodes and nodes.group(1) != "(null)" else ""), when


def gather(cfg: Config, job_id: str, nodes: Sequence[str], policy: Policy,
           not_before: Optional[float] = None) -> Decision:
    """Poll the evidence until every node reported or the deadline passed, then decide."""
    t0 = time.monotonic()
    end = t0 + policy.deadline_seconds
    url = cfg.get("pushgateway", "url")
    while True:
        error, evidence, source = "", {}, "pushgateway"
        if url:
            try:
                # The whole answer can take seconds on a busy gateway: only the deadline bounds it.
                evidence = fetch_pushgateway(url, job_id, max(0.5, end - time.monotonic()))
            except Unreachable as e:
                error = str(e)
        else:
            error = "pushgateway.url is not set"
        if error:
            evidence, source = evidence_from_state(cfg, job_id, nodes), "state"
        complete = all(n in evidence for n in nodes)
        if complete or time.monotonic() + POLL_SECONDS > end:
            break
        time.sleep(POLL_SECONDS)
    if error and not evidence:
        d = unreachable(job_id, nodes, error + "; no readable state either", policy)
    else:
        d = decide(job_id, nodes, evidence, policy, not_before, source)
    d.seconds = time.monotonic() - t0
    return d


# ---- output -------------------------------------------------------------------------------------

def render_text(d: Decision) -> str:
    """The short table the user sees; one line when all is well."""
    head = (f"slurm-triage gang gate, job {d.job_id}, {d.nodes} node{'s' if d.nodes != 1 else ''} "
            f"({d.source}, {d.seconds:.2f} s): ")
    if not d.rows:
        return head + "all OK\n"
    head += "BLOCKED, nothing launched" if d.blocked else "launching"
    rows = [("node", "verdict", "reason", "action")] + \
        [(r.node, r.verdict.value, r.reason, r.action) for r in d.rows]
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [head] + [f"  {a:<{w[0]}}  {b:<{w[1]}}  {c:<{w[2]}}  {e}" for a, b, c, e in rows]
    return "\n".join(lines) + "\n"


def run(cfg: Config, job_id: str, nodelist: str, fmt: str = "text", out: Any = None) -> int:
    """Gate ``job_id`` on ``nodelist`` (empty: ask Slurm); print; EXIT_PASS or EXIT_BLOCKED."""
    out = out or sys.stderr
    policy = Policy.from_config(cfg)
    slurm_nodes, started = job_info(cfg, job_id)
    nodes = expand_hostlist(nodelist or slurm_nodes)
    if not nodes:
        d = unreachable(job_id, nodes, "the allocation's node list is unknown", policy)
    else:
        d = gather(cfg, job_id, nodes, policy, started)
    if fmt == "json":
        out.write(json.dumps(d.to_dict(), sort_keys=True) + "\n")
    else:
        out.write(render_text(d))
    return EXIT_BLOCKED if d.blocked else EXIT_PASS


def _cmd(args: Any) -> int:
    import os

    from ..config import load

    job = args.job or os.environ.get("SLURM_JOB_ID", "")
    if not ids.is_job_id(job):
        print("slurm-triage gang-check: no job id (--job, or run it inside the job)", file=sys.stderr)
        return EXIT_USAGE
    nodes = args.nodes if args.nodes is not None else os.environ.get("SLURM_JOB_NODELIST", "")
    try:
        return run(load(getattr(args, "config", None)), job, nodes, args.format,
                   sys.stdout if args.format == "json" else sys.stderr)
    except HostlistError as e:
        print(f"slurm-triage gang-check: {e}", file=sys.stderr)
        return EXIT_USAGE


def register(subparsers: Any) -> None:
    """Adds ``gang-check`` (for batch scripts: ``slurm-triage gang-check && srun ...``)."""
    c = subparsers.add_parser("gang-check", help="gate this job's nodes on their Prolog verdicts and peers",
                              description="Exit 0: every node reported and none blocks; 1: blocked.")
    c.add_argument("--job", metavar="ID", help="job id (default: $SLURM_JOB_ID)")
    c.add_argument("--nodes", metavar="HOSTLIST", help="nodes to gate (default: $SLURM_JOB_NODELIST, else Slurm's)")
    c.add_argument("--format", choices=("text", "json"), default="text")
    c.set_defaults(func=_cmd)
