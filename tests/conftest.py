"""Shared fixtures: the fake NVML library, a real Pushgateway, config files, the CLI."""
from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
FAKENVML = ROOT / "tests" / "fakenvml"
SCENARIOS = FAKENVML / "scenarios"


@pytest.fixture(autouse=True)
def private_state_dirs(request, tmp_path_factory, monkeypatch):
    """Defaults point at /var/lib and /var/spool: tests get their own, never the machine's."""
    from slurm_triage import config

    if request.module.__name__ == "test_config":
        return  # it checks the real defaults and never writes state

    base = tmp_path_factory.mktemp("defaults")
    for key, sub in (("state_dir", "state"), ("spool_dir", "spool")):
        monkeypatch.setitem(config.SCHEMA["node"], key,
                            config.SCHEMA["node"][key]._replace(default=str(base / sub)))


@pytest.fixture(scope="session")
def fakenvml_lib() -> Path:
    """Build tests/fakenvml with make (gcc) once per session; the .so's absolute path."""
    if shutil.which("gcc") is None or shutil.which("make") is None:
        pytest.skip("gcc/make not installed: the fake NVML cannot be built")
    subprocess.run(["make", "-s", "-C", str(FAKENVML)], check=True)
    lib = FAKENVML / "build" / "libnvidia-ml.so.1"
    assert lib.exists()
    return lib


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, seconds: float) -> bool:
    import requests

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if requests.get(url, timeout=0.5).status_code == 200:
                return True
        except requests.RequestException:
            pass
        time.sleep(0.05)
    return False


class Pushgateway:
    """A real prometheus-pushgateway on 127.0.0.1, which tests may stop and restart."""

    def __init__(self, binary: str, workdir: Path):
        self.binary, self.workdir = binary, workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-admin-api",
             f"--persistence.file={self.workdir / 'pgw.state'}"],
            stdout=subprocess.DEVNULL, stderr=open(self.workdir / "pgw.log", "ab"))
        if not _wait_http(self.url + "/-/ready", 10):
            raise RuntimeError("pushgateway did not become ready")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None

    def groups(self) -> List[Dict]:
        import requests

        return requests.get(self.url + "/api/v1/metrics", timeout=5).json()["data"]

    def wipe(self) -> None:
        import requests

        r = requests.put(self.url + "/api/v1/admin/wipe", timeout=5)
        assert r.status_code == 202, f"wipe failed: {r.status_code} {r.text}"


@pytest.fixture(scope="session")
def pushgateway_server(tmp_path_factory) -> Iterator[Pushgateway]:
    binary = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
    if binary is None:
        pytest.skip("prometheus-pushgateway not installed (apt-get install prometheus-pushgateway)")
    pg = Pushgateway(binary, tmp_path_factory.mktemp("pushgateway"))
    pg.start()
    yield pg
    pg.stop()


@pytest.fixture
def pushgateway(pushgateway_server: Pushgateway) -> Iterator[Pushgateway]:
    """The session's Pushgateway, running and empty at the start of the test."""
    if pushgateway_server.proc is None:
        pushgateway_server.start()
    pushgateway_server.wipe()
    yield pushgateway_server
    if pushgateway_server.proc is None:
        pushgateway_server.start()


@pytest.fixture
def write_config(tmp_path: Path) -> Callable[[str], Path]:
    """Write TOML text to a file in tmp_path and return its path."""

    def write(text: str, name: str = "config.toml") -> Path:
        p = tmp_path / name
        p.write_text(text)
        return p

    return write


def cli(*args: str, env: Optional[Dict[str, str]] = None, timeout: float = 60,
        check: bool = False) -> subprocess.CompletedProcess:
    """Run `python -m slurm_triage` as a real subprocess (fresh interpreter, real exit code)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "slurm_triage", *args], env=full_env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=timeout, check=check)


_LAB_FIXTURES = ("lab", "plugged")


@pytest.fixture(autouse=True)
def lab_turn(request):
    """A test module that uses the lab holds it only while its tests run (module fixtures may keep
    faults in place across them), so the pytest sessions of several developers, or CI's and a
    developer's, interleave module by module instead of waiting for whole runs."""
    import lab as labmod

    if any(name in request.fixturenames for name in _LAB_FIXTURES) and labmod.find() is not None:
        labmod.take_turn()
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    yield  # the module's fixtures are finalized (and the lab reset) inside
    if nextitem is None or nextitem.module is not item.module:
        import lab as labmod

        labmod.end_turn()


@pytest.fixture
def lab():
    """The running Slurm lab (else a skip saying how to start it), reset before and after."""
    import lab as labmod

    the_lab = labmod.require()
    the_lab.reset()
    yield the_lab
    the_lab.reset()


@contextmanager
def serving(handler: type) -> Iterator[str]:
    """A threaded HTTP server on 127.0.0.1 (a free port) with ``handler``: its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
