"""Structured-output parsers and the rules that judge them, on recorded real captures
(tests/data/structured/SOURCES.md names each source) and on hostile input."""
from __future__ import annotations

import gzip
import os
from pathlib import Path
from typing import List

import pytest

from slurm_triage.triage import healthy, lexicon, logs, parsers, triage_logs
from slurm_triage.triage.model import CATEGORIES, LogEvent, TriageFinding
from slurm_triage.triage.parsers import kernel, nvidia_smi
from slurm_triage.triage.rules import correlate, prior, run_rules, structured

DATA = Path(__file__).resolve().parent / "data" / "structured"
CORPUS = Path(__file__).resolve().parent / "corpus"  # dev cases only (bench/corpus.py split_of)


def events(name: str) -> List[LogEvent]:
    return parsers.parse_file(str(DATA / name))


def kinds(name: str, kind: str) -> List[LogEvent]:
    return [e for e in events(name) if e.kind == kind]


def judge(*names: str) -> List[TriageFinding]:
    """The structured rules alone over the parsers' events of these files, ranked."""
    evs: List[LogEvent] = []
    for i, name in enumerate(names):
        evs += parsers.parse_file(str(DATA / name), file_index=i)
    out: List[TriageFinding] = []
    for rule in structured.RULES:
        out += rule.fn(evs)
    return correlate(out)


def pipeline(*names: str) -> List[TriageFinding]:
    """What ``triage --log`` answers: the line scanner's and the parsers' events, every rule."""
    return run_rules(logs.scan_many([str(DATA / n) for n in names])[0])


STRUCTURED = tuple(r.id.split(".")[0] + "." for r in structured.RULES)


def test_every_capture_has_a_source_and_every_rule_a_doc() -> None:
    listed = (DATA / "SOURCES.md").read_text()
    files = sorted(str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file() and p.name != "SOURCES.md")
    assert files and [f for f in files if f"`{f}`" not in listed] == []
    ids = [r.id for r in structured.RULES]
    assert len(ids) == len(set(ids)) and all(r.doc for r in structured.RULES)
    assert all(set(r.categories) <= set(CATEGORIES) for r in structured.RULES)


# --- nvidia-smi -q -------------------------------------------------------------------------------------------

def test_smi_q_old_heading_reads_the_figures_and_finds_nothing_on_a_healthy_gpu() -> None:
    [gpu] = kinds("nvidia_smi_q/m4-a100-throttle-reasons-old-heading.txt", "smi_q_gpu")
    f = gpu.fields
    assert gpu.gpu == "0000:07:00.0" and f["uuid"] == "GPU-eb0003d2-77b4-70fd-4ab9-3ef1c9853c49"
    assert (f["reasons_listed"], f["reasons_active"]) == (9, [])  # "Clocks Throttle Reasons", all Not Active
    assert (f["temp_c"], f["slowdown_c"], f["shutdown_c"], f["max_operating_c"]) == (28, 89, 92, 85)
    assert (f["power_w"], f["power_limit_w"], f["sm_mhz"], f["sm_max_mhz"]) == (67.97, 400, 1155, 1410)
    assert (f["remap_pending"], f["remap_failure"], f["ecc_volatile_uncorrectable"]) == (False, False, 0)
    assert gpu.time == 1677905777.0  # "Timestamp : Sat Mar  4 04:56:17 2023"
    assert judge("nvidia_smi_q/m4-a100-throttle-reasons-old-heading.txt") == []


def test_smi_q_power_brake_on_all_eight_h100s_is_one_thermal_power_root() -> None:
    gpus = kinds("nvidia_smi_q/gpud-h100x8-power-brake.535.161.08.txt", "smi_q_gpu")
    assert len(gpus) == 8 and all(set(g.fields["reasons_active"]) == {"hw_slowdown", "hw_power_brake_slowdown"}
                                  for g in gpus)
    [root] = judge("nvidia_smi_q/gpud-h100x8-power-brake.535.161.08.txt")
    assert (root.id, root.category, root.tier, root.confidence) == \
        ("smi.power.hw_power_brake_slowdown", "thermal_power", 0, 0.85)
    assert len(root.evidence["gpus"]) == 8 and root.evidence["sm_clock"]["0000:19:00.0"] == "86 / 1980 MHz"
    assert "HW Power Brake Slowdown       : Active" in root.evidence["lines"][0]


def test_smi_q_thermal_evidence_sets_temperature_against_its_own_limits() -> None:
    [f] = judge("nvidia_smi_q/thermald-300-temperature-at-max-operating.txt")
    assert (f.id, f.category) == ("smi.thermal.at_max_operating", "thermal_power")
    assert "56 °C" in f.summary and "max operating 57 °C" in f.summary and f.confidence < 0.8


