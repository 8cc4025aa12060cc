# Two user-facing targets: `make run` and `make test`. Each installs what is missing
# (Debian packages, the virtual environment) and then does its job. Idempotent.
PY ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed
# Python 3.10 (a Jetson's): `make test` also installs the package there without torch and
# runs the tests that need none (tests/without_torch.txt); skipped, saying so, without 3.10.
PY310 ?= $(shell for p in python3.10 $$HOME/.pyenv/versions/3.10*/bin/python3.10; do \
	$$p -c 'import sys; print(sys.executable)' 2>/dev/null && break; done)
VENV310 := .venv310
STAMP310 := $(VENV310)/.installed
ARGS ?=
PYTEST_ARGS ?=
# The packages' bytecode, compiled at install, so that no run compiles its ~250 modules
# (every run would where Python writes none itself: PYTHONDONTWRITEBYTECODE, a read-only tree).
COMPILE := $(VENV)/bin/python -m compileall -q testbed edge_device aggregator radio

.PHONY: run test test-py310 setup system lint bench clean edge

run: setup
	$(VENV)/bin/testbed run --set workers=auto $(ARGS)

test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory test-py310

test-py310:
ifeq ($(strip $(PY310)),)
	@echo "test-py310: no Python 3.10 found; the Python 3.10 check is skipped" >&2
else
	@$(MAKE) --no-print-directory $(STAMP310)
	$(VENV310)/bin/python -m pytest -p no:cacheprovider -q \
	    $(shell grep -v '^\#' tests/without_torch.txt)
endif

$(STAMP310): pyproject.toml scripts/install_edge.py
	@test -x $(VENV310)/bin/python || $(PY310) -m venv $(VENV310)
	$(VENV310)/bin/python scripts/install_edge.py --allow-no-torch --with-tests --skip ray \
	    --skip-radio
	@touch $(STAMP310)

# An edge on a machine that has its own PyTorch (a Jetson): PY=<that environment's python>.
edge:
	$(PY) scripts/install_edge.py --skip ray

setup: system $(STAMP)

system:
	@scripts/ensure-system.sh

$(STAMP): pyproject.toml
	@test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[dev,watch]'
	$(COMPILE)
	@touch $(STAMP)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy testbed edge_device aggregator radio flowgraphs

bench: setup
	$(VENV)/bin/testbed bench

clean:
	rm -rf $(VENV) $(VENV310) runs
