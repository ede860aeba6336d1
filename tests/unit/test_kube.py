"""Kubernetes manifests (``app topology --format k8s|pytorchjob|trainjob|trainingruntime``), validated
offline: golden files, the API's strict schemas for Kubernetes 1.31 and 1.37 (kubernetes-validate),
the Kubeflow PyTorchJob CRD's schema, the "restricted" Pod Security Standard, and torchrun's own
parser; each validator also gets a broken manifest that it must refuse. Trainer v2's CRDs, pods and
PET_* variables: test_trainjob.py.

    DDP_K8S_SCHEMAS=/work/shared/k8s pytest tests/unit/test_kube.py    # the CRDs' folder, if not ../shared/k8s
    DDP_UPDATE_GOLDEN=1 pytest tests/unit/test_kube.py -k golden       # rewrite the golden files, then review the diff
                                                                       # (refused under CI=true: one-line failure)
"""

import copy
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app import contract
from app.errors import UsageError
from app.topology import kube
from app.topology.spec import build
from tests.deps import need
from tests.unit import kube_checks

jsonschema = need("jsonschema")
kubernetes_validate = need("kubernetes_validate")
yaml = need("yaml")

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).resolve().parent / "golden"
GPU_FLAGS = ("--nodes", "3", "--nproc-per-node", "4", "--gpus-per-node", "4", "--image", "registry.example/ddp:cuda")
GPU_FLAGS += ("--name", "llm", "--namespace", "ml", "--max-restarts", "3", "--time-limit", "86400", "--ifname", "eth0")
GPU_FLAGS += ("--cpu-request", "16", "--cpu-limit", "16", "--memory-request", "128Gi", "--memory-limit", "128Gi")
GPU_FLAGS += ("--shm-size", "64Gi", "--results-claim", "llm-results", "--command", "train --out /results/llm")
VARIANTS = {
    "k8s-cpu": ("--format", "k8s"),
    "k8s-gpu": (*GPU_FLAGS, "--format", "k8s"),
    "pytorchjob-cpu": ("--format", "pytorchjob"),
    "pytorchjob-gpu": (*GPU_FLAGS, "--format", "pytorchjob"),
    "trainjob-cpu": ("--format", "trainjob"),
    "trainjob-gpu": (*GPU_FLAGS, "--format", "trainjob"),
    "trainingruntime-cpu": ("--format", "trainingruntime"),
    "trainingruntime-gpu": (*GPU_FLAGS, "--format", "trainingruntime"),
}
"""Golden files by name (tests/unit/golden/NAME.yaml.golden) and the flags that render them."""


def _topology(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", "topology", *args], capture_output=True, text=True, timeout=60, check=False
    )


def _documents(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((GOLDEN / f"{name}.yaml.golden").read_text()) if d]


