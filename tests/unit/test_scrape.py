"""The renderings carry the nodes' metrics (issue 27): on Kubernetes the metrics port, the scrape annotations, a
pod-local events file, the NetworkPolicy's rule for Prometheus and the PodMonitor (``--format podmonitor``); for
a site's own Prometheus the scrape configuration of ``--format prometheus``, parsed and checked by ``promtool
check config`` (Debian's prometheus package, which ``make host-deps`` installs; without it, tests/deps.py's
rule). Slurm: test_slurm.py; Ansible: tests/ansible.

    pytest tests/unit/test_scrape.py
"""

import shutil
import subprocess
from pathlib import Path

import pytest

from app import contract
from app.runtime import launcher
from app.topology import kube, prometheus
from app.topology.spec import Host, build
from tests.deps import missing, need
from tests.unit.cli_errors import usage_error
from tests.unit.test_kube import VARIANTS, _documents, _pod_specs

yaml = need("yaml")

PODS = [name for name in VARIANTS if not name.startswith("trainjob")]
"""The golden files whose pods are written out (a TrainJob's are its runtime's: test_trainjob.py)."""
PROMETHEUS_POD = ({"app.kubernetes.io/name": "prometheus"}, {"kubernetes.io/metadata.name": "monitoring"})
"""A Prometheus pod's labels and its namespace's, as the Prometheus Operator and the Helm chart make them."""


