"""The Indexed Job of ``app topology --format k8s``, its pods run by the Docker engine as a kubelet
would run them: no Kubernetes API server can run here, so this test stands in for the kubelet only
(``kubelet.py``). Each pod becomes one container with the pod's own settings, read from the
rendered manifest: its command, user and groups, read-only root, dropped capabilities, no privilege
escalation, resource limits, emptyDirs (tmpfs), memory-backed /dev/shm, the ConfigMap (read-only
files), the claim (a volume), the hostname ``<job>-<i>`` in the subdomain of the headless Service,
and its DNS name (a network alias; Docker writes /etc/hosts as the kubelet does).

Run: ``.venv/bin/python -m pytest tests/docker/test_kube_pods.py`` (about a minute once the image exists).
"""

import subprocess
import sys
import uuid

import pytest
import yaml

from .kubelet import HARDENED, PROBE, Pod, identity, pod_options, probe_and_train

pytestmark = pytest.mark.docker


def _render(*args: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-m", "app", "topology", "--format", "k8s", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def pods_of(objects: dict, tmp_path, network: str, prefix: str) -> list[Pod]:
    """The Indexed Job's pods, each as the kubelet would start it."""
    job, service = objects["Job"], objects["Service"]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["subdomain"] == service["metadata"]["name"] and pod["restartPolicy"] == "Never"
    config_maps = {objects["ConfigMap"]["metadata"]["name"]: objects["ConfigMap"]["data"]}
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    domain = f"{pod['subdomain']}.{job['metadata']['namespace']}.svc.cluster.local"
    common = pod_options(pod, config_maps, tmp_path, prefix, network)
    pods = []
    for index in range(job["spec"]["completions"]):
        host = f"{job['metadata']['name']}-{index}"
        ident = identity(host, domain, [f"{host}.{domain}"], {**env, "JOB_COMPLETION_INDEX": str(index)})
        pods.append(Pod(f"{prefix}-{index}", [*ident, *common], container["image"], container["command"][1:]))
    return pods


OWN_PROBE = """
touch /cluster/x 2>/dev/null && echo cluster=writable || echo cluster=read-only
echo "args=$(head -c 10 /cluster/torchrun.args)"
"""


def test_the_jobs_pods_train_together_under_their_security_context(cpu_image, tmp_path):
    prefix = f"kpod-{uuid.uuid4().hex[:8]}"
    command = "train --dataset digits --epochs 1 --out /results/k8s"
    flags = ("--name", prefix, "--image", cpu_image, "--command", command, "--results-claim", "results")
    rendered = _render(*flags, "--nodes", "2", "--nproc-per-node", "1")
    objects = {o["kind"]: o for o in rendered}
    pods = pods_of(objects, tmp_path, prefix, prefix)
    # The controls: the pod cannot write its root or its ConfigMap, runs as app without capabilities
    # or a way to gain privileges, and finds its own DNS name in /etc/hosts.
    probe, summary = probe_and_train(pods, prefix, pods[0], PROBE + OWN_PROBE, "/results/k8s/summary.json")
    assert probe == {
        **HARDENED,
        "cluster": "read-only",
        "fqdn": f"{prefix}-0.{prefix}.default.svc.cluster.local",
        "args": "--nnodes=2",
    }
    assert (summary["world_size"], summary["nodes"], summary["params_identical"]) == (2, 2, True)
