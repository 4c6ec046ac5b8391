#!/usr/bin/env python3
"""A training stand-in for the lab: ranks that compute, then all-reduce over TCP, every step.

Pure standard library (it runs as the job's user with the system python, like a user's job).
One process per Slurm task (``srun -n N python3 lab/workload/train.py ...``): rank and world
come from SLURM_PROCID/SLURM_NTASKS, the rendezvous from MASTER_ADDR/MASTER_PORT as torchrun's
does. Each step is a compute phase (pure-Python arithmetic, so its time follows the CPU the
rank gets) and a ring all-reduce (reduce-scatter + all-gather, XOR as the reduction) of
``--bytes`` over TCP, received by busy-polling the socket as NCCL's proxy spins on the wire.
Each rank's step time — the time it spent on the step itself, without waiting for its peers in
the collective (what per-rank forward/backward timers report; in a synchronous job the wall time
of a step is the slowest rank's for everyone) — goes to the Pushgateway as
``tb_perf_step_time_seconds{instance=<node>, rank=<r>}`` and, with the step's wall time, into one
log line per ``--log-every`` steps or ``--log-seconds``, whichever comes first: the mean of the
steps since the last line (so that a scrape, which sees the last push, reads a stable figure
however slow the steps are).

Modes: ``fresh``; ``restored`` (on "restore from checkpoint", K communicator threads named
like PyTorch's NCCL watchdog start, never exit and spin, competing with the training loop for CPU);
``slow-rank`` (the ranks on ``--slow-node`` compute ``--slow-factor`` times longer, as behind
a throttled GPU); ``stuck-rank`` (rank ``--stuck-rank`` stops joining the collective at step
``--stuck-after``; the others spin in it until ``--timeout`` and exit 1, as a watchdog would).
A run ends after ``--steps`` or, with ``--seconds``, once rank 0 has run that long (with
``--until-file``, only once that file exists too: a driver that waits for what it must see).
"""
from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import queue
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from typing import List, Optional, Tuple

MODES = ("fresh", "restored", "slow-rank", "stuck-rank")
LEAK_THREAD_NAME = b"pt_nccl_watchdg"  # the name PyTorch's ProcessGroupNCCL gives its watchdog


