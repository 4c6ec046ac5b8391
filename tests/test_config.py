"""Config: schema validation with file/key/line, search order, fail-open, the example file."""
from __future__ import annotations


import os

import pytest

from slurm_triage import config
from slurm_triage.config import ConfigError, load, parse

from conftest import ROOT, cli


def test_defaults_without_any_file(monkeypatch, tmp_path):
    monkeypatch.delenv("SLURM_TRIAGE_CONFIG", raising=False)
    monkeypatch.setattr(config, "DEFAULT_PATH", str(tmp_path / "absent.toml"))
    monkeypatch.setenv("SLURMD_NODENAME", "gpu017")
    cfg = load()
    assert cfg.source == "<defaults>"
    assert cfg.get("node", "name") == "gpu017"
    assert cfg.get("gpu", "deadline_seconds") == 5.0


def test_env_var_then_explicit_wins(monkeypatch, write_config):
    env_file = write_config("[gpu]\ndeadline_seconds = 7\n", "env.toml")
    explicit = write_config("[gpu]\ndeadline_seconds = 3.5\n", "explicit.toml")
    monkeypatch.setenv("SLURM_TRIAGE_CONFIG", str(env_file))
    assert load().get("gpu", "deadline_seconds") == 7.0  # int is accepted for a float key
    assert load(str(explicit)).get("gpu", "deadline_seconds") == 3.5


def test_node_placeholder_is_expanded(monkeypatch, write_config):
    monkeypatch.setenv("SLURMD_NODENAME", "node2")
    p = write_config('[node]\nstate_dir = "/tmp/lab/nodes/{node}/state"\n')
    assert load(str(p)).get("node", "state_dir") == "/tmp/lab/nodes/node2/state"
    # a SPANK helper gets no SLURMD_NODENAME: the node name Slurm gave the plugin wins
    monkeypatch.delenv("SLURMD_NODENAME")
    cfg = load(str(p), node="node3")
    assert cfg.get("node", "name") == "node3" and cfg.get("node", "state_dir") == "/tmp/lab/nodes/node3/state"


@pytest.mark.parametrize("text,key,line,words", [
    ("[gpu]\nenabled = true\nnvml_libary = \"/x\"\n", "gpu.nvml_libary", 3, "unknown key"),
    ("\n[gpuu]\n", "gpuu", 2, "unknown section"),
    ("[gpu]\n\ndeadline_seconds = \"5\"\n", "gpu.deadline_seconds", 3, "expected float"),
    ("[gpu]\ndeadline_seconds = -1\n", "gpu.deadline_seconds", 2, "must be > 0"),
    ("[pushgateway]\nurl = \"127.0.0.1:9091\"\n", "pushgateway.url", 2, "http(s) URL"),
    ("[kernel]\nsource = \"journal\"\n", "kernel.source", 2, "must be one of"),
    ("[gpu]\nenabled = 1\n", "gpu.enabled", 2, "expected bool"),
    ("[gpu]\nexpected_count = true\n", "gpu.expected_count", 2, "expected int"),
    # break 7: a deadline of inf or 1e300 was accepted, and the hook never ended
    ("[hooks]\nprolog_deadline_seconds = inf\n", "hooks.prolog_deadline_seconds", 2, "finite number"),
    ("[hooks]\nprolog_deadline_seconds = 1e300\n", "hooks.prolog_deadline_seconds", 2, "finite number"),
    ("[hooks]\nepilog_deadline_seconds = 301\n", "hooks.epilog_deadline_seconds", 2, "<= 300"),
    ("[pushgateway]\ntimeout_seconds = nan\n", "pushgateway.timeout_seconds", 2, "finite number"),
    ("[pushgateway]\nretries = 1000\n", "pushgateway.retries", 2, "<= 5"),
    ("[watcher]\nthread_growth_threshold = 10000000000\n", "watcher.thread_growth_threshold", 2, "finite number"),
    ("[drain]\nmax_fraction = 1.5\n", "drain.max_fraction", 2, "<= 1"),
])
def test_bad_values_name_file_key_and_line(text, key, line, words):
    with pytest.raises(ConfigError) as e:
        parse(text, "/etc/slurm-triage/config.toml")
    msg = str(e.value)
    assert msg.startswith(f"/etc/slurm-triage/config.toml:{line}: {key}:"), msg
    assert words in msg


