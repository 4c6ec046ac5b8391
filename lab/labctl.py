"""Drive the local Slurm lab (`make lab-up`) from Python: the demo and the integration tests.

The lab is found through $LAB_DIR/env.sh (LAB_DIR defaults to /tmp/slurm-lab). Jobs run as
the unprivileged user `triage-test`, as on a real cluster, and every wait has a deadline.
"""
from __future__ import annotations

import json
import os
import pwd
import shlex
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional

ROOT = Path(__file__).resolve().parent.parent
# LAB_USER (env.sh of a second lab on the machine, lab/common.sh): that lab's own jobs' user
TEST_USER = os.environ.get("LAB_USER") or "triage-test"
DEFAULT_SCENARIO = "h100x8-idle.json"
TERMINAL_JOB_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                       "BOOT_FAIL", "DEADLINE", "PREEMPTED")
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# A rank that escapes its job (new session, reparented to init: proctrack/linuxproc loses it)
# and keeps a TCP listener and, optionally, a /dev/shm segment, as a crashed torchrun leaves
# them. argv: pidfile host port [shm]; it writes "pid port" to pidfile once ready.
ESCAPED_RANK = r"""
import os, socket, sys, time
out, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if os.fork():
    os._exit(0)
os.setsid()
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((host, port)); s.listen(8)
if len(sys.argv) > 4:
    fd = os.open(sys.argv[4], os.O_CREAT | os.O_RDWR, 0o600); os.ftruncate(fd, 1 << 20)
with open(out + ".tmp", "w") as fh:
    fh.write(f"{os.getpid()} {s.getsockname()[1]}")
os.rename(out + ".tmp", out)
time.sleep(600)
"""


def lab_dir() -> Path:
    return Path(os.environ.get("LAB_DIR") or "/tmp/slurm-lab")


def read_env(path: Path) -> Dict[str, str]:
    """The `export K=V` lines of env.sh (written by lab/up.sh) as a dict."""
    env: Dict[str, str] = {}
    for line in path.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            key, _, value = words[1].partition("=")
            env[key] = value
    return env


