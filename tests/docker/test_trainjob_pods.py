"""The TrainJob of ``app topology --format trainjob`` on the runtime of ``--format trainingruntime``,
its pods run by the Docker engine: no API server, Trainer or JobSet controller can run here, so the
pods are what their source says they make (tests/unit/kube_trainer.py: the runtime's pod with the
TrainJob's image, command, resources and patches, and the torch plugin's PET_* variables), each
started as the kubelet would (``kubelet.py``) with the host name ``<job>-node-0-<i>`` in the
subdomain ``<job>``. The node agent (``python -m app node --serve-metrics``, torchrun's agent behind the
node's gate) gets no torchrun argument but the job: it reads its nodes, processes, node rank and pod 0's
address from PET_*; the pods rendezvous and train. Docker's DNS has no search domains,
so the short name PET_MASTER_ADDR gives (``<job>-node-0-0.<job>``, which cluster DNS completes) is
one more network alias of pod 0.

Run: ``.venv/bin/python -m pytest tests/docker/test_trainjob_pods.py`` (about 70 s once the image exists).
"""

import subprocess
import sys
import uuid

import pytest
import yaml

from tests.unit.kube_trainer import trainer_pods

from .kubelet import HARDENED, PROBE, Pod, identity, pod_options, probe_and_train

pytestmark = pytest.mark.docker


def _render(fmt: str, *args: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-m", "app", "topology", "--format", fmt, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def pods_of(train_job: dict, runtime: dict, tmp_path, network: str, prefix: str) -> list[Pod]:
    """The TrainJob's pods on ``runtime``, each as the kubelet would start it."""
    namespace = train_job["metadata"]["namespace"]
    pods = []
    for pod in trainer_pods(train_job, runtime):
        domain = f"{pod.subdomain}.{namespace}.svc.cluster.local"
        aliases = [f"{pod.hostname}.{domain}", f"{pod.hostname}.{pod.subdomain}"]
        options = [
            *identity(pod.hostname, domain, aliases, pod.env()),
            *pod_options(pod.spec, {}, tmp_path, prefix, network),
        ]
        pods.append(Pod(f"{prefix}-{pod.index}", options, pod.node["image"], pod.node["command"][1:]))
    return pods


OWN_PROBE = """
echo "pet=$PET_NNODES,$PET_NPROC_PER_NODE,$PET_NODE_RANK,$PET_MASTER_ADDR,$PET_MASTER_PORT"
"""


def test_the_trainjobs_pods_train_together_from_the_torch_plugins_variables(cpu_image, tmp_path):
    prefix = f"tjob-{uuid.uuid4().hex[:8]}"
    command = "train --dataset digits --epochs 1 --out /results/trainjob"
    flags = ("--name", prefix, "--image", cpu_image, "--command", command, "--results-claim", "results")
    flags += ("--nodes", "2", "--nproc-per-node", "1")
    (runtime,) = _render("trainingruntime", *flags)
    *_, train_job = _render("trainjob", *flags)
    pods = pods_of(train_job, runtime, tmp_path, prefix, prefix)
    agent = ["-m", "app", "node", "--serve-metrics", "--", "-m", "app"]  # torchrun's agent gets nothing but the job
    assert [p.args[:7] for p in pods] == [agent] * 2
    probe, summary = probe_and_train(pods, prefix, pods[1], PROBE + OWN_PROBE, "/results/trainjob/summary.json")
    assert probe == {
        **HARDENED,
        "fqdn": f"{prefix}-node-0-1.{prefix}.default.svc.cluster.local",
        "pet": f"2,1,1,{prefix}-node-0-0.{prefix},29500",
    }
    assert (summary["world_size"], summary["nodes"], summary["params_identical"]) == (2, 2, True)
