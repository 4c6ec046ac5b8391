"""Real processes for the procs collector: a fleet that holds sockets, and one fake job rank.

One small helper interpreter forks N children; each child holds a TCP listener on
127.0.0.1 (ephemeral port) and a UNIX socket pair, then sleeps. Forking from one parent
keeps memory low (pages are shared). The helper kills its children by PID when its
stdin closes, so the fleet dies with whoever started it, even on a crash.

    with Fleet(2000, job_id="4242") as fleet:   # fleet.pids: the children
        ...
Run directly to time ``collect()``: ``python bench/procs_fixture.py 2000``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lab"))
from labctl import publisher_pids  # noqa: E402,F401 (what the benches and tests that use this module wait for)

_HELPER = r"""
import ctypes, os, signal, socket, sys
n = int(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
pids = []
ready_r, ready_w = os.pipe()
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the helper
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        pair = socket.socketpair()
        os.close(ready_r)
        os.write(ready_w, b".")
        os.close(ready_w)
        while True:
            signal.pause()
    pids.append(pid)
os.close(ready_w)
got = 0
while got < n:
    b = os.read(ready_r, n - got)
    if not b:
        break
    got += len(b)
sys.stdout.write(" ".join(map(str, pids)) + "\n")
sys.stdout.flush()
sys.stdin.read()
for pid in pids:
    os.kill(pid, signal.SIGKILL)
for pid in pids:
    os.waitpid(pid, 0)
"""


class Fleet:
    """``n`` socket-holding processes, optionally carrying SLURM_JOB_ID in their environment."""

    def __init__(self, n: int, job_id: Optional[str] = None):
        self.n, self.job_id = n, job_id
        self.pids: List[int] = []
        self._helper: Optional[subprocess.Popen] = None

    def __enter__(self) -> "Fleet":
        env = {"PATH": "/usr/bin:/bin"}
        if self.job_id:
            env["SLURM_JOB_ID"] = self.job_id
        self._helper = subprocess.Popen([sys.executable, "-I", "-S", "-c", _HELPER, str(self.n)], env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._helper.stdout is not None
        self.pids = [int(x) for x in self._helper.stdout.readline().split()]
        if len(self.pids) != self.n:
            self.__exit__()
            raise RuntimeError(f"fleet started {len(self.pids)} of {self.n} processes")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._helper is not None:
            assert self._helper.stdin is not None
            self._helper.stdin.close()
            self._helper.wait(60)
            self._helper = None


_RANK = r"""
import ctypes, mmap, os, socket, sys
addr, ipc = sys.argv[1], sys.argv[2]
loaded = [ctypes.CDLL(lib) for lib in sys.argv[3:]]
s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
s.bind((addr, 0))
s.listen(1)
if ipc:
    fd = os.open(ipc, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_NOFOLLOW, 0o600)
    os.ftruncate(fd, 4096)
    seg = mmap.mmap(fd, 4096)
sys.stdout.write("%d\n" % s.getsockname()[1])
sys.stdout.flush()
sys.stdin.read()
"""


class JobProcess:
    """One real process posing as a job rank, as NCCL leaves them behind.

    SLURM_JOB_ID (and SLURMD_NODENAME) in its environment, a TCP listener on ``bind``
    (ephemeral port), optionally an IPC file it creates, keeps open and maps, and
    shared libraries it loads.
    Exits when its stdin closes; the IPC file is removed by its exact path.
    """

    def __init__(self, job_id: Optional[str], bind: str = "127.0.0.1", ipc_path: str = "",
                 node: Optional[str] = None, libs: Sequence[str] = ()):
        self.job_id, self.bind, self.ipc_path, self.node = job_id, bind, ipc_path, node
        self.libs = list(libs)  # shared libraries it dlopen()s, e.g. a copy named libnccl.so.2
        self.pid = self.port = 0
        self._proc: Optional[subprocess.Popen] = None

    def __enter__(self) -> "JobProcess":
        env = {"PATH": "/usr/bin:/bin"}
        if self.job_id:
            env["SLURM_JOB_ID"] = self.job_id
        if self.node:
            env["SLURMD_NODENAME"] = self.node
        self._proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _RANK, self.bind, self.ipc_path, *self.libs],
                                      env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.strip().isdigit():
            self.__exit__()
            raise RuntimeError(f"job process did not start: {line!r}")
        self.pid, self.port = self._proc.pid, int(line)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
            self._proc = None
        if self.ipc_path and os.path.lexists(self.ipc_path):
            os.unlink(self.ipc_path)

_IN_NETNS = r"""
import json, sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/bench"]
from procs_fixture import JobProcess
from slurm_triage.collect import procs
from slurm_triage.config import Config, defaults
values = defaults()
values["node"]["name"] = "thisnode"
values["procs"].update(json.loads(sys.argv[3]))
with JobProcess(sys.argv[2], bind="0.0.0.0") as rank:
    facts = procs.collect(Config(values))
print(json.dumps({"pid": rank.pid, "port": rank.port, "procs": facts}))
"""


def wildcard_listener_facts(job_id: str, procs_keys: Dict[str, Any]) -> Optional[Tuple[Dict[str, Any], int, int]]:
    """``procs.collect`` with a job rank listening on 0.0.0.0, both inside a network namespace made for
    the call (``unshare --net``: only a loopback that is down), so the wildcard listener reaches
    nobody. Returns (procs facts, rank pid, port); None where no namespace can be made (not root,
    no unshare, a container that forbids it)."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        return None
    if subprocess.run([unshare, "--net", "--", "true"], capture_output=True, timeout=30).returncode != 0:
        return None
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([unshare, "--net", "--", sys.executable, "-I", "-c", _IN_NETNS, root, job_id,
                          json.dumps(procs_keys)], capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        raise RuntimeError(f"collect in a network namespace failed ({run.returncode}): {run.stderr[-2000:]}")
    out = json.loads(run.stdout)
    return out["procs"], out["pid"], out["port"]


def _main() -> None:
    import statistics
    import time

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from slurm_triage.collect import procs
    from slurm_triage.config import load

    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    job = sys.argv[2] if len(sys.argv) > 2 else None
    cfg = load()

    def timed() -> List[float]:
        out = []
        for _ in range(7):
            t = time.perf_counter()
            procs.collect(cfg)
            out.append(time.perf_counter() - t)
        return out

    base = timed()
    with Fleet(n, job) as fleet:
        t0 = time.perf_counter()
        loaded = timed()
        listed = len(procs.collect(cfg)["processes"])
        print(f"fleet of {len(fleet.pids)} started; timing took {time.perf_counter() - t0:.1f} s")
    print(f"collect() median: baseline {statistics.median(base) * 1e3:.1f} ms, "
          f"+{n} processes (job_id={job}) {statistics.median(loaded) * 1e3:.1f} ms, {listed} listed")


if __name__ == "__main__":
    _main()
