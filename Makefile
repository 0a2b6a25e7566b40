# sweetspot: two commands for a newcomer (`make demo`, `make test`); the rest are building blocks.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Where built tools are cached between runs (outside the work tree, keyed by version inside).
export SWEETSPOT_CACHE_DIR ?= $(HOME)/.cache/sweetspot

.PHONY: demo test check lint venv llama-server vllm prometheus redis dnsmasq bench lock clean

# Branch coverage of gateway/server from the unit and component tests alone, in per cent: `make test` fails below
# it. Set to the measured figure rounded down to a multiple of 5 (README.md, "Quick start", has the figure).
COVERAGE_FLOOR := 90

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

# Install dnsmasq (Debian's dnsmasq-base) when it is missing; the DNS discovery test runs one as its resolver.
dnsmasq:
	bash scripts/install-dnsmasq.sh

# ruff 0.17 also formats the Python blocks of Markdown files; the check covers the Python sources.
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check --extend-exclude '*.md' .
	$(PY) -m mypy

# The whole suite in two pytest runs, each test once: the unit and component layers under coverage (the floor is
# checked on gateway/server), then everything else (tests/integration, tests/scenarios) without it. Every step
# runs even if one before it failed, and the last line printed is the second run's pytest summary.
test: $(STAMP) llama-server vllm prometheus redis dnsmasq lint
	@status=0; \
	$(PY) -m coverage erase; \
	$(PY) -m coverage run -m pytest tests/unit tests/component || status=$$?; \
	$(PY) -m coverage report --include='gateway/server/*' --fail-under=$(COVERAGE_FLOOR) || status=$$?; \
	$(PY) -m pytest tests --ignore=tests/unit --ignore=tests/component || status=$$?; \
	exit $$status

# The quick loop while developing (about a minute on 2 cores): lint, types, and the unit and component tests,
# which need no real backend (promtool, from `make prometheus`, checks the alert rules).
check: $(STAMP) prometheus lint
	$(PY) -m pytest tests/unit tests/component

bench: $(STAMP) llama-server
	$(PY) -m bench.overhead

# Re-pin what the Docker image installs (the base dependencies, with hashes) after changing pyproject.toml.
lock:
	python3 -m venv /tmp/sweetspot-lock && /tmp/sweetspot-lock/bin/pip install --quiet pip-tools
	/tmp/sweetspot-lock/bin/pip-compile --quiet --generate-hashes --strip-extras --no-emit-index-url \
	    --no-emit-find-links --output-file requirements.lock pyproject.toml

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
