"""Kubeflow Trainer v2 (``app topology --format trainjob|trainingruntime``), validated offline: the
TrainJob and ClusterTrainingRuntime CRDs' openAPIV3Schema, strict (unknown fields refused, as
``kubectl apply`` refuses them), and their CEL rules (written out in kube_checks.CEL_RULES), with
Kubeflow's own torch-distributed runtime as the control that real runtimes pass; the pods that
Trainer makes of our TrainJob on our runtime and on torch-distributed (tests/unit/kube_trainer.py)
against the API's schema and the "restricted" Pod Security Standard; what Trainer's webhook refuses;
and the PET_* variables of its torch plugin read by torchrun's own parser. Each check also gets a
broken input that it must refuse. The golden files and the built-in kinds: test_kube.py.

    pytest tests/unit/test_trainjob.py             # the CRDs from ../shared/k8s, or DDP_K8S_SCHEMAS=DIR
"""

import copy

import pytest

from app import contract
from app.runtime.launcher import detect
from app.topology import trainjob
from app.topology.spec import build
from tests.deps import need
from tests.unit import kube_checks
from tests.unit.kube_trainer import trainer_pods, webhook_violations
from tests.unit.test_kube import GPU_FLAGS, _documents, _set, _topology

yaml = need("yaml")

SHAPES = {"cpu": (), "gpu": GPU_FLAGS}
"""The flags of the golden files trainjob-SHAPE and trainingruntime-SHAPE."""


def _train_job(shape: str) -> dict:
    return _documents(f"trainjob-{shape}")[-1]


def _runtime(shape: str) -> dict:
    return _documents(f"trainingruntime-{shape}")[0]


def _kubeflow_runtime() -> dict:
    return yaml.safe_load(kube_checks.schema_file(kube_checks.KUBEFLOW_RUNTIME).read_text())


@pytest.fixture(scope="module")
def job_crd():
    return kube_checks.crd_validator(kube_checks.TRAINJOB_CRD, "v1alpha1")


@pytest.fixture(scope="module")
def runtime_crd():
    return kube_checks.crd_validator(kube_checks.RUNTIME_CRD, "v1alpha1")


def _errors(validator, obj: dict) -> list[str]:
    return [e.message for e in validator.iter_errors(obj)]


@pytest.mark.parametrize("shape", SHAPES)
def test_the_trainjob_and_our_runtime_pass_their_crds(shape: str, job_crd, runtime_crd) -> None:
    assert _errors(job_crd, _train_job(shape)) == []
    assert _errors(runtime_crd, _runtime(shape)) == []


def test_kubeflows_own_runtime_passes_the_same_check(runtime_crd) -> None:
    """The control that the strict checker accepts a real runtime: Kubeflow's torch-distributed."""
    runtime = _kubeflow_runtime()
    assert runtime["metadata"]["name"] == "torch-distributed" and _errors(runtime_crd, runtime) == []
    assert kube_checks.cel_violations(runtime_crd.schema, runtime) == []


@pytest.mark.parametrize("shape", SHAPES)
def test_the_crds_cel_rules_hold(shape: str, job_crd, runtime_crd) -> None:
    assert kube_checks.cel_violations(job_crd.schema, _train_job(shape)) == []
    assert kube_checks.cel_violations(runtime_crd.schema, _runtime(shape)) == []


CEL_MISTAKES = {
    "name not an RFC 1035 label": ("metadata.name", "1st-job", "must match RFC 1035"),
    "name too long": ("metadata.name", "a" * 64, "no more than 63 characters"),
    "no process per node": ("spec.trainer.numProcPerNode", 0, "numProcPerNode must be greater than or equal to 1"),
}


@pytest.mark.parametrize("mistake", CEL_MISTAKES)
def test_the_cel_rules_refuse_a_broken_trainjob(mistake: str, job_crd) -> None:
    path, value, message = CEL_MISTAKES[mistake]
    assert _errors(job_crd, _set(_train_job("cpu"), path, value)) == []  # the schema alone lets it pass
    assert message in " ".join(kube_checks.cel_violations(job_crd.schema, _set(_train_job("cpu"), path, value)))


def test_the_cel_rules_refuse_two_ml_policies_and_unknown_rules(runtime_crd) -> None:
    broken = _set(_runtime("cpu"), "spec.mlPolicy.mpi", {"numProcPerNode": 1})
    assert "Only one of the policy" in " ".join(kube_checks.cel_violations(runtime_crd.schema, broken))
    schema = {"x-kubernetes-validations": [{"rule": "self.size() > 0"}]}
    assert "cannot evaluate: self.size() > 0" in " ".join(kube_checks.cel_violations(schema, "x"))


PATCHED_POD = "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].template.spec.template.spec"
JOB_MISTAKES = {
    "misspelled field": ("spec.trainer.numProcsPerNode", 2, "'numProcsPerNode' was unexpected"),
    "wrong type": ("spec.trainer.numNodes", "2", "'2' is not of type 'integer'"),
    "below the minimum": ("spec.trainer.numNodes", -1, "-1 is less than the minimum of 0"),
    "missing required field": ("spec.runtimeRef", None, "'runtimeRef' is a required property"),
    "a field a patch may not set": (f"{PATCHED_POD}.containers[0].image", "x", "'image' was unexpected"),
    "PyTorchJob's field": ("spec.elasticPolicy", {"maxRestarts": 3}, "'elasticPolicy' was unexpected"),
}