def _pod_specs(obj: dict) -> list[dict]:
    if obj["kind"] == "Job":
        return [obj["spec"]["template"]["spec"]]
    if obj["kind"] == "PyTorchJob":
        return [r["template"]["spec"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
    if obj["kind"] == "ClusterTrainingRuntime":
        return [r["template"]["spec"]["template"]["spec"] for r in obj["spec"]["template"]["spec"]["replicatedJobs"]]
    return []  # a TrainJob's pods are its runtime's with its patches: tests/unit/test_trainjob.py


@pytest.fixture(scope="module")
def crd() -> jsonschema.Draft7Validator:
    """The PyTorchJob CRD's schema (skips without its folder, fails under CI)."""
    return kube_checks.crd_validator(kube_checks.PYTORCHJOB_CRD, "v1")


@pytest.mark.parametrize("name", VARIANTS)
def test_golden_files_are_what_the_cli_renders(name: str) -> None:
    done = _topology(*VARIANTS[name])
    assert done.returncode == 0, done.stderr
    path = GOLDEN / f"{name}.yaml.golden"
    want = kube_checks.golden_text(path, done.stdout)
    assert done.stdout == want, f"{path.name} is stale: rerun with DDP_UPDATE_GOLDEN=1 and review"


@pytest.mark.parametrize("ci", ["true", None])
def test_updating_golden_files_is_refused_under_ci(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ci) -> None:
    path = tmp_path / "x.golden"
    path.write_text("old\n")
    monkeypatch.setenv(kube_checks.UPDATE_GOLDEN_ENV, "1")
    if ci is None:  # the control: outside CI the file is rewritten, so the comparison passes
        monkeypatch.delenv("CI", raising=False)
        assert kube_checks.golden_text(path, "new\n") == "new\n"
        return
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception) as failed:
        kube_checks.golden_text(path, "new\n")
    assert str(failed.value) == (
        "DDP_UPDATE_GOLDEN=1 under CI=true would write x.golden from the output it checks: unset DDP_UPDATE_GOLDEN "
        "in CI (update golden files locally, then review the diff)"
    )
    assert path.read_text() == "old\n"  # nothing written


KINDS = {
    "k8s": ["ConfigMap", "Service", "NetworkPolicy", "Job"],
    "pytorchjob": ["NetworkPolicy", "PyTorchJob"],
    "trainjob": ["NetworkPolicy", "TrainJob"],
    "trainingruntime": ["ClusterTrainingRuntime"],
}
"""The objects of each format, in order."""


@pytest.mark.parametrize("version", kube_checks.K8S_VERSIONS)
@pytest.mark.parametrize("name", VARIANTS)
def test_builtin_kinds_pass_the_apis_strict_schema(name: str, version: str) -> None:
    checked = []
    for obj in _documents(name):
        if "kubeflow.org/" in obj["apiVersion"]:  # their pods are checked as the API's PodTemplate
            for pod in _pod_specs(obj):
                tmpl = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": {"spec": pod}}
                kube_checks.validate_builtin(tmpl, version)
        else:
            kube_checks.validate_builtin(obj, version)
        checked.append(obj["kind"])
    assert checked == KINDS[name.rsplit("-", 1)[0]]


@pytest.mark.parametrize("name", ["pytorchjob-cpu", "pytorchjob-gpu"])
def test_pytorchjob_passes_its_crd_schema(name: str, crd) -> None:
    job = _documents(name)[1]
    assert [e.message for e in crd.iter_errors(job)] == []


@pytest.mark.parametrize("name", [v for v in VARIANTS if not v.startswith("trainjob")])
def test_pods_meet_the_restricted_pod_security_standard(name: str) -> None:
    pods = [p for obj in _documents(name) for p in _pod_specs(obj)]
    assert pods and all(kube_checks.restricted_violations(p) == [] for p in pods)


def _set(obj: dict, path: str, value) -> dict:
    """A deep copy of obj with path (dots; [i] for list items, [len] appends) set to value, or removed for None."""
    broken = copy.deepcopy(obj)
    *parents, last = [int(k) if k.isdigit() else k for k in re.findall(r"[^.\[\]]+", path)]
    node = broken
    for key in parents:
        node = node[key]
    if value is None:
        del node[last]
    elif isinstance(node, list) and last == len(node):
        node.append(value)
    else:
        node[last] = value
    return broken


POD = "spec.template.spec"
BUILTIN_MISTAKES = {
    "wrong type": ("spec.completions", "two", "'two' is not of type 'integer'"),
    "missing required field": (f"{POD}.containers[0].name", None, "'name' is a required property"),
    "unknown field": ("spec.completionsMode", "Indexed", "'completionsMode' was unexpected"),
    "wrong nested type": (f"{POD}.securityContext.runAsNonRoot", "yes", "'yes' is not of type 'boolean'"),
}


@pytest.mark.parametrize("version", kube_checks.K8S_VERSIONS)
@pytest.mark.parametrize("mistake", BUILTIN_MISTAKES)
def test_the_api_schema_refuses_a_broken_job(mistake: str, version: str) -> None:
    job = _documents("k8s-cpu")[3]
    kube_checks.validate_builtin(job, version)  # the control: unbroken, it passes
    path, value, message = BUILTIN_MISTAKES[mistake]
    with pytest.raises(kubernetes_validate.ValidationError, match=re.escape(message)):
        kube_checks.validate_builtin(_set(job, path, value), version)


def test_an_unknown_kind_is_an_error_not_a_pass() -> None:
    with pytest.raises(kubernetes_validate.utils.SchemaNotFoundError):
        kube_checks.validate_builtin({**_documents("k8s-cpu")[3], "kind": "Jobs"}, kube_checks.K8S_VERSIONS[-1])


MASTER = "spec.pytorchReplicaSpecs.Master"
CRD_MISTAKES = {
    "wrong type": ("spec.elasticPolicy.maxRestarts", "3", "'3' is not of type 'integer'"),
    "missing required field": ("spec.pytorchReplicaSpecs", None, "'pytorchReplicaSpecs' is a required property"),
    "unknown field": ("spec.elasticPolicy.rdzvBackends", "c10d", "'rdzvBackends' was unexpected"),
    "wrong type in the pod": (f"{MASTER}.template.spec.containers[0].ports[0].containerPort", "1", "'1' is not of"),
    "duplicate container port": (
        f"{MASTER}.template.spec.containers[0].ports[1]",
        {"name": "again", "containerPort": 29500, "protocol": "TCP"},
        "duplicate entry for keys ['containerPort', 'protocol']",
    ),
}


@pytest.mark.parametrize("mistake", CRD_MISTAKES)
def test_the_crd_schema_refuses_a_broken_pytorchjob(mistake: str, crd) -> None:
    job = _documents("pytorchjob-cpu")[1]
    assert list(crd.iter_errors(job)) == []  # the control: unbroken, it passes
    path, value, message = CRD_MISTAKES[mistake]
    assert message in " ".join(e.message for e in crd.iter_errors(_set(job, path, value)))


POLICY_MISTAKES = {
    "privileged": ("containers[0].securityContext.privileged", True, "privileged"),
    "root": ("securityContext.runAsUser", 0, "runAsUser 0"),
    "escalation allowed": ("containers[0].securityContext.allowPrivilegeEscalation", None, "allowPrivilegeEscalation"),
    "capability added": ("containers[0].securityContext.capabilities.add", ["SYS_ADMIN"], "capabilities"),
    "host path": ("volumes[1]", {"name": "tmp", "hostPath": {"path": "/tmp"}}, "hostPath"),
    "host network": ("hostNetwork", True, "hostNetwork"),
    "seccomp unconfined": ("securityContext.seccompProfile.type", "Unconfined", "seccompProfile Unconfined"),
    "writable root": ("containers[0].securityContext.readOnlyRootFilesystem", False, "root file system"),
}


@pytest.mark.parametrize("mistake", POLICY_MISTAKES)
def test_the_pod_security_check_refuses_a_weakened_pod(mistake: str) -> None:
    pod = _documents("k8s-gpu")[3]["spec"]["template"]["spec"]
    assert kube_checks.restricted_violations(pod) == []  # the control
    path, value, message = POLICY_MISTAKES[mistake]
    assert message in " ".join(kube_checks.restricted_violations(_set(pod, path, value)))


def test_kubectl_reads_the_file_as_yaml_documents() -> None:
    """kubectl takes a file whose first character is ``{`` for one JSON stream, which ``---`` breaks."""
    text = (GOLDEN / "k8s-cpu.yaml.golden").read_text()
    assert text.lstrip()[0] == "#" and text.count("\n---\n") == 4
    assert not any(line.startswith("---") for doc in text.split("\n---\n")[1:] for line in doc.splitlines())


def test_torchrun_parses_the_rendered_arguments() -> None:
    from torch.distributed.run import get_args_parser

    config = _documents("k8s-gpu")[0]
    args = get_args_parser().parse_args([*config["data"]["torchrun.args"].split(), "-m", "app", "check"])
    assert (args.nnodes, args.nproc_per_node, args.max_restarts) == ("3", "4", 3)
    assert args.rdzv_endpoint == "llm-0.llm.ml.svc.cluster.local:29500" and args.rdzv_backend == "c10d"


def test_torchrun_reads_the_pytorchjob_as_the_training_operator_passes_it(monkeypatch) -> None:
    """The operator (kubeflow/training-operator release-1.9, pkg/controller.v1/pytorch/elastic.go and
    envvar.go) gives torchrun its settings as PET_* variables; no operator runs here, so they are
    derived from the PyTorchJob by the same rules. The node agent (app node) reads them with torchrun's parser."""
    job = _documents("pytorchjob-gpu")[1]["spec"]
    elastic = job["elasticPolicy"]
    env = {
        "PET_RDZV_ENDPOINT": f"{elastic['rdzvHost']}:{elastic['rdzvPort']}",
        "PET_RDZV_BACKEND": elastic["rdzvBackend"],
        "PET_NNODES": f"{elastic['minReplicas']}:{elastic['maxReplicas']}",
        "PET_MAX_RESTARTS": str(elastic["maxRestarts"]),
        "PET_RDZV_ID": elastic["rdzvId"],
        "PET_RDZV_CONF": ",".join(f"{c['key']}={c['value']}" for c in elastic["rdzvConf"]),
        "PET_NPROC_PER_NODE": job["nprocPerNode"],
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    command = job["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
    args = kube_checks.node_agent_torchrun(command)
    assert (args.nnodes, args.nproc_per_node, args.max_restarts, args.rdzv_backend) == ("3:3", "4", 3, "c10d")
    conf = "join_timeout=120,keep_alive_interval=1,keep_alive_max_attempt=10"
    assert (args.rdzv_endpoint, args.rdzv_id, args.rdzv_conf) == ("llm-master-0:29500", "llm", conf)
    assert args.training_script == "app" and args.module


def test_the_job_is_consistent_with_the_spec() -> None:
    spec = build({"nodes": {"nodes": 3}, "rendezvous": {"max_restarts": 2}, "job": {"time_limit": 600}})
    job = kube.indexed_job(spec)["spec"]
    assert (job["completions"], job["parallelism"], job["backoffLimit"], job["activeDeadlineSeconds"]) == (3, 3, 2, 600)
    pod = job["template"]["spec"]
    assert pod["subdomain"] == kube.service(spec)["metadata"]["name"] == "ddp-cluster"
    assert kube.service(spec)["spec"]["selector"].items() <= job["template"]["metadata"]["labels"].items()
    assert "nvidia.com/gpu" not in pod["containers"][0]["resources"]["limits"] and "tolerations" not in pod
    elastic = kube.pytorch_job(spec)["spec"]["elasticPolicy"]
    assert (elastic["minReplicas"], elastic["maxReplicas"], elastic["maxRestarts"]) == (3, 3, 2)


def test_min_nodes_reaches_torchrun_and_the_pytorchjob() -> None:
    spec = build({"nodes": {"nodes": 3, "min_nodes": 2}, "job": {"command": "train --accum-steps 2"}})
    assert "--nnodes=2:3" in kube.config_map(spec)["data"]["torchrun.args"]
    elastic = kube.pytorch_job(spec)["spec"]["elasticPolicy"]
    assert (elastic["minReplicas"], elastic["maxReplicas"]) == (2, 3)
    assert {"key": "last_call_timeout", "value": "2"} in elastic["rdzvConf"]


def test_an_elastic_job_gives_the_node_agents_the_straggler_policy_a_fixed_one_none() -> None:
    elastic = build({"nodes": {"nodes": 3, "min_nodes": 2}, "job": {"command": "train --accum-steps 2"}})
    retry = f"--retry-every={contract.GATE_RETRY_S}"
    assert kube.config_map(elastic)["data"][contract.NODE_ARGS] == f"{retry} --evict-factor=2 --evict-after=4\n"
    command = kube.pytorch_job(elastic)["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert command["command"][:9] == ["python", "-m", "app", "node", "--serve-metrics", "--retry-every=10",
                                      "--evict-factor=2", "--evict-after=4", "--"]  # fmt: skip
    fixed = build({"nodes": {"nodes": 3}})
    assert kube.config_map(fixed)["data"][contract.NODE_ARGS] == f"{retry}\n"  # the gate's alone
    assert "--evict-factor=2" not in json.dumps(kube.pytorch_job(fixed))


def test_the_pods_run_as_the_images_user() -> None:
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    assert f"ARG APP_UID={contract.APP_UID}\n" in dockerfile


def test_rendering_never_imports_torch_or_yaml() -> None:
    probe = (
        "import sys, app.cli as c\n"
        "for f in ('k8s', 'pytorchjob', 'trainjob', 'trainingruntime'): c.main(['topology', '--format', f])\n"
        "print('torch' in sys.modules, 'yaml' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.splitlines()[-1] == "False False"


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ({"kubernetes": {"namespace": "ML"}}, "--namespace 'ML' must be a DNS label"),
        ({"kubernetes": {"results_claim": "my_claim"}}, "--results-claim 'my_claim' must be a DNS name"),
        ({"kubernetes": {"cluster_domain": "cluster..local"}}, "--cluster-domain"),
        ({"kubernetes": {"cpu_request": "2 cores"}}, "--cpu-request '2 cores' is not a Kubernetes quantity"),
        ({"kubernetes": {"cpu_request": "0"}}, "--cpu-request 0 is below 1m"),
        ({"kubernetes": {"memory_limit": "4GB"}}, "--memory-limit '4GB' is not a Kubernetes quantity"),
        ({"kubernetes": {"memory_limit": "2Gi"}}, "--memory-limit 2Gi is below --memory-request 4Gi"),
        ({"kubernetes": {"cpu_request": "4"}}, "--cpu-limit 2 is below --cpu-request 4"),
        ({"kubernetes": {"memory_request": "4", "memory_limit": "4"}}, "give a unit, e.g. 4Gi"),
        ({"kubernetes": {"shm_size": "8Gi"}}, "--shm-size 8Gi exceeds --memory-limit 4Gi"),
        ({"kubernetes": {"cpu_limit": 2}}, "kubernetes.cpu_limit = 2 must be a string"),
    ],
)
def test_bad_kubernetes_fields_are_one_line_errors(tables: dict, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        build(tables)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--hosts", "a:2,b:2", "--format", "k8s"), "give --nodes, not --hosts"),
        (("--launcher", "mpirun", "--format", "k8s"), "--launcher mpirun: the Kubernetes manifests run torchrun"),
        (("--script", "examples/minimal_ddp.py", "--format", "k8s"), "--script is not shipped into these pods"),
        (("--name", "1st", "--format", "k8s"), "must start with a letter"),
        (("--nodes", "1", "--format", "pytorchjob"), "needs --nodes 2 or more"),
        (("--memory-limit", "1Gi", "--format", "k8s"), "--memory-limit 1Gi is below --memory-request 4Gi"),
        (("--training-runtime", "Torch_Dist", "--format", "trainjob"), "--training-runtime 'Torch_Dist' must be a DNS"),
        (("--nodes", "0", "--format", "trainjob"), "--nodes 0 must be"),
        (("--master-port", "29400", "--format", "trainjob"), "fixes the rendezvous port at 29500"),
        (("--master-port", "29400", "--format", "trainingruntime"), "drop --master-port"),
        (("--script", "no/such/job.py", "--format", "trainjob"), "cannot read --script no/such/job.py"),
        (("--launcher", "srun", "--format", "trainjob"), "--launcher srun: the Kubernetes manifests run torchrun"),
        (("--script", "examples/minimal_ddp.py", "--format", "pytorchjob"), "use --format trainjob (it ships it)"),
    ],
)
def test_cli_refuses_what_kubernetes_and_trainer_cannot_run(args: tuple[str, ...], message: str) -> None:
    done = _topology(*args)
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
