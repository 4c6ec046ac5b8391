"""The drain circuit breaker's judgement over a census, from sinfo output recorded on the
lab's Slurm 22.05 (`sinfo -h -N -o '%N|%P|%T|%H|%E'`), and its cache."""
from __future__ import annotations

import time

from slurm_triage import breaker
from slurm_triage.config import Config, defaults

# Recorded on the lab (Slurm 22.05.8): node3 drained by an admin, node4 by us.
SINFO_22_05 = """node1|debug*|idle|Unknown|none
node2|debug*|idle|Unknown|none
node3|debug*|drained|2026-12-01T10:35:48|bad DIMM ticket 4711
node4|debug*|drained|2026-12-01T10:35:48|triage: GPU-0dbc98d5 Xid 79: GPU has fallen off the bus
"""


def make_cfg(tmp_path, **drain) -> Config:
    values = defaults()
    values["node"]["state_dir"] = str(tmp_path / "state")
    values["drain"].update(drain)
    return Config(values)


def census(text: str = SINFO_22_05, now: float = 0.0) -> breaker.Census:
    now = now or time.time()
    parts, ours = breaker.parse_sinfo(text, now)
    return breaker.Census(parts, {n: now for n in ours}, now)


def test_parse_sinfo_counts_only_our_tagged_drains():
    from slurm_triage.slurmctl import TAG

    assert breaker.TAG == TAG  # the breaker counts exactly the reasons slurmctl writes
    parts, ours = breaker.parse_sinfo(SINFO_22_05, 0.0)
    assert parts == {"debug": ["node1", "node2", "node3", "node4"]}
    assert list(ours) == ["node4"]


def test_no_cap_configured_always_allows(tmp_path):
    assert breaker.judge(make_cfg(tmp_path), "node2", "debug", census()).allowed


def test_max_nodes_1_holds_the_second_drain_back(tmp_path):
    cfg = make_cfg(tmp_path, max_nodes=1)
    d = breaker.judge(cfg, "node2", "debug", census())
    assert not d.allowed and "node4" in d.why and "max_nodes = 1" in d.why
    # the node that is already ours is not counted against itself; an empty census allows
    assert breaker.judge(cfg, "node4", "debug", census()).allowed
    assert breaker.judge(cfg, "node2", "debug", census(SINFO_22_05.replace("triage:", "admin:"))).allowed


def test_max_fraction_rounds_up_like_sites_count(tmp_path):
    """"1 % of 288 is 3 nodes": three may be drained, the fourth is held back."""
    nodes = [f"gpu{i:03d}" for i in range(288)]

    def lines(drained: int) -> str:
        return "".join(f"{n}|batch|{'drained' if i < drained else 'idle'}|2026-12-01T10:00:00|"
                       f"{'triage: Xid 79' if i < drained else 'none'}\n" for i, n in enumerate(nodes))

    cfg = make_cfg(tmp_path, max_fraction=0.01)
    assert breaker.judge(cfg, "gpu287", "batch", census(lines(2))).allowed
    held = breaker.judge(cfg, "gpu287", "batch", census(lines(3)))
    assert not held.allowed and "3 of 288" in held.why


def test_a_node_resumed_within_the_window_still_counts(tmp_path):
    cfg = make_cfg(tmp_path, max_nodes=1, window_seconds=3600.0, cache_seconds=0.0)
    old = breaker.Census({"debug": ["node1", "node2"]}, {"node1": time.time() - 60}, time.time() - 60)
    breaker._save_cache(cfg, old)
    cfg.values["drain"]["sinfo"] = "/bin/false"  # slurmctld does not answer now: the cache stands
    c = breaker.census(cfg, 1.0)
    assert c is not None and "node1" in c.ours
    assert not breaker.judge(cfg, "node2", "debug", c).allowed
    cfg.values["drain"]["window_seconds"] = 30.0
    assert breaker.judge(cfg, "node2", "debug", c).allowed


def test_the_census_is_cached_for_cache_seconds(tmp_path):
    script = tmp_path / "sinfo"
    calls = tmp_path / "calls"
    script.write_text(f"#!/bin/sh\necho x >> {calls}\ncat <<'X'\n{SINFO_22_05}X\n")
    script.chmod(0o755)
    cfg = make_cfg(tmp_path, max_nodes=1, cache_seconds=60.0, sinfo=str(script))
    for _ in range(5):
        assert list(breaker.census(cfg, 2.0).ours) == ["node4"]
    assert calls.read_text().count("x") == 1


def test_suppressed_counter_persists(tmp_path):
    cfg = make_cfg(tmp_path)
    assert breaker.suppressed_total(cfg) == 0
    assert [breaker.count_suppressed(cfg) for _ in range(3)] == [1, 2, 3]
    assert breaker.suppressed_total(cfg) == 3
