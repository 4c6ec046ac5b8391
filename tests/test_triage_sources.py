"""Triage evidence sources: Slurm (parsers + the lab's real slurmctld/slurmdbd), our Pushgateway
groups and state files (real Pushgateway), the job-level rules over them, the CLI's exit codes,
and the grep prefilter of the log scanner (same events as the pure-Python scanner)."""
from __future__ import annotations

import gzip
import json
import os
import time
from pathlib import Path

import pytest

from conftest import cli
from slurm_triage.config import load
from slurm_triage.model import Finding, Verdict
from slurm_triage.triage import logs
from slurm_triage.triage.model import JobEvidence
from slurm_triage.triage.rules import JOB_RULES, RULES, correlate, pushed, run_job_rules
from slurm_triage.triage.sources import settings
from slurm_triage.triage.sources import pushgateway as pg_source
from slurm_triage.triage.sources import slurm

# Recorded from the lab (Slurm 22.05.8, Debian 12): `sacct --json -j 4`, trimmed to the keys read.
SACCT_JSON_2205 = {"jobs": [{
    "job_id": 4, "state": {"current": "CANCELLED", "reason": "None"},
    "exit_code": {"status": "SUCCESS", "return_code": 0},
    "time": {"elapsed": 2, "eligible": 1795972414, "end": 1795972416, "start": 1795972414,
             "submission": 1795972414, "suspended": 0, "limit": None},
    "nodes": "node[1-4]", "name": "true", "steps": []}]}
# Slurm >= 23.02 wraps numbers ({"set", "infinite", "number"}) and lists states; shape as recorded from
# a Slurm 25.11 cluster in a public project's fixtures (TinkerCliffs), with a time limit and a signal.
SACCT_JSON_NEW = {"jobs": [{
    "job_id": 7823204, "state": {"current": ["TIMEOUT"], "reason": "None"},
    "exit_code": {"status": ["SIGNALED"], "return_code": {"set": True, "infinite": False, "number": 0},
                  "signal": {"id": {"set": True, "infinite": False, "number": 15}, "name": "TERM"}},
    "time": {"start": 1720000000, "end": 1720003600, "submission": 1719999000,
             "limit": {"set": True, "infinite": False, "number": 60}},
    "nodes": "gpu[01-02]", "restart_cnt": 2, "stdout_expanded": "/home/u/slurm-7823204.out", "steps": []}]}
# Recorded from the lab: `sacct -n -P -D -j 4 -o JobID,State,ExitCode,Start,End,NodeList,Reason,Timelimit,Submit`.
SACCT_P = "4|CANCELLED by 0|0:0|2026-11-29T17:13:34|2026-11-29T17:13:36|node[1-4]|None|UNLIMITED|2026-11-29T17:13:34\n"
# Recorded from the lab: `scontrol show job -o 4` (cut after WorkDir).
SCONTROL = ("JobId=4 JobName=true UserId=triage-test(4242) GroupId=triage-test(4242) MCS_label=N/A "
            "Priority=4294901756 Nice=0 Account=(null) QOS=normal JobState=CANCELLED Reason=Prolog "
            "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=0 Reboot=0 ExitCode=0:1 RunTime=00:00:02 "
            "TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-29T17:13:34 EligibleTime=2026-11-29T17:13:34 "
            "AccrueTime=Unknown StartTime=2026-11-29T17:13:34 EndTime=2026-11-29T17:13:36 Deadline=N/A "
            "NodeList=node[1-4] BatchHost=node1 NumNodes=4 WorkDir=/tmp/slurm-lab/work "
            "StdErr=/tmp/slurm-lab/work/slurm-4.out StdOut=/tmp/slurm-lab/work/slurm-4.out Power=")


# ---- Slurm -------------------------------------------------------------------------------------

