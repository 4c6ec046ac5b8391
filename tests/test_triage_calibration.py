"""Confidence calibration: what triage may claim as established (>= 0.8) on logs it has never seen.

A wrong answer at 0.8 or more misleads an SRE most, so a root cause keeps that confidence only
when it is a cause (not a symptom) and no cause of another category of similar strength stands
beside it; a catalog entry matching a generic phrase is never that sure on its own; a line-level
entry gives way to the structured parser that read the same line in context.
"""
from __future__ import annotations

from pathlib import Path
import pytest

from slurm_triage.model import Verdict
from slurm_triage.triage import catalog, triage_logs
from slurm_triage.triage.logs import parse_line
from slurm_triage.triage.model import TriageFinding
from slurm_triage.triage.rules import CONFIDENT, CONTESTED, correlate, fallback, run_rules

DATA = Path(__file__).resolve().parent / "data" / "structured"


def finding(fid: str, category: str, conf: float, t: float, consequence: bool = False, tier: int = 1,
            node: str = "n1") -> TriageFinding:
    f = TriageFinding(id=fid, category=category, verdict=Verdict.FAIL, confidence=conf, summary=fid, action="-",
                      node=node, consequence=consequence, tier=tier)
    f.first_time = t
    return f


def test_a_symptom_alone_is_not_confident() -> None:
    [f] = correlate([finding("log.slurm.time_limit", "scheduler", 0.8, 10.0, consequence=True)])
    assert f.confidence == CONTESTED < CONFIDENT and "symptom" in f.evidence["confidence_note"]


def test_a_cause_of_another_category_of_similar_strength_contests_the_root() -> None:
    root, rival = finding("a", "memory", 0.9, 10.0), finding("b", "config", 0.8, 20.0, node="n2")
    ranked = correlate([rival, root])
    assert ranked[0] is root and root.confidence == CONTESTED
    assert "b (config, 0.8)" in root.evidence["confidence_note"]


@pytest.mark.parametrize("other", [
    finding("weak", "config", 0.7, 20.0, node="n2"),                       # far weaker: no contest
    finding("same", "memory", 0.9, 20.0, node="n2"),                       # same category: agrees
    finding("sym", "network", 0.9, 20.0, consequence=True, node="n2"),     # a symptom: follows the root
    finding("child", "network", 0.9, 20.0, tier=2),                        # later on the root's node: explained
])
def test_an_uncontested_cause_stays_confident(other: TriageFinding) -> None:
    root = finding("a", "memory", 0.9, 10.0)
    assert correlate([root, other])[0] is root and root.confidence == 0.9
    assert "confidence_note" not in root.evidence


# Generic lines, each seen in failures of several categories: an entry that matches one of them may
# name its category, but never at CONFIDENT on that line alone.
GENERIC = [
    "RuntimeError: Address already in use",
    "RuntimeError: CUDA error: invalid device ordinal",
    "OSError: [Errno 24] Too many open files",
    "RuntimeError: CUDA error: out of memory",
    "connect() failed: Connection refused",
    "socket.timeout: timed out",
    "ConnectionError: Connection timed out",
    "error: Job 123 launch failed requeued held",
    "RuntimeError: NCCL error: unhandled system error",
    "srun: error: Task launch for StepId=5.0 failed on node n1: Connection refused",
    "Segmentation fault (core dumped)",
    "Killed",
]


@pytest.mark.parametrize("line", GENERIC)
def test_no_confident_entry_matches_a_generic_line(line: str) -> None:
    sure = [e.id for e in catalog.entries() if e.confidence >= CONFIDENT and e.regex.search(line)]
    assert sure == [], (line, sure)
    evs, _ = parse_line(line, "job.out", 1)
    assert all(f.confidence < CONFIDENT for f in run_rules(evs)), line


def test_ib_local_protection_error_is_not_confident() -> None:
    """Completion error 4 (a memory registration refused) is as often GPUDirect RDMA setup as a fault."""
    line = "gpu-a1:1:2 [0] NCCL WARN NET/IB : Got completion from peer 10.0.0.2<5000> with error 4, opcode 0, len 0, vendor err 81"
    evs, _ = parse_line(line, "job.out", 1)
    [f] = run_rules(evs)
    assert (f.category, f.confidence) == ("network", 0.65)


def test_ib_port_down_defers_to_the_ib_parser_on_a_full_ibstat_paste() -> None:
    """Port 2 Down/Polling beside an Active port 1: the parser's reading (a spare port, a weak note)
    is the finding, not the bare 'State: Down' line at 0.6."""
    res = triage_logs([str(DATA / "infiniband" / "archwiki-ibstat-port2-polling.txt")])
    ids = [f.id for f in res.findings]
    assert "log.ib_port_down" not in ids and "ib.port.polling" in ids
    assert max(f.confidence for f in res.findings) <= 0.3
    assert next(e for e in catalog.entries() if e.id == "ib_port_down").defers_to == ("ib_port",)


