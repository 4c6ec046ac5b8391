"""CPU cost of one node's watcher: user+sys of the daemon and its reaped probe children
(/proc/PID/stat utime+stime+cutime+cstime) over a window, as % of one core. Goal <= 1 %.

Runs the real daemon against the fake NVML (8 GPUs, h100x8-busy) with a process titled
``slurmstepd: [JOB.0]`` standing in for the step and, when the binary is installed, a real
Pushgateway on 127.0.0.1 receiving every interval's push.

    .venv/bin/python bench/bench_watcher.py [--seconds 60] [--interval 5] [--warmup 6]
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurm_triage.step import watcher# noqa: E402
from slurm_triage.config import Config, defaults  # noqa: E402


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=6.0, help="excluded from the steady-state figure (imports)")
    ap.add_argument("--scenario", default="h100x8-busy")
    a = ap.parse_args()

    subprocess.run(["make", "-s", "-C", str(ROOT / "tests" / "fakenvml")], check=True)
    tmp = Path(tempfile.mkdtemp(prefix="bench-watcher-"))
    procs = []
    try:
        nvml = tmp / "nvml"
        nvml.mkdir()
        (nvml / "libnvidia-ml.so.1").symlink_to(ROOT / "tests" / "fakenvml" / "build" / "libnvidia-ml.so.1")
        shutil.copy(ROOT / "tests" / "fakenvml" / "scenarios" / f"{a.scenario}.json", nvml / "scenario.json")
        values = defaults()
        values["node"].update(name="bench1", spool_dir="")
        values["gpu"]["nvml_library"] = str(nvml / "libnvidia-ml.so.1")
        values["watcher"].update(interval_seconds=a.interval, run_dir=str(tmp), evidence_dir=str(tmp))
        pgw = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
        if pgw:
            port = free_port()
            procs.append(subprocess.Popen([pgw, f"--web.listen-address=127.0.0.1:{port}"],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            values["pushgateway"]["url"] = f"http://127.0.0.1:{port}"
            time.sleep(1.0)
        job = str(900000 + os.getpid() % 99999)
        procs.append(subprocess.Popen(["bash", "-c", f"exec -a 'slurmstepd: [{job}.0]' sleep {a.seconds + a.warmup + 30}"]))
        time.sleep(0.5)  # bash has exec-ed into the titled process
        ctx = watcher.WatchContext(job, "0", "bench1", os.geteuid(), os.getegid(), "on")
        cfg = Config(values)
        t0 = time.monotonic()
        pid = watcher.start(ctx, cfg)
        with open(f"/proc/{pid}/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        start_s = time.monotonic() - t0
        time.sleep(a.warmup)
        c0, w0 = cpu_seconds(pid), time.monotonic()
        time.sleep(a.seconds)
        c1, w1 = cpu_seconds(pid), time.monotonic()
        total = c1 / (w1 - t0) * 100
        steady = (c1 - c0) / (w1 - w0) * 100
        stopped = watcher.stop(ctx, cfg)
        left = watcher.process_alive(pid, ticks)
        print(f"watcher: 8 fake GPUs, interval {a.interval:g} s, push={'yes' if pgw else 'no'}, "
              f"start() returned in {start_s * 1000:.0f} ms")
        print(f"steady state over {w1 - w0:.0f} s: {c1 - c0:.3f} CPU s = {steady:.2f} % of one core (goal <= 1 %)")
        print(f"including start-up (imports) over {w1 - t0:.0f} s: {c1:.3f} CPU s = {total:.2f} % of one core")
        print(f"stop(): {stopped}, watcher process left: {left}")
        return 0 if steady <= 1.0 and not left else 1
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
