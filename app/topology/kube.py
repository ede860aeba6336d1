"""Kubernetes manifests from the cluster spec: an Indexed Job with a headless Service (``--format
k8s``) or a Kubeflow PyTorchJob (``--format pytorchjob``), for the same image and the same job as
the other engines. Needs no torch and no YAML library: each object is written as JSON, which is YAML.

    python -m app topology --nodes 2 --format k8s --output build/k8s/ddp-cluster.yaml
    kubectl apply -f build/k8s/ddp-cluster.yaml
    kubectl -n default logs -f -l batch.kubernetes.io/job-name=ddp-cluster,batch.kubernetes.io/job-completion-index=0
    python -m app topology --nodes 4 --nproc-per-node 8 --gpus-per-node 8 --image REGISTRY/ddp-cluster:cuda \\
        --format pytorchjob --output build/k8s/pytorchjob.yaml      # needs the Kubeflow training operator

``k8s``: a ConfigMap holds torchrun's arguments (``/cluster/torchrun.args``, what the image's
``ddp-node`` reads on every engine); pod ``i`` of the Indexed Job is ``<name>-i`` in the headless
Service ``<name>``, and pod 0's full DNS name is the c10d endpoint (pod 0 finds that name in its own
/etc/hosts, so it serves the rendezvous before cluster DNS knows it). c10d, not a static rank from
JOB_COMPLETION_INDEX, because a restart (``max_restarts``) is a new rendezvous round that a
replaced pod can join. A NetworkPolicy admits only the job's own pods: the rendezvous store and
gloo/NCCL take any connection. ``pytorchjob``: the training operator gives torchrun its settings
(PET_* variables) from ``elasticPolicy``; the Master hosts the c10d rendezvous.

Every node serves its Prometheus metrics (app/metrics.py) on its ``metrics`` port, contract.METRICS_PORT,
read from the pod's own events file on /tmp: ``ddp-node`` does, and the PyTorchJob's nodes run the same
agent (``python -m app node --serve-metrics``). The pods carry the usual ``prometheus.io/*`` annotations;
``--format podmonitor`` renders the Prometheus Operator's PodMonitor; the NetworkPolicy admits the
Prometheus pods of ``--prometheus-pods`` (any namespace) to that port only.

    python -m app topology --nodes 2 --format podmonitor --output build/k8s/podmonitor.yaml

Pods run as the image's user ``app`` with a read-only root file system, no capabilities and the
runtime's seccomp profile; /tmp, the cache and /dev/shm are emptyDirs, /results the user's claim.
"""

import json

from app import contract
from app.errors import UsageError
from app.runtime import envvars
from app.topology import render
from app.topology.spec import ClusterSpec, Host

GPU_RESOURCE = "nvidia.com/gpu"
"""The NVIDIA device plugin's resource name."""
PORT_NAME = "rendezvous"
FAIL_JOB_EXIT_CODES = (1, 2, 126, 127)
"""Exit codes of a node that end the whole job at once: torchrun gave up after its restarts (1), bad
input (2), the entrypoint cannot run its command (126, 127). A pod killed by a signal (OOM, preemption,
a lost machine) is replaced instead, at most max_restarts times, and rejoins in a new round."""
PYTORCHJOB_CONTAINER, PYTORCHJOB_PORT = "pytorch", "pytorchjob-port"
"""The container and port names that the Kubeflow training operator looks for."""
METRICS_PORT_NAME = "metrics"
"""The nodes' metrics port (contract.METRICS_PORT) by name, as the PodMonitor scrapes it."""
EVENTS_FILE = f"/tmp/{contract.EVENTS_NAME}"
"""Each pod's own events file, on its /tmp emptyDir (the root is read-only): what its node serves metrics from."""
SCRAPE_ANNOTATIONS = {
    "prometheus.io/scrape": "true",
    "prometheus.io/port": str(contract.METRICS_PORT),
    "prometheus.io/path": contract.METRICS_PATH,
}
"""The pod annotations by which a Prometheus's ``kubernetes_sd_configs`` (role: pod) finds the nodes' metrics."""
PODMONITOR_API = "monitoring.coreos.com/v1"
"""The Prometheus Operator's API of the PodMonitor (``--format podmonitor``)."""


