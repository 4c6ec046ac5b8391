"""`python -I -m slurm_triage.hooks prolog|epilog`: what prolog/ and epilog/ exec."""
import importlib
import sys

if len(sys.argv) != 2 or sys.argv[1] not in ("prolog", "epilog"):
    sys.stderr.write("usage: python -I -m slurm_triage.hooks prolog|epilog\n")
    sys.exit(0)  # a mistyped hook line must not drain the fleet
sys.exit(importlib.import_module(f"slurm_triage.hooks.{sys.argv[1]}").main())
