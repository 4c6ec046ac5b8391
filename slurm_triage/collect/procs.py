"""Processes, sockets and IPC files that jobs leave behind, read straight from /proc.

One pass over /proc: stat, owner, fd links and cgroup for every process; the costly
files (environ, maps, cmdline) only for the few candidates. Direct reads beat psutil
here (no 55 ms import, no per-process objects) and keep the cost linear in
processes + fds. Sockets are joined to processes through ``socket:[inode]`` fd links.
IPC files are lstat-ed, never opened and never followed.

Everything here is bounded against a hostile user: at most MAX_IPC_SCAN entries of each
directory are looked at and at most MAX_IPC_FILES of them are listed (the rest are counted
in ``ipc_files_omitted``); names, titles and command lines are stored ``printable`` (a
name that is not, e.g. one with byte 0xff, keeps its exact bytes in ``raw_name``, hex,
for the clean-up); job ids and node names from an environment must have their closed form.
"""
from __future__ import annotations

import os
import stat as stat_mod
import sys
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from ..config import Config
from ..ids import is_job_id, is_node
from ..printable import printable
from . import jobs

try:  # the C module socket.py wraps: inet_ntop is all the scan needs, and socket.py's enums cost ~12 ms of CPU
    import _socket as socket
except ImportError:  # an interpreter without it
    import socket  # type: ignore[no-redef]

PROC = "/proc"
CMDLINE_MAX = 512
# Substrings of mapped library paths -> the communication stack they reveal.
LIBS = ((b"/libnccl", "nccl"), (b"/libmpi", "mpi"), (b"/libucp", "ucx"), (b"/libpsm2", "psm2"))
# Name prefixes of IPC files left in /dev/shm or /tmp -> the stack that creates them.
IPC_KINDS = (("nccl-", "nccl"), ("vader_segment.", "mpi"), ("sm_segment.", "mpi"), ("ompi.", "mpi"),
             ("openmpi-sessions-", "mpi"), ("ucx_", "ucx"), ("psm2_shm.", "psm2"),
             ("torch_", "torch"), ("torchelastic_", "torch"))
_IPC_PREFIXES = tuple(prefix for prefix, _ in IPC_KINDS)
_IPC_PREFIX_BYTES = tuple(prefix.encode() for prefix in _IPC_PREFIXES)
"""The prefixes at C speed: most names in /tmp and /dev/shm are no IPC file and go at one startswith."""
TCP_LISTEN = "0A"
WILDCARDS = ("0.0.0.0", "::")
"""Listening on every address: what the listener check reports (a loopback bind is private)."""
STEPD_EXECUTABLES = ("slurmstepd", "slurmstepd-wlm")
"""File names of the real slurmstepd (Debian's slurm-wlm installs /usr/sbin/slurmstepd-wlm)."""
MAX_IPC_SCAN = 50_000
"""Directory entries looked at per IPC directory (100,000 names cost ~90 ms to list)."""
MAX_IPC_FILES = 1_000
"""IPC files listed (lstat-ed) over all directories; the rest are counted, not listed."""

Sock = Tuple[str, str, str, int]  # proto, state, local "HEX:PORT", uid
Listener = Tuple[str, str, int, int]  # proto, address, port, uid (sockdiag.Listener)


def ipc_kind(name: str) -> Optional[str]:
    """The stack an IPC file name belongs to, None for unrelated files."""
    if not name.startswith(_IPC_PREFIXES):
        return None
    for prefix, kind in IPC_KINDS:
        if name.startswith(prefix):
            return kind
    return None


