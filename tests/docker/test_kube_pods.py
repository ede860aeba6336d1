"""The Indexed Job of ``app topology --format k8s``, its pods run by the Docker engine as a kubelet
would run them: no Kubernetes API server can run here, so this test stands in for the kubelet only.
Each pod becomes one container with the pod's own settings, read from the rendered manifest: its
command, user and groups, read-only root, dropped capabilities, no privilege escalation, resource
limits, emptyDirs (tmpfs), memory-backed /dev/shm, the ConfigMap (read-only files), the claim (a
volume), the hostname ``<job>-<i>`` in the subdomain of the headless Service, and its DNS name (a
network alias; Docker writes /etc/hosts as the kubelet does). A field the translation does not know
fails the test, so the manifest cannot grow past what is proven here.

Run: ``.venv/bin/python -m pytest tests/docker/test_kube_pods.py`` (about a minute once the image exists).
"""

import json
import subprocess
import sys
import uuid
from dataclasses import dataclass

import pytest
import yaml

from app.topology.spec import quantity

from .conftest import explain, run

pytestmark = pytest.mark.docker

POD_KEYS = {"subdomain", "restartPolicy", "automountServiceAccountToken", "enableServiceLinks", "securityContext"}
POD_KEYS |= {"containers", "volumes"}
CONTAINER_KEYS = {"name", "image", "imagePullPolicy", "command", "env", "ports", "resources", "securityContext"}
CONTAINER_KEYS |= {"volumeMounts"}


