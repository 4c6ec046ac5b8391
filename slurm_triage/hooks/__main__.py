"""`python -I -m slurm_triage.hooks prolog|epilog`: what prolog/ and epilog/ exec."""
import sys

from . import epilog, prolog

HOOKS = {"prolog": prolog.main, "epilog": epilog.main}

if len(sys.argv) != 2 or sys.argv[1] not in HOOKS:
    sys.stderr.write("usage: python -I -m slurm_triage.hooks prolog|epilog\n")
    sys.exit(0)  # a mistyped hook line must not drain the fleet
sys.exit(HOOKS[sys.argv[1]]())