def test_smi_q_thermal_slowdown_cites_temperature_and_its_limits() -> None:
    """Fact-level fixture: the real m4 capture with its "SW Thermal Slowdown" line set Active (no public
    paste of an active thermal reason with the full block was found)."""
    lines = (DATA / "nvidia_smi_q/m4-a100-throttle-reasons-old-heading.txt").read_text().splitlines()
    hot = [ln.replace("Not Active", "Active") if "SW Thermal Slowdown" in ln else ln for ln in lines]
    [f] = structured.smi_clock_events(parsers.parse_lines(hot, "smi.txt"))
    assert (f.id, f.category, f.gpu) == ("smi.thermal.sw_thermal_slowdown", "thermal_power", "0000:07:00.0")
    assert "28 °C (limits: slowdown 89 °C, max operating 85 °C, shutdown 92 °C)" in f.summary
    assert any("SW Thermal Slowdown" in line for line in f.evidence["lines"])


def test_smi_q_memory_faults_are_gpu_hardware() -> None:
    [pending] = judge("nvidia_smi_q/gpud-a10-remap-pending.535.129.03.txt")
    assert (pending.category, pending.verdict.value, pending.gpu) == ("gpu_hardware", "WARN", "0000:07:00.0")
    assert any("Pending                           : Yes" in line for line in pending.evidence["lines"])
    [sram] = judge("nvidia_smi_q/stas00-sram-uncorrectable.txt")  # an ECC block pasted without its GPU header
    assert (sram.verdict.value, sram.tier, sram.evidence["ecc_volatile_uncorrectable"]) == ("FAIL", 0, 1)
    assert sram.evidence["ecc_aggregate_uncorrectable"] == 5
    [retired] = judge("nvidia_smi_q/stas00-retired-pages-pending.txt")
    assert "page retirement is pending" in retired.summary
    [remap] = judge("nvidia_smi_q/stas00-a100-xid63-remap-pending.txt")
    assert remap.gpu == "0000:10:1c.0" and "row remap is pending" in remap.summary


def test_smi_q_unknown_error_in_a_field_the_driver_lacks_is_not_a_lost_gpu() -> None:
    gpus = kinds("nvidia_smi_q/gpud-rtx4090x8-addressing-unknown-error.535.154.05.txt", "smi_q_gpu")
    assert len(gpus) == 8 and gpus[0].fields["unknown_error_fields"] == ["addressing mode"]
    assert judge("nvidia_smi_q/gpud-rtx4090x8-addressing-unknown-error.535.154.05.txt") == []


def test_smi_q_newer_heading_idle_gpu() -> None:
    [gpu] = kinds("nvidia_smi_q/gpud-titanv-idle.560.35.03.txt", "smi_q_gpu")
    assert gpu.fields["reasons_active"] == ["idle"] and gpu.fields["slowdown_c"] == 97
    assert judge("nvidia_smi_q/gpud-titanv-idle.560.35.03.txt") == []


# --- nvidia-smi table and its one-line errors -----------------------------------------------------------------

def test_smi_table_rows() -> None:
    rows = kinds("nvidia_smi/gpud-550.90.07.txt", "smi_row")
    assert [r.fields["index"] for r in rows] == list(range(8))
    assert (rows[0].gpu, rows[0].fields["temp_c"], rows[0].fields["power_w"], rows[0].fields["power_cap_w"]) == \
        ("0000:19:00.0", 27, 72, 700)
    assert judge("nvidia_smi/gpud-550.90.07.txt") == []


def test_smi_table_err_cells_are_a_weak_note() -> None:
    [row] = kinds("nvidia_smi/azhpc-77-power-err.txt", "smi_row")
    assert row.fields["err_cells"] == ["power"] and row.fields["temp_c"] == 29
    [f] = judge("nvidia_smi/gpud-rtx-fan-err.525.125.06.txt")
    assert f.id == "smi.table_err" and f.consequence and f.confidence <= 0.3 and "fan" in f.summary


def test_a_gpu_reading_zero_degrees_or_unknown_error_is_an_unreadable_cell_not_a_cool_gpu(tmp_path: Path) -> None:
    """NVML answers 0 °C and "[Unknown Error]" for a GPU in a broken state (gpu-fryer#10, a dev case: four
    GPUs at 0.00 °C doing 0 GFLOPS): real captures with one cell set so are GPU notes, never thermal."""
    table = (DATA / "nvidia_smi/azhpc-77-power-err.txt").read_text().replace("  29C  ", "   0C  ")
    csv = (DATA / "nvidia_smi/ksysguard-27-query-gpu-csv.txt").read_text().splitlines()
    csv[1] = csv[1].replace("0, 56, ", "0, 0, ").replace("83.92 W", "[Unknown Error]")
    (tmp_path / "table.txt").write_text(table)
    (tmp_path / "csv.txt").write_text("\n".join(csv) + "\n")
    for name, cells in (("table.txt", ["power", "temp"]), ("csv.txt", ["power.draw", "temperature.gpu"])):
        evs = parsers.parse_file(str(tmp_path / name))
        [row] = [e for e in evs if e.kind == "smi_row"]
        assert row.fields["err_cells"] == cells, name
        [f] = correlate([f for r in structured.RULES for f in r.fn(evs)])
        assert (f.id, f.category) == ("smi.table_err", "gpu_hardware"), name
    [row] = kinds("nvidia_smi/ksysguard-27-query-gpu-csv.txt", "smi_row")
    assert row.fields.get("err_cells") is None  # the untouched capture reads fine