class Lab:
    """A running lab: its paths, URLs and Slurm commands run as root or as the test user."""

    def __init__(self, env: Dict[str, str]):
        self.env = env
        self.dir = Path(env["LAB_DIR"])
        self.slurm_conf = env["SLURM_CONF"]
        self.pushgateway_url = env["PUSHGATEWAY_URL"]
        self.prometheus_url = env["PROMETHEUS_URL"]
        self.triage_config = Path(env["SLURM_TRIAGE_CONFIG"])
        # what the hooks and the SPANK plugin run: this checkout, or lab/up.sh's copy of it
        self.checkout = Path(env.get("LAB_CHECKOUT") or ROOT)
        self.workdir = self.dir / "work"
        self.nodes: List[str] = sorted(p.name for p in (self.dir / "nodes").iterdir())

    # -- running commands ------------------------------------------------------------
    def run(self, *argv: str, user: Optional[str] = TEST_USER, timeout: float = 60,
            check: bool = False, extra_env: Optional[Dict[str, str]] = None) -> subprocess.CompletedProcess:
        """Run a command with a clean env holding SLURM_CONF, in the lab's work dir.

        `user` (default: the test user) takes effect when we are root; `user=None` runs as
        ourselves. Jobs inherit this env, so nothing from pytest's environment leaks in.
        """
        env = {"PATH": _PATH, "LANG": "C.UTF-8", "SLURM_CONF": self.slurm_conf}
        env.update(extra_env or {})
        cmd = ["env", "-i"] + [f"{k}={v}" for k, v in env.items()] + list(argv)
        if user is not None and os.geteuid() == 0:
            cmd = ["runuser", "-u", user, "--"] + cmd
        return subprocess.run(cmd, cwd=str(self.workdir), capture_output=True, text=True,
                              timeout=timeout, check=check)

    def srun(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.run("srun", *args, **kw)

    def sbatch(self, *args: str, **kw) -> int:
        """Submit with `sbatch --parsable ARGS`; the job id."""
        out = self.run("sbatch", "--parsable", *args, check=True, **kw).stdout
        return int(out.strip().split(";")[0])

    def scontrol(self, *args: str, timeout: float = 30) -> str:
        """`scontrol ARGS` as root (admin commands such as update/resume); stdout."""
        return self.run("scontrol", *args, user=None, timeout=timeout, check=True).stdout

    # -- nodes -------------------------------------------------------------------------
    def node_info(self, node: str) -> Dict[str, str]:
        """`scontrol show node -o NODE` as a dict (State=IDLE+DRAIN, Reason=..., ...)."""
        return _parse_oneliner(self.scontrol("show", "node", "-o", node))

    def node_state(self, node: str) -> str:
        """Slurm's state words, e.g. 'IDLE', 'IDLE+DRAIN', 'ALLOCATED', 'DOWN+NOT_RESPONDING'."""
        return self.node_info(node)["State"]

    def wait_node(self, node: str, predicate: Callable[[str], bool], timeout: float = 30) -> str:
        """Poll node_state until predicate(state) holds; the state, or AssertionError."""
        return _wait(lambda: self.node_state(node), predicate, timeout, f"node {node}")

    def wait_idle(self, nodes: Optional[Iterable[str]] = None, timeout: float = 30, published: bool = True) -> None:
        """Wait until the nodes are plain IDLE (no DRAIN, COMPLETING, ...) and, with ``published``,
        no hook publisher runs: an OK hook's push is made by its detached publisher just after
        the hook, and what a caller reads of the gateway after a job must find it."""
        for node in nodes or self.nodes:
            self.wait_node(node, lambda s: s == "IDLE", timeout)
        if published:
            self.wait_published(timeout)

    def wait_published(self, timeout: float = 30) -> None:
        """Wait until no hook publisher runs (what an OK hook pushes leaves after the hook)."""
        _wait(publisher_pids, lambda pids: not pids, timeout, "hook publishers")

    def resume(self, node: str) -> None:
        """Return a drained/down node to service (no-op error if it already is)."""
        self.run("scontrol", "update", f"nodename={node}", "state=resume", user=None)

    def node_dir(self, node: str) -> Path:
        """$LAB_DIR/nodes/NODE: nvml/, state/, spool/, kernel.log."""
        return self.dir / "nodes" / node

    def scenario(self, node: str) -> str:
        """File name of the fake-GPU scenario NODE uses (target of nvml/scenario.json)."""
        return Path(os.readlink(self.node_dir(node) / "nvml" / "scenario.json")).name

    def set_scenario(self, node: str, scenario: str) -> None:
        """Switch NODE to SCENARIO (name or path) and its recorded kernel log (lab/set-scenario)."""
        subprocess.run([str(ROOT / "lab" / "set-scenario"), node, scenario], check=True,
                       capture_output=True, text=True, env={**os.environ, "LAB_DIR": str(self.dir)})

    def train(self, mode: str, seconds: float, nodes: str = "node1,node2", during: Optional[Callable[[], Any]] = None,
              extra: Iterable[str] = (), triage: bool = True, scrapes: int = 1, timeout: float = 90) -> str:
        """The training stand-in (lab/workload/train.py) as a 2-node job of one rank per node,
        `srun --triage` by default; `during()` runs 1 s after the ranks started (a fault injected
        mid-job: the Prologs are done). The job runs at least `seconds` and until Prometheus holds
        `scrapes` samples of every node's step time (and, with --triage, of its watcher's series),
        whatever the scrape interval's phase and the machine's load. Each rank pushes the mean
        step time of its last 50 steps or 1 s, whichever is shorter: one scrape reads a stable
        figure. Returns the job id once the job's nodes are done."""
        names = nodes.split(",")
        self.wait_idle(names)
        stop = self.workdir / f"stop-{os.getpid()}-{time.monotonic_ns()}"
        train = str(self.checkout / "lab" / "workload" / "train.py")
        argv = ["runuser", "-u", TEST_USER, "--", "env", "-i", "PATH=/usr/bin:/bin", f"SLURM_CONF={self.slurm_conf}",
                "srun"] + (["--triage"] if triage else []) + [
                "-N2", "-n2", "-w", nodes, "-t", "5", "/usr/bin/python3", train, "--mode", mode, "--steps", "100000000",
                "--seconds", str(seconds), "--until-file", str(stop), "--pushgateway", self.pushgateway_url,
                "--bytes", "200000", "--work", "100000", "--log-every", "50", "--log-seconds", "1", *extra]
        proc = subprocess.Popen(argv, cwd=str(self.workdir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: List[str] = []

        def read() -> None:
            for line in proc.stdout or ():
                lines.append(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        metrics = ["tb_perf_step_time_seconds"] + (["slurm_triage_watch_threads"] if triage else [])

        def started() -> str:  # the job id once rank 0 logged its start; "-" if srun ended before
            found = [ln.split("job=", 1)[1].split()[0] for ln in list(lines) if "[rank0] start " in ln]
            return found[0] if found else ("" if proc.poll() is None else "-")

        def enough(job: str) -> bool:
            return proc.poll() is not None or all(self.scraped(m, job, names, scrapes) for m in metrics)

        try:
            job = _wait(started, bool, timeout, "the ranks' start")
            if job != "-":
                if during:
                    time.sleep(1)
                    during()
                _wait(lambda: enough(job), bool, timeout, f"{scrapes} scrape(s) of {metrics} of job {job} on {nodes}")
        finally:
            stop.touch()
            try:
                proc.wait(timeout=120)
            finally:
                reader.join(5)
                stop.unlink()
        if proc.returncode:
            raise RuntimeError(f"training job failed ({proc.returncode}): {''.join(lines).strip()[-500:]}")
        for n in names:
            self.wait_node(n, lambda s: "COMPLETING" not in s)
        return job

    def prom(self, query: str) -> List[Dict[str, Any]]:
        """An instant PromQL query against the lab's Prometheus: the result vector."""
        url = self.prometheus_url + "/api/v1/query?" + urllib.parse.urlencode({"query": query})
        with urllib.request.urlopen(url, timeout=10) as r:
            return json.load(r)["data"]["result"]

    def scraped(self, metric: str, job: str, nodes: Iterable[str], n: int = 1) -> bool:
        """Prometheus holds at least n samples of the job's `metric` for every one of the nodes."""
        res = self.prom(f'min by (instance) (count_over_time({metric}{{slurm_job_id="{job}"}}[10m]))')
        have = {r["metric"].get("instance"): float(r["value"][1]) for r in res}
        return all(have.get(node, 0) >= n for node in nodes)

    def set_rdma(self, node: str, *assignments: str, reset: bool = False) -> None:
        """Advance NODE's InfiniBand counters (``symbol_error+=5``, ``link_downed=1``: lab/set-rdma)."""
        argv = [str(ROOT / "lab" / "set-rdma"), node] + (["--reset"] if reset else []) + list(assignments)
        subprocess.run(argv, check=True, capture_output=True, text=True, env={**os.environ, "LAB_DIR": str(self.dir)})

    def reset(self, timeout: float = 30) -> None:
        """Default scenario and quiet RDMA counters everywhere, no jobs, every node resumed and IDLE."""
        self.run("scancel", "-u", TEST_USER, user=None)
        for node in self.nodes:
            if self.scenario(node) != DEFAULT_SCENARIO:
                self.set_scenario(node, DEFAULT_SCENARIO)
            self.set_rdma(node, reset=True)
        # An Epilog still running from a faulty scenario may drain again after a resume:
        # resume only once nothing is completing.
        for node in self.nodes:
            self.wait_node(node, lambda s: "COMPLETING" not in s, timeout)
            if any(w in self.node_state(node) for w in ("DRAIN", "DOWN", "FAIL")):
                self.resume(node)
        self.wait_idle(timeout=timeout)
        self.kill_user_processes()

    @contextmanager
    def escaped_process(self, node: str, host: str = "127.0.0.1", port: int = 0,
                        shm: str = "") -> Iterator[Dict[str, Any]]:
        """A job on NODE leaves an escaped process behind (listener on host:port, optional
        shm file); yields {job, pid, port, shm} and kills it and removes its files after."""
        tag = f"{os.getpid()}-{time.monotonic_ns()}"
        out, script = self.workdir / f"escaped-{tag}", self.workdir / f"escaped-{tag}.py"
        script.write_text(ESCAPED_RANK)
        os.chmod(script, 0o644)
        pid = 0
        try:
            r = self.srun("-N1", "-w", node, "sh", "-c",
                          f"echo $SLURM_JOB_ID; /usr/bin/python3 {script} {out} {host} {port} {shm} "
                          f"</dev/null >/dev/null 2>&1; while [ ! -e {out} ]; do sleep 0.05; done", timeout=60)
            if r.returncode != 0:
                raise RuntimeError(f"srun on {node} failed: {r.stderr.strip()}")
            pid, bound = map(int, out.read_text().split())
            yield {"job": int(r.stdout.split()[0]), "pid": pid, "port": bound, "shm": shm}
        finally:
            if pid:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            for p in (shm, str(out), str(script)):
                if p and os.path.lexists(p):
                    os.unlink(p)

    @contextmanager
    def config(self, extra: str = "", replace: str = "") -> Iterator[None]:
        """Append to (or replace) the lab's slurm-triage config while the block runs; srun,
        slurmstepd and the hooks read it afresh for every job."""
        saved = self.triage_config.read_text()
        self.triage_config.write_text(replace if replace else saved + "\n" + extra)
        try:
            yield
        finally:
            self.triage_config.write_text(saved)

    def kill_user_processes(self) -> List[int]:
        """SIGKILL, by pid, what the test user still runs with no job left (leftovers that
        tests and the demo provoke on purpose, or a failed launch left); the pids."""
        uid = pwd.getpwnam(TEST_USER).pw_uid
        killed = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                if os.stat(f"/proc/{d}").st_uid != uid:
                    continue
                os.kill(int(d), signal.SIGKILL)
                killed.append(int(d))
            except (OSError, ProcessLookupError):
                continue
        return killed

    # -- jobs --------------------------------------------------------------------------
    def job_info(self, job_id: int) -> Dict[str, str]:
        """`scontrol show job -o ID` as a dict (JobState, Reason, ExitCode, NodeList, ...)."""
        return _parse_oneliner(self.scontrol("show", "job", "-o", str(job_id)))

    def wait_job(self, job_id: int, states: Iterable[str] = TERMINAL_JOB_STATES,
                 timeout: float = 60) -> Dict[str, str]:
        """Poll until JobState is one of `states`; the job's info."""
        wanted = tuple(states)
        info: Dict[str, str] = {}

        def poll() -> str:
            info.update(self.job_info(job_id))
            return info["JobState"]

        _wait(poll, lambda s: s in wanted, timeout, f"job {job_id}")
        return info

    def sacct(self, job_id: int, fields: str = "JobID,JobName,User,State,ExitCode,NodeList") -> List[Dict[str, str]]:
        """Accounting rows (job and steps) for JOB_ID from slurmdbd."""
        out = self.run("sacct", "-n", "-P", "-j", str(job_id), "-o", fields, user=None, check=True).stdout
        names = fields.split(",")
        return [dict(zip(names, line.split("|"))) for line in out.splitlines() if line]

    # -- daemons -----------------------------------------------------------------------
    def daemon_pids(self) -> Dict[str, int]:
        """name -> pid of every lab daemon alive, from the pid files lab/up.sh keeps."""
        files = {"munged": self.dir / "munge" / "munged.pid"}
        files.update({p.name[:-4]: p for p in (self.dir / "run").glob("*.pid")})
        pids: Dict[str, int] = {}
        for name, path in files.items():
            try:
                pid = int(path.read_text().split()[0])
                os.kill(pid, 0)
            except (OSError, ValueError, IndexError):
                continue
            pids[name] = pid
        return pids


def _parse_oneliner(text: str) -> Dict[str, str]:
    """`scontrol show ... -o` output: space-separated Key=Value (values may not contain '=')."""
    out: Dict[str, str] = {}
    key = ""
    for word in text.strip().split(" "):
        if "=" in word:
            key, _, value = word.partition("=")
            out[key] = value
        elif key:  # a value with spaces, e.g. Reason=Prolog error [root@...]
            out[key] += " " + word
    return out


def publisher_pids() -> List[int]:
    """PIDs of running hook publishers (``python -I -m slurm_triage.hooks.publish``)."""
    out = []
    for d in os.listdir("/proc"):
        try:
            if d.isdigit() and b"slurm_triage.hooks.publish" in open(f"/proc/{d}/cmdline", "rb").read():
                out.append(int(d))
        except OSError:
            pass
    return out


def _wait(poll: Callable[[], Any], predicate: Callable[[Any], bool], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    value = poll()
    while not predicate(value):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still {value!r} after {timeout}s")
        time.sleep(0.2)
        value = poll()
    return value


def find() -> Optional[Lab]:
    """The running lab, or None (no env.sh, or slurmctld does not answer)."""
    env_file = lab_dir() / "env.sh"
    if not env_file.is_file():
        return None
    lab = Lab(read_env(env_file))
    try:
        ping = lab.run("scontrol", "ping", user=None, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return lab if ping.returncode == 0 and "UP" in ping.stdout else None
