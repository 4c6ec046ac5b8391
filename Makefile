# slurm-triage: local lab (a real Slurm cluster on 127.0.0.1, see lab/) and tests.
# The lab targets need root.
LAB_DIR ?= /tmp/slurm-lab
export LAB_DIR
PYTHON := .venv/bin/python

.PHONY: lab-up lab-status lab-down test demo

lab-up:
	bash lab/up.sh

lab-status:
	bash lab/status.sh

lab-down:
	bash lab/down.sh

# Unit tests always run; integration tests use the lab when it is up (else they skip).
test:
	@if [ -f "$(LAB_DIR)/env.sh" ]; then . "$(LAB_DIR)/env.sh"; fi; $(PYTHON) -m pytest -q tests

# ---- demo: filled in by the lead -------------------------------------------------
demo:
	@echo "demo: not written yet" >&2; exit 1
