# `make run` and `make test` do all set-up themselves (apt packages + .venv, via scripts/setup.sh).
# Extra arguments: make test ARGS="-k foo"   make run ARGS="--port 9000"
SHELL := /bin/bash
ARGS ?=
BENCH ?= transport

.PHONY: run test setup lint bench clean

run:    ## set up, then serve with the default config (dashboard http://127.0.0.1:8080/)
	bash scripts/run.sh $(ARGS)

test:   ## set up, lint, then the whole suite in a private network namespace
	bash scripts/test.sh $(ARGS)

setup:  ## install system packages and the venv (idempotent, stamped)
	bash scripts/setup.sh

lint: setup
	.venv/bin/ruff check .

bench:  ## a benchmark (BENCH=transport|video|voice|api), same offline sandbox as the tests
	@# voice also needs its pipecat peer's venv (.cache/pipecat-venv), made online before the sandbox
	if [[ $(BENCH) == voice ]]; then bash scripts/setup.sh && .venv/bin/python -m bench.voice --setup; fi
	bash scripts/test.sh --exec .venv/bin/python -m bench.$(BENCH) $(ARGS)

clean:  ## remove the venv and the set-up stamps (next run reinstalls)
	rm -rf .venv .cache/setup
