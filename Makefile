# slurm-triage: local lab (a real Slurm cluster on 127.0.0.1, see lab/) and tests.
# The lab targets need root.
LAB_DIR ?= /tmp/slurm-lab
export LAB_DIR
PYTHON := .venv/bin/python
# The venv is made from the system interpreter, not a per-user one (pyenv under /root):
# Prologs run it as root and SPANK helpers as the job's user, so everyone must reach it.
BASE_PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)

.PHONY: install venv spank lab-up lab-status lab-down test demo

# The admin's install: the venv the hook scripts run, and the SPANK plugin.
install: venv spank

venv: .venv/bin/python
.venv/bin/python: setup.py
	$(BASE_PYTHON) -m venv .venv
	.venv/bin/pip install -q -e '.[test,mcp,html]'
	@touch $@

spank:
	$(MAKE) -s -C spank

lab-up:
	bash lab/up.sh

lab-status:
	bash lab/status.sh

lab-down:
	bash lab/down.sh

# Unit tests always run; integration tests use the lab when it is up (else they skip).
test:
	@if [ -f "$(LAB_DIR)/env.sh" ]; then . "$(LAB_DIR)/env.sh"; fi; $(PYTHON) -m pytest -q tests

# The README's first command: the lab from nothing, then what an operator sees (lab/demo.py).
demo: lab-up
	$(PYTHON) lab/demo.py
