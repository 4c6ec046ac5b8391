"""Config: schema validation with file/key/line, search order, fail-open, the example file."""
from __future__ import annotations


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