def _read(path: str, limit: int = 1 << 16) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def _read_all(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            b = os.read(fd, 1 << 18)
            if not b:
                return b"".join(chunks)
            chunks.append(b)
    finally:
        os.close(fd)


def decode_addr(hexaddr: str) -> Tuple[str, int]:
    """/proc/net/tcp{,6} "0100007F:1F90" -> ("127.0.0.1", 8080); words are host-endian (LE)."""
    h, _, p = hexaddr.partition(":")
    raw = b"".join(bytes.fromhex(h[i:i + 8])[::-1] for i in range(0, len(h), 8))
    return socket.inet_ntop(socket.AF_INET6 if len(raw) == 16 else socket.AF_INET, raw), int(p, 16)


def _inet_table(proc: str) -> Dict[int, Sock]:
    table: Dict[int, Sock] = {}
    for proto in ("tcp", "tcp6"):
        try:
            lines = _read_all(f"{proc}/net/{proto}").decode().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            inode = int(f[9])
            if inode:  # 0: TIME_WAIT and friends, owned by no process
                table[inode] = (proto, f[3], f[1], int(f[7]))
    return table


def _listening(proc: str) -> Tuple[Dict[int, Listener], Optional[Dict[int, Sock]]]:
    """Listening sockets by inode, and the whole /proc/net/tcp table when it had to be read for
    them (else None: read later, only if a process listed holds other TCP sockets)."""
    if proc == PROC:
        from . import sockdiag

        found = sockdiag.listening()
        if found is not None:
            return found, None
    table = _inet_table(proc)
    return {inode: (s[0], *decode_addr(s[2]), s[3]) for inode, s in table.items() if s[1] == TCP_LISTEN}, table


def _unix_inodes(proc: str) -> Set[int]:
    try:
        lines = _read_all(f"{proc}/net/unix").split(b"\n")[1:]
    except OSError:
        return set()
    return {int(f[6]) for f in (ln.split() for ln in lines) if len(f) > 6}


def _boot_time(proc: str) -> float:
    for line in _read_all(f"{proc}/stat").split(b"\n"):
        if line.startswith(b"btime "):
            return float(line.split()[1])
    return 0.0


def _environ(proc: str, pid: int) -> Dict[str, str]:
    """SLURM_JOB_ID and SLURMD_NODENAME from a process's initial environment."""
    out: Dict[str, str] = {}
    try:
        data = _read_all(f"{proc}/{pid}/environ")
    except OSError:
        return out
    for var, valid in ((b"SLURM_JOB_ID=", is_job_id), (b"SLURMD_NODENAME=", is_node)):
        i = data.find(b"\0" + var)
        i = 0 if data.startswith(var) else (i + 1 if i >= 0 else -1)
        if i >= 0:
            end = data.find(b"\0", i)
            value = data[i + len(var):end if end >= 0 else len(data)].decode(errors="replace")
            if valid(value):  # the user writes the environment: anything else is not an id
                out[var[:-1].decode()] = value
    return out


def _maps(proc: str, pid: int, ipc_prefixes: List[bytes]) -> Tuple[List[str], List[str]]:
    """Communication libraries mapped, and IPC files mapped (NCCL maps its /dev/shm segments)."""
    try:
        data = _read_all(f"{proc}/{pid}/maps")
    except OSError:
        return [], []
    libs = sorted({name for marker, name in LIBS if marker in data})
    shm: Set[str] = set()
    for prefix in ipc_prefixes:
        i = data.find(prefix)
        while i >= 0:
            end = data.find(b"\n", i)
            raw = data[i:end if end >= 0 else len(data)]
            raw = raw[:-len(b" (deleted)")] if raw.endswith(b" (deleted)") else raw
            path = printable(raw)
            if ipc_kind(os.path.basename(path)):
                shm.add(path)
            i = data.find(prefix, i + 1)
    return libs, sorted(shm)


def _details(proc: str, want: List[Any], ipc_prefixes: List[bytes]) -> List[Any]:
    """[pid, environ vars or {}, (libs, mapped IPC files) or None, cmdline] for one candidate.

    maps (the costliest file) only for job and GPU processes, the environ's SLURM_JOB_ID
    included; cmdline for every candidate, since whether it is listed is decided after this.
    """
    pid, need_env, job_or_gpu = want
    env = _environ(proc, pid) if need_env else {}
    maps = list(_maps(proc, pid, ipc_prefixes)) if job_or_gpu or env.get("SLURM_JOB_ID") else None
    return [pid, env, maps, printable(_cmdline(proc, pid).replace(b"\0", b" ").strip())[:CMDLINE_MAX]]


def _cmdline(proc: str, pid: int) -> bytes:
    try:
        return _read(f"{proc}/{pid}/cmdline", CMDLINE_MAX)
    except OSError:
        return b""


def _is_stepd(base: str, uid: int, comm: bytes) -> bool:
    """A real slurmstepd: root-owned and running the slurmstepd executable.

    The title (``slurmstepd: [J.0]``) and comm are the user's to choose, so they prove
    nothing alone. /proc/PID/exe is readable only by root; a non-root scan cannot check it
    and relies on uid 0, which a user cannot fake.
    """
    if comm != b"slurmstepd" or uid != 0:
        return False
    try:
        exe = os.readlink(base + "/exe")
    except PermissionError:
        return os.geteuid() != 0
    except OSError:
        return False
    exe = exe[:-len(" (deleted)")] if exe.endswith(" (deleted)") else exe  # upgraded under it
    return os.path.basename(exe) in STEPD_EXECUTABLES


def _is_our_hook(proc: str, p: "_Proc") -> bool:
    """Another job's Prolog/Epilog (or its publisher) of this installation: root, running our own
    interpreter with ``-m slurm_triage.hooks``. It carries that job's SLURM_JOB_ID while it runs
    beside the next job's hook; it is Slurm's, never a leftover of the job. A user cannot be uid 0,
    and /proc/PID/exe (root-only) must be the interpreter running this scan."""
    if p.uid != 0 or b"slurm_triage.hooks" not in _cmdline(proc, p.pid):
        return False
    try:
        return os.path.realpath(f"{proc}/{p.pid}/exe") == os.path.realpath(sys.executable)
    except OSError:
        return False


class _Proc:
    __slots__ = ("pid", "ppid", "uid", "start", "ticks", "comm", "state", "threads", "socks", "nvidia",
                 "shm", "job", "source", "node", "stepd")

    def __init__(self, pid: int, ppid: int, uid: int, start: float, ticks: int, comm: str, state: str,
                 threads: int):
        self.pid, self.ppid, self.uid, self.start, self.ticks = pid, ppid, uid, start, ticks
        self.comm, self.state, self.threads = comm, state, threads
        self.socks: List[int] = []
        self.nvidia: List[str] = []
        self.shm: List[str] = []
        self.job: Optional[str] = None
        self.source: Optional[str] = None
        self.node: Optional[str] = None
        self.stepd = False

    def dump(self) -> List[Any]:
        return [getattr(self, k) for k in self.__slots__]

    @classmethod
    def load(cls, row: List[Any]) -> "_Proc":
        p = cls.__new__(cls)
        for k, v in zip(cls.__slots__, row):
            setattr(p, k, v)
        return p


# Above this many processes the per-process reads are split over forked children, one per
# CPU (at most PARALLEL_MAX): the Prolog's cost then stays flat on big, busy nodes.
PARALLEL_ABOVE = 400
PARALLEL_MAX = 8


def _parallel(fn: Callable[[List[Any]], List[Any]], items: List[Any], seconds: float) -> List[Any]:
    """``fn(items)``, in up to PARALLEL_MAX forked children when there are many items."""
    k = min(PARALLEL_MAX, os.cpu_count() or 1, len(items) // (PARALLEL_ABOVE // 2))
    if len(items) <= PARALLEL_ABOVE or k < 2:
        return fn(items)
    from ..deadline import run_probes

    chunks = {str(i): (lambda c=items[i::k]: fn(c), seconds) for i in range(k)}
    out: List[Any] = []
    for name, r in sorted(run_probes(chunks).items()):
        if not r.ok:
            raise RuntimeError(f"process scan part {name}: {r.error}")
        out.extend(r.value)
    return out


def _scan(proc: str, ipc_dirs: List[str], boot: float, hz: int, seconds: float) -> Dict[int, _Proc]:
    """Every user-space process with its fds and cgroup job: the linear part of the scan."""
    pids = [int(n) for n in os.listdir(proc) if n.isdigit()]
    rows = _parallel(lambda part: [p.dump() for p in _scan_pids(proc, part, ipc_dirs, boot, hz)], pids, seconds)
    return {row[0]: _Proc.load(row) for row in rows}


def _scan_pids(proc: str, pids: List[int], ipc_dirs: List[str], boot: float, hz: int) -> List[_Proc]:
    procs: List[_Proc] = []
    dir_prefixes = tuple(d.rstrip("/") + "/" for d in ipc_dirs)
    for pid in pids:
        name = str(pid)
        base = f"{proc}/{name}"
        try:
            data = _read(base + "/stat", 4096)
            uid = os.stat(base).st_uid
        except OSError:
            continue  # exited meanwhile
        r = data.rfind(b")")
        f = data[r + 2:].split()
        ppid = int(f[1])
        if pid == 2 or ppid == 2:
            continue  # kernel threads hold no files and belong to no job
        comm = data[data.find(b"(") + 1:r]
        p = _Proc(pid, ppid, uid, round(boot + int(f[19]) / hz, 2), int(f[19]),
                  printable(comm), f[0].decode(), int(f[17]))
        p.stepd = _is_stepd(base, uid, comm)
        try:
            p.job = jobs.job_from_cgroup(_read(base + "/cgroup"))
            p.source = "cgroup" if p.job else None
        except OSError:
            pass
        fddir = base + "/fd/"
        try:
            fds = os.listdir(fddir)
        except OSError:
            fds = []  # not ours to read (non-root) or gone
        for fd in fds:
            try:
                link = os.readlink(fddir + fd)
            except OSError:
                continue
            if link.startswith("socket:["):
                p.socks.append(int(link[8:-1]))
            elif link.startswith("/dev/nvidia"):
                p.nvidia.append(link)
            elif link.startswith(dir_prefixes) and ipc_kind(os.path.basename(link)):
                p.shm.append(printable(link))
        procs.append(p)
    return procs


def _ancestors(procs: Dict[int, _Proc], pid: int) -> Set[int]:
    out: Set[int] = set()
    while pid in procs and pid not in out:
        out.add(pid)
        pid = procs[pid].ppid
    return out


def _under_stepd(procs: Dict[int, _Proc], pid: int, memo: Dict[int, bool]) -> bool:
    """True when a slurmstepd is among the ancestors (iterative: deep trees must not recurse)."""
    chain: List[int] = []
    found = False
    while pid in procs and pid not in memo:
        if procs[pid].stepd:
            found = True
            break
        chain.append(pid)
        pid = procs[pid].ppid
    found = found or memo.get(pid, False)
    for c in chain:
        memo[c] = found
    return found


def collect(cfg: Config) -> Dict[str, Any]:
    """The ``procs`` fact section (docs/architecture.md)."""
    proc = PROC
    ipc_dirs = list(cfg.get("procs", "ipc_dirs"))
    listening, table = _listening(proc)
    unix = _unix_inodes(proc)
    seconds = cfg.get("procs", "deadline_seconds")
    procs = _scan(proc, ipc_dirs, _boot_time(proc), os.sysconf("SC_CLK_TCK"), seconds)
    ours = _ancestors(procs, os.getpid())  # hooks run with SLURM_JOB_ID set: never report ourselves
    ipc_prefixes = [d.rstrip("/").encode() + b"/" for d in ipc_dirs]

    running: Set[str] = set()
    memo: Dict[int, bool] = {}
    # Which costly files each process needs, decided on the whole tree, then read in parallel.
    wants: List[List[Any]] = []
    for p in procs.values():
        if p.stepd or p.pid in ours:
            continue
        env = p.job is None and bool(p.socks or p.nvidia or p.shm or p.uid != 0 or _under_stepd(procs, p.pid, memo))
        wants.append([p.pid, env, bool(p.job or p.nvidia)])
    extra = {row[0]: row for row in _parallel(lambda part: [_details(proc, w, ipc_prefixes) for w in part],
                                              wants, seconds)}
    out_procs: List[Dict[str, Any]] = []
    holders: Dict[int, List[_Proc]] = {}
    for p in procs.values():
        if p.stepd:
            jid = jobs.job_from_stepd_title(_cmdline(proc, p.pid)) or p.job
            if jid:
                running.add(jid)
        if p.pid in ours:
            continue
        _, env, maps, cmdline = extra.get(p.pid, [p.pid, {}, None, ""])
        if p.job is None and env:
            p.job = env.get("SLURM_JOB_ID") or None
            p.source = "environ" if p.job else None
            p.node = env.get("SLURMD_NODENAME")
            if p.job and _is_our_hook(proc, p):
                continue
        libs: List[str] = []
        if maps is not None and (p.job or p.nvidia):  # maps is the costliest file: job and GPU processes
            libs, mapped = maps
            p.shm = sorted(set(p.shm) | set(mapped))
        listen: List[Dict[str, Any]] = []
        others: List[int] = []
        for inode in p.socks:
            ls = listening.get(inode)
            if ls is None:
                others.append(inode)
                continue
            listen.append({"proto": ls[0], "addr": ls[1], "port": ls[2]})
            holders.setdefault(inode, []).append(p)
        if not (p.job or libs or p.nvidia):
            continue  # a listener outside any job (sshd, a dashboard) shows in `listeners` only
        if others and table is None:
            table = _inet_table(proc)
        tcp = sum(1 for inode in others if inode in table)  # others is empty while table is None
        nunix = sum(1 for inode in others if inode not in table and inode in unix)
        row: Dict[str, Any] = {
            "pid": p.pid, "ppid": p.ppid, "uid": p.uid, "start_time": p.start, "start_ticks": p.ticks,
            "comm": p.comm,
            "cmdline": cmdline,
            "threads": p.threads, "state": p.state, "job_id": p.job, "job_source": p.source,
            "libs": libs, "dev_nvidia": sorted(set(p.nvidia)), "shm": p.shm,
            "listen": sorted(listen, key=lambda x: (x["port"], x["proto"])),
            "tcp_connections": tcp, "unix_sockets": nunix}
        if p.node:
            row["node"] = p.node
        out_procs.append(row)

    listeners: List[Dict[str, Any]] = []
    for inode, (proto, addr, port, uid) in listening.items():
        if addr not in WILDCARDS:
            continue
        owners = sorted(holders.get(inode, []), key=lambda q: (q.job is None, q.pid))
        owner = owners[0] if owners else None
        listeners.append({"proto": proto, "addr": addr, "port": port, "uid": uid,
                          "pid": owner.pid if owner else None, "job_id": owner.job if owner else None})

    jobs_source = "slurmstepd"
    if os.geteuid() != 0 and not os.access(f"{proc}/1/cmdline", os.R_OK):
        # hidepid: slurmstepd (root) is invisible to us; job cgroups are the only evidence left
        running |= set(jobs.job_cgroup_dirs())
        jobs_source = "cgroup"
    ipc_files, omitted = scan_ipc_bounded(ipc_dirs)
    return {"processes": sorted(out_procs, key=lambda r: r["pid"]),
            "ipc_files": ipc_files, "ipc_files_omitted": omitted,
            "listeners": sorted(listeners, key=lambda x: (x["port"], x["proto"], x["pid"] or 0)),
            "running_jobs": sorted(running, key=jobs.sort_key), "jobs_source": jobs_source}


def scan_ipc(dirs: List[str]) -> List[Dict[str, Any]]:
    """NCCL/MPI/UCX/PSM2/torch files in ``dirs``: lstat only, a symlink is reported, not followed."""
    return scan_ipc_bounded(dirs)[0]


def scan_ipc_bounded(dirs: List[str], max_files: int = MAX_IPC_FILES,
                     max_scan: int = MAX_IPC_SCAN) -> Tuple[List[Dict[str, Any]], Dict[str, Any]]:
    """(listed IPC files, what was left out): at most ``max_files`` listed over all ``dirs``,
    at most ``max_scan`` entries looked at per directory.

    The omitted part is ``{"count": IPC files seen but not listed, "by_dir": {dir: count},
    "unscanned_dirs": [dirs with more than max_scan entries]}``.
    """
    out: List[Dict[str, Any]] = []
    omitted: Dict[str, Any] = {"count": 0, "by_dir": {}, "unscanned_dirs": []}
    for d in dirs:
        try:
            it = os.scandir(os.fsencode(d))
        except OSError:
            continue
        with it:
            for n, e in enumerate(it):
                if n >= max_scan:
                    omitted["unscanned_dirs"].append(d)
                    break
                if not e.name.startswith(_IPC_PREFIX_BYTES):
                    continue  # (printable keeps an ASCII prefix as it is)
                name = printable(e.name)
                kind = ipc_kind(name)
                if kind is None:
                    continue
                if len(out) >= max_files:
                    omitted["count"] += 1
                    omitted["by_dir"][d] = omitted["by_dir"].get(d, 0) + 1
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                row = {"path": os.path.join(d, name), "dir": d, "name": name, "kind": kind,
                       "uid": st.st_uid, "size_bytes": st.st_size, "mtime": st.st_mtime,
                       "symlink": stat_mod.S_ISLNK(st.st_mode)}
                if name != e.name.decode("utf-8", "surrogateescape"):
                    row["raw_name"] = e.name.hex()  # the exact bytes, for the clean-up
                out.append(row)
    return sorted(out, key=lambda x: x["path"]), omitted