def check(spec: ClusterSpec, *, ships_script: bool = False) -> None:
    """Raise UsageError for what these manifests cannot run (``ships_script``: a --script is shipped)."""
    if spec.nodes.hosts or spec.rendezvous.master_addr:
        raise UsageError("Kubernetes names its own pods: give --nodes, not --hosts, --hostfile or --master-addr")
    if spec.job.launcher != "torchrun":
        raise UsageError(
            f"--launcher {spec.job.launcher}: the Kubernetes manifests run torchrun in every pod; drop --launcher"
        )
    if spec.job.script and not ships_script:
        raise UsageError(
            "--script is not shipped into these pods: give the app's --command, or use --format trainjob (it ships it)"
        )
    if not spec.job.name[0].isalpha():
        raise UsageError(f"--name {spec.job.name!r} must start with a letter on Kubernetes (it names a Service)")


def labels(spec: ClusterSpec) -> dict[str, str]:
    """The labels of every object; the job's pods are selected by all of them."""
    return {
        "app.kubernetes.io/name": "ddp-cluster",
        "app.kubernetes.io/instance": spec.job.name,
        "app.kubernetes.io/part-of": "ddp-cluster",
    }


def metadata(spec: ClusterSpec, name: str) -> dict:
    """An object's metadata: its name, the spec's namespace and the job's labels."""
    return {"name": name, "namespace": spec.kubernetes.namespace, "labels": labels(spec)}


def pod_hosts(spec: ClusterSpec) -> tuple[Host, ...]:
    """The Indexed Job's pods by their full DNS names (``<name>-<i>.<service>.<namespace>.svc.<domain>``)."""
    k = spec.kubernetes
    domain = f"{spec.job.name}.{k.namespace}.svc.{k.cluster_domain}"
    return tuple(Host(f"{spec.job.name}-{i}.{domain}", spec.nodes.nproc_per_node) for i in range(spec.nodes.nodes))


def resources(spec: ClusterSpec) -> dict:
    """Each node's requests and limits: the spec's CPU and memory, and its GPUs."""
    k = spec.kubernetes
    limits = {"cpu": k.cpu_limit, "memory": k.memory_limit}
    if spec.nodes.gpus_per_node:
        limits[GPU_RESOURCE] = str(spec.nodes.gpus_per_node)
    return {"requests": {"cpu": k.cpu_request, "memory": k.memory_request}, "limits": limits}


def env(spec: ClusterSpec) -> list[dict]:
    """The container's variables: the interface for gloo and NCCL, when the spec names one; torch's flight
    recorder and the pod's own events file (its node serves metrics from it), always."""
    ifname = spec.rendezvous.ifname
    values = dict.fromkeys(envvars.IFNAME_VARIABLES, ifname) if ifname else {}
    values |= envvars.FLIGHT_RECORDER | {envvars.EVENTS_FILE: EVENTS_FILE}
    return [{"name": n, "value": v} for n, v in values.items()]


def node_agent(job: list[str], node: list[str] = ()) -> list[str]:
    """The image's node agent serving the node's metrics (``app node``: the health gate, then torchrun's agent in
    its process), with its own flags ``node``, for pods whose torchrun arguments are the operator's PET_* variables
    (torch's parser reads them as torchrun does): the command of the PyTorchJob's and the TrainJob's nodes."""
    return ["python", "-m", "app", "node", "--serve-metrics", *node, "--", *job]


CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
"""Every container: unprivileged, no way to gain privileges, no capabilities, a read-only root."""
POD_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": contract.APP_UID,
    "runAsGroup": contract.APP_UID,
    "fsGroup": contract.APP_UID,
    "fsGroupChangePolicy": "OnRootMismatch",
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""Every pod: the image's user ``app``, which owns the claim, and the runtime's seccomp profile."""


def volume_mounts(extra: list[dict] = ()) -> list[dict]:
    """Where the node's volumes appear: /results, /tmp, the cache, /dev/shm, then ``extra``."""
    return [
        {"name": "results", "mountPath": contract.RESULTS_DIR},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "cache", "mountPath": f"{contract.APP_HOME}/.cache"},
        {"name": "dshm", "mountPath": "/dev/shm"},
        *extra,
    ]