def test_sacct_json_2205_and_new_shapes() -> None:
    old = slurm.from_sacct_json(SACCT_JSON_2205, "4")
    assert (old.state, old.exit_code, old.nodes, old.start, old.end) == \
        ("CANCELLED", 0, ["node1", "node2", "node3", "node4"], 1795972414.0, 1795972416.0)
    assert old.reason is None and old.time_limit_seconds is None
    new = slurm.from_sacct_json(SACCT_JSON_NEW, "7823204")
    assert (new.state, new.exit_code, new.signal, new.restarts) == ("TIMEOUT", 0, 15, 2)
    assert new.time_limit_seconds == 3600 and new.nodes == ["gpu01", "gpu02"]
    assert new.stdout == "/home/u/slurm-7823204.out"


def test_sacct_json_of_slurm_2411_agrees_with_sacct_parsable() -> None:
    """24.11's JSON: an unset start is NO_VAL (not 0) and a step id carries its job id ("107.batch")."""
    data = Path(__file__).resolve().parent / "data" / "slurm-24.11"
    for job in ("4", "107"):
        js = slurm.from_sacct_json(json.loads((data / f"sacct-json-job{job}.json").read_text()), job)
        pp = slurm.from_sacct_parsable((data / f"sacct-P-job{job}.txt").read_text(), job)
        assert js is not None and pp is not None
        assert (js.start, js.end, js.submit) == (pp.start, pp.end, pp.submit), job
        assert [s["id"] for s in js.steps] == [s["id"] for s in pp.steps], job
    assert slurm.from_sacct_json(json.loads((data / "sacct-json-job4.json").read_text()), "4").start is None


def test_sacct_parsable_and_scontrol_merge() -> None:
    acct = slurm.from_sacct_parsable(SACCT_P, "4")
    assert acct.state == "CANCELLED" and acct.nodes == ["node1", "node2", "node3", "node4"] and acct.restarts == 0
    live = slurm.from_scontrol(SCONTROL, "4")
    assert live.stdout == "/tmp/slurm-lab/work/slurm-4.out" and live.reason == "Prolog" and live.signal == 1
    merged = slurm.merge(acct, live)
    assert merged.stdout == live.stdout and merged.reason == "Prolog" and merged.sources == ["sacct", "scontrol"]
    assert slurm.parse_duration("1-02:03:04") == 93784 and slurm.parse_duration("UNLIMITED") is None


def test_pyslurm_version_match() -> None:
    assert slurm.pyslurm_matches("23.2.2", "slurm 23.02.7")
    assert not slurm.pyslurm_matches("23.2.2", "slurm-wlm 22.05.8")
    assert not slurm.pyslurm_matches("", "slurm 23.02.7")


def test_missing_binaries_are_a_source_note() -> None:
    facts, rec = slurm.fetch("4", sacct="/nonexistent/sacct", scontrol="/nonexistent/scontrol", timeout=2)
    assert facts is None and rec["read"] is False and "not found" in rec["error"]


def test_real_slurm_job_facts(tmp_path: Path, monkeypatch) -> None:
    """A job that exits 3 on two lab nodes: sacct (real slurmdbd) + scontrol name its facts."""
    import lab as labmod

    lab = labmod.require()
    monkeypatch.setenv("SLURM_CONF", lab.slurm_conf)
    job = lab.sbatch("-N2", "--wrap", "echo hello; exit 3")
    info = lab.wait_job(job, timeout=90)
    if info["JobState"] != "FAILED":  # the lab is shared: a drained node or a reset cancels the job
        pytest.skip(f"lab job {job} ended {info['JobState']} (Reason={info.get('Reason')}), not by its exit code")
    deadline = time.monotonic() + 20
    while True:  # slurmdbd receives the record asynchronously
        facts, rec = slurm.fetch(str(job))
        done = facts and "sacct-json" in facts.sources and facts.state == "FAILED" and len(facts.nodes) == 2
        if done or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert rec["read"] and facts is not None, rec
    assert facts.state == "FAILED" and facts.exit_code == 3
    assert len(facts.nodes) == 2 and all(n in lab.nodes for n in facts.nodes)
    assert facts.start and facts.end and facts.end >= facts.start
    assert "sacct-json" in facts.sources and "scontrol" in facts.sources
    assert facts.stdout and facts.stdout.endswith(f"slurm-{job}.out")