def test_dcgmi_dmon_xid_column_is_an_xid_even_when_dcgmi_health_says_healthy() -> None:
    """dcgm#263 (a dev case): dmon -e 230 shows Xid 120 on GPU 1 while ``dcgmi health -c`` reports Healthy."""
    evs = parsers.parse_file(str(CORPUS / "dcgm-263-gpu-recovery-reset-xid120-health-says-healthy" / "log.txt"))
    assert [(e.gpu, e.fields["xid"]) for e in evs if e.kind == "xid"] == [("1", 120)]  # zeros are no Xid
    root = triage_logs([str(CORPUS / "dcgm-263-gpu-recovery-reset-xid120-health-says-healthy" / "log.txt")]).findings[0]
    assert (root.category, root.gpu, root.verdict.value) == ("gpu_hardware", "1", "FAIL")


def test_idle_gpus_in_p0_without_persistence_are_a_config_note() -> None:
    evs = parsers.parse_file(str(CORPUS / "shinecluster-54-hot-gpu" / "log.txt"))
    rows = [e for e in evs if e.kind == "smi_row"]
    assert rows and all(r.fields["persistence"] is False and r.fields["perf"] == "P0" for r in rows)
    [f] = [f for f in structured.smi_unreachable(evs) if f.id == "smi.persistence_off"]
    assert f.category == "config" and f.consequence and f.confidence <= 0.3
    assert judge("nvidia_smi/gpud-550.90.07.txt") == []  # persistence on: nothing to say


def test_smi_unknown_error_handle_is_a_lost_gpu() -> None:
    [f] = judge("nvidia_smi/nvidia-docker-1553-handle-unknown-error.txt")
    assert (f.category, f.gpu, f.tier, f.verdict.value) == ("gpu_hardware", "0000:09:00.0", 0, "FAIL")


def test_query_gpu_csv_samples_are_one_row_per_gpu_and_a_cool_gpu_is_nothing() -> None:
    [row] = kinds("nvidia_smi/ksysguard-27-query-gpu-csv.txt", "smi_row")
    assert (row.fields["index"], row.fields["samples"], row.fields["temp_c"], row.fields["power_w"]) == (0, 13, 56, 83.92)
    assert row.fields["perf"] == "P3" and "power_cap_w" not in row.fields
    assert kinds("nvidia_smi/ksysguard-27-query-gpu-csv.txt", "smi_q_gpu") == []  # no clock-event reason queried
    assert judge("nvidia_smi/ksysguard-27-query-gpu-csv.txt") == []


def test_query_gpu_csv_without_its_header_or_with_a_foreign_header_is_left_alone(tmp_path: Path) -> None:
    lines = (DATA / "nvidia_smi/ksysguard-27-query-gpu-csv.txt").read_text().splitlines()
    bare, foreign = tmp_path / "bare.txt", tmp_path / "foreign.txt"
    bare.write_text("\n".join(lines[1:]) + "\n")
    foreign.write_text("index, name, pstate\n0, job-a, P3\n")
    assert [e for p in (bare, foreign) for e in parsers.parse_file(str(p)) if e.kind.startswith("smi_")] == []


@pytest.mark.parametrize("name,cell,expected", [
    ("clocks_event_reasons.active", "0x0000000000000048", ["hw_slowdown", "hw_thermal_slowdown"]),
    ("clocks_throttle_reasons.active", "0x0000000000000000", []),
    ("clocks_throttle_reasons.gpu_idle", "Active", ["idle"]),
    ("clocks_event_reasons.hw_power_brake_slowdown", "Not Active", []),
    ("clocks_event_reasons.supported", "0x00000000000001FF", None),
    ("clocks_event_reasons.sw_power_cap", "[N/A]", None)])
def test_query_gpu_clock_event_cells_are_read_as_nvml_names_them(name: str, cell: str, expected: object) -> None:
    """``.active`` is NVML's nvmlClocksEventReasons bitmask (0x8 HW Slowdown, 0x40 HW Thermal Slowdown);
    the per-reason columns say Active / Not Active; names follow nvidia-smi -q (gpu_idle is "Idle")."""
    assert nvidia_smi._reasons(name, cell) == expected


