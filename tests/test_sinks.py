"""Sinks without a gateway: exposition text, grouping paths, textfile, state, spool bounds."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from slurm_triage.config import Config, defaults
from slurm_triage.model import Finding, Verdict
from slurm_triage.sinks import exposition, spool, state, textfile
from slurm_triage.sinks.pushgateway import group_path, grouping_key

ROOT = Path(__file__).resolve().parent.parent


def make_cfg(tmp_path: Path, url: str = "", **node) -> Config:
    values = defaults()
    values["node"].update({"name": "node1", "state_dir": str(tmp_path / "state"),
                           "spool_dir": str(tmp_path / "spool")}, **node)
    values["pushgateway"]["url"] = url
    return Config(values)


SNAPSHOT = {
    "schema": 1, "node": "node1", "time": 1700000000.25,
    "errors": {"kernel": "timed out after 2.0 s"}, "probe_seconds": {"gpu": 0.125, "kernel": 2.0},
    "gpu": {"library": "/x/libnvidia-ml.so.1", "driver_version": "550.54.15", "nvml_version": "12.550.54.15",
            "count": 2, "gpus": [
                {"index": 0, "uuid": "GPU-aaaa", "pci_bus_id": "0000:18:00.0", "minor": 2, "name": "NVIDIA H100 80GB HBM3",
                 "temperature_celsius": 61, "slowdown_temp_celsius": 87, "power_watts": 312.5,
                 "power_limit_watts": 700.0, "energy_joules": 123456.789, "util_gpu_percent": 87,
                 "mem_used_bytes": 1024, "sm_clock_mhz": 1980, "sm_clock_max_mhz": 1980,
                 "ecc_uncorrected_volatile": 0, "remap_pending": False, "remap_failure": True,
                 "clock_event_names": ["sw_power_cap", "hw_slowdown"], "processes": [{"pid": 7, "used_bytes": 1}]},
                {"index": 1, "uuid": "GPU-bbbb", "pci_bus_id": "0000:2a:00.0", "minor": 0, "name": "NVIDIA H100 80GB HBM3",
                 "temperature_celsius": 40, "power_watts": None, "energy_joules": None,
                 "unsupported": ["power_watts", "energy_joules"], "clock_event_names": [], "processes": []}]},
    "procs": {"processes": []}, "kernel": None, "rdma": None,
}
FINDINGS = [
    Finding("gpu.row_remap", Verdict.FAIL, "row remap failed", gpu="GPU-aaaa", hardware=True),
    Finding("gpu.temperature", Verdict.WARN, "hot", gpu="GPU-aaaa"),
    Finding("leftover.process", Verdict.WARN, "left over", pid=4242),
    Finding("leftover.process", Verdict.WARN, "left over", pid=4242),
]


def parse(body: bytes):
    return {f.name: f for f in text_string_to_metric_families(body.decode())}


def samples(fams, name):
    return [(s.name, s.labels, s.value) for f in fams.values() for s in f.samples if s.name == name]


def test_render_families_units_and_labels():
    body = exposition.render(SNAPSHOT, FINDINGS, {"internal_errors": 2, "spooled_pushes": 3, "spool_dropped": 1})
    fams = parse(body)
    assert fams["slurm_triage_node_verdict"].type == "gauge"
    verdicts = {s.labels["verdict"]: s.value for s in fams["slurm_triage_node_verdict"].samples}
    assert verdicts == {"OK": 0, "WARN": 0, "FAIL": 1, "UNKNOWN": 0}
    # two identical findings become one series with value 2 (duplicates would make the gateway answer 400)
    left = [s for s in fams["slurm_triage_findings"].samples if s.labels["check"] == "leftover.process"]
    assert [(s.labels["pid"], s.labels["gpu_uuid"], s.value) for s in left] == [("4242", "", 2.0)]
    hw = [s for s in fams["slurm_triage_findings"].samples if s.labels["hardware"] == "true"]
    assert [s.labels["check"] for s in hw] == ["gpu.row_remap"]
    assert samples(fams, "slurm_triage_check_timestamp_seconds")[0][2] == 1700000000.25
    up = {s.labels["probe"]: s.value for s in fams["slurm_triage_probe_up"].samples}
    assert up == {"gpu": 1.0, "kernel": 0.0}
    gpu0 = {"gpu_uuid": "GPU-aaaa", "pci_bus_id": "0000:18:00.0", "index": "0"}
    assert ("slurm_triage_gpu_sm_clock_hertz", gpu0, 1.98e9) in samples(fams, "slurm_triage_gpu_sm_clock_hertz")
    assert samples(fams, "slurm_triage_gpu_utilization_ratio") == [("slurm_triage_gpu_utilization_ratio", gpu0, 0.87)]
    assert samples(fams, "slurm_triage_gpu_row_remap_failure") == [("slurm_triage_gpu_row_remap_failure", gpu0, 1.0)]
    # energy is a counter; the GPU whose NVML said NOT_SUPPORTED has no sample at all
    assert fams["slurm_triage_gpu_energy_joules"].type == "counter"
    assert samples(fams, "slurm_triage_gpu_energy_joules_total") == [
        ("slurm_triage_gpu_energy_joules_total", gpu0, 123456.789)]
    assert [s[1]["gpu_uuid"] for s in samples(fams, "slurm_triage_gpu_power_watts")] == ["GPU-aaaa"]
    temps = {s[1]["gpu_uuid"]: s[2] for s in samples(fams, "slurm_triage_gpu_temperature_celsius")}
    assert temps == {"GPU-aaaa": 61, "GPU-bbbb": 40}
    reasons = sorted(s[1]["reason"] for s in samples(fams, "slurm_triage_gpu_clock_event_reason"))
    assert reasons == ["hw_slowdown", "sw_power_cap"]
    assert samples(fams, "slurm_triage_internal_errors_total")[0][2] == 2
    assert fams["slurm_triage_spooled_pushes"].type == "gauge"
    for name in fams:
        assert name.startswith("slurm_triage_")


def test_every_sample_has_a_type_line():
    text = exposition.render(SNAPSHOT, FINDINGS, {"internal_errors": 0}).decode()
    typed = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{")[0].split(" ")[0]
            assert name in typed or name.rsplit("_total", 1)[0] in typed, line


def test_missing_sections_produce_no_gpu_series_and_no_verdict_without_findings():
    snap = dict(SNAPSHOT, gpu=None, errors={"gpu": "NVML timed out"})
    fams = parse(exposition.render(snap, None))
    assert not [n for n in fams if n.startswith("slurm_triage_gpu")]
    assert "slurm_triage_node_verdict" not in fams and "slurm_triage_findings" not in fams
    assert {s.labels["probe"]: s.value for s in fams["slurm_triage_probe_up"].samples}["gpu"] == 0.0
    ok = parse(exposition.render({}, []))
    assert {s.labels["verdict"]: s.value for s in ok["slurm_triage_node_verdict"].samples}["OK"] == 1.0


def test_unknown_extra_key_is_refused():
    with pytest.raises(ValueError, match="unknown extra"):
        exposition.render(SNAPSHOT, [], {"internal_error": 1})


def test_sinks_do_not_import_requests_or_prometheus_client_until_used():
    code = ("import sys; import slurm_triage.sinks.exposition, slurm_triage.sinks.spool, "
            "slurm_triage.sinks.state, slurm_triage.sinks.textfile; "
            "print(sorted(m for m in ('requests', 'prometheus_client') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_group_path_plain_and_base64():
    assert group_path(grouping_key("node7", "42")) == "/metrics/job/slurm_triage/instance/node7/slurm_job_id/42"
    # the lab note's recorded example: job "slurm/triage", instance "node[1-3]"
    assert group_path({"job": "slurm/triage", "instance": "node[1-3]", "slurm_job_id": "42"}) == \
        "/metrics/job@base64/c2x1cm0vdHJpYWdl/instance@base64/bm9kZVsxLTNd/slurm_job_id/42"
    assert group_path({"instance": ""}) == "/metrics/job/slurm_triage/instance@base64/="
    # "." and ".." would be eaten by URL normalisation
    assert group_path({"instance": ".."}) == "/metrics/job/slurm_triage/instance@base64/Li4"
    assert group_path({"instance": "gpu-node/7"}) == "/metrics/job/slurm_triage/instance@base64/Z3B1LW5vZGUvNw"
    assert group_path({"instance": "n1\n"}) == "/metrics/job/slurm_triage/instance@base64/bjEK"
    with pytest.raises(ValueError):
        group_path({"bad-label": "x"})


def test_textfile_replaces_atomically(tmp_path: Path):
    path = textfile.write(str(tmp_path), "slurm_triage", b"# TYPE a gauge\na 1\n")
    assert path == str(tmp_path / "slurm_triage.prom")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    with open(path, "rb") as old:
        textfile.write(str(tmp_path), "slurm_triage", b"# TYPE a gauge\na 2\n")
        # a reader that opened the old file still reads all of it: the new one was renamed in
        assert old.read() == b"# TYPE a gauge\na 1\n"
    assert Path(path).read_bytes() == b"# TYPE a gauge\na 2\n"
    assert sorted(os.listdir(tmp_path)) == ["slurm_triage.prom"]
    for bad in ("../x", "a/b", "x.prom", ".hidden", "", "a\n"):
        with pytest.raises(ValueError):
            textfile.write(str(tmp_path), bad, b"")
    assert textfile.remove(str(tmp_path), "slurm_triage") is True
    assert textfile.remove(str(tmp_path), "slurm_triage") is False


def test_state_roundtrip_schema_and_array_jobs(tmp_path: Path):
    cfg = make_cfg(tmp_path)
    p = state.save(cfg, "123_4", "prolog", {"verdict": "OK", "gpus": ["GPU-aaaa"]})
    assert p == str(tmp_path / "state" / "jobs" / "123_4" / "prolog.json")
    on_disk = json.loads(Path(p).read_text())
    assert on_disk["schema"] == 1 and on_disk["job_id"] == "123_4" and on_disk["kind"] == "prolog"
    assert state.load(cfg, "123_4", "prolog") == {"verdict": "OK", "gpus": ["GPU-aaaa"]}
    assert state.load(cfg, "123_4", "epilog") is None
    assert state.load(cfg, "999", "prolog") is None
    assert [n for n in os.listdir(Path(p).parent) if n != "prolog.json"] == []


@pytest.mark.parametrize("job_id", ["../../etc", "1/../../x", "", "12a", "1_", "_1", "1_2_3", "/etc", "12\n"])
def test_state_rejects_job_ids_that_could_leave_state_dir(tmp_path: Path, job_id: str):
    cfg = make_cfg(tmp_path)
    with pytest.raises(ValueError):
        state.save(cfg, job_id, "prolog", {"x": 1})
    with pytest.raises(ValueError):
        state.load(cfg, job_id, "prolog")
    assert not (tmp_path / "etc").exists() and not (tmp_path / "state").exists()


def test_state_rejects_bad_kind(tmp_path: Path):
    with pytest.raises(ValueError):
        state.save(make_cfg(tmp_path), "5", "../passwd", {})


def test_state_latest_and_prune(tmp_path: Path):
    cfg = make_cfg(tmp_path)
    assert state.latest(cfg) is None
    state.save(cfg, None, "check", {"verdict": "WARN"})
    time.sleep(0.01)
    state.save(cfg, "77", "check", {"verdict": "OK"})
    rec = state.latest(cfg, "check")
    assert rec is not None and rec.job_id == "77" and rec.data == {"verdict": "OK"}
    time.sleep(0.01)
    state.save(cfg, None, "check", {"verdict": "FAIL"})
    assert state.latest(cfg, "check").data == {"verdict": "FAIL"}
    state.save(cfg, "78", "prolog", {})
    jobs = tmp_path / "state" / "jobs"
    old = time.time() - 10 * 86400
    os.utime(jobs / "77", (old, old))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    os.utime(outside, (old, old))
    os.symlink(outside, jobs / "900")  # named like a job, but a link: never followed
    assert state.prune(cfg, max_age_days=7) == 1
    assert sorted(os.listdir(jobs)) == ["78", "900"]
    assert (outside / "keep").exists()


def test_spool_names_follow_creation_order_even_if_clock_steps_back(tmp_path: Path, monkeypatch):
    sp = spool.Spool(str(tmp_path / "spool"), 100)
    os.makedirs(sp.directory)
    sp.append("PUT", {"instance": "a"}, b"1")
    real = time.time_ns
    monkeypatch.setattr(time, "time_ns", lambda: real() - 3600 * 10**9)  # clock stepped back an hour
    sp.append("PUT", {"instance": "b"}, b"2")
    names = sp.entries()
    groups = [json.loads((tmp_path / "spool" / n).read_text())["grouping"]["instance"] for n in names]
    assert groups == ["a", "b"]


def test_spool_bound_drops_oldest_and_counts(tmp_path: Path):
    sp = spool.Spool(str(tmp_path / "spool"), 3)
    os.makedirs(sp.directory)
    for i in range(5):
        sp.append("PUT", {"instance": f"n{i}"}, f"body{i}".encode())
    bodies = [json.loads((tmp_path / "spool" / n).read_text())["grouping"]["instance"] for n in sp.entries()]
    assert bodies == ["n2", "n3", "n4"]
    assert sp.dropped_total() == 2
    assert spool.stats(make_cfg(tmp_path, spool_max_files=3)) == {"spooled_pushes": 3, "spool_dropped": 2}


def test_deliver_without_url_does_nothing(tmp_path: Path):
    res = spool.deliver(make_cfg(tmp_path), grouping_key("node1", "1"), b"x 1\n")
    assert (res.delivered, res.sent, res.spooled, res.dropped, res.error) == (False, 0, 0, 0, "")
    assert not (tmp_path / "spool").exists()
    with pytest.raises(ValueError):
        spool.deliver(make_cfg(tmp_path, url="http://127.0.0.1:1"), {"instance": "n"}, b"x", delete=True)
