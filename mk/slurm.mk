# Slurm: a mini-cluster of containers (slurmctld + NODES slurmd nodes with munge, Debian bookworm's
# Slurm 22.05, no slurmdbd) and batch jobs rendered from the cluster spec (included by the
# top-level Makefile). docker/slurm/minicluster.py does the work; the spec's knobs (NODES,
# NPROC_PER_NODE, CLUSTER, JOB, SCRIPT, ARGS, SPEC, ...: mk/cluster.mk) pass through as spec flags.

##@ Slurm

# The mini-cluster's image: FROM the workload image $(IMAGE_NAME):cpu, plus Slurm and munge.
SLURM_IMAGE ?= $(IMAGE_NAME)-slurm:bookworm
# The batch style of slurm-job: torchrun (one agent per node) or srun (one task per rank); empty: the spec's.
LAUNCHER ?=
# The job that slurm-cancel cancels (empty: every job named after the spec's job name, CLUSTER).
SLURM_JOBID ?=
# slurm-up: slurm.conf's SlurmdTimeout, seconds before a silent node is DOWN (empty: the mini-cluster's, 60).
SLURMD_TIMEOUT ?=

# The driver talks to the engine through the Docker SDK for Python, as the cluster runner does (ENGINE_PYTHON's
# tools venv); it is the package `slurm` under docker/, found as the image builder is (docker/ on PYTHONPATH).
SLURM_RUN = $(ENGINE_TOOLS) && PYTHONPATH=$(CURDIR)/docker:$(CURDIR) $(TOOLS_VENV)/bin/python -m slurm.minicluster $(1) \
	--image $(SLURM_IMAGE) --results $(RESULTS) \
	$(call knob,--job-id,$(SLURM_JOBID)) $(call knob,--slurmd-timeout,$(SLURMD_TIMEOUT)) -- $(SPEC_FLAGS) $(call knob,--launcher,$(LAUNCHER))

.PHONY: slurm-image
slurm-image: image-cpu ## Build the Slurm mini-cluster's image (the workload image + Slurm 22.05 + munge).
	@docker/slurm/build.sh --workload $(IMAGE_NAME):cpu --tag $(SLURM_IMAGE)

.PHONY: slurm-up
slurm-up: slurm-image ## Start the Slurm mini-cluster: slurmctld and NODES slurmd containers; shows sinfo.
	@$(call SLURM_RUN,up)

.PHONY: slurm-job
slurm-job: ## sbatch JOB (or SCRIPT) on the mini-cluster, stream its output, print the summary; make exits 2 if the job failed.
	@$(call SLURM_RUN,job) $(JOB_FLAGS)

.PHONY: slurm-status
slurm-status: ## sinfo and squeue of the mini-cluster.
	@$(call SLURM_RUN,status)

.PHONY: slurm-cancel
slurm-cancel: ## scancel SLURM_JOBID, else every job of the spec's job name.
	@$(call SLURM_RUN,cancel)

.PHONY: slurm-logs
slurm-logs: ## The daemons' logs (slurmctld, slurmd, init).
	@$(call SLURM_RUN,logs)

.PHONY: slurm-down
slurm-down: ## Remove the mini-cluster's containers, network and volumes.
	@$(call SLURM_RUN,down)

# `make test` runs tests/slurm: it needs the mini-cluster's image.
TEST_PREREQS += slurm-image