def test_query_gpu_csv_reason_held_over_the_samples_is_judged_a_blip_is_not(tmp_path: Path) -> None:
    """The real capture's rows with a clock-event column added: HW Slowdown in every sample is a thermal_power
    finding; in one sample of thirteen (NVML: also reported during a P-state change) it is not held."""
    header, *rows = (DATA / "nvidia_smi/ksysguard-27-query-gpu-csv.txt").read_text().splitlines()
    header += ", clocks_throttle_reasons.hw_slowdown"
    held, blip = tmp_path / "held.txt", tmp_path / "blip.txt"
    held.write_text("\n".join([header] + [r + ", Active" for r in rows]) + "\n")
    blip.write_text("\n".join([header] + [r + (", Active" if i == 3 else ", Not Active") for i, r in enumerate(rows)]) + "\n")
    [q] = [e for e in parsers.parse_file(str(held)) if e.kind == "smi_q_gpu"]
    assert q.fields["reasons_active"] == ["hw_slowdown"] and q.fields["samples"] == 13
    [f] = [f for f in structured.smi_clock_events(parsers.parse_file(str(held)))]
    assert f.category == "thermal_power" and f.id == "smi.power.hw_slowdown"
    [q2] = [e for e in parsers.parse_file(str(blip)) if e.kind == "smi_q_gpu"]
    assert q2.fields["reasons_active"] == [] and q2.fields["reason_samples"] == {"hw_slowdown": 1}
    assert structured.smi_clock_events(parsers.parse_file(str(blip))) == []


# --- dcgmi ------------------------------------------------------------------------------------------------------

def test_dcgmi_fixed_width_message_pieces_are_joined_as_cut() -> None:
    [msg] = kinds("dcgmi/stas00-diag-r2-thermal-fail.txt", "dcgm_diag_message")
    assert msg.fields["message"].startswith("GPU 0 Thermal violations totaling 13.3 seconds started at 9.7 seconds "
                                            "into the test for GPU 0 Verify that the cooling")
    assert msg.fields["message"].endswith("any other components.")
    [f] = judge("dcgmi/stas00-diag-r2-thermal-fail.txt")
    assert (f.id, f.category, f.evidence["gpus"]) == ("dcgm.diag.gpu_memory", "thermal_power", [0])


def test_dcgmi_row_remap_error_and_passing_runs() -> None:
    [f] = judge("dcgmi/stas00-diag-xid64-row-remap.txt")
    assert f.category == "gpu_hardware" and "GPU 3 has uncorrectable memory errors and row remappings are pending" \
        in f.summary
    results = kinds("dcgmi/dcgm-55-diag-r3-pass.txt", "dcgm_diag_result")
    assert len(results) == 9 and {r.fields["result"] for r in results} == {"pass"}
    assert judge("dcgmi/dcgm-55-diag-r3-pass.txt") == []


def test_dcgm_health() -> None:
    [ok] = kinds("dcgmi/dcgm-263-health-json-healthy.txt", "dcgm_health")
    assert ok.fields["health"] == "healthy" and judge("dcgmi/dcgm-263-health-json-healthy.txt") == []
    [f] = judge("dcgmi/dcgm-270-hostengine-thermal.txt")
    assert (f.category, f.evidence["gpu_index"]) == ("thermal_power", 2)


# --- Slurm ------------------------------------------------------------------------------------------------------

def test_sinfo_r_rows_with_and_without_header() -> None:
    rows = kinds("slurm/ace-hpc-sinfo-R-grep.txt", "slurm_node_reason")
    assert [(r.fields["reason"], r.node) for r in rows] == [("Kill task failed", "kla-ac-cpu-[04,16]"),
                                                            ("Kill task failed", "kla-ac-cpu-17")]
    [f] = judge("slurm/awsome-185-sinfo-R-kill-task-failed.txt")
    assert (f.category, f.node) == ("scheduler", "ip-10-0-1-23") and f.first_time == 1706195543.0
    [ours] = judge("slurm/lab-sinfo-R-triage-drain.txt")
    assert ours.category == "gpu_hardware" and ours.node == "node2"


def test_scontrol_show_node_without_reason_and_sacct_forms() -> None:
    assert events("slurm/lab-scontrol-show-node-idle.txt") == []
    table = {e.fields["jobid"]: e.fields["state"] for e in kinds("slurm/lab-sacct-table.txt", "sacct_job")}
    parsable = {e.fields["jobid"]: e.fields for e in kinds("slurm/lab-sacct-parsable.txt", "sacct_job")}
    assert table["3"] == "CANCELLED" and table["27"] == "FAILED"  # "CANCELLED+" expanded
    assert parsable["18"]["cancelled_by"] == "4242" and parsable["30"]["exit_code"] == "0:11"


@pytest.mark.parametrize("cell,expected", [
    ("OUT_OF_ME+", ("OUT_OF_MEMORY", None)), ("CANCELLED+", ("CANCELLED", None)),
    ("CANCELLED by 4242", ("CANCELLED", "4242")), ("NODE_FAIL", ("NODE_FAIL", None)),
    ("PREEMPTED", ("PREEMPTED", None)),
])
def test_sacct_cut_states_expand_by_prefix(cell: str, expected: tuple) -> None:
    """sacct cuts a state to its column width and marks it "+" (sacct(1)); the prefix names one state."""
    from slurm_triage.triage.parsers.slurm import _state

    assert _state(cell) == expected


