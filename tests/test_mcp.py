"""The MCP server, driven by the SDK's own client over stdio and HTTP, and its guard on hostile input."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List

import pytest

from conftest import ROOT, free_port
from slurm_triage.config import load
from slurm_triage.mcp import guard
from slurm_triage.mcp.tools import MAX_ANSWER_BYTES, Tools, bound

mcp = pytest.importorskip("mcp", reason="the MCP SDK (pip install '.[mcp]', Python >= 3.10) is not installed")
anyio = pytest.importorskip("anyio")

CASE = ROOT / "tests" / "corpus" / "nccl-1405-ib-retry-exceeded" / "log.txt"
HOSTILE_JOBS = ["1;id", "$(id)", "../../etc", "`id`", "1\n2", "", "-1", "1 2", "x" * (10 << 20)]


# ---- the guard, pure --------------------------------------------------------------------------

@pytest.mark.parametrize("argv, ok", [
    (["/usr/bin/sacct", "-j", "5"], True),
    (["/usr/bin/scontrol", "show", "job", "5"], True),
    (["/usr/bin/scontrol", "-o", "show", "node"], True),
    (["/usr/bin/scontrol", "update", "nodename=n1", "state=resume"], False),
    (["/usr/bin/scancel", "5"], False),
    (["/bin/sh", "-c", "id"], False),
    (["sacct", "-j", "5"], False),                       # not by absolute path
    (["/tmp/sacct", "-j", "5"], False),                  # a user's directory
    (["/usr/bin/grep", "-a", "-n", "-F", "x", "--", "f"], True),
])
def test_allowlist(argv: List[str], ok: bool) -> None:
    assert (guard.allowed_command(None, argv) is None) is ok


def test_audit_hook_refuses_a_subprocess_outside_the_allowlist() -> None:
    code = ("import subprocess; from slurm_triage.mcp import guard; guard.install()\n"
            "out = subprocess.run(['/usr/bin/sinfo', '--version'], capture_output=True)\n"
            "for argv in (['/usr/bin/scontrol', 'update', 'nodename=x'], ['/bin/sh', '-c', 'touch /tmp/pwned'],\n"
            "             ['/usr/bin/id']):\n"
            "    try:\n        subprocess.run(argv)\n        print('RAN', argv)\n"
            "    except guard.GuardError as e:\n        print('REFUSED', e)\n"
            "import os\ntry:\n    os.system('id')\n    print('RAN system')\nexcept guard.GuardError:\n    print('REFUSED system')\n")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=60)
    assert "RAN" not in cp.stdout, cp.stdout
    assert cp.stdout.count("REFUSED") == 4, cp.stdout + cp.stderr


def test_a_slurm_outside_usr_bin_is_trusted_only_where_no_one_else_may_write(tmp_path: Path) -> None:
    """A Slurm built under a prefix (docs/slurm-24.11.md) is named by the config; its directory is trusted
    when root owns it and neither group nor others may write to it."""
    if os.geteuid() != 0:
        pytest.skip("the directory must be root's: run as root (CI does); the rule is pure and tested below")
    good, loose = tmp_path / "opt-slurm" / "bin", tmp_path / "shared" / "bin"
    for d in (good, loose):
        d.mkdir(parents=True)
        shutil.copy("/bin/true", d / "sinfo")
    good.chmod(0o755)
    loose.chmod(0o777)
    under_loose = loose / "sub"
    under_loose.mkdir()
    under_loose.chmod(0o755)  # its own mode is fine, but others may swap it: the directory above is theirs
    dirs = guard.trusted_dirs([str(good / "sinfo"), str(loose / "sinfo"), str(under_loose / "sinfo"), "sacct",
                               "/nonexistent/bin/sacct", ""])
    assert str(good) in dirs and str(loose) not in dirs and str(under_loose) not in dirs
    assert "/nonexistent/bin" not in dirs and len(dirs) == len(guard.trusted_dirs([])) + 1
    assert guard.allowed_command(None, [str(good / "sinfo")], dirs) is None
    assert guard.allowed_command(None, [str(good / "sinfo")]) is not None  # not without the config naming it
    code = (f"import subprocess; from slurm_triage.mcp import guard; guard.install({dirs!r})\n"
            f"print(subprocess.run([{str(good / 'sinfo')!r}]).returncode)\n"
            f"try:\n    subprocess.run([{str(loose / 'sinfo')!r}])\n    print('RAN')\n"
            "except guard.GuardError as e:\n    print('REFUSED', e)\n")
    cp = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=60)
    assert cp.stdout.splitlines()[0] == "0" and "REFUSED" in cp.stdout and "RAN" not in cp.stdout, cp.stdout + cp.stderr


@pytest.mark.parametrize("job", HOSTILE_JOBS)
def test_hostile_job_ids_are_tool_errors(job: str) -> None:
    tools = Tools(load(None))
    with pytest.raises(guard.GuardError) as e:
        tools.triage_job(job)
    assert "not a Slurm job id" in str(e.value) and len(str(e.value)) < 200


@pytest.mark.parametrize("node", ["node1\nnode2", "-n", "../x", "a b", "$(id)", "x" * 100])
def test_hostile_node_names(node: str) -> None:
    with pytest.raises(guard.GuardError):
        Tools(load(None)).node_history(node)


def test_hostile_paths(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    loop = tmp_path / "loop"
    os.symlink(loop, loop)
    tools = Tools(load(None))
    for p, why in (("/dev/zero", "not a regular file"), (str(fifo), "not a regular file"),
                   (str(loop), "Too many levels"), (str(tmp_path), "not a regular file"),
                   ("/nonexistent/x", "No such file"), ("a\x00b", "not a path")):
        t0 = time.monotonic()
        with pytest.raises(guard.GuardError) as e:
            tools.scan_logs([p])
        assert why in str(e.value) and time.monotonic() - t0 < 2, (p, e.value)


def test_unknown_choices_and_bounds() -> None:
    tools = Tools(load(None))
    with pytest.raises(guard.GuardError, match="source must be one of"):
        tools.get_evidence("5", "shell")
    with pytest.raises(guard.GuardError, match="metric must be one of"):
        tools.query_metrics("5", 'up{job="x"} or vector(1)')
    big = {"lines": [f"line {i} " + "x" * 100 for i in range(5000)], "summary": "s"}
    out = bound(big)
    assert len(json.dumps(out)) <= MAX_ANSWER_BYTES and out["truncated"] == {"lines": 5000}
    assert out["lines"][0].startswith("line 0")


# ---- real client, stdio -----------------------------------------------------------------------

def _stdio_params(env: Dict[str, str]) -> Any:
    from mcp.client.stdio import StdioServerParameters

    return StdioServerParameters(command=sys.executable, args=["-m", "slurm_triage", "mcp"], cwd=str(ROOT),
                                 env=env)


def _env() -> Dict[str, str]:
    keep = ("SLURM_CONF", "SLURM_TRIAGE_CONFIG", "PATH", "HOME", "LANG")
    return {k: os.environ[k] for k in keep if k in os.environ}


def test_stdio_lists_read_only_tools_and_answers() -> None:
    from mcp import Client

    async def main() -> Dict[str, Any]:
        async with Client(_stdio_params(_env())) as c:
            tools = (await c.list_tools()).tools
            scan = await c.call_tool("scan_logs", {"paths": [str(CASE)]})
            bad = await c.call_tool("triage_job", {"job_id": "$(id)"})
            zero = await c.call_tool("scan_logs", {"paths": ["/dev/zero"]})
            topics = await c.call_tool("describe", {"topic": "topics"})
            prompt = await c.get_prompt("investigate-job", {"job_id": "42"})
            return {"tools": tools, "scan": scan, "bad": bad, "zero": zero, "topics": topics, "prompt": prompt}

    r = anyio.run(main)
    names = {t.name for t in r["tools"]}
    assert names == {"triage_job", "get_evidence", "node_history", "query_metrics", "scan_logs", "describe"}
    for t in r["tools"]:
        a = t.annotations
        assert a.read_only_hint is True and a.idempotent_hint is True and a.destructive_hint is False, t.name
    assert not r["scan"].is_error and r["scan"].structured_content["files"][0]["bytes"] == CASE.stat().st_size
    assert r["bad"].is_error and "not a Slurm job id" in r["bad"].content[0].text
    assert r["zero"].is_error and "not a regular file" in r["zero"].content[0].text
    assert "collective_hang" in r["topics"].structured_content["categories"]
    assert "triage_job('42')" in r["prompt"].messages[0].content.text


def test_triage_alias_serves_mcp() -> None:
    cp = subprocess.run([sys.executable, "-c", "import sys; from slurm_triage.cli import triage_main; "
                         "sys.exit(triage_main(['mcp', '--help']))"], capture_output=True, text=True, cwd=str(ROOT))
    assert cp.returncode == 0 and "Model Context Protocol" in cp.stdout


# ---- real client, streamable HTTP ---------------------------------------------------------------

class _HttpServer:
    def __init__(self, tmp: Path, token: str, host: str = "127.0.0.1"):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        tf = tmp / "token"
        tf.write_text(token + "\n")
        tf.chmod(0o600)
        self.proc = subprocess.Popen([sys.executable, "-m", "slurm_triage", "mcp", "--http", "--host", host,
                                      "--port", str(self.port), "--token-file", str(tf)], cwd=str(ROOT),
                                     env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(self.proc.stderr.read().decode())
                time.sleep(0.1)
        raise RuntimeError("mcp --http did not listen")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


@pytest.fixture
def http_server(tmp_path: Path):
    srv = _HttpServer(tmp_path, "s3cret-token-for-tests")
    yield srv
    srv.stop()


def _init_body() -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}).encode()


def _post(url: str, headers: Dict[str, str]) -> int:
    import requests

    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers}
    return requests.post(url, data=_init_body(), headers=h, timeout=10, stream=True).status_code


def test_http_requires_the_token_and_a_local_host_header(http_server: _HttpServer) -> None:
    auth = {"Authorization": "Bearer s3cret-token-for-tests"}
    assert _post(http_server.url, {}) == 401
    assert _post(http_server.url, {"Authorization": "Bearer wrong"}) == 401
    assert _post(http_server.url, {**auth, "Host": "evil.example:80"}) in (403, 421)
    assert _post(http_server.url, {**auth, "Origin": "http://evil.example"}) == 403
    assert _post(http_server.url, auth) == 200


def test_http_client_with_token_lists_tools(http_server: _HttpServer) -> None:
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async def main() -> List[str]:
        http = create_mcp_http_client(headers={"Authorization": "Bearer s3cret-token-for-tests"})
        async with http, Client(streamable_http_client(http_server.url, http_client=http)) as c:
            return [t.name for t in (await c.list_tools()).tools]

    assert "triage_job" in anyio.run(main)


def test_http_refuses_a_public_bind_without_token(tmp_path: Path) -> None:
    cp = subprocess.run([sys.executable, "-m", "slurm_triage", "mcp", "--http", "--host", "0.0.0.0",
                         "--port", str(free_port())], cwd=str(ROOT), env=_env(), capture_output=True, text=True,
                        timeout=30)
    assert cp.returncode == 2 and "not a loopback address" in cp.stderr and "token" in cp.stderr
