"""The failure catalog (slurm_triage/triage/catalog/*.toml): it loads, every entry matches its own
real example lines through the whole scanner, and no entry of another category steals them."""
from __future__ import annotations

from pathlib import Path

import pytest

from slurm_triage.triage import catalog, logs
from slurm_triage.triage.catalog import CatalogError, load, render
from slurm_triage.triage.logs import parse_line
from slurm_triage.triage.rules import RULES

ENTRIES = catalog.entries()
BY_ID = {e.id: e for e in ENTRIES}
EXAMPLES = [(e.id, i, ex) for e in ENTRIES for i, ex in enumerate(e.examples)]


def test_catalog_loads_with_every_category_and_known_rules() -> None:
    assert len(ENTRIES) == len(BY_ID)
    rule_ids = {r.id for r in RULES}
    for e in ENTRIES:
        assert not e.handled_by or e.handled_by in rule_ids, (e.file, e.id, e.handled_by)


@pytest.mark.parametrize("entry_id,i,example", EXAMPLES, ids=[f"{a}-{b}" for a, b, _ in EXAMPLES])
def test_entry_matches_its_own_example(entry_id: str, i: int, example: str) -> None:
    events, _ = parse_line(example, "ex.log", 1)
    assert entry_id in [ev.kind for ev in events], (entry_id, example)


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.id for e in ENTRIES])
def test_every_field_and_needle_is_exercised_by_an_example(entry: catalog.Entry) -> None:
    """A named group that no example fills, or a needle no example holds, is untested knowledge."""
    found = set()
    for ex in entry.examples:
        m = entry.regex.search(ex)
        assert m, (entry.id, ex)
        found |= {k for k, v in m.groupdict().items() if v is not None}
    assert set(entry.fields) <= found, (entry.id, sorted(set(entry.fields) - found))
    for n in entry.needles:
        hay = [ex.lower() for ex in entry.examples] if entry.nocase else list(entry.examples)
        assert any((n.lower() if entry.nocase else n) in h for h in hay), (entry.id, n)


def test_summaries_name_where_by_the_builtin_fields() -> None:
    """The scanner moves the ``node``/``node_*``, ``rank`` and ``gpu`` groups into the event's own fields,
    so a summary naming them directly would print "?": it must use ``nodes``/``ranks``/``gpus``."""
    bad = []
    for e in ENTRIES:
        if e.handled_by:
            continue
        for key in ("summary", "action"):
            named = set(catalog._template_fields(getattr(e, key)))
            if named & {"rank", "gpu", "node"} or any(f.startswith("node_") for f in named):
                bad.append((e.id, key))
    assert not bad, bad


def test_no_entry_steals_an_example_of_another_category() -> None:
    stolen = []
    for entry_id, _, ex in EXAMPLES:
        own = BY_ID[entry_id]
        events, _ = parse_line(ex, "ex.log", 1)
        for ev in events:
            other = BY_ID[ev.kind]
            if other.category == own.category or other.role == "context" or own.role == "context":
                continue
            if other.id in own.shares or own.id in other.shares:
                continue
            stolen.append((entry_id, other.id, ex[:120]))
    assert not stolen, stolen


@pytest.mark.skipif(logs.grep_binary() is None, reason="GNU grep not at /usr/bin/grep or /bin/grep")
def test_grep_and_python_scanners_agree_on_every_example(tmp_path: Path) -> None:
    p = tmp_path / "examples.log"
    p.write_text("\n".join(ex for _, _, ex in EXAMPLES) + "\nplain step line\n", encoding="utf-8")
    a, sa = logs.scan(str(p))
    b, sb = logs.scan(str(p), prefilter=False)
    assert [(e.kind, e.line, e.fields) for e in a] == [(e.kind, e.line, e.fields) for e in b]
    assert sa.candidate_lines == sb.candidate_lines == len(EXAMPLES)
    assert {e.kind for e in a} >= {e.id for e in ENTRIES}


def _write(tmp_path: Path, body: str) -> Path:
    d = tmp_path / "cat"
    d.mkdir(exist_ok=True)
    (d / "memory.toml").write_text(body)
    return d


GOOD = '''[[entry]]
id = "x_oom"
category = "memory"
role = "cause"
confidence = 0.5
needles = ["boom"]
regex = 'boom (?P<n>\\d+)'
summary = "boom[ {n}][ on {nodes}]"
action = "fix it"
sources = ["https://example.org/x"]
examples = ["boom 3"]
'''


@pytest.mark.parametrize("change,message", [
    (("confidence = 0.5", "confidence = 2"), "memory.toml:x_oom:confidence"),
    (('category = "memory"', 'category = "mem"'), "memory.toml:x_oom:category"),
    (('role = "cause"', 'role = "maybe"'), "memory.toml:x_oom:role"),
    (("regex = 'boom (?P<n>\\d+)'", "regex = 'boom (?P<n>'"), "memory.toml:x_oom:regex"),
    (('summary = "boom[ {n}][ on {nodes}]"', 'summary = "boom {size}"'), "memory.toml:x_oom:summary"),
    (('sources = ["https://example.org/x"]', 'sources = ["example.org"]'), "memory.toml:x_oom:sources"),
    (('action = "fix it"', 'action = "fix it"\ncolour = "red"'), "memory.toml:x_oom:colour"),
    (('needles = ["boom"]', 'needles = "boom"'), "memory.toml:x_oom:needles"),
    (("regex = 'boom (?P<n>\\d+)'", "regex = 'boom (?P<count>\\d+)'"), "memory.toml:x_oom:regex"),
    (('examples = ["boom 3"]', ''), "memory.toml:x_oom:examples"),
])
def test_loader_names_file_entry_and_key(tmp_path: Path, change, message: str) -> None:
    assert len(load(_write(tmp_path, GOOD))) == 1
    with pytest.raises(CatalogError, match=message):
        load(_write(tmp_path, GOOD.replace(*change)))


def test_loader_rejects_duplicates_and_bad_toml(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="x_oom:id: also defined"):
        load(_write(tmp_path, GOOD + GOOD))
    with pytest.raises(CatalogError, match="memory.toml:-:-: not valid TOML"):
        load(_write(tmp_path, "[[entry]\n"))


def test_render_drops_optional_parts_without_values() -> None:
    assert render("boom[ {n}][ on {nodes}]", {"n": "3", "nodes": ""}) == "boom 3"
    assert render("boom {n}", {}) == "boom ?"


def test_a_hint_leads_only_when_no_cause_was_found(tmp_path: Path) -> None:
    """A symptom-role hint (NCCL on a loopback address) comes first in the log but gives way to a real
    cause after it; alone it still names the likely misconfiguration instead of a word-count guess."""
    from slurm_triage.triage import triage_logs

    hint = BY_ID["nccl_unroutable_interface"].examples[2]
    oom = BY_ID["cuda_error_oom"].examples[0]
    log = tmp_path / "job.log"
    log.write_text(f"{hint}\n{oom}\n")
    assert triage_logs([str(log)]).findings[0].category == "memory"
    log.write_text(f"{hint}\n")
    root = triage_logs([str(log)]).findings[0]
    assert (root.id, root.category) == ("log.nccl_unroutable_interface", "config")
    assert root.confidence < 0.8