def test_slurm_shapes_from_dev_cases() -> None:
    """sinfo -R pasted as JSON strings, a DOWN+NOT_RESPONDING node record cut before its Reason, and
    header-less ``sacct -P -n`` whose columns only the command line names."""
    def found(case: str) -> List[TriageFinding]:
        evs = parsers.parse_file(str(CORPUS / case / "log.txt"))
        return correlate([f for r in structured.RULES for f in r.fn(evs)])
    [f] = found("az-hop-1210-cyclecloud-node-fail")
    assert f.evidence["nodes"] == ["viz3d-1", "viz3d-2", "viz3d-3", "viz3d-4"] and f.category == "scheduler"
    [f] = found("slurm-exporter-198-gpu-node-not-responding")
    assert (f.node, f.evidence["reason"], f.confidence) == ("gpu02", "DOWN+NOT_RESPONDING", 0.6)
    [f] = found("slurm-mail-63-cancelled-before-start")
    assert f.id == "sacct.cancelled.31178" and "uid 1060117793" in f.summary and f.node is None


def test_sacct_timeout_from_the_lab_is_a_scheduler_symptom() -> None:
    found = [f for f in judge("slurm/lab-timeout-job.txt") if f.id.startswith("sacct.")]
    assert [(f.id, f.category, f.consequence) for f in found] == [("sacct.timeout.58", "scheduler", True)]


# --- kernel log -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line,expected", [
    ("[ 7063.247407] Memory cgroup out of memory", (None, 7063.247407, None)),
    ("[Sun Feb 23 16:24:18 2025] NVRM: GPU at PCI:0000:9b:00", (1740327858.0, None, None)),
    ("2024-04-29T14:55:41,679700+02:00 Out of memory", (1714395341.6797, None, None)),
    ("May 15 23:09:30 ubuntu-s-1vcpu-2gb-ams3-01 kernel: [  518.050606] Out of", (None, 518.050606,
                                                                              "ubuntu-s-1vcpu-2gb-ams3-01")),
    ("<6>[    2.962781] mlx5_core 0000:41:00.1: Port", (None, 2.962781, None)),
    ("> [6781753.400584] nvidia-nvswitch1: SXid", (None, 6781753.400584, None)),
])
def test_kernel_time_forms(line: str, expected: tuple) -> None:
    when, up, host, _ = kernel.split_prefix(line, None)
    assert (None if when is None else round(when, 4), up, host) == expected


def test_syslog_time_needs_a_year_from_the_same_file() -> None:
    assert kernel.split_prefix("May 15 23:09:30 h kernel: x", 2023)[0] == 1684192170.0


def test_oom_kills_in_all_forms_are_memory_and_not_judged_twice() -> None:
    [cg] = judge("kernel/reportportal-203-memcg-oom.dmesg.txt")
    assert (cg.id, cg.category) == ("kmsg.oom.cgroup", "memory") and "uwsgi:63214" in cg.summary
    [iso] = kinds("kernel/equinor-ert-7797-oom.dmesg-iso.txt", "kmsg_oom_kill")
    assert iso.fields["constraint"] == "CONSTRAINT_NONE" and iso.fields["anon_rss_kb"] == 60356340
    comms = {e.fields["comm"] for e in kinds("kernel/docker-1001-oom.syslog.txt", "kmsg_oom_kill")}
    assert comms == {"python3", "(resolved)"}
    # "Out of memory: Killed process" is also a catalog signature: triage judges those lines once.
    found = pipeline("kernel/docker-1001-oom.syslog.txt")
    assert found[0].category == "memory" and not [f for f in found if f.id.startswith("kmsg.oom")]
    assert len(kinds("kernel/ltp-1080-memcg-kill-old.syslog.txt", "kmsg_oom_kill")) == 2


def test_aer_on_a_gpu_is_hardware_and_corrected_ones_only_a_note() -> None:
    found = judge("../kernel/aer_fatal_xid79.dmesg.log")
    aer = [f for f in found if f.id.startswith("kmsg.aer")]
    assert {f.id: (f.category, f.confidence) for f in aer} == {"kmsg.aer.fatal": ("gpu_hardware", 0.7),
                                                               "kmsg.aer.corrected": ("gpu_hardware", 0.15)}
    assert next(f for f in aer if f.id == "kmsg.aer.corrected").consequence
    assert [f for f in judge("../kernel/aer_corrected_nvme.log") if f.id.startswith("kmsg.")] == []  # an NVMe


