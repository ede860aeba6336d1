"""Offline validators of Kubernetes manifests, for the tests: the API's own schemas (built-in kinds,
bundled by kubernetes-validate), the openAPIV3Schema of the Kubeflow CRDs (PyTorchJob, TrainJob,
ClusterTrainingRuntime; from shared/k8s) and the Pod Security Standard "restricted" profile.

The CRD files are data kept beside the checkout (``<repo>/../shared/k8s``, or the folder that
DDP_K8S_SCHEMAS names): never copied into the repository. Where they are absent, the tests that need
them skip with one line naming both, or fail where the test dependencies are required (tests/deps.py).
"""

import copy
import os
import re
from functools import cache
from pathlib import Path

import pytest

from tests.deps import missing, need

jsonschema = need("jsonschema")
kubernetes_validate = need("kubernetes_validate")
yaml = need("yaml")

K8S_VERSIONS = ("1.31", "1.37")
"""Kubernetes versions the manifests are validated against (strict: unknown fields are errors): 1.31,
the first with podFailurePolicy GA, and 1.37, the newest that kubernetes-validate bundles."""
SCHEMAS_ENV = "DDP_K8S_SCHEMAS"
UPDATE_GOLDEN_ENV = "DDP_UPDATE_GOLDEN"
"""Set to 1, the golden tests rewrite their files from what the CLI renders (then review the diff)."""
DEFAULT_SCHEMAS = Path(__file__).resolve().parents[3] / "shared" / "k8s"
PYTORCHJOB_CRD = "kubeflow.org_pytorchjobs.yaml"
TRAINJOB_CRD = "trainer.kubeflow.org_trainjobs.yaml"
RUNTIME_CRD = "trainer.kubeflow.org_clustertrainingruntimes.yaml"
KUBEFLOW_RUNTIME = "runtime_torch_distributed.yaml"
"""Kubeflow Trainer's default ClusterTrainingRuntime, torch-distributed (a real runtime: a control)."""


def schemas_dir() -> Path:
    """The folder of the CRDs: $DDP_K8S_SCHEMAS, else shared/k8s beside the checkout."""
    return Path(os.environ.get(SCHEMAS_ENV) or DEFAULT_SCHEMAS)


def schema_file(name: str) -> Path:
    """``name`` in the CRDs' folder; where it is absent, the test is ``missing`` it."""
    path = schemas_dir() / name
    if not path.is_file():
        missing(
            f"no {name} in {path.parent}: put the Kubeflow CRDs in shared/k8s beside the checkout "
            f"({DEFAULT_SCHEMAS}) or set {SCHEMAS_ENV} to their folder"
        )
    return path


def golden_text(path: Path, rendered: str) -> str:
    """What ``path`` holds, to compare ``rendered`` with; under DDP_UPDATE_GOLDEN=1, ``rendered`` is written there
    first. Under CI (CI=true) that is refused with one line: a test that writes what it compares cannot fail."""
    if os.environ.get(UPDATE_GOLDEN_ENV) == "1":
        if os.environ.get("CI") == "true":
            pytest.fail(
                f"{UPDATE_GOLDEN_ENV}=1 under CI=true would write {path.name} from the output it checks: "
                f"unset {UPDATE_GOLDEN_ENV} in CI (update golden files locally, then review the diff)",
                pytrace=False,
            )
        path.write_text(rendered)
    return path.read_text()


def validate_builtin(obj: dict, version: str) -> None:
    """Raise kubernetes_validate's ValidationError (or SchemaNotFoundError for an unknown kind)."""
    kubernetes_validate.validate(obj, version, strict=True)


def _strict(node):
    """The schema with unknown fields refused wherever the API server prunes them, as ``kubectl apply``
    (``--validate=strict``, its default) refuses them."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    open_ended = "additionalProperties" in node or node.get("x-kubernetes-preserve-unknown-fields")
    if node.get("type") == "object" and "properties" in node and not open_ended:
        out["additionalProperties"] = False
    return out


def _unique_map_keys(validator, keys, instance, schema):
    """``x-kubernetes-list-type: map``: no two items with the same keys (e.g. two ports 29500/TCP)."""
    if schema.get("x-kubernetes-list-type") != "map" or not isinstance(instance, list):
        return
    seen = set()
    for item in instance:
        key = tuple(item.get(k, "TCP" if k == "protocol" else None) for k in keys)
        if key in seen:
            yield jsonschema.ValidationError(f"duplicate entry for keys {keys}: {key}")
        seen.add(key)


CrdValidator = jsonschema.validators.extend(
    jsonschema.Draft7Validator, {"x-kubernetes-list-map-keys": _unique_map_keys}
)


def crd_validator(file_name: str, version: str) -> jsonschema.Draft7Validator:
    """A validator for the ``version`` of the CRD ``file_name`` in the CRDs' folder (skips without it)."""
    return _crd_validator(schema_file(file_name), version)


