"""Kernel log collector and the kernel.* checks, from recorded real log lines (tests/data/kernel)."""
from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from slurm_triage import xid_codes
from slurm_triage.checks import xid as xid_checks
from slurm_triage.collect import kernel
from slurm_triage.config import Config, defaults
from slurm_triage.model import Verdict

DATA = Path(__file__).resolve().parent / "data" / "kernel"


def cfg(**kernel_keys: Any) -> Config:
    values = defaults()
    values["kernel"].update(kernel_keys)
    return Config(values)


def from_file(name: str, since_seq: Optional[int] = None) -> Dict[str, Any]:
    return kernel.collect(cfg(source="file", path=str(DATA / name)), since_seq=since_seq)


def facts(kern: Dict[str, Any], gpu: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    return {"node": "n1", "kernel": kern, "gpu": gpu}


def by_kind(kern: Dict[str, Any], kind: str) -> List[Dict[str, Any]]:
    return [e for e in kern["events"] if e["kind"] == kind]


# --- collector: parsing recorded logs --------------------------------------------------------

def test_xid79_with_aer_and_uuid_line():
    k = from_file("aer_fatal_xid79.dmesg.log")
    assert k["source"] == "file" and k["last_seq"] == 13
    (x,) = by_kind(k, "xid")
    assert (x["xid"], x["pci_bus_id"], x["seq"]) == (79, "0000:02:00.0", 13)
    assert x["time"] == pytest.approx(74889.644138)
    assert x["uuid"] == "GPU-660d987e-5b28-3bf6-2a2d-1d5ecae7f6df"  # from "NVRM: GPU at PCI:0000:02:00:"
    aer = by_kind(k, "aer")
    # "id=0010" is the requester id bus 0, dev 2, fn 0: the root port itself
    assert [(e["pci_bus_id"], e["severity"]) for e in aer] == [("0000:00:02.0", "corrected"), ("0000:00:02.0", "fatal")]


def test_fallen_off_bus_multiline_without_xid():
    k = from_file("fallen_off_no_xid.dmesg.log")
    assert by_kind(k, "xid") == []
    (f,) = by_kind(k, "fallen_off_bus")
    assert f["pci_bus_id"] == "0000:b3:00.0" and f["seq"] == 1 and f["time"] == pytest.approx(1843.308145)
    assert "not responding to commands" in f["text"]


def test_syslog_format_and_unknown_pid_and_nvlink_domains():
    k = from_file("xid13_app.syslog.log")
    assert [e["xid"] for e in k["events"]] == [13] * 5
    assert {e["pci_bus_id"] for e in k["events"]} == {"0000:41:00.0"}
    assert k["events"][0]["time"] == pytest.approx(82659.755847)
    k = from_file("xid13_unknown_pid.dmesg.log")
    assert [(e["xid"], e["pci_bus_id"]) for e in k["events"]] == [(13, "0000:43:00.0")] * 2
    k = from_file("nvlink_144_150.log")
    assert [(e["xid"], e["pci_bus_id"]) for e in k["events"]] == [
        (144, "0000:01:00.0"), (149, "0000:00:00.0"), (149, "0019:01:00.0"), (145, "0018:01:00.0")]
    assert all(e["time"] is None for e in k["events"])  # bare lines carry no timestamp


def test_dmesg_relative_timestamps_are_not_uptime():
    k = from_file("aer_fatal_rootport.dmesg-H.log")
    (a,) = by_kind(k, "aer")
    assert (a["pci_bus_id"], a["severity"], a["driver"]) == ("0000:00:03.0", "fatal", "pcieport")
    assert a["time"] is None


def test_modern_aer_format_counts_each_device_once_per_burst():
    k = from_file("aer_corrected_nvme.log")
    assert [(e["pci_bus_id"], e["driver"]) for e in k["events"]] == [
        ("0000:00:1d.0", "pcieport"), ("0000:03:00.0", None), ("0000:00:1d.0", "pcieport")]
    assert {e["severity"] for e in k["events"]} == {"corrected"}


def test_since_seq_returns_only_later_events():
    k = from_file("xid31_62_45.dmesg.log", since_seq=3)
    assert [e["xid"] for e in k["events"]] == [45, 45, 45]
    assert k["last_seq"] == 7
    assert from_file("xid31_62_45.dmesg.log", since_seq=7)["events"] == []


def test_kmsg_records_from_recorded_strings():
    # Header format and dictionary lines: Documentation/ABI/testing/dev-kmsg (recorded example).
    rec = kernel.parse_kmsg_record((DATA / "dev-kmsg-abi-example.kmsg").read_bytes().split(b"\n6,")[0])
    assert rec == (160, pytest.approx(0.424069), "pci_root PNP0A03:00: host bridge window [io  0x0000-0x0cf7] (ignored)")
    # Recorded NVRM messages (SOURCES.md) in a kmsg record; one record holds the multi-line
    # fallen-off-the-bus message with its newlines escaped as \x0a, as devkmsg_read does.
    fallen = ("NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) installed in this system has"
              "\\x0aNVRM: fallen off the bus and is not responding to commands.")
    lines = [b"4,901,1843308145,-;" + fallen.encode(),
             b"4,902,1843308200,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1173, GPU has fallen off the bus.",
             b" SUBSYSTEM=pci", b" DEVICE=+pci:0000:18:00.0",
             b"6,903,1843309000,-;NET: Registered protocol family 10"]
    events, last = kernel.parse_records(kernel.records_from_lines(enumerate(lines, 1)))
    assert last == 903
    assert [(e["kind"], e["pci_bus_id"], e["seq"]) for e in events] == [
        ("fallen_off_bus", "0000:b3:00.0", 901), ("xid", "0000:18:00.0", 902)]
    assert events[1]["time"] == pytest.approx(1843.3082)
    events, _ = kernel.parse_records(kernel.records_from_lines(enumerate(lines, 1)), since_seq=901)
    assert [e["seq"] for e in events] == [902]


def test_binary_garbage_huge_line_and_nul_still_find_xid(tmp_path: Path):
    rnd = random.Random(7)
    garbage = bytes(rnd.getrandbits(8) for _ in range(200_000))
    xid_line = (DATA / "aer_fatal_xid79.dmesg.log").read_bytes().splitlines()[-1]
    blob = (garbage + b"\n" + b"\x00\xff\xfe NVRM:" + b"A" * (1 << 20) + b"\n"
            + b"[1.0] \x00\x80\x81 invalid utf-8 \xc3\x28 NVRM:\n" + xid_line + b"\n")
    path = tmp_path / "kern.log"
    path.write_bytes(blob)
    t0 = time.monotonic()
    k = kernel.collect(cfg(source="file", path=str(path)))
    assert time.monotonic() - t0 < 2.0
    xids = by_kind(k, "xid")
    assert [(e["xid"], e["pci_bus_id"]) for e in xids] == [(79, "0000:02:00.0")]
    assert xids[0]["seq"] == k["last_seq"] == blob.count(b"\n")
    assert all(len(e["text"]) <= kernel.MAX_TEXT_CHARS for e in k["events"])


def test_real_kmsg_and_dmesg_on_this_host():
    """The real /dev/kmsg and dmesg of this machine: bounded, non-blocking, seq advances."""
    if not os.access(kernel.KMSG_PATH, os.R_OK):
        pytest.skip("/dev/kmsg not readable here")
    t0 = time.monotonic()
    k = kernel.collect(cfg(source="kmsg"))
    assert time.monotonic() - t0 < 2.0  # returned at EAGAIN instead of waiting for new records
    assert k["source"] == "kmsg" and isinstance(k["last_seq"], int) and k["last_seq"] >= 0
    again = kernel.collect(cfg(source="auto"), since_seq=k["last_seq"])
    assert again["source"] == "kmsg" and again["events"] == [] and again["last_seq"] >= k["last_seq"]
    try:
        d = kernel.collect(cfg(source="dmesg"))
    except RuntimeError as e:  # dmesg_restrict
        pytest.skip(f"dmesg not permitted: {e}")
    assert d["source"] == "dmesg" and d["last_seq"] > 0


def test_missing_file_raises_so_the_probe_reports_it():
    with pytest.raises(OSError):
        kernel.collect(cfg(source="file", path="/nonexistent/kern.log"))


# --- xid table ------------------------------------------------------------------------------

def test_xid_table_classification():
    for code in (48, 64, 74, 79, 94, 95, 119, 120, 140):
        assert xid_codes.lookup(code).severity == xid_codes.FAIL and xid_codes.lookup(code).hardware
    for code in (13, 31, 43, 45):
        info = xid_codes.lookup(code)
        assert info.severity == xid_codes.WARN and info.noise_alone and not info.hardware
    assert xid_codes.lookup(92).severity == xid_codes.WARN and xid_codes.lookup(92).hardware
    assert xid_codes.severity_for(144, "NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB Nonfatal XC0 i0") == xid_codes.WARN
    assert xid_codes.severity_for(149, "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0") == xid_codes.FAIL
    assert xid_codes.lookup(4242) is None and xid_codes.severity_for(4242) == xid_codes.WARN


# --- checks ---------------------------------------------------------------------------------

H100 = {"gpus": [{"index": 3, "uuid": "GPU-aaaa-3", "pci_bus_id": "0000:02:00.0"},
                 {"index": 0, "uuid": "GPU-aaaa-0", "pci_bus_id": "0000:0a:00.0"}]}


def test_xid79_fails_hardware_and_names_gpu_from_gpu_facts():
    f = facts(from_file("aer_fatal_xid79.dmesg.log"), gpu=H100)
    (x,) = xid_checks.xid(f, cfg())
    assert x.verdict is Verdict.FAIL and x.hardware and x.gpu == "GPU-aaaa-3"
    assert "Xid 79" in x.summary and "fallen off the bus" in x.summary and "GPU 3" in x.summary
    assert x.evidence["pci_bus_id"] == "0000:02:00.0" and x.evidence["count"] == 1
    # Without gpu facts the UUID comes from the kernel's own "GPU at PCI:" line.
    (x,) = xid_checks.xid(facts(from_file("aer_fatal_xid79.dmesg.log")), cfg())
    assert x.gpu == "GPU-660d987e-5b28-3bf6-2a2d-1d5ecae7f6df"
    # The fatal AER is on the root port, not on a GPU bus id: kernel.aer finds nothing.
    assert xid_checks.aer(f, cfg()) == []


def test_app_xids_only_warn_and_fold_into_fatal():
    (w,) = xid_checks.xid(facts(from_file("xid13_app.syslog.log")), cfg())
    assert w.verdict is Verdict.WARN and not w.hardware and "Xid 13" in w.summary and w.evidence["count"] == 5
    out = xid_checks.xid(facts(from_file("xid31_62_45.dmesg.log"), gpu=H100), cfg())
    assert [(x.evidence["xid"], x.verdict) for x in out] == [(62, Verdict.FAIL)]
    assert out[0].evidence["accompanying_xids"] == [31, 45] and out[0].gpu == "GPU-aaaa-0"
    lone45 = xid_checks.xid(facts(from_file("xid45_after_nvlink.journal.log")), cfg())
    assert len(lone45) == 4 and all(x.verdict is Verdict.WARN and not x.hardware for x in lone45)


def test_nvlink_fatal_vs_nonfatal():
    out = {(x.evidence["pci_bus_id"], x.evidence["xid"]): x for x in
           xid_checks.xid(facts(from_file("nvlink_144_150.log")), cfg())}
    assert out[("0000:01:00.0", 144)].verdict is Verdict.WARN
    assert out[("0018:01:00.0", 145)].verdict is Verdict.WARN
    assert out[("0019:01:00.0", 149)].verdict is Verdict.FAIL and out[("0019:01:00.0", 149)].hardware


def test_fallen_off_bus_check_and_dedup_with_xid79():
    (f,) = xid_checks.fallen_off_bus(facts(from_file("fallen_off_no_xid.dmesg.log")), cfg())
    assert f.verdict is Verdict.FAIL and f.hardware and "0000:b3:00.0" in f.summary
    k = from_file("fallen_off_no_xid.dmesg.log")
    k["events"].append(dict(k["events"][0], kind="xid", xid=79))
    assert xid_checks.fallen_off_bus(facts(k), cfg()) == []  # the Xid 79 finding already covers this GPU


def test_aer_on_gpu_fatal_fails_and_corrected_needs_a_count():
    k = from_file("aer_fatal_rootport.dmesg-H.log")
    gpu = {"gpus": [{"index": 1, "uuid": "GPU-root", "pci_bus_id": "0000:00:03.0"}]}
    (a,) = xid_checks.aer(facts(k, gpu=gpu), cfg())
    assert a.verdict is Verdict.FAIL and a.hardware and a.gpu == "GPU-root" and "fatal" in a.summary
    assert xid_checks.aer(facts(k), cfg()) == []  # a root port is not a GPU
    nvme = from_file("aer_corrected_nvme.log")
    gpu = {"gpus": [{"index": 0, "uuid": "GPU-x", "pci_bus_id": "0000:03:00.0"}]}
    assert xid_checks.aer(facts(nvme, gpu=gpu), cfg()) == []  # 1 corrected < threshold
    nvme["events"] = nvme["events"] * xid_checks.AER_CORRECTED_WARN_COUNT
    (a,) = xid_checks.aer(facts(nvme, gpu=gpu), cfg())
    assert a.verdict is Verdict.WARN and not a.hardware and a.evidence["count"] == xid_checks.AER_CORRECTED_WARN_COUNT


def test_no_findings_on_a_clean_log():
    k = kernel.collect(cfg(source="file", path=str(DATA / "dev-kmsg-abi-example.kmsg")))
    assert k["events"] == [] and k["last_seq"] == 340
    for fn in (xid_checks.xid, xid_checks.fallen_off_bus, xid_checks.aer):
        assert fn(facts(k), cfg()) == []


# --- hostile input: only the driver's own records count (issue 13, break 1) ------------------

# A crashing binary named like an Xid line: arch/x86/mm/fault.c prints
# "<comm>[<pid>]: segfault at <addr> ip <ip> sp <sp> error <n> in <file basename>[<base>+<size>]".
FORGED_NAME = "NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus."
SEGV = (f"evil[4242]: segfault at 0 ip 0000563c1e0a1129 sp 00007ffd2a3c8d10 error 6 in {FORGED_NAME}"
        "[563c1e0a1000+1000] likely on CPU 1 (core 1, socket 0)")


def test_segfault_report_quoting_an_xid_file_name_is_not_an_xid(tmp_path: Path):
    real = "NVRM: Xid (PCI:0000:19:00): 79, pid=1173, GPU has fallen off the bus."
    formats = {
        "kmsg": [f"6,900,1843300000,-;{SEGV}", f"4,901,1843308200,-;{real}"],
        "dmesg": [f"[ 1843.300000] {SEGV}", f"[ 1843.308200] {real}"],
        "syslog": [f"Dec  1 10:00:00 n1 kernel: [ 1843.300000] {SEGV}",
                   f"Dec  1 10:00:01 n1 kernel: [ 1843.308200] {real}"],
        "caller": [f"[ 1843.300000] [ T4242] {SEGV}", f"[ 1843.308200] [  T311] {real}"],
    }
    for fmt, lines in formats.items():
        path = tmp_path / f"{fmt}.log"
        path.write_text("\n".join(lines) + "\n")
        k = kernel.collect(cfg(source="file", path=str(path)))
        assert [(e["xid"], e["pci_bus_id"]) for e in k["events"]] == [(79, "0000:19:00.0")], fmt
    # a 15-byte task name (TASK_COMM_LEN - 1) cannot hold the pattern at the start of a line either
    k = parse_kmsg_lines(["6,1,1,-;NVRM: Xid (PCI[4242]: segfault at 0 ip 0 sp 0 error 6 in x[1+1]"])
    assert k == []


def parse_kmsg_lines(lines: List[str]) -> List[Dict[str, Any]]:
    events, _ = kernel.parse_records(kernel.records_from_lines(enumerate((l.encode() for l in lines), 1)))
    return events


def test_file_name_with_a_newline_cannot_forge_a_second_line():
    # devkmsg_read escapes every control character of a record, the newline as \x0a
    forged = "evil[4242]: segfault at 0 ip 0 sp 0 error 6 in x\\x0a" + FORGED_NAME + "[1+1]"
    assert parse_kmsg_lines([f"6,900,1843300000,-;{forged}"]) == []
    # dmesg prints the rest of a multi-line record indented under it
    events, _ = kernel.parse_records(kernel.records_from_lines(enumerate(
        [f"[ 5.0] {SEGV[:60]}".encode(), f"        {FORGED_NAME}".encode()], 1)))
    assert events == []
    # while the driver's own multi-line record still counts (recorded, SOURCES.md)
    assert [e["kind"] for e in from_file("fallen_off_no_xid.dmesg.log")["events"]] == ["fallen_off_bus"]


def test_user_space_write_to_kmsg_is_not_the_driver():
    # prio = facility * 8 + level: 12 is user.warning (what `echo ... > /dev/kmsg` gets by default)
    line = "NVRM: Xid (PCI:0000:18:00): 79, pid=1173, GPU has fallen off the bus."
    assert parse_kmsg_lines([f"12,77,1843300000,-;{line}"]) == []
    assert [e["xid"] for e in parse_kmsg_lines([f"4,78,1843300000,-;{line}"])] == [79]


# --- Xid semantics: consequences never drain, are attributed to their cause (issue 13) -------

# Lines in the recorded shapes of SOURCES.md (xid45_after_nvlink.journal.log, aer_fatal_xid79.dmesg.log)
BUSES = [f"0000:{b:02x}:00" for b in (0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb)]


def storm_lines(cause: Optional[int] = None) -> List[str]:
    """An Xid 45 burst on all 8 GPUs, as one crashing job leaves it (optionally naming a cause)."""
    tail = f" caused by previous Xid {cause}" if cause else ""
    return [f"[ 100.{i:06d}] NVRM: Xid (PCI:{bus}): 45, pid=1818990, name=python3, Ch 0000000{k}{tail}"
            for i, (bus, k) in enumerate((b, k) for b in BUSES for k in range(1, 4))]


def storm_facts(tmp_path: Path, lines: List[str]) -> Dict[str, Any]:
    p = tmp_path / "kern.log"
    p.write_text("\n".join(lines) + "\n")
    return facts(kernel.collect(cfg(source="file", path=str(p))))


def test_xid45_storm_on_every_gpu_drains_nothing(tmp_path: Path):
    out = xid_checks.xid(storm_facts(tmp_path, storm_lines()), cfg())
    assert len(out) == 8 and all(f.verdict is Verdict.WARN and not f.hardware for f in out)
    out = xid_checks.xid(storm_facts(tmp_path, storm_lines(cause=79)), cfg())  # cause named, not logged here
    assert all(not f.hardware and f.evidence["caused_by_xid"] == 79 and "not in this log window" in f.summary
               for f in out)


def test_storm_caused_by_one_xid79_is_attributed_to_that_gpu(tmp_path: Path):
    x79 = "[ 99.000000] NVRM: Xid (PCI:0000:5d:00): 79, pid=1173, GPU has fallen off the bus."
    out = xid_checks.xid(storm_facts(tmp_path, [x79] + storm_lines(cause=79)), cfg())
    (f,) = out  # the 45s of the other seven GPUs are the 79's consequences, not findings of their own
    assert f.verdict is Verdict.FAIL and f.hardware and f.evidence["pci_bus_id"] == "0000:5d:00.0"
    assert sum(c["count"] for c in f.evidence["consequences"]) == 24
    assert "caused 21 Xid(s) on 7 other GPU(s)" in f.summary
    # without the named cause, the other GPUs' 45s stay WARN of their own; the node still fails once
    out = xid_checks.xid(storm_facts(tmp_path, [x79] + storm_lines()), cfg())
    assert [f.evidence["xid"] for f in out if f.hardware] == [79] and len(out) == 8


def test_application_xids_that_recur_say_so_and_never_drain(tmp_path: Path):
    lines = [f"[ {1000 + i}.000000] NVRM: Xid (PCI:0000:41:00): 31, pid=7, name=python3, Ch 00000010, "
             "intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f29_5b8c9000" for i in range(25)]
    (f,) = xid_checks.xid(storm_facts(tmp_path, lines), cfg())
    assert f.verdict is Verdict.WARN and not f.hardware and f.evidence["recurring"]["count"] == 25
    spread = [l.replace(f"[ {1000 + i}.", f"[ {1000 + i * 400}.") for i, l in enumerate(lines)]
    (f,) = xid_checks.xid(storm_facts(tmp_path, spread), cfg())  # 25 over 2.7 h: at most 10 in any hour
    assert "recurring" not in f.evidence
