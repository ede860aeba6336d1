# Measuring the cluster: `app comm` (collective bandwidth sweep) and `app links` (per-link matrix),
# on local ranks and across the compose mini-cluster (included by the top-level Makefile).

##@ Measuring

# Extra flags of `app comm` / `app links`, e.g. COMM_ARGS='--ops all_reduce --max-bytes 1G'.
COMM_ARGS ?=
LINKS_ARGS ?=

.PHONY: comm
comm: venv ## Collective bandwidth sweep (app comm) on NPROC_PER_NODE local ranks; table, RESULTS/comm/local.{json,png}.
	$(VENV)/bin/torchrun --standalone --nproc-per-node $(LOCAL_NPROC) -m app comm \
	  --json $(RESULTS)/comm/local.json --plot $(RESULTS)/comm/local.png $(COMM_ARGS)

.PHONY: cluster-comm
cluster-comm: ## app comm across the mini-cluster's NODES x NPROC_PER_NODE ranks; results in RESULTS/comm/.
	@$(CLUSTER_JOB) --command 'comm --json /results/comm/cluster.json --plot /results/comm/cluster.png $(COMM_ARGS)'

# One rank per container: the links are between containers.
cluster-links: NODES = 3
cluster-links: NPROC_PER_NODE = 1
.PHONY: cluster-links
cluster-links: ## app links between the mini-cluster's containers (3 x 1); names a slow one; RESULTS/links/.
	@$(CLUSTER_JOB) --command 'links --json /results/links/links.json --plot /results/links/links.png $(LINKS_ARGS)'

# Extra arguments of the metrics benchmark (docker/bench/metrics.py, the package `bench` under docker/ as in
# mk/faults.mk), e.g. BENCH_METRICS_ARGS='--pairs 5 --json build/bench-metrics.json'.
BENCH_METRICS_ARGS ?=

.PHONY: bench-metrics
bench-metrics: venv ## Steady samples/s of 2 local ranks with and without serving Prometheus metrics (scraped every 0.5 s), alternately (~4 min).
	PYTHONPATH=$(CURDIR)/docker:$(CURDIR) $(PY) -m bench.metrics $(BENCH_METRICS_ARGS)
