# Training workload: `app train`, `app bench` and `app scale` on local ranks (and `app scale` on the
# mini-cluster), and the torchvision test suite.

# Empty knobs keep the app's own defaults (python -m app train --help shows them).
EPOCHS ?=
OUT ?= runs/digits
RUN ?= $(OUT)
TB_PORT ?= 6006
TRAIN_ARGS ?=
BENCH_ARGS ?=
SCALE_ARGS ?=
TV_VENV ?= .venv-tv
TV_SPEC ?= torch==$(TV_TORCH_VERSION) torchvision==$(TORCHVISION_VERSION)

# The torchvision suite and its venv run before pytest starts, beside the base and the images (the venv made after
# the main run added its whole install; beside it, it loaded the timed tests).
TEST_BESIDE += test-torchvision

##@ Training

.PHONY: train
train: venv ## Train the seed MLP on digits on NPROC_PER_NODE local ranks into OUT (resumes: --resume auto).
	$(VENV)/bin/torchrun --standalone --nproc-per-node $(LOCAL_NPROC) -m app train \
	  --dataset digits --model mlp $(call knob,--epochs,$(EPOCHS)) --out $(OUT) --resume auto $(TRAIN_ARGS)

.PHONY: tensorboard
tensorboard: venv ## Serve the TensorBoard scalars of RUN (a run's OUT, or a folder of runs) on 127.0.0.1:TB_PORT only.
	$(VENV)/bin/tensorboard --logdir $(RUN) --host 127.0.0.1 --port $(TB_PORT)

.PHONY: bench
bench: venv ## Samples/s of app train vs a plain tutorial DDP loop on NPROC_PER_NODE ranks, and their ratio.
	$(PY) -m app bench $(call knob,--nproc-per-node,$(NPROC_PER_NODE)) $(BENCH_ARGS)

.PHONY: scale
scale: venv ## Scaling report at 1, 2, 4 local ranks into build/scale.{json,png} (SCALE_ARGS="--sweep --world-sizes 1,2").
	@mkdir -p build
	$(PY) -m app scale --json build/scale.json --plot build/scale.png $(SCALE_ARGS)

.PHONY: cluster-scale
cluster-scale: ## Scaling report over the mini-cluster's NODES x NPROC_PER_NODE ranks; RESULTS/scale.{json,png}.
	@$(CLUSTER_JOB) --command $(call quote,scale --json /results/scale.json --plot /results/scale.png $(SCALE_ARGS))

$(TV_VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(TV_VENV)
	$(TV_VENV)/bin/python -m pip install --quiet $(TV_SPEC)
	$(TV_VENV)/bin/python -m pip install --quiet -e '.[vision,test]'
	touch $@

.PHONY: venv-tv
venv-tv: $(TV_VENV)/.stamp ## Create .venv-tv: docker/versions.env's torch and torchvision pair (about 5.5 GB).

.PHONY: test-gpu
test-gpu: venv ## Tests that need a CUDA GPU (marked gpu; `make test` runs them too where a GPU is visible).
	$(PY) -m pytest -m gpu tests/unit tests/integration $(PYTEST_ARGS)

.PHONY: test-torchvision
test-torchvision: venv-tv ## Tests that need torchvision (MNIST, CIFAR-10, ResNet-18), and torch's private names, in .venv-tv.
	$(TV_VENV)/bin/python -m pytest -m 'torchvision or torch_api' tests/unit tests/integration $(PYTEST_ARGS)