def test_a_bare_port_down_line_still_counts(tmp_path: Path) -> None:
    """Without the CA/port context no parser decodes the line: the catalog entry still speaks."""
    log = tmp_path / "paste.log"
    log.write_text("                State: Down\n")
    assert [f.id for f in triage_logs([str(log)]).findings][:1] == ["log.ib_port_down"]


def test_defers_to_is_validated_as_a_list(tmp_path: Path) -> None:
    src = (catalog.DIR / "network.toml").read_text()
    (tmp_path / "network.toml").write_text(src.replace('defers_to = ["ib_port"]', 'defers_to = "ib_port"'))
    with pytest.raises(catalog.CatalogError, match=r"network\.toml:ib_port_down:defers_to: must be list"):
        catalog.load(tmp_path)



# A communication symptom without a cause (rules.fallback.cause_lean): real lines of dev cases.
WATCHDOG = ("[rank1]:[E626 06:24:44.903881913 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation "
            "timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) "
            "ran for 600020 milliseconds before timing out.")                      # basicsr-737-watchdog
SETTINGS = ("mpirun --allow-run-as-root -np 2 --mca btl tcp,self --mca btl_tcp_if_exclude eth0 -host *,*  "
            "-x CUDA_VISIBLE_DEVICES=\"0,2\" -x NCCL_DEBUG=INFO -x LD_LIBRARY_PATH -x NCCL_IB_HCA=mlx5_bond_0:1 "
            "-x NCCL_P2P_DISABLE=0 -x NCCL_SHM_DISABLE=0 -x NCCL_IB_DISABLE=0 -x NCCL_IB_CUDA_SUPPORT=0  "
            "/home/mingkun/enter/test/nccl-tests/build/all_reduce_perf -b 9 -e 128M -f 2 -g 1 -z 0")  # nccl-426
LAUNCH = ("CUDA_VISIBLE_DEVICES=6,7 python -m torch.distributed.launch --nproc_per_node=$NGPUS tools/train_net.py "
          "--config-file configs/e2e_mask_rcnn_R_50_FPN_1x.yaml ")                   # maskrcnn-benchmark-137
OOM = ("RuntimeError: CUDA out of memory. Tried to allocate 72.00 MiB (GPU 0; 1024.00 MiB total capacity; "
       "378.05 MiB already allocated; 0 bytes free; 418.00 MiB reserved in total by PyTorch)")


def _triage(tmp_path: Path, lines: list) -> list:
    log = tmp_path / "job.err"
    log.write_text("\n".join(lines) + "\n")
    return triage_logs([str(log)]).findings


def test_a_communication_symptom_gives_way_to_the_fabric_setting_its_log_names(tmp_path: Path) -> None:
    """A collective timeout is the only error and the job set NCCL's transport by hand: config goes
    first as a guess (far below CONFIDENT), the timeout stays as its consequence."""
    ranked = _triage(tmp_path, [SETTINGS, "step 1", WATCHDOG])
    lean, symptom = ranked[0], next(f for f in ranked if f.id == "log.watchdog")
    assert (lean.id, lean.category, lean.confidence) == (fallback.LEAN_ID, "config", fallback.LEAN_CONFIDENCE)
    assert lean.confidence < CONFIDENT and "nccl_ib_*" in lean.evidence["lexicon"]["words"]
    assert symptom.caused_by == fallback.LEAN_ID and lean.evidence["symptom"] == "log.watchdog"
    assert "guess" in lean.action and "behind a communication symptom" in lean.summary


def test_a_launcher_line_alone_does_not_displace_the_symptom(tmp_path: Path) -> None:
    """CUDA_VISIBLE_DEVICES / --nproc_per_node are printed by healthy launches too: not a named cause."""
    assert _triage(tmp_path, [LAUNCH, WATCHDOG])[0].id == "log.watchdog"


def test_a_setting_never_outranks_a_cause(tmp_path: Path) -> None:
    ranked = _triage(tmp_path, [SETTINGS, OOM, WATCHDOG])
    assert ranked[0].category == "memory" and fallback.LEAN_ID not in [f.id for f in ranked]


def test_a_lean_speaks_only_over_a_communication_symptom() -> None:
    lean = finding(fallback.LEAN_ID, "config", fallback.LEAN_CONFIDENCE, 5.0)
    limit = finding("log.slurm.time_limit", "scheduler", 0.75, 10.0, consequence=True)
    reset = finding("log.conn_reset", "network", 0.3, 10.0, consequence=True)
    assert [f.id for f in correlate([lean, limit])] == ["log.slurm.time_limit"]
    assert [f.id for f in correlate([reset, lean])] == [fallback.LEAN_ID, "log.conn_reset"]
    assert correlate([lean]) == []
