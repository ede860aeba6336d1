# Faults and recovery of the compose mini-cluster (included by the top-level Makefile). The fault
# suite itself is tests/docker/test_faults.py (part of `make test`); these are its benchmarks: the
# package `bench` under docker/ (docker/bench), found as the Slurm driver is (docker/ on PYTHONPATH).

##@ Faults

# Extra arguments of the benchmark, e.g. BENCH_FAULTS_ARGS='--epochs 400 --json build/bench-faults.json'.
BENCH_FAULTS_ARGS ?=

.PHONY: bench-faults
bench-faults: image-cpu ## Recovery time, steps lost and training time ratio of the 2x2 cluster with one fault a minute (~9 min; BENCH_FAULTS_ARGS=--pairs 2: ~18 min).
	PYTHONPATH=$(CURDIR)/docker:$(CURDIR) $(PY) -m bench.faults --image $(IMAGE_NAME):cpu $(BENCH_FAULTS_ARGS)

.PHONY: bench-straggler
bench-straggler: image-cpu ## Samples/s of 3 nodes with one held at --cpus 0.17 and 0.25, with and without its eviction; build/bench-straggler.png (~11 min).
	PYTHONPATH=$(CURDIR)/docker:$(CURDIR) $(PY) -m bench.straggler --image $(IMAGE_NAME):cpu
