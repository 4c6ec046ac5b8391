"""`python -I -m slurm_triage.hooks prolog|epilog`: what prolog/ and epilog/ run.

The GPU probe's child is forked first of all (snapshot.GPU_SPARE): it imports pynvml while
this process reads its config and imports the hook, and takes its job once the config is
known. The hook ends with os._exit once its output is flushed: everything it wrote is closed
by then, and tearing down the interpreter (module and object finalisation) cost ~35 ms of
every Prolog and Epilog for nothing. The cyclic garbage collector is off: a hook lives a
tenth of a second and frees what it makes by reference counting, while the collector's passes
over its imports cost ~4 ms, and in a forked probe each pass copies the pages it touches.
"""
import gc

gc.disable()
import importlib  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402

if len(sys.argv) != 2 or sys.argv[1] not in ("prolog", "epilog"):
    sys.stderr.write("usage: python -I -m slurm_triage.hooks prolog|epilog\n")
    sys.exit(0)  # a mistyped hook line must not drain the fleet
from slurm_triage.deadline import Spare  # noqa: E402 - after the usage check, as little as possible first
from slurm_triage.snapshot import GPU_SPARE  # noqa: E402

rc = importlib.import_module(f"slurm_triage.hooks.{sys.argv[1]}").main(Spare.fork(*GPU_SPARE))
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except (OSError, ValueError):
        pass
os._exit(rc)