# ---- Pushgateway groups and state files ---------------------------------------------------------

def _push(pgw, node: str, job: str, phase: str, findings) -> None:
    """As the hooks push: live groups keyed by job, the Epilog's last_job group by node with
    the job id as a sample label."""
    from slurm_triage.config import Config, defaults
    from slurm_triage.sinks.exposition import render
    from slurm_triage.sinks.spool import deliver

    values = defaults()
    values["pushgateway"]["url"] = pgw.url
    values["node"]["spool_dir"] = ""
    key = {"job": "slurm_triage", "instance": node, "phase": phase}
    labels = None
    if phase == "last_job":
        labels = {"slurm_job_id": job}
    else:
        key["slurm_job_id"] = job
    res = deliver(Config(values), key, render({"node": node, "time": time.time(), "errors": {}}, findings,
                                              labels=labels))
    assert res.error is None or not res.error, res


def test_pushgateway_groups_to_findings(pushgateway) -> None:
    """Real pushes of the hooks' exposition; the job's groups only, one finding per check across phases."""
    public = Finding(id="listener.public", verdict=Verdict.FAIL, summary="jupyter on 0.0.0.0:8888", pid=77)
    left = Finding(id="leftover.process", verdict=Verdict.WARN, summary="python (pid 55) of job 9", pid=55)
    _push(pushgateway, "n1", "42", "prolog", [public, left])
    _push(pushgateway, "n1", "42", "last_job", [public])
    _push(pushgateway, "n3", "41", "last_job", [public])  # another job's summary
    _push(pushgateway, "n2", "43", "prolog", [public])  # another job
    nodes = pg_source.from_groups(pg_source.fetch_groups(pushgateway.url, 2.0), "42")
    assert sorted(nodes) == ["n1"]
    ev = JobEvidence(nodes=nodes)
    sec = pushed.public_dashboards(ev)
    assert len(sec) == 1 and sec[0].category == "security" and sec[0].node == "n1"
    assert sorted(sec[0].evidence["phases"]) == ["last_job", "prolog"]
    lo = pushed.leftovers(ev)
    assert len(lo) == 1 and lo[0].consequence is False  # found before the job: a cause


def test_state_files_and_unreachable_gateway(tmp_path: Path, write_config) -> None:
    from slurm_triage.sinks import state

    cfg_path = write_config(f'[node]\nstate_dir = "{tmp_path}/{{node}}/state"\n')
    for node in ("n1", "n2"):
        ncfg = load(str(cfg_path))
        ncfg.values["node"]["state_dir"] = f"{tmp_path}/{node}/state"
        state.save(ncfg, "7", "prolog", {"node": node, "verdict": "OK", "findings": [], "snapshot": {
            "time": 100.0, "gpu": {"gpus": [{"uuid": f"GPU-{node}", "index": 0, "slowdown_temp_celsius": 90}]}}})
    state.save(ncfg, "7", "epilog", {"node": "n2", "verdict": "FAIL", "snapshot": {"time": 200.0},
                                      "leftovers": [{"pid": 9, "comm": "python"}], "gpu_diff": {},
                                      "findings": [{"id": "gpu.row_remap", "verdict": "FAIL", "hardware": True,
                                                    "summary": "row remap failure on GPU 0", "gpu": "GPU-n2"}]})
    cfg = load(str(cfg_path))
    nodes, recs = pg_source.gather(cfg, "http://127.0.0.1:9", "7", ["n1", "n2"])
    assert recs["pushgateway"]["read"] is False and recs["state"]["nodes"] == ["n1", "n2"]
    assert nodes["n1"]["gpus"]["GPU-n1"]["slowdown_temp_celsius"] == 90
    hw = pushed.node_hardware(JobEvidence(nodes=nodes))
    assert [(f.node, f.category, f.tier, f.first_time) for f in hw] == [("n2", "gpu_hardware", 0, 200.0)]
    left = pushed.leftovers(JobEvidence(nodes=nodes))
    assert left and left[0].consequence  # left behind by this job: a symptom


