# Ansible: provision machines and run the job across them (included by the top-level Makefile).
# The playbook is ansible/deploy.yml; `python -m app deploy` runs it through ansible-runner.

##@ Ansible

# Inventory of the cluster (group ddp_cluster). The default: node containers on this machine.
INVENTORY ?= ansible/inventory/local-nodes.yml
# Extra arguments of `python -m app deploy`, e.g. DEPLOY_ARGS='--tags verify -e launch_rerun=true'.
DEPLOY_ARGS ?=
# Node containers for the local inventory: PREFIX-node0 ... on PREFIX-net.
ANSIBLE_NODES ?= 2
ANSIBLE_NODES_PREFIX ?= ddp
ANSIBLE_NODE_IMAGE ?= ddp-cluster-node:bookworm

.PHONY: ansible-node-image
ansible-node-image: engine ## Build the node-container image (Debian bookworm stand-in for a GPU machine; debootstrap).
	@docker image inspect $(ANSIBLE_NODE_IMAGE) >/dev/null 2>&1 || docker/nodes/build.sh $(ANSIBLE_NODE_IMAGE)

.PHONY: ansible-nodes-up
ansible-nodes-up: venv ansible-node-image ## Start ANSIBLE_NODES fresh node containers for the local inventory.
	@$(PY) docker/nodes/nodes.py up --prefix $(ANSIBLE_NODES_PREFIX) --nodes $(ANSIBLE_NODES)

.PHONY: ansible-nodes-down
ansible-nodes-down: ## Remove the node containers, their volumes and network.
	@$(PY) docker/nodes/nodes.py down --prefix $(ANSIBLE_NODES_PREFIX)

.PHONY: ansible-clean
ansible-clean: venv ## Remove the controller's saved image tarballs (image_cache_dir, ~/.cache/ddp-cluster/images).
	cd ansible && ../$(VENV)/bin/ansible-playbook clean.yml -i localhost,

.PHONY: deploy
deploy: venv ## Run ansible/deploy.yml on INVENTORY (provision, ship the image, check, train).
	$(PY) -m app deploy -i $(INVENTORY) $(DEPLOY_ARGS)

# The inventory of the node containers that ansible-nodes-up started (ANSIBLE_NODES_PREFIX, ANSIBLE_NODES).
LOCAL_INVENTORY = build/ansible/$(ANSIBLE_NODES_PREFIX)-nodes.yml

.PHONY: deploy-local
deploy-local: venv image-cpu ansible-nodes-up ## Fresh node containers, then the full deploy onto them (summary in runs/ansible/).
	@mkdir -p $(dir $(LOCAL_INVENTORY))
	$(PY) docker/nodes/nodes.py inventory --prefix $(ANSIBLE_NODES_PREFIX) --nodes $(ANSIBLE_NODES) > $(LOCAL_INVENTORY)
	$(PY) -m app deploy -i $(LOCAL_INVENTORY) $(DEPLOY_ARGS)

.PHONY: ansible-collections
ansible-collections: venv ## Install the pinned collections into ansible/collections (needs Galaxy; the ansible package bundles them).
	cd ansible && ../$(VENV)/bin/ansible-galaxy collection install -r requirements.yml -p collections

.PHONY: lint-ansible
lint-ansible: venv ## ansible-lint (production profile) and yamllint on ansible/.
	cd ansible && ../$(VENV)/bin/ansible-lint
	$(VENV)/bin/yamllint -s ansible tests/ansible

.PHONY: test-ansible
test-ansible: venv image-cpu ansible-node-image ## The Ansible tests: GPU roles without a GPU, full deploy onto node containers.
	$(PY) -m pytest -m ansible tests/ansible $(PYTEST_ARGS)

# `make test` runs tests/ansible too: it needs the workload image and the node image.
TEST_PREREQS += image-cpu ansible-node-image