def test_fallen_off_bus_text_once_nvswitch_and_nic() -> None:
    lost = kinds("../kernel/fallen_off_no_xid.dmesg.log", "kmsg_gpu_lost")
    assert [e.gpu for e in lost] == ["0000:b3:00.0"]
    assert [f.id for f in judge("../kernel/fallen_off_no_xid.dmesg.log")] == ["kmsg.gpu_lost.0000:b3:00.0"]
    found = pipeline("../kernel/fallen_off_no_xid.dmesg.log")  # the line scanner reports it: not twice
    assert found[0].category == "gpu_hardware" and not [f for f in found if f.id.startswith("kmsg.")]
    ids = {f.id for f in judge("kernel/gpud-sxid-xid79-quoted.md.txt")}
    assert {"kmsg.sxid.fatal", "kmsg.gpu_lost.0000:91:00.0"} <= ids
    [nic] = [f for f in judge("kernel/gpud-pstore-mlx5.dmesg-r.txt") if f.category == "network"]
    assert nic.consequence and nic.confidence <= 0.2  # an unplugged unused port at boot


def test_hung_task_in_a_real_dmesg_t_gzip() -> None:
    hung = kinds("kernel/m4-jean-zay-hung-task.dmesg-T.txt.gz", "kmsg_hung_task")
    assert {(e.fields["comm"], e.fields["pid"]) for e in hung} == {("epilog.sh", 76609), ("python", 280058)}
    assert hung[1].line == 6778 and hung[1].time == 1677903052.0  # [Sat Mar  4 04:10:52 2023]


# --- py-spy and Flight Recorder ---------------------------------------------------------------------------------

def test_pyspy_the_rank_in_the_data_loader_is_the_outlier() -> None:
    threads = kinds("pyspy/bigscience-tr11-eval-deadlock.txt", "pyspy_thread")
    assert len(threads) == 8 and threads[1].fields["frames"][0].startswith("broadcast (torch/distributed")
    [f] = judge("pyspy/bigscience-tr11-eval-deadlock.txt")
    assert (f.id, f.category) == ("pyspy.outlier", "collective_hang")
    assert list(f.evidence["outliers"]) == ["pid 688514"] and "DataLoader" in f.summary
    assert f.evidence["in_collective"] == {"broadcast": 7}


def test_pyspy_single_process_and_unreadable_process() -> None:
    threads = kinds("pyspy/deepspeed-6524-zero3-backward.txt", "pyspy_thread")
    assert [t.fields["tid"] for t in threads][-1] == "8287" and threads[2].fields["frames"] == []
    assert judge("pyspy/deepspeed-6524-zero3-backward.txt") == []
    [err] = kinds("pyspy/m4-tr141-suspend-failed.txt", "pyspy_error")
    assert (err.fields["pid"], err.fields["error"]) == (280058, "Failed to suspend process")
    [f] = judge("pyspy/m4-tr141-barrier.txt", "pyspy/m4-tr141-suspend-failed.txt")
    assert "pid 280058" in f.evidence["outliers"] and f.evidence["in_collective"] == {"barrier": 1}


def test_pyspy_one_process_waiting_in_a_collective_is_a_weak_hang_note() -> None:
    evs = parsers.parse_file(str(CORPUS / "accelerate-3104-zero3-pyspy-one-rank-forward" / "log.txt"))
    [f] = structured.pyspy_outliers(evs)
    assert (f.id, f.category, f.consequence) == ("pyspy.waits_in_collective", "collective_hang", True)
    assert f.evidence["in_collective"] == {"all_gather_into_tensor": 1} and "4068" in f.summary


def test_pyspy_one_process_whose_main_thread_waits_for_data_is_a_weak_straggler_note() -> None:
    """fairseq rank 0 blocked in its data iterator's queue while the other ranks sat in allreduce
    (pytorch#87995); a single dump in backward (deepspeed#6524, above) still says nothing."""
    evs = parsers.parse_file(str(CORPUS / "pytorch-87995-rank0-dataloader-pyspy-others-allreduce-unresolved" / "log.txt"))
    [f] = structured.pyspy_outliers(evs)
    assert (f.id, f.category, f.consequence) == ("pyspy.main_thread_waits_for_data", "collective_hang", True)
    assert f.confidence < 0.5 and f.evidence["main_thread_at"] == "__next__ (fairseq/data/iterators.py:648)"


def test_flight_recorder_report_and_dump() -> None:
    [f] = judge("flight_recorder/pytorch-tutorial-torchfrtrace.txt")
    assert (f.category, f.rank, f.evidence["seq"], f.evidence["op"]) == ("collective_hang", 1, 5, "nccl:all_reduce")
    [last] = kinds("flight_recorder/pytorch-tutorial-unpickled-dump.txt", "fr_last_collective")
    assert (last.fields["group"], last.fields["seq"], last.fields["state"]) == ("0:default_pg", 1, "completed")