def _render(*args: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-m", "app", "topology", "--format", "k8s", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _security(pod: dict, container: dict) -> list[str]:
    """docker run options for the pod's and the container's security contexts."""
    ctx, own = pod["securityContext"], container["securityContext"]
    assert ctx["runAsNonRoot"] and ctx["runAsUser"] != 0 and ctx["seccompProfile"] == {"type": "RuntimeDefault"}
    assert own == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }, f"a security setting this test does not translate: {own}"
    # Docker's default seccomp profile is the runtime default; fsGroup owns the claim (a supplementary group).
    user = ["--user", f"{ctx['runAsUser']}:{ctx['runAsGroup']}", "--group-add", str(ctx["fsGroup"])]
    return [*user, "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]


def _resources(container: dict) -> list[str]:
    limits = container["resources"]["limits"]
    assert set(limits) == {"cpu", "memory"}, f"limits this test cannot give a container: {limits}"
    return ["--cpus", str(quantity("cpu", limits["cpu"])), "--memory", str(int(quantity("memory", limits["memory"])))]


def _volumes(pod: dict, container: dict, objects: dict, tmp_path, prefix: str) -> list[str]:
    """Mount options for each volumeMount: emptyDir as tmpfs, the claim as a volume, the ConfigMap as files."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    options = []
    for mount in container["volumeMounts"]:
        volume, path = volumes[mount["name"]], mount["mountPath"]
        if "emptyDir" in volume and volume["emptyDir"].get("medium") == "Memory":
            assert path == "/dev/shm"
            options += ["--shm-size", str(int(quantity("shm", volume["emptyDir"]["sizeLimit"])))]
        elif "emptyDir" in volume:
            options += ["--mount", f"type=tmpfs,destination={path},tmpfs-mode=1777"]
        elif "persistentVolumeClaim" in volume:
            claim = f"{prefix}-{volume['persistentVolumeClaim']['claimName']}"
            options += ["--mount", f"type=volume,source={claim},destination={path}"]
        elif "configMap" in volume:
            folder = tmp_path / volume["name"]
            folder.mkdir(exist_ok=True)
            for name, text in objects["ConfigMap"]["data"].items():
                (folder / name).write_text(text)
                (folder / name).chmod(0o644)
            folder.chmod(0o755)
            assert mount.get("readOnly") is True
            options += ["--mount", f"type=bind,source={folder},destination={path},readonly"]
        else:
            raise AssertionError(f"a volume this test does not translate: {volume}")
    return options


@dataclass
class Pod:
    """One pod of the Job as a container: its name, docker run options, image and arguments."""

    name: str
    options: list[str]
    image: str
    args: list[str]

    def start(self) -> list[str]:
        return ["docker", "run", "--detach", "--name", self.name, *self.options, self.image, *self.args]

    def probe(self, script: str) -> list[str]:
        """The same pod running a shell script instead (Docker takes the last --entrypoint)."""
        options = [*self.options, "--entrypoint", "bash"]
        return ["docker", "run", "--rm", "--name", f"{self.name}-probe", *options, self.image, "-c", script]


def pods_of(objects: dict, tmp_path, network: str, prefix: str) -> list[Pod]:
    """The Indexed Job's pods, each as the kubelet would start it."""
    job, service = objects["Job"], objects["Service"]
    pod = job["spec"]["template"]["spec"]
    assert set(pod) <= POD_KEYS, f"pod fields this test does not translate: {set(pod) - POD_KEYS}"
    (container,) = pod["containers"]
    assert set(container) <= CONTAINER_KEYS, f"unknown container fields: {set(container) - CONTAINER_KEYS}"
    assert pod["subdomain"] == service["metadata"]["name"] and pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    env = [f"{e['name']}={e['value']}" for e in container.get("env", [])]
    domain = f"{pod['subdomain']}.{job['metadata']['namespace']}.svc.cluster.local"
    common = [
        *_security(pod, container),
        *_resources(container),
        *_volumes(pod, container, objects, tmp_path, prefix),
        *[opt for e in env for opt in ("--env", e)],
        *["--network", network, "--entrypoint", container["command"][0]],
    ]
    pods = []
    for index in range(job["spec"]["completions"]):
        host = f"{job['metadata']['name']}-{index}"
        ident = ["--hostname", host, "--domainname", domain, "--network-alias", f"{host}.{domain}"]
        ident += ["--env", f"JOB_COMPLETION_INDEX={index}"]  # what the Job controller sets
        pods.append(Pod(f"{prefix}-{index}", [*ident, *common], container["image"], container["command"][1:]))
    return pods


PROBE = """
touch /home/app/x 2>/dev/null && echo root=writable || echo root=read-only
touch /cluster/x 2>/dev/null && echo cluster=writable || echo cluster=read-only
touch /tmp/x /home/app/.cache/x /results/x /dev/shm/x && echo volumes=writable
echo "user=$(id -u):$(id -g) groups=$(id -G | tr ' ' ,)"
echo "caps=$(awk '/^CapEff/ {print $2}' /proc/self/status)"
echo "nonewprivs=$(awk '/^NoNewPrivs/ {print $2}' /proc/self/status)"
echo "shm=$(df -B1 --output=size /dev/shm | tail -1 | tr -d ' ')"
echo "fqdn=$(python -c 'import socket; print(socket.getfqdn())')"
echo "args=$(head -c 10 /cluster/torchrun.args)"
"""


def _fields(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for line in text.split("\n") for item in line.split() if "=" in item)


def test_the_jobs_pods_train_together_under_their_security_context(cpu_image, tmp_path):
    prefix = f"kpod-{uuid.uuid4().hex[:8]}"
    command = "train --dataset digits --epochs 1 --out /results/k8s"
    flags = ("--name", prefix, "--image", cpu_image, "--command", command, "--results-claim", "results")
    rendered = _render(*flags, "--nodes", "2", "--nproc-per-node", "1")
    objects = {o["kind"]: o for o in rendered}
    pods = pods_of(objects, tmp_path, prefix, prefix)
    network = run(["docker", "network", "create", prefix], 60)
    assert network.returncode == 0, explain(network)
    try:
        # The controls: the pod cannot write its root or its ConfigMap, runs as app without
        # capabilities or a way to gain privileges, and finds its own DNS name in /etc/hosts.
        probe = run(pods[0].probe(PROBE), 120)
        assert probe.returncode == 0, explain(probe)
        assert _fields(probe.stdout) == {
            "root": "read-only",
            "cluster": "read-only",
            "volumes": "writable",
            "user": "1000:1000",
            "groups": "1000",
            "caps": "0000000000000000",
            "nonewprivs": "1",
            "shm": str(2**30),
            "fqdn": f"{prefix}-0.{prefix}.default.svc.cluster.local",
            "args": "--nnodes=2",
        }, probe.stdout
        for pod in pods:
            started = run(pod.start(), 120)
            assert started.returncode == 0, explain(started)
        waited = run(["docker", "wait", *(p.name for p in pods)], 600)
        logs = [run(["docker", "logs", p.name], 60) for p in pods]
        assert waited.stdout.split() == ["0", "0"], "\n".join(explain(log) for log in logs)
        assert "done: " in logs[0].stdout + logs[0].stderr, "rank 0 is not on pod 0\n" + explain(logs[0])
        read = [*pods[0].probe("cat /results/k8s/summary.json")]
        summary = json.loads(run(read, 120).stdout)
        assert (summary["world_size"], summary["nodes"], summary["params_identical"]) == (2, 2, True)
    finally:
        run(["docker", "rm", "--force", *(p.name for p in pods)], 120)
        run(["docker", "network", "rm", prefix], 60)
        run(["docker", "volume", "rm", f"{prefix}-results"], 60)