@cache
def _crd_validator(path: Path, version: str) -> jsonschema.Draft7Validator:
    crd = yaml.safe_load(path.read_text())
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]
    return CrdValidator(_strict(copy.deepcopy(schema)))


RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim"}
RESTRICTED_VOLUMES |= {"projected", "secret"}


def restricted_violations(pod: dict) -> list[str]:
    """Where a pod spec breaks the Pod Security Standard "restricted" (and our read-only root), as text.

    The profile's rules (kubernetes.io/docs/concepts/security/pod-security-standards): no host
    namespaces or ports, no privileged containers, no privilege escalation, non-root, seccomp
    RuntimeDefault or Localhost, every capability dropped (NET_BIND_SERVICE may be added back), only
    the listed volume types.
    """
    found = [f"spec.{k}" for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)]
    pod_ctx = pod.get("securityContext", {})
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        found += [f"volume {volume['name']}: {k}" for k in kinds - RESTRICTED_VOLUMES]
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        ctx = c.get("securityContext", {})
        where = f"container {c.get('name')}"
        if ctx.get("privileged"):
            found.append(f"{where}: privileged")
        if ctx.get("allowPrivilegeEscalation") is not False:
            found.append(f"{where}: allowPrivilegeEscalation is not false")
        if not ctx.get("runAsNonRoot", pod_ctx.get("runAsNonRoot")):
            found.append(f"{where}: runAsNonRoot is not true")
        if ctx.get("runAsUser", pod_ctx.get("runAsUser")) == 0:
            found.append(f"{where}: runAsUser 0")
        seccomp = ctx.get("seccompProfile", pod_ctx.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append(f"{where}: seccompProfile {seccomp}")
        caps = ctx.get("capabilities", {})
        if "ALL" not in caps.get("drop", []) or set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append(f"{where}: capabilities not dropped")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            found.append(f"{where}: hostPort")
        if ctx.get("readOnlyRootFilesystem") is not True:
            found.append(f"{where}: root file system is writable")
    return found


_RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
CEL_RULES = {
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')": lambda o: bool(_RFC1035.match(o["metadata"]["name"])),
    "size(self.metadata.name) <= 63": lambda o: len(o["metadata"]["name"]) <= 63,
    "self >= 1": lambda v: v >= 1,
    "[has(self.torch), has(self.mpi), has(self.jax), has(self.xgboost),has(self.flux)].filter(x, x).size() <= 1": (
        lambda p: len({"torch", "mpi", "jax", "xgboost", "flux"} & set(p)) <= 1
    ),
    "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && "
    "self.replicatedJobs.exists(x, has(x.dependsOn)))": (
        lambda s: (
            not (
                s.get("startupPolicy", {}).get("startupPolicyOrder") == "InOrder"
                and any("dependsOn" in r for r in s.get("replicatedJobs", []))
            )
        )
    ),
}
"""The CEL rules (``x-kubernetes-validations``) that the Trainer CRDs put on the fields our objects and
Kubeflow's runtime use, each written out in Python: the API server evaluates them on create."""


def cel_violations(schema: dict, instance, path: str = "") -> list[str]:
    """The CEL rules of ``schema`` that ``instance`` breaks, as text; a rule not in CEL_RULES is reported
    too (a refreshed CRD must not pass unchecked). Transition rules (``oldSelf``) apply on update only."""
    found = []
    for rule in schema.get("x-kubernetes-validations", []):
        if "oldSelf" in rule["rule"]:
            continue
        check = CEL_RULES.get(rule["rule"])
        if check is None:
            found.append(f"{path or '.'}: a CEL rule this check cannot evaluate: {rule['rule']}")
        elif not check(instance):
            found.append(f"{path or '.'}: {rule.get('message', rule['rule'])}")
    if isinstance(instance, dict):
        extra = schema.get("additionalProperties")
        for key, value in instance.items():
            sub = schema.get("properties", {}).get(key, extra if isinstance(extra, dict) else None)
            if sub is not None:
                found += cel_violations(sub, value, f"{path}.{key}")
    elif isinstance(instance, list) and "items" in schema:
        for i, value in enumerate(instance):
            found += cel_violations(schema["items"], value, f"{path}[{i}]")
    return found


def node_agent_torchrun(command: list[str]):
    """torchrun's arguments in a node's command, ``PYTHON -m app node --serve-metrics -- ARGS JOB``, read by the app's
    own parser and then torchrun's (which takes the PET_* variables of the environment as its defaults, as torchrun
    would); fails unless the command runs the node agent serving its metrics."""
    from torch.distributed.run import get_args_parser

    from app import cli

    assert command[1:4] == ["-m", "app", "node"], command  # after a Python
    parser, _ = cli.build_parser("node")
    node = parser.parse_args(command[4:])
    assert node.serve_metrics, command
    words = node.torchrun[1:] if node.torchrun[:1] == ["--"] else node.torchrun
    return get_args_parser().parse_args(words)