def test_flight_recorder_rank_whose_last_collective_differs() -> None:
    """The tutorial's dump as two ranks' pastes would read, rank 1 one collective behind (fact-level fixture)."""
    lines = (DATA / "flight_recorder/pytorch-tutorial-unpickled-dump.txt").read_text().splitlines()
    second = [ln.replace('"collective_seq_id": 1', '"collective_seq_id": 0') for ln in lines]
    evs = parsers.parse_lines(["nccl_trace_rank_0"] + lines + ["nccl_trace_rank_1"] + second, "fr.txt")
    assert sorted((e.rank, e.fields["seq"]) for e in evs if e.kind == "fr_last_collective") == [(0, 1), (1, 0)]
    [f] = structured.fr_outliers(evs)
    assert f.evidence["last_seq_by_rank"] == {"0": 1, "1": 0} and f.rank == 1


# --- hostile input ----------------------------------------------------------------------------------------------

def test_garbage_gzip_truncated_and_huge_lines_never_raise(tmp_path: Path) -> None:
    junk = tmp_path / "junk.bin"
    junk.write_bytes(os.urandom(1 << 16) + b"\x00" * 1000 + b"\n| Diagnostic | Result |\n\xff\xfe")
    assert isinstance(parsers.parse_file(str(junk)), list)
    real = (DATA / "nvidia_smi/nvidia-docker-1553-handle-unknown-error.txt").read_bytes()
    gz = tmp_path / "smi.log.gz"
    gz.write_bytes(gzip.compress(real * 50))
    assert len([e for e in parsers.parse_file(str(gz)) if e.kind == "smi_handle_error"]) == 50
    cut = tmp_path / "cut.gz"
    cut.write_bytes(gzip.compress(real * 5000)[:-40])  # truncated: keep what decompressed
    assert len(parsers.parse_file(str(cut))) > 0
    huge = tmp_path / "huge.log"
    huge.write_bytes(b"Thread 1 (idle): " + b"x" * (5 << 20) + b"\n" + real)
    assert parsers.parse_file(str(huge)) == []  # past MAX_BYTES nothing is read; the long line is cut
    short = tmp_path / "short.log"
    short.write_bytes(b"A" * 10000 + b"\n" + real)
    assert [e.line for e in parsers.parse_file(str(short))] == [4]
    (tmp_path / "empty").write_bytes(b"")
    assert parsers.parse_file(str(tmp_path / "empty")) == []
    with pytest.raises(OSError):
        parsers.parse_file(str(tmp_path / "missing"))


def test_triage_judges_each_line_once_and_names_the_cause_first() -> None:
    """Through the whole pipeline (line scanner + parsers, every rule), no structured finding starts at a
    line another finding already starts at, and the capture's cause comes first."""
    expect = {"nvidia_smi_q/gpud-h100x8-power-brake.535.161.08.txt": "thermal_power",
              "nvidia_smi_q/stas00-sram-uncorrectable.txt": "gpu_hardware",
              "dcgmi/stas00-diag-xid64-row-remap.txt": "gpu_hardware",
              "nvidia_smi/nvidia-docker-1553-handle-unknown-error.txt": "gpu_hardware",
              "slurm/ace-hpc-sinfo-R-grep.txt": "scheduler",
              "pyspy/bigscience-tr11-eval-deadlock.txt": "collective_hang",
              "flight_recorder/pytorch-tutorial-torchfrtrace.txt": "collective_hang",
              "kernel/reportportal-203-memcg-oom.dmesg.txt": "memory"}
    for path in sorted(p for p in DATA.rglob("*") if p.is_file() and p.name != "SOURCES.md"):
        name = str(path.relative_to(DATA))
        found = pipeline(name)
        ours = [f for f in found if f.id.startswith(STRUCTURED)]
        theirs = {f.first_order for f in found if not f.id.startswith(STRUCTURED)}
        assert not [f.id for f in ours if f.first_order in theirs], name
        if name in expect:
            assert found and found[0].category == expect[name], (name, [(f.id, f.category) for f in found[:3]])


def test_captures_of_one_format_yield_no_events_of_another() -> None:
    """A paste of one tool's output does not look like another's to the parsers."""
    prefix = {"nvidia_smi_q": ("smi_q_",), "nvidia_smi": ("smi_row", "smi_processes", "smi_handle", "smi_no"),
              "infiniband": ("ib_",), "dcgmi": ("dcgm_",), "slurm": ("slurm_", "sacct_"), "pyspy": ("pyspy_",),
              "flight_recorder": ("fr_",)}
    for fmt, allowed in prefix.items():
        for path in (DATA / fmt).iterdir():
            other = {e.kind for e in parsers.parse_file(str(path))
                     if not e.kind.startswith(allowed)}
            assert other == set(), (path.name, other)


# --- InfiniBand ports, GPU tables without limits, free-text drain reasons ------------------------------------

def test_ibstat_ports_and_a_spare_port_down_is_only_a_weak_note() -> None:
    ports = kinds("infiniband/archwiki-ibstat-port2-polling.txt", "ib_port")
    assert [(e.fields["ca"], e.fields["port"], e.fields["state"], e.fields["phys_state"], e.fields["rate_gbps"])
            for e in ports] == [("mlx4_0", 1, "Active", "LinkUp", 20.0), ("mlx4_0", 2, "Down", "Polling", 10.0)]
    [f] = [f for f in judge("infiniband/archwiki-ibstat-port2-polling.txt") if f.id.startswith("ib.")]
    assert (f.id, f.category, f.consequence, f.confidence) == ("ib.port.polling", "network", True, 0.3)
    assert "mlx4_0 port 2" in f.summary and "no physical link" in f.summary
    assert f.evidence["active_ports"] == ["mlx4_0 port 1"]