def log(rank: int, msg: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    print(f"[{stamp}Z] [rank{rank}] {msg}", flush=True)


def set_thread_name(name: bytes) -> None:
    """The kernel-visible name (/proc/PID/task/TID/comm), which Python threads do not set."""
    try:
        libc = ctypes.CDLL(None)
        libc.pthread_setname_np(ctypes.c_ulong(threading.get_ident()), name[:15])
    except (OSError, AttributeError):
        pass


def recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    """Busy-poll ``n`` bytes (non-blocking reads in a loop); TimeoutError past ``deadline``."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        try:
            k = sock.recv_into(view[got:], n - got)
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"collective stalled: {got}/{n} bytes after the timeout") from None
            continue
        if k == 0:
            raise ConnectionError("peer closed the ring")
        got += k
    return bytes(buf)


class Ring:
    """This rank's two ring sockets: ``send_to`` the next rank, ``recv_from`` the previous one."""

    def __init__(self, rank: int, world: int, master: Tuple[str, int], timeout: float):
        self.rank, self.world, self.timeout = rank, world, timeout
        listener = socket.socket()
        listener.bind((master[0], 0))
        listener.listen(1)
        table = rendezvous(rank, world, master, listener.getsockname()[1], timeout)
        nxt = table[(rank + 1) % world]
        self.send_to = socket.create_connection((master[0], nxt), timeout=timeout)
        listener.settimeout(timeout)
        self.recv_from, _ = listener.accept()
        listener.close()
        self.recv_from.setblocking(False)
        self.outbox: "queue.Queue[Optional[bytes]]" = queue.Queue()
        self.sender = threading.Thread(target=self._send_loop, name="ring-sender", daemon=True)
        self.sender.start()

    def _send_loop(self) -> None:
        while True:
            data = self.outbox.get()
            if data is None:
                return
            self.send_to.sendall(data)

    def close(self) -> None:
        """Flush the last sends (the next rank still reads them), then close both sockets."""
        self.outbox.put(None)
        self.sender.join()
        self.send_to.close()
        self.recv_from.close()

    def allreduce(self, buf: bytes) -> bytes:
        """Ring all-reduce (XOR) of ``buf``: W-1 reduce-scatter steps, then W-1 all-gather steps."""
        w, r = self.world, self.rank
        if w == 1:
            return buf
        size = -(-len(buf) // w)
        chunks = [bytearray(buf[i * size:(i + 1) * size].ljust(size, b"\0")) for i in range(w)]
        deadline = time.monotonic() + self.timeout
        for s in range(w - 1):  # reduce-scatter
            self.outbox.put(bytes(chunks[(r - s) % w]))
            i = (r - s - 1) % w
            other = recv_exact(self.recv_from, size, deadline)
            chunks[i] = bytearray((int.from_bytes(chunks[i], "little") ^ int.from_bytes(other, "little"))
                                  .to_bytes(size, "little"))
        for s in range(w - 1):  # all-gather
            self.outbox.put(bytes(chunks[(r + 1 - s) % w]))
            chunks[(r - s) % w] = bytearray(recv_exact(self.recv_from, size, deadline))
        return b"".join(chunks)[:len(buf)]


def rendezvous(rank: int, world: int, master: Tuple[str, int], my_port: int, timeout: float) -> List[int]:
    """Rank 0 collects every rank's listening port and sends each the table."""
    if rank == 0:
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(master)
        srv.listen(world)
        srv.settimeout(timeout)
        ports = {0: my_port}
        conns = []
        while len(ports) < world:
            c, _ = srv.accept()
            r, p = c.makefile().readline().split()
            ports[int(r)] = int(p)
            conns.append(c)
        line = (" ".join(str(ports[i]) for i in range(world)) + "\n").encode()
        for c in conns:
            c.sendall(line)
            c.close()
        srv.close()
        return [ports[i] for i in range(world)]
    end = time.monotonic() + timeout
    while True:
        try:
            c = socket.create_connection(master, timeout=2)
            break
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.1)
    c.sendall(f"{rank} {my_port}\n".encode())
    table = [int(p) for p in c.makefile().readline().split()]
    c.close()
    return table


def compute(units: int) -> int:
    """Pure-Python arithmetic: its wall time is the CPU this rank gets."""
    acc = 0
    for i in range(units):
        acc = (acc + i * i) % 1000003
    return acc


def spin_forever() -> None:
    """A leaked communicator thread: spins, never exits. Its loop runs outside the interpreter lock
    (hashlib releases it over large buffers), as a native NCCL/MPI thread does: it takes a CPU
    from the training loop and stays runnable, rather than only interleaving with it on the lock."""
    set_thread_name(LEAK_THREAD_NAME)
    blob = bytes(1 << 20)
    while True:
        hashlib.sha256(blob).digest()


def push_step_time(url: str, metric: str, job: str, node: str, rank: int, seconds: float) -> None:
    body = (f"# TYPE {metric} gauge\n{metric} {seconds:.6f}\n").encode()
    path = f"{url.rstrip('/')}/metrics/job/training/slurm_job_id/{job}/instance/{node}/rank/{rank}"
    req = urllib.request.Request(path, data=body, method="PUT", headers={"Content-Type": "text/plain"})
    try:
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=2).close()
    except (OSError, urllib.error.URLError):
        pass  # a training job never dies for its metrics


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=MODES, default="fresh")
    ap.add_argument("--steps", type=int, default=100, help="at most this many steps")
    ap.add_argument("--seconds", type=float, default=0.0,
                    help="stop after this long (rank 0's clock; the ranks agree through the all-reduce)")
    ap.add_argument("--bytes", type=int, default=2 << 20, help="all-reduce size per step (default 2 MiB)")
    ap.add_argument("--work", type=int, default=200_000, help="compute units per step")
    ap.add_argument("--until-file", default="", help="with --seconds: go on until this file exists too")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--log-seconds", type=float, default=0.0, help="also log once this long passed since the last line")
    ap.add_argument("--restore-threads", type=int, default=4, help="restored: leaked communicator threads")
    ap.add_argument("--slow-node", default="", help="slow-rank: the node whose ranks compute slower")
    ap.add_argument("--slow-factor", type=float, default=3.0)
    ap.add_argument("--stuck-rank", type=int, default=1)
    ap.add_argument("--stuck-after", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=60.0, help="collective timeout in seconds")
    ap.add_argument("--pushgateway", default=os.environ.get("PUSHGATEWAY_URL", ""))
    ap.add_argument("--metric", default="tb_perf_step_time_seconds")
    a = ap.parse_args(argv)
    rank, world = int(os.environ.get("SLURM_PROCID", "0")), int(os.environ.get("SLURM_NTASKS", "1"))
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    job = os.environ.get("SLURM_JOB_ID", "0")
    master = (os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT") or 20000 + int(job) % 20000))
    log(rank, f"start mode={a.mode} job={job} world={world} node={node} master={master[0]}:{master[1]}")
    if a.mode == "restored":
        log(rank, f"restored from checkpoint (step 0): {a.restore_threads} communicator threads cached")
        for _ in range(a.restore_threads):
            threading.Thread(target=spin_forever, daemon=True).start()
    ring = Ring(rank, world, master, a.timeout)
    work = int(a.work * (a.slow_factor if a.mode == "slow-rank" and node == a.slow_node else 1))
    buf = os.urandom(max(a.bytes, 1))
    t_start = t_log = time.monotonic()
    window: List[float] = []
    walls: List[float] = []
    for step in range(1, a.steps + 1):
        if a.mode == "stuck-rank" and rank == a.stuck_rank and step > a.stuck_after:
            log(rank, f"step {step}: stopped joining the collective")
            time.sleep(a.timeout * 2)
            return 1
        t0 = time.perf_counter()
        compute(work)
        window.append(time.perf_counter() - t0)
        # byte 0 carries rank 0's "stop" vote: the XOR of one 1 and zeros is 1 on every rank
        stop = rank == 0 and a.seconds > 0 and time.monotonic() - t_start >= a.seconds and (
            not a.until_file or os.path.exists(a.until_file))
        buf = bytes([1 if stop else 0]) + buf[1:]
        try:
            buf = ring.allreduce(buf)
        except (TimeoutError, ConnectionError) as e:
            log(rank, f"ERROR step {step}: all-reduce of {a.bytes} bytes failed: {e}")
            return 1
        walls.append(time.perf_counter() - t0)
        last = step == a.steps or buf[0] == 1
        if step % a.log_every == 0 or last or 0 < a.log_seconds <= time.monotonic() - t_log:
            t_log = time.monotonic()
            mean = sum(window) / len(window)
            log(rank, f"step {step} step_time {mean:.4f} s wall {sum(walls) / len(walls):.4f} s")
            if a.pushgateway:
                push_step_time(a.pushgateway, a.metric, job, node, rank, mean)
            window, walls = [], []
        if last:
            break
    ring.close()
    log(rank, f"done checksum {zlib.crc32(buf):08x}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
