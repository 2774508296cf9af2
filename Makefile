# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install demo test lint typecheck pytest system-deps services bench clean

$(STAMP): pyproject.toml setup.py $(wildcard broker_sim/store/_codec*.[ch])
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# Debian packages the project needs (JDBC drivers for Spark, Chromium for the report's render test).
system-deps:
	bash .ci/system-deps.sh

# Start PostgreSQL / MariaDB / Redis / RabbitMQ when they are not answering on their default ports.
services:
	bash .ci/services.sh

demo: install
	$(BIN)/reliable demo $(DEMO_ARGS)

lint: install
	$(BIN)/ruff check reliable broker_sim jobs tests bench migrations
	$(BIN)/ruff format --check reliable broker_sim jobs tests bench migrations

# the packages as configured in pyproject.toml, then the code around them under the same strict settings
typecheck: install
	$(BIN)/mypy
	$(BIN)/mypy tests bench jobs

# the fifteen slowest tests close the report, so each CI log shows where its time went (30-minute limit)
PYTEST_ARGS ?= --durations=15

pytest: install system-deps services
	$(BIN)/pytest $(PYTEST_ARGS)

test: lint typecheck pytest

bench: install
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