def test_toml_syntax_error_names_line():
    with pytest.raises(ConfigError) as e:
        parse("[gpu]\nenabled = \n", "f.toml")
    assert e.value.line == 2 and "not valid TOML" in str(e.value)


def test_fail_open_defaults_only_the_bad_keys_and_says_so(write_config):
    p = write_config("[gpu]\ndeadline_seconds = 'soon'\nexpected_count = 8\n[nope]\nx = 1\n"
                     "[pushgateway]\nurl = \"http://127.0.0.1:9091\"\n")
    cfg = load(str(p), fail_open=True)
    assert cfg.get("gpu", "deadline_seconds") == 5.0  # the bad key: its default
    assert cfg.get("gpu", "expected_count") == 8  # the good keys survive
    assert cfg.get("pushgateway", "url") == "http://127.0.0.1:9091"
    assert len(cfg.warnings) == 2
    assert "gpu.deadline_seconds" in cfg.warnings[0] and ":2:" in cfg.warnings[0]
    assert "unknown section [nope]" in cfg.warnings[1]
    with pytest.raises(ConfigError):
        load(str(p))


def test_fail_open_syntax_error_uses_all_defaults(write_config):
    p = write_config("[gpu\nexpected_count = 8\n")
    cfg = load(str(p), fail_open=True)
    assert cfg.get("gpu", "expected_count") == -1
    assert len(cfg.warnings) == 1 and "using built-in defaults" in cfg.warnings[0]


def test_unreadable_file_fails_open_in_hooks(tmp_path):
    cfg = load(str(tmp_path / "missing.toml"), fail_open=True)
    assert cfg.warnings and "cannot read" in cfg.warnings[0]


def test_example_file_documents_every_key_and_is_current():
    text = (ROOT / "etc" / "config.toml.example").read_text()
    assert text == config.example(), "regenerate: slurm-triage config example > etc/config.toml.example"
    for section, keys in config.SCHEMA.items():
        assert f"[{section}]" in text
        for name in keys:
            assert f"# {name} = " in text
    # Uncommenting every default yields a valid file with the same values.
    import re

    uncommented = "\n".join(l[2:] if re.match(r"^# [a-z_]+ = ", l) else l for l in text.splitlines())
    assert parse(uncommented, "example") == config.defaults()


def test_cli_config_check_exit_codes(write_config):
    good = write_config("[gpu]\nexpected_count = 8\n", "good.toml")
    bad = write_config("[gpu]\nexpected_count = 'eight'\n", "bad.toml")
    r = cli("config", "check", str(good))
    assert r.returncode == 0 and "OK" in r.stdout
    r = cli("config", "check", str(bad))
    assert r.returncode == 2
    assert f"{bad}:2: gpu.expected_count: expected int" in r.stderr


def test_cli_check_with_broken_config_is_a_usage_error(write_config):
    bad = write_config("[nope]\n")
    r = cli("--config", str(bad), "check")
    assert r.returncode == 2 and "unknown section [nope]" in r.stderr


# --- the hooks' parsed-config cache (issue 10: tomllib's import and parse were ~8 ms of CPU per hook) ---

@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A cache directory of this user's, and files old enough to be cached."""
    d = tmp_path / "cache"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("SLURM_TRIAGE_CACHE_DIR", str(d))
    monkeypatch.setattr(config, "RACY_SECONDS", 0.0)
    return d


def _parses(monkeypatch) -> list:
    calls: list = []
    real = config.parse
    monkeypatch.setattr(config, "parse", lambda *a, **k: calls.append(a[1]) or real(*a, **k))
    return calls


