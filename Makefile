# Two user-facing targets: `make run` and `make test`. Each installs what is missing
# (Debian packages, the virtual environment) and then does its job. Idempotent.
PY ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
STAMP := $(VENV)/.installed
ARGS ?=
PYTEST_ARGS ?=

.PHONY: run test setup system lint bench clean

run: setup
	$(VENV)/bin/testbed run --set workers=auto $(ARGS)

test: setup
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

setup: system $(STAMP)

system:
	@scripts/ensure-system.sh

$(STAMP): pyproject.toml
	@test -x $(VENV)/bin/python || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[dev]'
	@touch $(STAMP)

lint: setup
	$(VENV)/bin/ruff check .

bench: setup
	$(VENV)/bin/testbed bench

clean:
	rm -rf $(VENV) runs