# ---- job rules, correlation, CLI ----------------------------------------------------------------

def test_slurm_state_rule_and_first_failure_wins() -> None:
    nodes = {"n2": {"findings": [{"id": "gpu.lost", "verdict": "FAIL", "hardware": True, "phase": "prolog",
                                  "gpu": "GPU-x", "time": 100.0}], "watch": {}, "gpus": {}}}
    ev = JobEvidence(job={"job_id": "9", "state": "NODE_FAIL", "end": 150.0, "start": 90.0, "restarts": 1}, nodes=nodes)
    found = run_job_rules(ev)
    assert found[0].id.startswith("node.prolog.gpu.lost") and found[0].node == "n2"
    slurm_f = next(f for f in found if f.id == "slurm.node_fail")
    assert "requeued 1" in slurm_f.summary and slurm_f.category == "scheduler"
    timeout = run_job_rules(JobEvidence(job={"job_id": "9", "state": "TIMEOUT", "end": 150.0}))
    assert timeout[0].id == "slurm.timeout" and timeout[0].consequence


def test_rules_are_listed() -> None:
    cp = cli("triage", "--list-rules")
    assert cp.returncode == 0
    for r in RULES + JOB_RULES:
        assert r.id in cp.stdout


def test_cli_exit_2_when_nothing_reachable(tmp_path: Path, write_config) -> None:
    cfg = write_config('[pushgateway]\nurl = "http://127.0.0.1:9"\n')
    cp = cli("--config", str(cfg), "triage", "12345", "--format", "json",
             env={"SLURM_CONF": _dead_slurm_conf(tmp_path)})
    assert cp.returncode == 2, cp.stderr
    assert "could not triage" in cp.stderr and "pushgateway" in cp.stderr
    doc = json.loads(cp.stdout)
    assert doc["sources"]["slurm"]["read"] is False and doc["findings"] == []


def test_cli_down_prometheus_is_a_note_not_a_crash(tmp_path: Path, write_config) -> None:
    log = tmp_path / "job.out"
    log.write_text("step 1 ok\n")
    cfg = write_config('[pushgateway]\nurl = "http://127.0.0.1:9"\n')
    cp = cli("--config", str(cfg), "triage", "12345", "--prometheus", "http://127.0.0.1:9", "--log", str(log),
             "--nodes", "n[1-2]",
             "--since", "1700000000", "--until", "1700003600", env={"SLURM_CONF": _dead_slurm_conf(tmp_path)})
    assert cp.returncode == 0, cp.stderr
    assert "prometheus: unreachable" in cp.stdout and f"{log}: 1 lines" in cp.stdout


