"""What Kubeflow Trainer v2's controller and JobSet make of a TrainJob and its runtime, for the tests:
the trainer pods, each with its host name and the PET_* variables of Trainer's torch plugin. No
controller runs here, so its rules are written out from its source (kubeflow/trainer master of
2026-08-21, commit 8c0f505, as shared/k8s): ``pkg/runtime/core/trainingruntime.go`` (runtimePatches
by strategic merge, resourcesPerNode merged per resource), ``plugins/jobset/builder.go`` (image,
command, args and env of the ``node`` container), ``plugins/torch/torch.go`` (PET_NNODES = numNodes,
PET_NPROC_PER_NODE = numProcPerNode, PET_NODE_RANK = the Job completion index, PET_MASTER_ADDR =
``<name>-node-0-0.<name>``, PET_MASTER_PORT = 29500 and that container port), and JobSet's pod
names (``<jobset>-<replicatedJob>-<job index>-<pod index>`` in the subdomain ``<jobset>``).
"""

import copy
from dataclasses import dataclass

NODE = "node"
MASTER_PORT = 29500
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name", "env": "name"}
MERGE_KEYS |= {"volumeMounts": "mountPath", "replicatedJobs": "name", "ports": "containerPort"}
"""The strategic-merge keys of the lists that a runtime patch touches (k8s.io/api patchMergeKey)."""


def merge(base, patch):
    """Kubernetes' strategic merge of ``patch`` into ``base``: maps merged, keyed lists merged by key,
    other lists replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for key, value in patch.items():
            if key in MERGE_KEYS and isinstance(value, list):
                out[key] = _merge_list(base.get(key, []), value, MERGE_KEYS[key])
            else:
                out[key] = merge(base.get(key), value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(patch)


def _merge_list(base: list[dict], patch: list[dict], key: str) -> list[dict]:
    out = [copy.deepcopy(item) for item in base]
    for item in patch:
        at = next((i for i, old in enumerate(out) if old.get(key) == item.get(key)), None)
        if at is None:
            out.append(copy.deepcopy(item))
        else:
            out[at] = merge(out[at], item)
    return out


def _upsert(items: list[dict], new: dict, key: str) -> None:
    at = next((i for i, old in enumerate(items) if old.get(key) == new.get(key)), None)
    if at is None:
        items.append(new)
    else:
        items[at] = new


@dataclass
class TrainerPod:
    """One pod of the trainer's Job: its host name, subdomain, completion index and pod spec."""

    hostname: str
    subdomain: str
    index: int
    labels: dict
    spec: dict

    @property
    def node(self) -> dict:
        return next(c for c in self.spec["containers"] if c["name"] == NODE)

    def env(self) -> dict[str, str]:
        """The node container's variables as the kubelet resolves them (the completion index's fieldRef)."""
        values = {}
        for item in self.node.get("env", []):
            if "value" in item:
                values[item["name"]] = item["value"]
            else:
                assert item["valueFrom"] == {"fieldRef": {"fieldPath": COMPLETION_INDEX}}, item
                values[item["name"]] = str(self.index)
        return values


def trainer_pods(train_job: dict, runtime: dict) -> list[TrainerPod]:
    """The pods that Trainer and JobSet start for ``train_job`` on ``runtime`` (a Cluster/TrainingRuntime)."""
    name, job = train_job["metadata"]["name"], train_job["spec"]
    template = copy.deepcopy(runtime["spec"]["template"]["spec"])
    for patch in job.get("runtimePatches", []):
        template = merge(template, patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {}))
    (replicated,) = [r for r in template["replicatedJobs"] if r["name"] == NODE]
    pod_template = replicated["template"]["spec"]["template"]
    spec = pod_template["spec"]
    node = next(c for c in spec["containers"] if c["name"] == NODE)
    trainer = job.get("trainer", {})
    for field in ("image", "command", "args"):
        if field in trainer:
            node[field] = trainer[field]
    resources = node.setdefault("resources", {})
    for kind, values in trainer.get("resourcesPerNode", {}).items():
        resources[kind] = {**resources.get(kind, {}), **values}
    env = node.setdefault("env", [])
    for item in trainer.get("env", []):
        _upsert(env, item, "name")
    nodes = trainer.get("numNodes", runtime["spec"]["mlPolicy"].get("numNodes", 1))
    pet = {"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(trainer.get("numProcPerNode", "auto"))}
    for key, value in pet.items():
        _upsert(env, {"name": key, "value": value}, "name")
    _upsert(env, {"name": "PET_NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}}, "name")
    _upsert(env, {"name": "PET_MASTER_ADDR", "value": f"{name}-{NODE}-0-0.{name}"}, "name")
    _upsert(env, {"name": "PET_MASTER_PORT", "value": str(MASTER_PORT)}, "name")
    _upsert(node.setdefault("ports", []), {"containerPort": MASTER_PORT}, "containerPort")
    labels = pod_template.get("metadata", {}).get("labels", {})
    return [TrainerPod(f"{name}-{NODE}-0-{i}", name, i, labels, copy.deepcopy(spec)) for i in range(nodes)]


def webhook_violations(train_job: dict, runtime: dict) -> list[str]:
    """What Trainer's admission webhook refuses that no schema says (plugins/jobset/jobset.go and
    plugins/torch/torch.go Validate), as text."""
    found = []
    jobs = {r["name"]: r for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]}
    trainers = [
        r
        for r in jobs.values()
        if r["template"].get("metadata", {}).get("labels", {}).get("trainer.kubeflow.org/trainjob-ancestor-step")
        == "trainer"
    ]
    if not any(c["name"] == NODE for r in trainers for c in r["template"]["spec"]["template"]["spec"]["containers"]):
        found.append("runtime: no replicated Job labelled as the trainer with a container 'node'")
    for patch in train_job["spec"].get("runtimePatches", []):
        host, _, path = patch["manager"].partition("/")
        if not host or not path:
            found.append(f"manager {patch['manager']!r} is not a domain-prefixed path")
        for rjob in patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {}).get("replicatedJobs", []):
            if rjob["name"] not in jobs:
                found.append(f"patch of replicated Job {rjob['name']!r}, which the runtime lacks")
                continue
            names = {c["name"] for c in jobs[rjob["name"]]["template"]["spec"]["template"]["spec"]["containers"]}
            pod = rjob.get("template", {}).get("spec", {}).get("template", {}).get("spec", {})
            for c in pod.get("containers", []):
                if c["name"] not in names:
                    found.append(f"patch of container {c['name']!r}, which the runtime's Job lacks")
                elif c["name"] == NODE and c.get("env"):
                    found.append("patch sets env of the node container (give it in trainer.env)")
    reserved = sorted({e["name"] for e in train_job["spec"].get("trainer", {}).get("env", [])} & set(RESERVED_ENV))
    if reserved:
        found.append(f"trainer.env sets reserved variables {reserved}")
    return found