def _templates(name: str) -> list[dict]:
    """The pod templates (metadata and spec) of a golden file."""
    found = []
    for obj in _documents(name):
        if obj["kind"] == "Job":
            found.append(obj["spec"]["template"])
        elif obj["kind"] == "PyTorchJob":
            found += [r["template"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
        elif obj["kind"] == "ClusterTrainingRuntime":
            found += [r["template"]["spec"]["template"] for r in obj["spec"]["template"]["spec"]["replicatedJobs"]]
    return found


@pytest.mark.parametrize("name", PODS)
def test_every_node_declares_its_metrics_port_and_the_scrape_annotations(name: str) -> None:
    templates = _templates(name)
    assert templates
    for template in templates:
        assert template["metadata"]["annotations"] == {
            "prometheus.io/scrape": "true",
            "prometheus.io/port": "9473",
            "prometheus.io/path": "/metrics",
        }
        (node,) = template["spec"]["containers"]
        metrics = {"name": "metrics", "containerPort": 9473, "protocol": "TCP"}
        assert metrics in node["ports"]


@pytest.mark.parametrize("name", PODS)
def test_every_node_keeps_its_events_on_a_volume_of_its_own_pod(name: str) -> None:
    """The node serves metrics only with an events file (launcher.events_file), which must be writable: the root
    file system is read-only, so the file's folder is an emptyDir of the pod (no storage shared between nodes)."""
    for pod in _pod_specs(_documents(name)[-1]):
        (node,) = pod["containers"]
        path = launcher.events_file({e["name"]: e["value"] for e in node["env"]})
        assert path is not None
        folder = str(Path(path).parent)
        (mount,) = [m for m in node["volumeMounts"] if m["mountPath"] == folder]
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume == {"name": mount["name"], "emptyDir": {}} and not mount.get("readOnly")


def _admitted(policy: dict, pod: dict, namespace: dict, port: int, same_namespace: bool) -> bool:
    """Whether a NetworkPolicy's ingress admits a connection from a pod (its labels) in a namespace (its labels)
    to ``port``: the API's rules for matchLabels selectors (a peer's podSelector alone means the policy's own
    namespace; with a namespaceSelector, namespaces that match it; ``{}`` matches all)."""

    def matches(selector: dict, labels: dict) -> bool:
        return selector.get("matchLabels", {}).items() <= labels.items()

    for rule in policy["spec"]["ingress"]:
        ports = [p["port"] for p in rule.get("ports", [])]
        if ports and port not in ports:
            continue
        for peer in rule["from"]:
            where = peer.get("namespaceSelector")
            in_namespace = same_namespace if where is None else matches(where, namespace)
            if in_namespace and matches(peer.get("podSelector", {}), pod):
                return True
    return False


@pytest.mark.parametrize("name", ["k8s-cpu", "pytorchjob-gpu", "trainjob-cpu"])
def test_the_network_policy_admits_prometheus_to_the_metrics_port_only(name: str) -> None:
    (policy,) = [o for o in _documents(name) if o["kind"] == "NetworkPolicy"]
    own = policy["spec"]["podSelector"]["matchLabels"]
    prometheus_pod, monitoring = PROMETHEUS_POD
    assert _admitted(policy, own, {}, 29500, True) and _admitted(policy, own, {}, 40123, True)  # the job's own
    assert _admitted(policy, prometheus_pod, monitoring, contract.METRICS_PORT, False)
    assert not _admitted(policy, prometheus_pod, monitoring, 29500, False)  # not the rendezvous
    assert not _admitted(policy, {"app": "web"}, monitoring, contract.METRICS_PORT, False)  # not any pod
    assert not _admitted(policy, own, {}, contract.METRICS_PORT, False)  # the same labels in another namespace


def test_the_prometheus_pods_are_the_specs() -> None:
    spec = build({"kubernetes": {"prometheus_pods": "app=prom,release=kps"}})
    (scrape,) = [r for r in kube.network_policy(spec)["spec"]["ingress"] if "ports" in r]
    pods = {"matchLabels": {"app": "prom", "release": "kps"}}
    assert scrape["from"] == [{"namespaceSelector": {}, "podSelector": pods}]


@pytest.mark.parametrize("value", ["prometheus", "a=b,", "a b=c", "a=b c", "=x", "a=" + "x" * 64])
def test_bad_prometheus_pods_are_one_line(capsys, value: str) -> None:
    err = usage_error(capsys, "topology", "--prometheus-pods", value, "--format", "k8s")
    assert f"--prometheus-pods {value!r} must be KEY=VALUE labels joined by commas" in err


def test_the_pod_monitor_scrapes_the_metrics_port_of_the_jobs_pods() -> None:
    (monitor,) = yaml.safe_load_all(kube.render_podmonitor(build({})))
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "PodMonitor")
    assert set(monitor["spec"]) == {"selector", "podMetricsEndpoints"}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint == {"port": "metrics", "path": "/metrics", "honorLabels": True}
    selector = monitor["spec"]["selector"]["matchLabels"]
    for name in ("k8s-cpu", "pytorchjob-cpu", "trainingruntime-cpu"):  # the pods it finds, by their named port
        for template in _templates(name):
            assert endpoint["port"] in [p["name"] for p in template["spec"]["containers"][0]["ports"]]
            if not name.startswith("trainingruntime"):  # (a runtime's pods get the job's labels from its TrainJob)
                assert selector.items() <= template["metadata"]["labels"].items()
    patched = _documents("trainjob-cpu")[-1]["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]
    labels = patched["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()  # a TrainJob's pods carry the job's labels by its patch


def test_the_pod_monitor_is_refused_where_kubernetes_is(capsys) -> None:
    err = usage_error(capsys, "topology", "--hosts", "a:2,b:2", "--format", "podmonitor")
    assert "Kubernetes names its own pods" in err


def _scrape(*hosts: str) -> dict:
    spec = build({"nodes": {"hosts": ",".join(hosts)}, "job": {"name": "llm"}})
    return yaml.safe_load(prometheus.render_scrape_config(spec, spec.nodes.hosts))


def test_the_scrape_configuration_names_the_job_and_every_hosts_metrics() -> None:
    (job,) = _scrape("node0:2", "10.0.0.2:2")["scrape_configs"]
    assert job == {
        "job_name": "llm",
        "honor_labels": True,
        "metrics_path": "/metrics",
        "static_configs": [{"targets": ["node0:9473", "10.0.0.2:9473"]}],
    }
    assert prometheus.target(Host("fd00::2", 1)) == "[fd00::2]:9473"


def test_the_scrape_configuration_needs_the_hosts(capsys) -> None:
    err = usage_error(capsys, "topology", "--nodes", "2", "--format", "prometheus")
    assert "this format needs the hosts by name: give --hosts node0:2,node1:2 or --hostfile FILE" in err


@pytest.mark.parametrize("broken", [False, True])
def test_promtool_accepts_the_scrape_configuration(tmp_path: Path, broken: bool) -> None:
    """Prometheus's own check of a prometheus.yml that holds the entry (Debian bookworm's 2.42); the control: a
    broken entry (a label name Prometheus refuses) fails it."""
    promtool = shutil.which("promtool") or missing("no promtool: make host-deps installs it (Debian's prometheus)")
    spec = build({"nodes": {"hosts": "node0:2,node1:2"}})
    entry = prometheus.render_scrape_config(spec, spec.nodes.hosts)
    if broken:
        entry = entry.replace("honor_labels: true", "honor_labels: true\n    bad-key: 1")
    config = tmp_path / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 15s\n" + entry)
    done = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, check=False)
    assert (done.returncode != 0) == broken, done.stdout + done.stderr
