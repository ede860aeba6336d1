# ddp-cluster: `make help` lists every target.
SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec
.DEFAULT_GOAL := help

# Names, bases and pins of the images (docker/versions.env): each KEY=VALUE is a knob of its own,
# set on the command line or in the environment like any other (make image-cpu TORCH_VERSION=...).
# Read by the file's one reader (app/contract.py, stdlib only) with the python3 that make's PATH has.
VERSIONS := $(shell PYTHONPATH=$(CURDIR)/docker:$(CURDIR) python3 -m imagebuild versions)
$(if $(filter 0,$(.SHELLSTATUS)),,$(error docker/versions.env could not be read (the line above says why)))
$(foreach pair,$(VERSIONS),$(eval $(firstword $(subst =, ,$(pair))) ?= $(patsubst $(firstword $(subst =, ,$(pair)))=%,%,$(pair))))
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==$(TORCH_VERSION)
PYTEST_ARGS ?=
PY := $(VENV)/bin/python
# The [cluster] extra's wheels (the Docker SDK and what it needs), for tests that install the package offline.
CLUSTER_EXTRA_WHEELS = build/wheelhouse/cluster-extra
# Every Dockerfile of the repository, for hadolint.
DOCKERFILES = $(shell git ls-files -co --exclude-standard | grep -E '(^|/)([^/]+\.)?Dockerfile$$' | sort)
# Every shell script of the repository (by extension or by a bash/sh shebang), for shellcheck.
SHELL_SCRIPTS = $(shell git ls-files -co --exclude-standard | xargs grep -lsE '^\#!/(usr/)?bin/(env )?(ba)?sh' | sort)

# Targets the areas' own files (mk/*.mk) add for `make test`, e.g. the engine and the images: all of them made
# before pytest starts, so that nothing heavy runs beside the timed tests. TEST_BESIDE: those that need neither the
# engine nor the images (.venv-tv and the torchvision suite), run with lint beside the base's debootstrap and the
# image builds, which leave a core idle in turns; they too end before pytest starts.
TEST_PREREQS :=
TEST_BESIDE :=

##@ General

.PHONY: help
help: ## Show every target with one line.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target> [VAR=value]\n"} \
	  /^[a-zA-Z0-9_.-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e '.[dev,deploy]'
	$(PY) -m pip download --quiet --dest $(CLUSTER_EXTRA_WHEELS) 'docker==$(DOCKER_SDK_VERSION)'
	touch $@

.PHONY: venv
venv: $(VENV)/.stamp ## Create the Python environment in .venv (torch CPU, test and lint tools).

.PHONY: host-deps
# promtool comes with Debian's prometheus package, whose install starts and enables the Prometheus daemon where
# systemd runs: disabled and stopped right after (a policy-rc.d would only keep it from starting now, and it
# would start at the next boot), so that only the program stays.
host-deps: ## Install the host packages the tests use (OpenMPI, shellcheck, promtool) on Debian/Ubuntu if missing.
	@missing=""; command -v mpirun >/dev/null || missing="openmpi-bin libopenmpi-dev"; \
	command -v shellcheck >/dev/null || missing="$$missing shellcheck"; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if command -v apt-get >/dev/null; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    $$missing >/dev/null; \
	  if [[ $$missing == *prometheus* && -d /run/systemd/system ]]; then \
	    systemctl disable --now --quiet prometheus.service; fi; \
	else echo "error: missing $$missing: install them with your package manager" >&2; exit 1; fi

.PHONY: demo
demo: venv ## Run the health check and a NPROC_PER_NODE-process check on local processes (no containers).
	$(PY) -m app check
	$(VENV)/bin/torchrun --standalone --nproc-per-node $(LOCAL_NPROC) -m app check

.PHONY: readme-spec
readme-spec: ## Rewrite the table of the cluster spec's keys (docs/engines.md) from the code (python -m app topology --format doc).
	@PYTHONPATH=$(CURDIR) $(PYTHON) docs/spec_table.py

.PHONY: lint
lint: venv host-deps ## Lint: ruff (check + format), yamllint, ansible-lint (production), hadolint, shellcheck.
	$(PY) -m ruff check .
	$(PY) -m ruff format --check app tests examples
	$(VENV)/bin/yamllint -s .
	cd ansible && ../$(VENV)/bin/ansible-lint
	$(VENV)/bin/hadolint $(DOCKERFILES)
	shellcheck $(SHELL_SCRIPTS)

-include $(wildcard mk/*.mk)

##@ Tests

.PHONY: test-unit
test-unit: venv ## Unit tests only (seconds).
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

# make test's pytest workers (pytest-xdist): the container suites wait on the engine most of the time, so they run
# beside the process suites; a module's tests stay on one worker (--dist loadscope), and modules are handed out in
# the order tests/conftest.py:mixed_modules gives (container and process modules interleaved, unit tests last), not
# by their number of tests (xdist's default put the container modules last: the workers waited on the engine first,
# then all computed). Four workers: the quiet run's pytest time is that of three (both cores stay busy), and beside
# other load more of the CPU goes to the tests (tests/README.md, make test's time).
TEST_WORKERS ?= 4
# Each test's time, for the tables in tests/README.md: the 40 slowest on the terminal, all of them in the report.
TEST_REPORT = --durations=40 --junitxml=build/logs/test-report.xml
TEST_SELECTION = -m 'not noise' -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

.PHONY: test-noise
test-noise: venv engine ## Tests that judge verdicts on real measurement noise (marked noise; not in make test).
	$(PY) -m pytest -m noise $(PYTEST_ARGS)

.PHONY: test
# Python writes its bytecode caches in make test even where the environment says not to (PYTHONDONTWRITEBYTECODE,
# as on this machine): the suite starts over a thousand Python processes, and each one compiled the
# app's and the tests' modules again (8 % of a process suite's CPU time, tests/README.md).
test: export PYTHONDONTWRITEBYTECODE =
# The venv, lint and TEST_BESIDE run beside the engine, base and images (which need no venv; one core each);
# host-deps first: it and the engine may both run apt. The pytest line holds no $(MAKE), so that `make -n test` runs
# no test.
test: host-deps ## Lint, then every test but the noise ones: unit, real processes, containers, Ansible (sets up what it needs).
	@mkdir -p build/logs; log=build/logs/test-beside.log; start=$$EPOCHSECONDS; \
	$(MAKE) --no-print-directory -j2 --output-sync=target lint $(TEST_BESIDE) >$$log 2>&1 & beside=$$!; \
	$(MAKE) --no-print-directory engine base && \
	$(MAKE) --no-print-directory -j3 --output-sync=target $(TEST_PREREQS) || { wait $$beside; exit 1; }; \
	wait $$beside && cat $$log || { cat $$log; echo "error: make lint $(TEST_BESIDE) failed (log: $$log)" >&2; exit 1; }; \
	echo "test: lint, $(TEST_BESIDE), the engine, the base and the images done in $$((EPOCHSECONDS - start)) s"
	@start=$$EPOCHSECONDS; echo "$(PY) -m pytest $(TEST_REPORT) $(TEST_SELECTION) $(PYTEST_ARGS)"; \
	DDP_REQUIRE_TEST_DEPS=1 $(PY) -m pytest $(TEST_REPORT) $(TEST_SELECTION) $(PYTEST_ARGS) && status=0 || status=$$?; \
	echo "test: pytest took $$((EPOCHSECONDS - start)) s"; exit "$$status"