@pytest.mark.parametrize("mistake", JOB_MISTAKES)
def test_the_crd_refuses_a_broken_trainjob(mistake: str, job_crd) -> None:
    job = _train_job("gpu")
    assert _errors(job_crd, job) == []  # the control: unbroken, it passes
    path, value, message = JOB_MISTAKES[mistake]
    assert message in " ".join(_errors(job_crd, _set(job, path, value)))


JOBSET = "spec.template.spec"
RUNTIME_MISTAKES = {
    "misspelled field": ("spec.mlPolicy.numNode", 2, "'numNode' was unexpected"),
    "removed in Trainer v2.2": ("spec.mlPolicy.torch.numProcPerNode", "auto", "'numProcPerNode' was unexpected"),
    "elastic policy (gone)": ("spec.mlPolicy.torch.elasticPolicy", {"maxNodes": 4}, "'elasticPolicy' was unexpected"),
    "unknown restart strategy": (f"{JOBSET}.failurePolicy.restartStrategy", "Retry", "'Retry' is not one of"),
    "rule without a name": (f"{JOBSET}.failurePolicy.rules[0].name", None, "'name' is a required property"),
    "wrong type in the pod": (
        f"{JOBSET}.replicatedJobs[0].template.spec.template.spec.containers[0].ports[0].containerPort",
        "29500",
        "'29500' is not of type 'integer'",
    ),
}


@pytest.mark.parametrize("mistake", RUNTIME_MISTAKES)
def test_the_crd_refuses_a_broken_runtime(mistake: str, runtime_crd) -> None:
    runtime = _runtime("gpu")
    assert _errors(runtime_crd, runtime) == []  # the control
    path, value, message = RUNTIME_MISTAKES[mistake]
    assert message in " ".join(_errors(runtime_crd, _set(runtime, path, value)))


def _runtimes(shape: str) -> dict[str, dict]:
    return {"ours": _runtime(shape), "torch-distributed": _kubeflow_runtime()}


@pytest.mark.parametrize("runtime_name", ["ours", "torch-distributed"])
@pytest.mark.parametrize("shape", SHAPES)
def test_trainers_pods_are_hardened_on_either_runtime(shape: str, runtime_name: str) -> None:
    """The TrainJob's patches alone make the pods "restricted", whatever runtime they land on."""
    pods = trainer_pods(_train_job(shape), _runtimes(shape)[runtime_name])
    assert len(pods) == (3 if shape == "gpu" else 2)
    for pod in pods:
        assert kube_checks.restricted_violations(pod.spec) == []
        template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}}
        for version in kube_checks.K8S_VERSIONS:
            kube_checks.validate_builtin({**template, "template": {"spec": pod.spec}}, version)
        assert pod.labels.items() >= _documents(f"trainjob-{shape}")[0]["spec"]["podSelector"]["matchLabels"].items()
        assert pod.node["image"] == _train_job(shape)["spec"]["trainer"]["image"]


def test_the_pod_check_sees_a_patch_that_loses_the_hardening() -> None:
    """The control: without the TrainJob's patch, torch-distributed's pods break the profile."""
    job = _set(_train_job("cpu"), "spec.runtimePatches", None)
    (pod, *_) = trainer_pods(job, _kubeflow_runtime())
    found = " ".join(kube_checks.restricted_violations(pod.spec))
    assert "allowPrivilegeEscalation" in found and "runAsNonRoot" in found and "root file system" in found


@pytest.mark.parametrize("runtime_name", ["ours", "torch-distributed"])
def test_trainers_webhook_accepts_the_trainjob(runtime_name: str) -> None:
    assert webhook_violations(_train_job("gpu"), _runtimes("gpu")[runtime_name]) == []


WEBHOOK_MISTAKES = {
    "manager without a domain": ("spec.runtimePatches[0].manager", "topology", "not a domain-prefixed path"),
    "env in the patch": (f"{PATCHED_POD}.containers[0].env", [{"name": "X", "value": "1"}], "env of the node"),
    "unknown container": (f"{PATCHED_POD}.containers[0].name", "pytorch", "container 'pytorch'"),
    "unknown replicated Job": (
        "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].name",
        "worker",
        "replicated Job 'worker'",
    ),
    "reserved variable": ("spec.trainer.env[0].name", "PET_NODE_RANK", "reserved variables ['PET_NODE_RANK']"),
}


@pytest.mark.parametrize("mistake", WEBHOOK_MISTAKES)
def test_the_webhook_check_refuses_what_trainer_refuses(mistake: str) -> None:
    path, value, message = WEBHOOK_MISTAKES[mistake]
    assert message in " ".join(webhook_violations(_set(_train_job("gpu"), path, value), _runtime("gpu")))


