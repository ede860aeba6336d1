"""The kubelet's part, played by the Docker engine: a rendered pod becomes ``docker run`` options with
the pod's own settings (user and groups, read-only root, dropped capabilities, no privilege
escalation, resource limits, emptyDirs as tmpfs, memory-backed /dev/shm, ConfigMaps as read-only
files, the claim as a volume, variables), and a job's pods run together until they exit. A field
the translation does not know fails the test, so the manifests cannot grow past what is proven.
Used by test_kube_pods.py (the Indexed Job) and test_trainjob_pods.py (Kubeflow Trainer v2).
"""

import json
from dataclasses import dataclass
from pathlib import Path

from app.topology.spec import quantity

from .conftest import explain, run

POD_KEYS = {"subdomain", "restartPolicy", "automountServiceAccountToken", "enableServiceLinks", "securityContext"}
POD_KEYS |= {"containers", "volumes"}
CONTAINER_KEYS = {"name", "image", "imagePullPolicy", "command", "env", "ports", "resources", "securityContext"}
CONTAINER_KEYS |= {"volumeMounts"}
PROBE = """
touch /home/app/x 2>/dev/null && echo root=writable || echo root=read-only
touch /tmp/x /home/app/.cache/x /results/x /dev/shm/x && echo volumes=writable
echo "user=$(id -u):$(id -g) groups=$(id -G | tr ' ' ,)"
echo "caps=$(awk '/^CapEff/ {print $2}' /proc/self/status)"
echo "nonewprivs=$(awk '/^NoNewPrivs/ {print $2}' /proc/self/status)"
echo "shm=$(df -B1 --output=size /dev/shm | tail -1 | tr -d ' ')"
echo "fqdn=$(python -c 'import socket; print(socket.getfqdn())')"
"""
"""What every pod must show (a shell script; each test adds its own lines): key=value words."""
HARDENED = {
    "root": "read-only",
    "volumes": "writable",
    "user": "1000:1000",
    "groups": "1000",
    "caps": "0000000000000000",
    "nonewprivs": "1",
    "shm": str(2**30),
}
"""PROBE's words in a pod of the default spec: it cannot write its root, runs as app without capabilities
or a way to gain privileges, and has its volumes and a 1 GiB /dev/shm (the controls of each pod test)."""


def probed(text: str) -> dict[str, str]:
    """The key=value words of a probe's output."""
    return dict(item.split("=", 1) for line in text.split("\n") for item in line.split() if "=" in item)


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


def _volumes(pod: dict, container: dict, config_maps: dict[str, dict], folder: Path, prefix: str) -> list[str]:
    """Mount options for each volumeMount: emptyDir as tmpfs, the claim as a volume, a ConfigMap as files."""
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
            files = folder / volume["name"]
            files.mkdir(exist_ok=True)
            for name, text in config_maps[volume["configMap"]["name"]].items():
                (files / name).write_text(text)
                (files / name).chmod(0o644)
            files.chmod(0o755)
            assert mount.get("readOnly") is True
            options += ["--mount", f"type=bind,source={files},destination={path},readonly"]
        else:
            raise AssertionError(f"a volume this test does not translate: {volume}")
    return options


def pod_options(pod: dict, config_maps: dict[str, dict], folder: Path, prefix: str, network: str) -> list[str]:
    """The ``docker run`` options of a pod's one container, ``--entrypoint`` its command's first word."""
    assert set(pod) <= POD_KEYS, f"pod fields this test does not translate: {set(pod) - POD_KEYS}"
    (container,) = pod["containers"]
    assert set(container) <= CONTAINER_KEYS, f"unknown container fields: {set(container) - CONTAINER_KEYS}"
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    return [
        *_security(pod, container),
        *_resources(container),
        *_volumes(pod, container, config_maps, folder, prefix),
        *["--network", network, "--entrypoint", container["command"][0]],
    ]


def identity(hostname: str, domain: str, aliases: list[str], env: dict[str, str]) -> list[str]:
    """A pod's host name in its subdomain, its DNS names (network aliases; Docker writes /etc/hosts as the
    kubelet does) and the variables its controllers set."""
    options = ["--hostname", hostname, "--domainname", domain]
    options += [opt for alias in aliases for opt in ("--network-alias", alias)]
    return options + [opt for key, value in env.items() for opt in ("--env", f"{key}={value}")]


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


def train_together(pods: list[Pod], summary: str) -> dict:
    """Start every pod, wait for all to exit 0 (rank 0's last line on pod 0) and read ``summary`` from the claim."""
    for pod in pods:
        started = run(pod.start(), 120)
        assert started.returncode == 0, explain(started)
    waited = run(["docker", "wait", *(p.name for p in pods)], 600)
    logs = [run(["docker", "logs", p.name], 60) for p in pods]
    assert waited.stdout.split() == ["0"] * len(pods), "\n".join(explain(log) for log in logs)
    assert "done: " in logs[0].stdout + logs[0].stderr, "rank 0 is not on pod 0\n" + explain(logs[0])
    return json.loads(run(pods[0].probe(f"cat {summary}"), 120).stdout)


def probe_and_train(pods: list[Pod], prefix: str, probe: Pod, script: str, summary: str) -> tuple[dict, dict]:
    """On a network named ``prefix``: ``probe`` runs ``script`` (its ``probed`` lines), then every pod trains
    together (``train_together``'s summary); everything named after ``prefix`` is removed at the end."""
    network = run(["docker", "network", "create", prefix], 60)
    assert network.returncode == 0, explain(network)
    try:
        probe_run = run(probe.probe(script), 120)
        assert probe_run.returncode == 0, explain(probe_run)
        return probed(probe_run.stdout), train_together(pods, summary)
    finally:
        remove(pods, prefix)


def remove(pods: list[Pod], prefix: str) -> None:
    """Remove the pods' containers, the network and the claim's volume (all named after ``prefix``)."""
    run(["docker", "rm", "--force", *(p.name for p in pods)], 120)
    run(["docker", "network", "rm", prefix], 60)
    run(["docker", "volume", "rm", f"{prefix}-results"], 60)