def volumes(spec: ClusterSpec, extra: list[dict] = ()) -> list[dict]:
    """The pod's volumes: the results claim, emptyDirs for /tmp and the cache, memory for /dev/shm, ``extra``."""
    return [
        {"name": "results", "persistentVolumeClaim": {"claimName": spec.kubernetes.results_claim}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "cache", "emptyDir": {}},
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec.kubernetes.shm_size}},
        *extra,
    ]


def tolerations(spec: ClusterSpec) -> list[dict]:
    """GPU nodes' taint, tolerated when the job asks for GPUs."""
    return [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}] if spec.nodes.gpus_per_node else []


def node_container(spec: ClusterSpec, name: str, command: list[str], port_name: str, mounts: list[dict]) -> dict:
    """The node's container: unprivileged, read-only root, the spec's resources, its rendezvous and metrics ports."""
    fields: dict = {"name": name, "image": spec.job.image, "imagePullPolicy": "IfNotPresent", "command": command}
    fields["env"] = env(spec)
    metrics = {"name": METRICS_PORT_NAME, "containerPort": contract.METRICS_PORT, "protocol": "TCP"}
    return fields | {
        "ports": [{"name": port_name, "containerPort": spec.rendezvous.master_port, "protocol": "TCP"}, metrics],
        "resources": resources(spec),
        "securityContext": CONTAINER_SECURITY,
        "volumeMounts": volume_mounts(mounts),
    }


def pod_template(spec: ClusterSpec, node: dict, extra_volumes: list[dict], **fields) -> dict:
    """A pod template of the job: its labels and scrape annotations, security context, volumes and ``fields`` (e.g.
    subdomain)."""
    spec_fields = {
        **fields,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": POD_SECURITY,
        "containers": [node],
        "volumes": volumes(spec, extra_volumes),
    }
    if tolerations(spec):
        spec_fields["tolerations"] = tolerations(spec)
    return {"metadata": {"labels": labels(spec), "annotations": SCRAPE_ANNOTATIONS}, "spec": spec_fields}


def network_policy(spec: ClusterSpec) -> dict:
    """Only the job's own pods may connect to its pods (rendezvous, gloo and NCCL on any port); the Prometheus pods
    of ``--prometheus-pods`` (in any namespace) may reach the metrics port, and nothing else."""
    own = {"podSelector": {"matchLabels": labels(spec)}}
    prometheus = {"namespaceSelector": {}, "podSelector": {"matchLabels": spec.kubernetes.prometheus_labels()}}
    scrape = {"from": [prometheus], "ports": [{"protocol": "TCP", "port": contract.METRICS_PORT}]}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(spec, spec.job.name),
        "spec": {**own, "policyTypes": ["Ingress"], "ingress": [{"from": [own]}, scrape]},
    }


def pod_monitor(spec: ClusterSpec) -> dict:
    """The Prometheus Operator's PodMonitor of the job's pods (by its labels): their ``metrics`` port, the series'
    own ``job`` and ``node`` labels kept (honorLabels)."""
    endpoint = {"port": METRICS_PORT_NAME, "path": contract.METRICS_PATH, "honorLabels": True}
    return {
        "apiVersion": PODMONITOR_API,
        "kind": "PodMonitor",
        "metadata": metadata(spec, spec.job.name),
        "spec": {"selector": {"matchLabels": labels(spec)}, "podMetricsEndpoints": [endpoint]},
    }


def config_map(spec: ClusterSpec) -> dict:
    """torchrun's arguments and the node agent's own flags, as ``ddp-node`` reads them from /cluster/torchrun.args
    and /cluster/node.args (the gate's, and the straggler policy where the job is elastic)."""
    data = {
        "torchrun.args": " ".join(render.torchrun_args(spec, pod_hosts(spec))) + "\n",
        contract.NODE_ARGS: " ".join(render.node_args(spec)) + "\n",
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(spec, f"{spec.job.name}-torchrun"),
        "data": data,
    }