@pytest.mark.parametrize("shape", SHAPES)
def test_torchrun_reads_the_torch_plugins_variables(shape: str, monkeypatch) -> None:
    """Each pod's PET_* variables, read by torchrun's own parser and config (torch.distributed.run),
    give a static rendezvous on pod 0 with the TrainJob's nodes, processes and node rank."""
    from torch.distributed.run import config_from_args

    job = _train_job(shape)
    trainer = job["spec"]["trainer"]
    name = job["metadata"]["name"]
    pods = trainer_pods(job, _runtime(shape))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # config_from_args sets it in os.environ otherwise
    for pod in pods:
        for key, value in pod.env().items():
            monkeypatch.setenv(key, value)
        command = pod.node["command"]
        assert command == trainer["command"]
        args = kube_checks.node_agent_torchrun(command)
        assert (args.nnodes, args.nproc_per_node, args.node_rank) == (
            str(trainer["numNodes"]),
            str(trainer["numProcPerNode"]),
            pod.index,
        )
        assert (args.master_addr, args.master_port) == (f"{name}-node-0-0.{name}", contract.RENDEZVOUS_PORT)
        assert (args.training_script, args.module, args.max_restarts) == ("app", True, 0)
        assert args.rdzv_id == name  # the job label of the node's metrics
        config, _, _ = config_from_args(args)
        nodes = len(pods)
        assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (nodes, nodes, trainer["numProcPerNode"])
        assert (config.rdzv_backend, config.rdzv_endpoint) == ("static", f"{name}-node-0-0.{name}:29500")
        assert config.rdzv_configs["rank"] == pod.index
    assert [p.hostname for p in pods] == [f"{name}-node-0-{i}" for i in range(len(pods))]


def test_the_launcher_names_trainers_node_count() -> None:
    """A worker inherits PET_NNODES: a pod that ran python without torchrun is seen as a world of one."""
    info = detect({"PET_NNODES": "2", "RANK": "0", "WORLD_SIZE": "1"})
    assert (info.named_nodes, info.named_nodes_by, info.spans_nodes) == (2, "PET_NNODES=2", False)


def test_the_trainjob_is_consistent_with_the_spec() -> None:
    spec = build(
        {"nodes": {"nodes": 3, "nproc_per_node": 4}, "rendezvous": {"max_restarts": 5}, "job": {"time_limit": 60}}
    )
    job = trainjob.train_job(spec)["spec"]
    assert (job["trainer"]["numNodes"], job["trainer"]["numProcPerNode"], job["activeDeadlineSeconds"]) == (3, 4, 60)
    assert job["runtimeRef"]["name"] == trainjob.training_runtime(spec)["metadata"]["name"] == "ddp-cluster-torch"
    runtime = trainjob.training_runtime(spec)["spec"]
    assert (runtime["template"]["spec"]["failurePolicy"]["maxRestarts"], runtime["mlPolicy"]["numNodes"]) == (5, 3)


def test_a_script_is_shipped_in_a_config_map(tmp_path) -> None:
    script = tmp_path / "my_job.py"
    script.write_text("print('hello')\n")
    done = _topology("--script", str(script), "--args", "--steps 3", "--format", "trainjob")
    assert done.returncode == 0, done.stderr
    config, _, job = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert config["kind"] == "ConfigMap" and config["data"] == {"my_job.py": "print('hello')\n"}
    assert job["spec"]["trainer"]["command"][-3:] == ["/job/my_job.py", "--steps", "3"]
    assert kube_checks.node_agent_torchrun(job["spec"]["trainer"]["command"]).training_script == "/job/my_job.py"
    (pod, *_) = trainer_pods(job, _runtime("cpu"))
    mount = {"name": "script", "mountPath": "/job", "readOnly": True}
    assert mount in pod.node["volumeMounts"]
    assert {"name": "script", "configMap": {"name": config["metadata"]["name"]}} in pod.spec["volumes"]


def test_a_binary_script_is_one_line(tmp_path) -> None:
    script = tmp_path / "job.py"
    script.write_bytes(b"\xff\xfe\x00")
    done = _topology("--script", str(script), "--format", "trainjob")
    assert (
        done.returncode == 2
        and done.stderr == f"error: --script {script} is not UTF-8 text: a ConfigMap ships text [exit 2]\n"
    )


def test_the_patch_is_not_shared_between_renderings() -> None:
    """The pod settings are shared constants of kube.py: a rendering must never alter them."""
    spec = build({})
    before = copy.deepcopy(trainjob.train_job(spec))
    trainer_pods(trainjob.train_job(spec), trainjob.training_runtime(spec))
    assert trainjob.train_job(spec) == before


def test_help_names_what_trainer_cannot_express() -> None:
    done = _topology("--help")
    assert done.returncode == 0 and trainjob.CANNOT_EXPRESS in done.stdout
    for limit in ("failurePolicy.maxRestarts", "ElasticPolicy", "29500", "automountServiceAccountToken"):
        assert limit in trainjob.CANNOT_EXPRESS