def test_a_hook_reuses_the_parse_of_the_same_file_and_its_warnings(monkeypatch, tmp_path, cache):
    path = tmp_path / "c.toml"
    path.write_text('[node]\nstate_dir = "/var/lib/x/{node}"\n[gpu]\nnvml_library = 7\n')  # one bad key
    calls = _parses(monkeypatch)
    first = load(str(path), fail_open=True, node="n1", cache=True)
    again = load(str(path), fail_open=True, node="n2", cache=True)
    assert calls == [str(path)]  # parsed once
    assert again.get("node", "state_dir") == "/var/lib/x/n2" and first.get("node", "state_dir") == "/var/lib/x/n1"
    assert again.warnings == first.warnings and "nvml_library" in again.warnings[0]
    assert again.source == str(path)
    assert load(str(path), fail_open=True, cache=False).get("node", "state_dir").startswith("/var/lib/x/")
    assert calls == [str(path)] * 2  # only the hooks use it


def test_an_edited_or_replaced_file_is_parsed_again(monkeypatch, tmp_path, cache):
    path = tmp_path / "c.toml"
    path.write_text('[node]\nstate_dir = "/a"\n')
    calls = _parses(monkeypatch)
    load(str(path), fail_open=True, cache=True)
    path.write_text('[node]\nstate_dir = "/bb"\n')  # edited in place
    assert load(str(path), fail_open=True, cache=True).get("node", "state_dir") == "/bb"
    new = tmp_path / "new.toml"
    new.write_text('[node]\nstate_dir = "/cc"\n')
    os.replace(new, path)  # how editors and config management write
    assert load(str(path), fail_open=True, cache=True).get("node", "state_dir") == "/cc"
    assert len(calls) == 3


def test_a_file_changed_just_now_is_not_cached(monkeypatch, tmp_path, cache):
    """A same-size rewrite within the same timestamp tick would keep the stat the cache is keyed on."""
    monkeypatch.setattr(config, "RACY_SECONDS", 60.0)
    path = tmp_path / "c.toml"
    path.write_text('[node]\nstate_dir = "/a"\n')
    load(str(path), fail_open=True, cache=True)
    assert list(cache.iterdir()) == []


@pytest.mark.parametrize("spoil", ["group_writable_file", "symlinked_file", "group_writable_dir"])
def test_a_cache_anyone_else_could_write_is_ignored(monkeypatch, tmp_path, cache, spoil):
    path = tmp_path / "c.toml"
    path.write_text('[node]\nstate_dir = "/a"\n')
    load(str(path), fail_open=True, cache=True)
    entry = next(cache.iterdir())
    forged = entry.read_text().replace('"/a"', '"/forged"')
    if spoil == "group_writable_file":
        entry.write_text(forged)
        entry.chmod(0o620)
    elif spoil == "symlinked_file":
        other = tmp_path / "other.json"
        other.write_text(forged)
        other.chmod(0o600)
        entry.unlink()
        entry.symlink_to(other)
    else:
        entry.write_text(forged)
        cache.chmod(0o770)
    calls = _parses(monkeypatch)
    assert load(str(path), fail_open=True, cache=True).get("node", "state_dir") == "/a"
    assert calls == [str(path)]
    entry.unlink()
    if spoil == "group_writable_file":
        entry.write_text(forged)
        entry.chmod(0o600)  # the same forged entry, this user's alone: taken (the cache is as trusted as its owner)
        assert load(str(path), fail_open=True, cache=True).get("node", "state_dir") == "/forged"


def test_a_hook_without_a_usable_cache_directory_still_reads_its_config(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_TRIAGE_CACHE_DIR", str(tmp_path / "not" / "there"))
    monkeypatch.setattr(config, "RACY_SECONDS", 0.0)
    path = tmp_path / "c.toml"
    path.write_text('[node]\nstate_dir = "/a"\n')
    assert load(str(path), fail_open=True, cache=True).get("node", "state_dir") == "/a"
    assert not (tmp_path / "not").exists()