def test_the_fallback_pass_words_on_a_parsed_line_leave_its_reading_standing() -> None:
    """The second pass's events (error lines, lexicon words, prior words, success markers) judge nothing: a
    lexicon hit on the Down port's line must not count as the line scanner's finding of it."""
    [down] = [e for e in kinds("infiniband/archwiki-ibstat-port2-polling.txt", "ib_port") if e.fields["state"] == "Down"]
    ports = kinds("infiniband/archwiki-ibstat-port2-polling.txt", "ib_port")
    for kind in ("first_error", lexicon.KIND, lexicon.WHOLE_KIND, prior.KIND, healthy.KIND):
        hit = LogEvent(kind, down.source, down.line, down.text, fields={"words": ["state: down"]})
        assert [f.id for f in structured.ib_ports(ports + [hit])] == ["ib.port.polling"], kind
    scanned = LogEvent("catalog", down.source, down.line, down.text)  # a catalog signature's event: it judged the line
    assert structured.ib_ports(ports + [scanned]) == []


def test_ib_port_down_with_no_active_port_is_the_finding() -> None:
    """The same capture cut to its CA line and the Down/Polling port (a contiguous excerpt, as a paste of
    ``ibstat mlx4_0 2`` would look): with no Active port beside it, the port is the evidence."""
    from slurm_triage.triage.parsers.base import Doc

    lines = (DATA / "infiniband/archwiki-ibstat-port2-polling.txt").read_text().splitlines()
    excerpt = lines[:1] + lines[lines.index("        Port 2:"):]
    [e] = parsers.infiniband.parse(Doc("x", excerpt))
    [f] = structured.ib_ports([e])
    assert (f.category, f.consequence, f.confidence, f.verdict.value) == ("network", False, 0.55, "FAIL")


def test_rocm_smi_table_gpu_at_94_c_is_thermal() -> None:
    """rocm-smi (ROCm 1.6) table of a dev case: a Vega FE at 94 °C with its fan at 40 %."""
    evs = parsers.parse_file(str(CORPUS / "rocm-196-vega-94c-training" / "log.txt"))
    [row] = [e for e in evs if e.kind == "rocm_row"]
    assert (row.fields["index"], row.fields["temp_c"], row.fields["power_w"], row.fields["fan_pct"]) == (0, 94.0, 195.0, 40.0)
    [f] = correlate([f for r in structured.RULES for f in r.fn(evs)])
    assert (f.id, f.category, f.confidence) == ("table.hot", "thermal_power", 0.45) and "94 °C" in f.summary


def test_healthy_tables_are_neither_hot_nor_capped() -> None:
    for name in ("nvidia_smi/gpud-550.90.07.txt", "nvidia_smi/gpud-rtx-fan-err.525.125.06.txt"):
        assert structured.table_heat(events(name)) == []


def test_drain_reasons_slurm_sets_keep_their_meaning_and_gpu_ids_stay_hardware() -> None:
    assert structured._reason_meaning("Kill task failed")[:2] == ("scheduler", 0.7)
    assert structured._reason_meaning("cyclecloud_node_fail")[:2] == ("scheduler", 0.3)
    [f] = [f for f in judge("slurm/lab-sinfo-R-triage-drain.txt") if f.id.startswith("slurm.reason")]
    assert f.category == "gpu_hardware"


def test_sacct_rows_without_their_header_are_read_by_the_catalog_and_give_way_to_the_parser(tmp_path: Path) -> None:
    """Rows pasted without sacct's header (no parser context) still name the end state; with the header the
    sacct rule judges them alone (the catalog entries defer to its ``sacct_job`` events, no double finding)."""
    capture = DATA / "slurm" / "lab-timeout-job.txt"
    with_header = {f.id for f in triage_logs([str(capture)]).findings}
    assert "sacct.timeout.58" in with_header
    assert not {i for i in with_header if i.startswith("log.sacct_row")}, with_header
    rows = [ln for ln in capture.read_text().splitlines() if ln.startswith("58 ") or ln.startswith("58.batch ")]
    assert len(rows) == 2
    bare = tmp_path / "rows.txt"
    bare.write_text("\n".join(rows) + "\n")
    found = {f.id: f for f in triage_logs([str(bare)]).findings}
    assert {"log.sacct_row_timeout", "log.sacct_row_cancelled"} <= set(found), sorted(found)
    assert all(found[i].category == "scheduler" and found[i].consequence
               for i in ("log.sacct_row_timeout", "log.sacct_row_cancelled"))
