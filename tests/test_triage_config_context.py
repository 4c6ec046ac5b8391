"""A communication failure next to a setting the log shows (catalog/config_context.toml): the setting is named
first, as the failure's likely cause; the failure alone, a confident cause, or a failure of another kind stays
as it was. Lines are the catalog entries' real examples (public threads and dev corpus cases, named there)."""
from __future__ import annotations

from pathlib import Path
from typing import List

import pytest

from slurm_triage.triage import catalog, triage_logs
from slurm_triage.triage.model import TriageFinding
from slurm_triage.triage.rules import fallback

BY_ID = {e.id: e for e in catalog.entries()}
CORPUS = Path(__file__).parent / "corpus"


def example(entry_id: str, i: int = 0) -> str:
    return BY_ID[entry_id].examples[i]


WATCHDOG = example("watchdog_timeout")          # collective_hang symptom, 0.6
SYSTEM_ERROR = example("nccl_system_error")     # network symptom, 0.3
IB_RETRY = example("ib_completion", 1)          # network cause, status 12: 0.7
SOCKET_ABORT = example("socket_connect_failed")  # network cause, 0.45
SETTINGS = {
    "log.setting.nccl_env": example("nccl_fabric_env_setting", 5),
    "log.setting.nccl_ib_unavailable": example("nccl_ib_unavailable"),
    "log.setting.nccl_bridge_interface": example("nccl_socket_bridge_interface", 1),
    "log.setting.nccl_roce_link_local_gid": example("nccl_roce_link_local_gid"),
    "log.setting.nccl_net_plugin": example("nccl_net_plugin_unusable"),
}


def run(tmp_path: Path, lines: List[str]) -> List[TriageFinding]:
    log = tmp_path / "job.log"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return triage_logs([str(log)]).findings


@pytest.mark.parametrize("setting_id", sorted(SETTINGS))
@pytest.mark.parametrize("failure", [WATCHDOG, SYSTEM_ERROR, IB_RETRY, SOCKET_ABORT],
                         ids=["watchdog", "system_error", "ib_retry", "socket_abort"])
def test_a_setting_explains_a_communication_failure(tmp_path: Path, setting_id: str, failure: str) -> None:
    alone = run(tmp_path, [failure])[0]
    assert alone.category in ("network", "collective_hang") and not alone.id.startswith("log.setting.")
    found = run(tmp_path, [SETTINGS[setting_id], failure])
    root = found[0]
    assert root.category == "config" and root.confidence < 0.8
    assert any(f.id == alone.id and f.caused_by == root.id for f in found[1:])
    if alone.consequence:
        # Over a symptom, the lean of the log's setting words (fallback.cause_lean) may speak first; the
        # hint is then listed after it.
        assert root.id in (setting_id, fallback.LEAN_ID) and setting_id in [f.id for f in found]
    else:
        assert root.id == setting_id and root.evidence["explains"] == alone.id


def test_the_setting_explains_the_failure_even_when_pasted_after_it(tmp_path: Path) -> None:
    """An untimed paste's order says nothing: the env dump pasted below the error still explains it."""
    root = run(tmp_path, [IB_RETRY, SETTINGS["log.setting.nccl_env"]])[0]
    assert (root.id, root.evidence.get("explains")) == ("log.setting.nccl_env", "log.ib_completion.12")


def test_a_loopback_peer_names_the_interface_not_the_fabric(tmp_path: Path) -> None:
    """The dev case awsome-distributed-ai-192: one line, a connect to 127.0.0.1 aborted between nodes."""
    log = CORPUS / "awsome-distributed-ai-192-nccl-socket-loopback-socket-ifname-enp" / "log.txt"
    found = triage_logs([str(log)]).findings
    assert (found[0].id, found[0].category) == ("log.setting.nccl_connect_to_loopback", "config")
    assert any(f.id == "log.socket_connect_failed" and f.caused_by == found[0].id for f in found)


@pytest.mark.parametrize("cause_id,category", [("collective_mismatch", "collective_hang"), ("cuda_oom", "memory")])
def test_a_confident_cause_is_never_displaced(tmp_path: Path, cause_id: str, category: str) -> None:
    found = run(tmp_path, list(SETTINGS.values()) + [example(cause_id)])
    assert found[0].category == category and found[0].confidence >= 0.8
    assert not found[0].id.startswith("log.setting.")


def test_a_setting_does_not_explain_a_failure_of_another_kind(tmp_path: Path) -> None:
    """A CUDA out-of-memory error (0.75) is no communication failure: the env dump does not claim it."""
    root = run(tmp_path, [SETTINGS["log.setting.nccl_env"], example("cuda_error_oom")])[0]
    assert root.category == "memory"


def test_benign_defaults_and_the_missing_default_plugin_are_not_settings(tmp_path: Path) -> None:
    """NCCL_IB_DISABLE=0 is NCCL's default and a missing libnccl-net.so is printed by every job without a net
    plugin (nccl issues 451 and 1232): neither is a setting hint that could claim the failure."""
    quiet = ["NCCL INFO NCCL_IB_DISABLE set by environment to 0.",
             "[0] node0:13571:13571 [0] NCCL INFO NET/Plugin : Plugin load (libnccl-net.so) returned 2 : "
             "libnccl-net.so: cannot open shared object file: No such file or directory"]
    found = run(tmp_path, quiet + [SYSTEM_ERROR])
    assert found and not any(f.id.startswith("log.setting.") for f in found)


def test_every_setting_hint_is_a_symptom_role_catalog_finding() -> None:
    """SETTING_HINTS names catalog findings: each must exist, be a symptom (ranked after any cause) and stay
    below CONFIDENT, so a hint can explain a failure but never outrank a cause."""
    import re

    from slurm_triage.triage.rules import CONFIDENT, SETTING_HINTS

    hints = [e for e in catalog.entries() if re.search(SETTING_HINTS, e.finding_id)]
    named = set(re.findall(r"\b[a-z][a-z0-9_]+(?=[|)])", SETTING_HINTS.split("(?:", 1)[1]))
    assert named <= {e.id for e in hints}, named - {e.id for e in hints}
    assert len(hints) >= len(SETTINGS) + len(named)
    assert all(e.role == "symptom" and e.confidence < CONFIDENT for e in hints), [e.id for e in hints]
