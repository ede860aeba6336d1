# Containers and the local gloo mini-cluster (included by the top-level Makefile).
# Scripts under docker/ do the work; every knob below can be set on the command line.

##@ Containers

# Base images: auto = upstream when present or pullable, else built locally
# (debootstrap); upstream or local force one. The one switch for offline builds.
BASE ?= auto
IMAGE_NAME ?= ddp-cluster
# GPU=1: every node gets this machine's NVIDIA GPUs (compose.gpu.yaml) and runs the cuda image.
GPU ?= 0
# The flavour the mini-cluster runs (cpu or cuda).
IMAGE_TAG ?= $(if $(filter 1,$(GPU)),cuda,cpu)
CPU_BASE_IMAGE ?= python:3.11-slim-bookworm
CUDA_BASE_IMAGE ?= nvidia/cuda:12.6.3-base-ubuntu22.04
LOCAL_BASE_IMAGE ?= ddp-cluster-base:bookworm
TORCH_CPU ?= torch==2.13.0+cpu
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_CUDA ?= torch==2.13.0
WHEELHOUSE ?= build/wheelhouse

# The mini-cluster: NODES containers x NPROC_PER_NODE processes.
NODES ?= 2
NPROC_PER_NODE ?= 2
MASTER_PORT ?= 29500
# An app command line (python -m app $(JOB)), or SCRIPT: your torchrun script, run unchanged with ARGS.
JOB ?= train --dataset digits --epochs 10 --out /results/digits --resume auto
SCRIPT ?=
ARGS ?=
# The app command of `make cluster-mpi`.
MPI_JOB ?= check
# Compose project name: several clusters can live side by side.
CLUSTER ?= ddp-cluster
RESULTS ?= build/results
CLUSTER_TIMEOUT ?= 1200

ENGINE_PYTHON = $(if $(wildcard $(PY)),$(PY),$(PYTHON))
BUILD_IMAGE = docker/build-image.sh --base $(BASE) --python $(ENGINE_PYTHON) \
	--cpu-upstream $(CPU_BASE_IMAGE) --cuda-upstream $(CUDA_BASE_IMAGE) --local-base $(LOCAL_BASE_IMAGE) \
	--torch-cpu '$(TORCH_CPU)' --torch-cpu-index '$(TORCH_CPU_INDEX)' --torch-cuda '$(TORCH_CUDA)' \
	--wheelhouse $(abspath $(WHEELHOUSE))
CLUSTER_JOB = cluster/run-job.sh --project $(CLUSTER) --nodes $(NODES) --nproc-per-node $(NPROC_PER_NODE) \
	--master-port $(MASTER_PORT) --image $(IMAGE_NAME):$(IMAGE_TAG) --results $(RESULTS) --timeout $(CLUSTER_TIMEOUT) \
	$(if $(filter 1,$(GPU)),--gpu)
COMPOSE = docker compose -f compose.yaml -p $(CLUSTER) --profile mpi

.PHONY: engine
engine: venv ## Install (Debian: docker.io + compose v2) and start the Docker engine if missing.
	@docker/setup-engine.sh --python $(PY)

.PHONY: base
base: engine ## Build the offline base image ddp-cluster-base:bookworm (debootstrap + docker import).
	@docker/build-base.sh --tag $(LOCAL_BASE_IMAGE)

.PHONY: image-cpu
image-cpu: engine ## Build ddp-cluster:cpu (BASE=auto|upstream|local).
	@$(BUILD_IMAGE) --flavour cpu --tag $(IMAGE_NAME):cpu

.PHONY: image-cuda
image-cuda: engine ## Build ddp-cluster:cuda (offline: a stand-in on the local base with CPU torch).
	@$(BUILD_IMAGE) --flavour cuda --tag $(IMAGE_NAME):cuda

.PHONY: images
images: image-cpu image-cuda ## Build both workload images (cpu and cuda flavours).

.PHONY: images-test
images-test: BASE = local
images-test: images ## Build both images offline, as CI does (BASE=local).

.PHONY: cluster-up
cluster-up: image-$(IMAGE_TAG) ## Start NODES x NPROC_PER_NODE containers, run JOB (or SCRIPT), stream rank 0, print the summary.
	@$(CLUSTER_JOB) $(if $(SCRIPT),--script '$(SCRIPT)' --args '$(ARGS)',--job '$(JOB)')

.PHONY: cluster-check
cluster-check: image-$(IMAGE_TAG) ## Run `app check` across the cluster containers (torchrun, gloo).
	@$(CLUSTER_JOB) --job 'check --json /results/check.json'

.PHONY: cluster-mpi
cluster-mpi: image-$(IMAGE_TAG) ## Run `app check` (or MPI_JOB/SCRIPT) with mpirun over SSH (compose profile mpi).
	@$(CLUSTER_JOB) --mpi $(if $(SCRIPT),--script '$(SCRIPT)' --args '$(ARGS)',--job '$(MPI_JOB)')

.PHONY: cluster-logs
cluster-logs: ## Show every cluster container's output (all ranks, init, sshd).
	@$(COMPOSE) logs --no-color --timestamps

.PHONY: cluster-down
cluster-down: ## Remove the cluster's containers, network and volumes (results stay in RESULTS).
	@$(COMPOSE) down --volumes --remove-orphans --timeout 10
	@left=$$(docker ps -aq --filter label=com.docker.compose.project=$(CLUSTER); \
	  docker network ls -q --filter label=com.docker.compose.project=$(CLUSTER); \
	  docker volume ls -q --filter label=com.docker.compose.project=$(CLUSTER)); \
	  if [ -n "$$left" ]; then echo "error: left behind by $(CLUSTER): $$left" >&2; exit 1; fi

TEST_PREREQS += engine
