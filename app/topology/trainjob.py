"""Kubeflow Trainer v2 from the cluster spec: a TrainJob (``--format trainjob``) and the
ClusterTrainingRuntime it runs on (``--format trainingruntime``), for the same image, job and pod
hardening as the Indexed Job of ``--format k8s`` (whose pod parts ``kube`` builds for both).

    python -m app topology --format trainingruntime --output build/k8s/runtime.yaml
    kubectl apply -f build/k8s/runtime.yaml                            # once per cluster (cluster-scoped)
    python -m app topology --nodes 2 --image REGISTRY/ddp-cluster:cpu --format trainjob --output build/k8s/trainjob.yaml
    kubectl apply -f build/k8s/trainjob.yaml
    kubectl -n default logs -f -l jobset.sigs.k8s.io/jobset-name=ddp-cluster,batch.kubernetes.io/job-completion-index=0
    python -m app topology --training-runtime torch-distributed --format trainjob    # Kubeflow's default runtime

The TrainJob names the runtime (``--training-runtime``) and gives the nodes (``numNodes``), processes
per node (``numProcPerNode``), image, command (``python -m app node --serve-metrics -- -m app
COMMAND``: torchrun's agent behind the node's health gate, serving its metrics; or ``... -- /job/SCRIPT
ARGS`` with the script shipped in a ConfigMap), resources per node and the time limit
(``activeDeadlineSeconds``); its ``runtimePatches`` carry the pod's security context, the labels of
the NetworkPolicy beside it, the scrape annotations, /tmp, the cache, /dev/shm, /results and (GPU) the
taint toleration, so that the hardening holds on any torch runtime. A runtime patch cannot declare a
container port: the named ``metrics`` port of ``--format podmonitor`` is our runtime's. Trainer's
torch plugin gives torchrun its place as PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the Job
completion index), PET_MASTER_ADDR (``<name>-node-0-0.<name>``, pod 0 of the JobSet) and
PET_MASTER_PORT (29500), which torchrun reads as its --nnodes, --nproc-per-node, --node-rank,
--master-addr and --master-port: a static rendezvous. The TrainJob adds PET_RDZV_ID, the job's name:
the job label of the nodes' metrics.

What Trainer v2 cannot express that the other renderings do: ``CANNOT_EXPRESS`` below, which
``python -m app topology --help`` shows.
"""

from pathlib import Path

from app import contract
from app.errors import UsageError
from app.runtime import envvars
from app.topology import kube, render
from app.topology.spec import ClusterSpec

CANNOT_EXPRESS = """\
Kubeflow Trainer v2 (--format trainjob, trainingruntime) cannot express what the other renderings do:

- Restarts: a TrainJob has no restart budget and torchrun runs without restarts (it has no elastic
  rendezvous here). ``--max-restarts N`` becomes the runtime's JobSet ``failurePolicy.maxRestarts``:
  a failed node (torchrun exit 1, a pod killed by a signal, a lost machine) recreates every node's
  Job, at most N times, and the job resumes from its last checkpoint; exit 2, 126 or 127 (bad
  arguments, a command that cannot run) fails the JobSet at once. Kubeflow's torch-distributed
  runtime has no failure policy: no restarts.
- Elastic training: no minimum node count (ElasticPolicy is gone in Trainer v2.2); the node count is
  fixed, as in the spec. ``--join-timeout`` has no counterpart (no c10d rendezvous).
- The rendezvous port is the torch plugin's 29500: another ``--master-port`` is refused.
- A TrainJob cannot patch automountServiceAccountToken, enableServiceLinks, imagePullPolicy,
  restartPolicy or the Job's podFailurePolicy: our runtime sets them; with torch-distributed the
  service-account token is mounted and a pod failure is retried by the Job's default backoffLimit.
- A NetworkPolicy is no part of the API: it is rendered beside the TrainJob.
"""
"""The limits of the Trainer v2 renderings, for ``app topology --help``."""

API_VERSION = "trainer.kubeflow.org/v1alpha1"
RUNTIME_KIND = "ClusterTrainingRuntime"
NODE = "node"
"""The replicated Job and the container that Trainer's torch plugin gives the PET_* variables."""
ANCESTOR_LABEL, ANCESTOR_TRAINER = "trainer.kubeflow.org/trainjob-ancestor-step", "trainer"
"""The label by which Trainer finds the trainer's replicated Job in a runtime."""
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
PATCH_MANAGER = "ddp-cluster/topology"
"""Who owns our runtime patch (Trainer's webhook wants a domain-prefixed path)."""
CONFIG_MAP_LIMIT = 1024 * 1024
"""The API server's limit on a ConfigMap's data (bytes)."""
FAIL_JOBSET_EXIT_CODES = (2, 126, 127)
"""Exit codes that end the job at once: torchrun's bad arguments (2), a command that cannot run (126,
127). torchrun's own failure (1) is a node's failure: the JobSet restarts, as for a killed pod."""


def _check(spec: ClusterSpec) -> None:
    kube.check(spec, ships_script=True)
    if spec.rendezvous.master_port != contract.RENDEZVOUS_PORT:
        raise UsageError(
            f"--master-port {spec.rendezvous.master_port}: Trainer v2's torch plugin fixes the rendezvous port at "
            f"{contract.RENDEZVOUS_PORT} (PET_MASTER_PORT); drop --master-port"
        )