def service(spec: ClusterSpec) -> dict:
    """The headless Service that gives each pod a DNS name, also before it is ready."""
    port = spec.rendezvous.master_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(spec, spec.job.name),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": labels(spec),
            "ports": [{"name": PORT_NAME, "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def indexed_job(spec: ClusterSpec) -> dict:
    """One pod per node, ``<name>-<index>``; each runs ``ddp-node`` (torchrun) and the job."""
    name = spec.job.name
    command = ["ddp-node", *render.job_argv(spec)]
    mount = {"name": "torchrun", "mountPath": contract.CLUSTER_DIR, "readOnly": True}
    node = node_container(spec, "node", command, PORT_NAME, [mount])
    volume = {"name": "torchrun", "configMap": {"name": f"{name}-torchrun"}}
    pod = pod_template(spec, node, [volume], subdomain=name, restartPolicy="Never")
    rules = [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": "node", "operator": "In", "values": list(FAIL_JOB_EXIT_CODES)},
        },
    ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(spec, name),
        "spec": {
            "completionMode": "Indexed",
            "completions": spec.nodes.nodes,
            "parallelism": spec.nodes.nodes,
            "backoffLimit": spec.rendezvous.max_restarts,
            "podFailurePolicy": {"rules": rules},
            "podReplacementPolicy": "Failed",
            "activeDeadlineSeconds": spec.job.time_limit,
            "template": pod,
        },
    }


def _rdzv_conf(spec: ClusterSpec) -> list[dict]:
    """The c10d settings of the PyTorchJob's elasticPolicy: those of ``render.c10d_args``."""
    return [{"key": key, "value": str(value)} for key, value in render.rdzv_conf(spec).items()]


def pytorch_job(spec: ClusterSpec) -> dict:
    """A Kubeflow PyTorchJob: one Master (it hosts the c10d rendezvous) and nodes - 1 Workers."""
    name, nodes, r = spec.job.name, spec.nodes.nodes, spec.rendezvous
    if nodes < 2:
        raise UsageError("--format pytorchjob needs --nodes 2 or more (a Master and a Worker); one node: --format k8s")
    command = node_agent(render.job_argv(spec), render.node_args(spec))  # elasticPolicy: a straggler evicts itself
    pod = pod_template(spec, node_container(spec, PYTORCHJOB_CONTAINER, command, PYTORCHJOB_PORT, []), [])

    def replicas(count: int) -> dict:
        return {"replicas": count, "restartPolicy": "ExitCode", "template": pod}

    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": metadata(spec, name),
        "spec": {
            "runPolicy": {
                "activeDeadlineSeconds": spec.job.time_limit,
                "backoffLimit": r.max_restarts,
                "cleanPodPolicy": "Running",
            },
            "nprocPerNode": str(spec.nodes.nproc_per_node),
            "elasticPolicy": {
                "rdzvBackend": "c10d",
                "rdzvHost": f"{name}-master-0",
                "rdzvPort": r.master_port,
                "rdzvId": name,
                "rdzvConf": _rdzv_conf(spec),
                "minReplicas": spec.nodes.min_nodes,
                "maxReplicas": nodes,
                "maxRestarts": r.max_restarts,
            },
            "pytorchReplicaSpecs": {"Master": replicas(1), "Worker": replicas(nodes - 1)},
        },
    }


def documents(spec: ClusterSpec, fmt: str, objects: list[dict]) -> str:
    """A multi-document YAML file of JSON objects; the comment first (kubectl reads a file that starts
    with ``{`` as one JSON stream, which ``---`` would break)."""
    kinds = ", ".join(o["kind"] for o in objects)
    head = f"# {kinds} of job {spec.job.name}: kubectl apply -f FILE (python -m app topology --format {fmt})\n"
    return head + "".join(f"---\n{json.dumps(o, indent=2)}\n" for o in objects)


def render_k8s(spec: ClusterSpec) -> str:
    """``--format k8s``: ConfigMap, headless Service, NetworkPolicy and the Indexed Job."""
    check(spec)
    return documents(spec, "k8s", [config_map(spec), service(spec), network_policy(spec), indexed_job(spec)])


def render_pytorchjob(spec: ClusterSpec) -> str:
    """``--format pytorchjob``: the NetworkPolicy and the Kubeflow PyTorchJob."""
    check(spec)
    return documents(spec, "pytorchjob", [network_policy(spec), pytorch_job(spec)])


def render_podmonitor(spec: ClusterSpec) -> str:
    """``--format podmonitor``: the PodMonitor of the pods of ``k8s``, ``pytorchjob`` or ``trainjob``."""
    check(spec, ships_script=True)
    return documents(spec, "podmonitor", [pod_monitor(spec)])