def _dead_slurm_conf(tmp_path: Path) -> str:
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("bench_triage_prom", CORPUS.parent.parent / "bench" / "bench_triage_prom.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return str(mod.dead_slurm_conf(tmp_path))


# ---- log scanning: grep prefilter vs pure Python --------------------------------------------------

CORPUS = Path(__file__).resolve().parent / "corpus"


def _key(events):
    return [(e.kind, e.line, e.text, e.time, e.node, e.rank, e.gpu, e.fields) for e in events]


@pytest.mark.skipif(logs.grep_binary() is None, reason="GNU grep not at /usr/bin/grep or /bin/grep")
def test_grep_prefilter_finds_the_same_events_as_python(tmp_path: Path) -> None:
    """Every corpus log plus garbage (NUL, invalid UTF-8, a 100 KiB line, no final newline)."""
    files = sorted(p for p in CORPUS.rglob("*") if p.is_file() and p.name != "meta.json")
    assert files
    total = 0
    for p in files:
        a, sa = logs.scan(str(p))
        b, sb = logs.scan(str(p), prefilter=False)
        if logs._is_gzip(str(p)):
            continue
        assert _key(a) == _key(b), p
        assert (sa.lines, sa.candidate_lines, sa.bytes) == (sb.lines, sb.candidate_lines, sb.bytes), p
        total += len(a)
    assert total > 20
    g = tmp_path / "garbage.log"
    watchdog = (b"[rank3]:[E321 02:07:08.408271257 ProcessGroupNCCL.cpp:607] [Rank 3] Watchdog caught collective "
                b"operation timeout: WorkNCCL(SeqNum=1580, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
                b"Timeout(ms)=600000) ran for 600060 milliseconds before timing out.")
    g.write_bytes(b"\x00\xff\xfe junk\n" + b"x" * 100_000 + watchdog + b"\nok\n\xc3\x28 " + watchdog)
    a, sa = logs.scan(str(g))
    b, sb = logs.scan(str(g), prefilter=False)
    assert _key(a) == _key(b) and len(a) == 2 and sa.lines == sb.lines == 4
    gz = tmp_path / "x.log.gz"
    gz.write_bytes(gzip.compress(watchdog + b"\n"))
    assert len(logs.scan(str(gz))[0]) == 1  # gzip: decompressed into grep
    os.chmod(g, 0)
    if os.geteuid() != 0:
        with pytest.raises(OSError):
            logs.scan(str(g))


def test_settings_accessor_defaults_and_fallback(write_config) -> None:
    cfg = load(str(write_config('[pushgateway]\nurl = "http://127.0.0.1:9091"\n')))
    s = settings(cfg)
    assert s["pushgateway_url"] == "http://127.0.0.1:9091" and s["straggler_factor"] == 2.0
    assert s["metric_gpu_util"] == "DCGM_FI_DEV_GPU_UTIL" and s["thermal_margin_celsius"] == 5.0
    cfg.values["triage"] = {"pushgateway_url": "http://127.0.0.1:9092", "metric_gpu_util": "gpu_util"}
    s = settings(cfg)
    assert s["pushgateway_url"] == "http://127.0.0.1:9092" and s["metric_gpu_util"] == "gpu_util"
    assert correlate([]) == []


# ---- the watcher's evidence bundles -----------------------------------------------------------

def test_evidence_bundles_flag_the_hung_node(tmp_path) -> None:
    """A bundle the watcher wrote in the lab (trimmed; job id 4711), read back per node."""
    import shutil

    from slurm_triage.triage.sources import bundles

    src = Path(__file__).parent / "data" / "bundles" / "hang-node2-0-1795977277.json"
    job_dir = tmp_path / "slurm-triage-4242" / "4711"
    job_dir.mkdir(parents=True)
    shutil.copy(src, job_dir / src.name)
    (job_dir / "hang-node3-0-1.json").write_bytes(b"\x00garbage{")  # a broken one is a note
    nodes, rec = bundles.gather(str(tmp_path), "4711", 4242)
    assert sorted(nodes) == ["node2"] and nodes["node2"]["watch"]["hang_suspected"] is True
    assert nodes["node2"]["watch"]["bundles"] == [str(job_dir / src.name)]
    assert rec["read"] and rec["files"] == 1 and "hang-node3-0-1.json" in rec["errors"][0]
    assert bundles.gather(str(tmp_path), "4712", 4242)[1]["read"] is False  # another job's: nothing
    assert bundles.gather(str(tmp_path), "*")[1]["error"].startswith("not a job id")


# ---- Slurm's output is other people's text (issue 13, break 12) ---------------------------------

def test_slurm_output_with_invalid_utf8_is_decoded_not_fatal(tmp_path: Path) -> None:
    """A job name/comment with byte 0xff: scontrol's output is still read (replacement character)."""
    from slurm_triage.triage.sources import slurm as slurm_src

    fake = tmp_path / "scontrol"
    fake.write_bytes(b"#!/bin/sh\nprintf 'JobId=77 JobName=x\\377y UserId=alice(4242) JobState=FAILED "
                     b"NodeList=n1 ExitCode=1:0\\n'\n")
    fake.chmod(0o755)
    out, err = slurm_src._run([str(fake)], 5.0)
    assert err == "" and out is not None and "x\ufffdy" in out
    facts = slurm_src.from_scontrol(out, "77")
    assert facts is not None and (facts.user, facts.uid, facts.state) == ("alice", 4242, "FAILED")