def _script(spec: ClusterSpec) -> tuple[str, str] | None:
    """The --script's file name and text, or None for the app's --command."""
    path = spec.job.script
    if not path:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot read --script {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--script {path} is not UTF-8 text: a ConfigMap ships text") from None
    if len(text.encode()) > CONFIG_MAP_LIMIT:
        raise UsageError(f"--script {path} is over 1 MiB, a ConfigMap's limit: put it in the image and use --command")
    return path.rsplit("/", 1)[-1], text


def _script_volume(spec: ClusterSpec) -> tuple[list[dict], list[dict]]:
    """The script's ConfigMap as a volume and its read-only mount at /job; none without --script."""
    if not spec.job.script:
        return [], []
    volume = {"name": "script", "configMap": {"name": f"{spec.job.name}-script"}}
    return [volume], [{"name": "script", "mountPath": contract.JOB_DIR, "readOnly": True}]


def command(spec: ClusterSpec) -> list[str]:
    """The node agent (torchrun's, serving the node's metrics) and the job; the torch plugin's PET_* variables give
    it everything else."""
    return kube.node_agent(render.job_argv(spec, contract.JOB_DIR))


def _runtime_patch(spec: ClusterSpec) -> dict:
    """The pod settings the TrainJob lays over any runtime's trainer pods (the fields Trainer lets it patch)."""
    volumes, mounts = _script_volume(spec)
    node = {"name": NODE, "securityContext": kube.CONTAINER_SECURITY, "volumeMounts": kube.volume_mounts(mounts)}
    pod = {"securityContext": kube.POD_SECURITY, "containers": [node], "volumes": kube.volumes(spec, volumes)}
    if kube.tolerations(spec):
        pod["tolerations"] = kube.tolerations(spec)
    meta = {"labels": kube.labels(spec), "annotations": kube.SCRAPE_ANNOTATIONS}
    job = {"name": NODE, "template": {"spec": {"template": {"metadata": meta, "spec": pod}}}}
    return {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [job]}}}}


def train_job(spec: ClusterSpec) -> dict:
    """The TrainJob: the spec's shape, image, command, resources and time limit on ``--training-runtime``."""
    trainer = {
        "image": spec.job.image,
        "command": command(spec),
        "numNodes": spec.nodes.nodes,
        "numProcPerNode": spec.nodes.nproc_per_node,
        "resourcesPerNode": kube.resources(spec),
    }
    trainer["env"] = [*kube.env(spec), {"name": envvars.PET_RDZV_ID, "value": spec.job.name}]  # the metrics' job
    runtime = {"apiGroup": API_VERSION.split("/")[0], "kind": RUNTIME_KIND, "name": spec.kubernetes.training_runtime}
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": kube.metadata(spec, spec.job.name),
        "spec": {
            "runtimeRef": runtime,
            "activeDeadlineSeconds": spec.job.time_limit,
            "trainer": trainer,
            "runtimePatches": [_runtime_patch(spec)],
        },
    }


def script_config_map(spec: ClusterSpec) -> dict | None:
    """The --script as a ConfigMap (``<name>-script``), mounted read-only at /job; None without one."""
    found = _script(spec)
    if found is None:
        return None
    name, text = found
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": kube.metadata(spec, f"{spec.job.name}-script"),
        "data": {name: text},
    }


def training_runtime(spec: ClusterSpec) -> dict:
    """Our ClusterTrainingRuntime: the torch ML policy and a JobSet of one replicated Job, ``node``, whose
    pods carry the hardening of ``--format k8s``, and the restart budget as JobSet's failure policy."""
    node = kube.node_container(spec, NODE, command(spec), kube.PORT_NAME, [])
    pod = kube.pod_template(spec, node, [], restartPolicy="Never")
    own = {k: v for k, v in kube.labels(spec).items() if k != "app.kubernetes.io/instance"}  # any job may use it
    pod["metadata"] = {"labels": own, "annotations": kube.SCRAPE_ANNOTATIONS}
    exit_codes = {"containerName": NODE, "operator": "In", "values": list(FAIL_JOBSET_EXIT_CODES)}
    job = {
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": exit_codes}]},
        "template": pod,
    }
    bad_input = {"name": "bad-input", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}
    jobset = {
        "failurePolicy": {
            "maxRestarts": spec.rendezvous.max_restarts,
            "restartStrategy": "Recreate",
            "rules": [bad_input],
        },
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "replicatedJobs": [
            {"name": NODE, "template": {"metadata": {"labels": {ANCESTOR_LABEL: ANCESTOR_TRAINER}}, "spec": job}}
        ],
    }
    return {
        "apiVersion": API_VERSION,
        "kind": RUNTIME_KIND,
        "metadata": {"name": spec.kubernetes.training_runtime, "labels": {FRAMEWORK_LABEL: "torch", **own}},
        "spec": {"mlPolicy": {"numNodes": spec.nodes.nodes, "torch": {}}, "template": {"spec": jobset}},
    }


def render_trainjob(spec: ClusterSpec) -> str:
    """``--format trainjob``: the script's ConfigMap (with --script), the NetworkPolicy and the TrainJob."""
    _check(spec)
    script = script_config_map(spec)
    objects = [*([script] if script else []), kube.network_policy(spec), train_job(spec)]
    return kube.documents(spec, "trainjob", objects)


def render_trainingruntime(spec: ClusterSpec) -> str:
    """``--format trainingruntime``: the ClusterTrainingRuntime that ``--format trainjob`` names by default."""
    _check(spec)
    return kube.documents(spec, "trainingruntime", [training_runtime(spec)])
