# sweetspot: two commands for a newcomer (`make demo`, `make test`); the rest are building blocks.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Where built tools are cached between runs (outside the work tree, keyed by version inside).
export SWEETSPOT_CACHE_DIR ?= $(HOME)/.cache/sweetspot

.PHONY: demo test venv llama-server vllm prometheus redis bench lock clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "sweetspot needs Python 3.11+, found " + sys.version' 
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/sweetspot demo

# Build (or reuse from the cache) the pinned llama-server used by the integration tests.
llama-server: $(STAMP)
	bash scripts/build-llama-server.sh

# Install (or reuse from the cache) the pinned vLLM CPU build in its own virtualenv, outside .venv: the gateway's
# own install never carries vLLM or torch. See docs/vllm.md.
vllm:
	bash scripts/install-vllm.sh

# Install Prometheus (Debian package) when it is missing; the dashboard/alert tests need it.
prometheus:
	bash scripts/install-prometheus.sh

# Install redis-server (Debian package) when it is missing; the replicas' shared-state tests need it.
redis:
	bash scripts/install-redis.sh

test: $(STAMP) llama-server vllm prometheus redis
	$(PY) -m mypy
	$(PY) -m pytest

bench: $(STAMP) llama-server
	$(PY) -m bench.overhead

# Re-pin what the Docker image installs (the base dependencies, with hashes) after changing pyproject.toml.
lock:
	python3 -m venv /tmp/sweetspot-lock && /tmp/sweetspot-lock/bin/pip install --quiet pip-tools
	/tmp/sweetspot-lock/bin/pip-compile --quiet --generate-hashes --strip-extras --no-emit-index-url \
	    --no-emit-find-links --output-file requirements.lock pyproject.toml

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
