"""The compose cluster's files, rendered once on the host: names, rank order, every node's command.

Run: ``.venv/bin/python -m pytest tests/unit/test_compose.py`` (under a second).
"""

import dataclasses
import json
import re
from pathlib import Path

import pytest

from app import cli, contract, evict
from app.topology import compose, render
from app.topology.spec import build

SPEC = build({"nodes": {"nodes": 11, "nproc_per_node": 2}, "job": {"name": "demo", "command": "check"}})


def test_every_node_is_named_as_docker_names_its_container_and_host():
    services = json.loads(compose.nodes_file(SPEC))["services"]
    assert services["head"]["hostname"] == services["head"]["container_name"] == "demo-head-1"
    assert services["head"]["extends"] == services["worker-3"]["extends"], "the head is a worker like the others"
    assert services["rendezvous"]["container_name"] == "demo-rendezvous-1" and services["rendezvous"]["command"] == [
        "29500"
    ]
    assert services["worker-10"]["hostname"] == services["worker-10"]["container_name"] == "demo-worker-10"
    assert services["mpi-worker-11"]["hostname"] == "demo-mpi-worker-11"
    assert services["worker-3"]["extends"] == {"file": str(compose.COMPOSE_FILE), "service": "worker"}
    assert services["worker-3"]["command"] == ["--local-addr=demo-worker-3", "-m", "app", "check"]
    assert services["launcher"]["command"] == ["python", "-m", "app", "check"]
    assert len([name for name in services if name.startswith("worker-")]) == 10


def test_ranks_follow_c10ds_order_of_the_rendered_addresses():
    """c10d sorts the nodes' addresses: worker-10 comes before worker-2; the head is always first."""
    order = compose.rank_order(SPEC)
    assert order[:4] == ["demo-head-1", "demo-worker-1", "demo-worker-10", "demo-worker-2"]
    assert compose.node_ranks(SPEC, "demo-head-1") == [0, 1]
    assert compose.node_ranks(SPEC, "demo-worker-10") == [4, 5]
    assert compose.node_ranks(SPEC, "demo-worker-2") == [6, 7]
    assert compose.node_ranks(SPEC, "demo-init-1") == []
    addresses = {c.split("=", 1)[1] for s in json.loads(compose.nodes_file(SPEC))["services"].values()
                 for c in s.get("command", [])[:1] if c.startswith("--local-addr=")}  # fmt: skip
    assert sorted(addresses) == order, "the ranks are computed from the addresses that nodes.yaml gives"


def test_the_nodes_get_rendered_files_not_the_spec(tmp_path):
    files = compose.cluster_files(SPEC, tmp_path)
    assert sorted(files) == ["compose.env", "events/README", "job/README", "monitor/prometheus.yml", "node/cluster.env",
                             "node/hostfile", "node/mpirun.args", "node/node.args", "node/ssh/README",
                             "node/torchrun.args", "nodes.yaml"]  # fmt: skip
    assert "CLUSTER_SPEC" not in files["compose.env"] and "{" not in files["compose.env"]
    assert f"NODE_FILES='{tmp_path.resolve()}/node'" in files["compose.env"]
    # The c10d store has a container of its own, whose name matches no node: every node's agent is a client.
    store = SPEC.as_dict() | {"rendezvous": SPEC.as_dict()["rendezvous"] | {"master_addr": "demo-rendezvous-1"}}
    assert files["node/torchrun.args"].split() == render.torchrun_args(build(store), compose.torchrun_hosts(SPEC))
    assert "--rdzv-endpoint=demo-rendezvous-1:29500" in files["node/torchrun.args"]
    assert "MASTER_ADDR=demo-rendezvous-1\n" in files["node/cluster.env"]
    assert "MASTER_ADDR=demo-mpi-worker-1" in files["node/mpirun.args"], "mpirun's rank 0 serves its own store"
    assert "-x DDP_CLUSTER_EVENTS_FILE=/events/events.jsonl" in files["node/mpirun.args"]  # its ranks' events
    assert files["node/node.args"] == f"--retry-every={contract.GATE_RETRY_S}\n", "the gate's alone (not elastic)"


def test_the_specs_gate_seconds_and_fraction_reach_every_engines_node_agent() -> None:
    quick = build({"nodes": {"gate_seconds": 0.2, "gate_fail_below": 0.25, "min_nodes": 1}})
    gate = ["--device-seconds=0.2", "--fail-below=0.25", f"--retry-every={contract.GATE_RETRY_S}"]
    policy = [f"--evict-factor={evict.FACTOR:g}", f"--evict-after={evict.AFTER}"]  # elastic: the agent evicts
    assert compose.node_files(quick)[contract.NODE_ARGS] == " ".join([*gate, *policy]) + "\n"  # as on every engine
    assert render.node_args(quick) == [*gate, *policy]
    assert render.node_args(build({"nodes": {"gate_seconds": 0.2, "gate_fail_below": 0.25}})) == gate  # not elastic
    assert render.gate_args(build({})) == []


def test_topology_writes_the_compose_files(tmp_path, capsys):
    assert cli.main(["topology", "--nodes", "3", "--format", "compose-files", "--output-dir", str(tmp_path)]) == 0
    assert (
        json.loads((tmp_path / "nodes.yaml").read_text())["services"]["worker-2"]["hostname"] == "ddp-cluster-worker-2"
    )
    assert (tmp_path / "node" / "torchrun.args").read_text().startswith("--nnodes=3 ")
    assert cli.main(["topology", "--format", "compose-path"]) == 0
    assert capsys.readouterr().out == f"{compose.COMPOSE_FILE}\n" and compose.COMPOSE_FILE.is_file()


@pytest.mark.parametrize("where", ["compose.yaml", "docs/engines.md"])
def test_the_compose_command_by_hand_names_files_that_topology_renders(tmp_path, capsys, where: str) -> None:
    """The documented ``docker compose ... -f ... --env-file ...`` after ``app topology --output-dir DIR``: every file
    it names under DIR is one that command writes (it once named build/cluster/ddp-tests/rigs/nodes.yaml)."""
    text = (Path(__file__).parents[2] / where).read_text()
    rendered = re.search(r"python -m app topology --nodes (\d+) --format compose-files --output-dir (\S+)", text)
    assert rendered, where
    named = re.findall(r"(?:-f|--env-file) (build/cluster/\S+)", text)  # the compose files under the state folder
    assert named, where
    words = ["topology", "--nodes", rendered[1], "--format", "compose-files", "--output-dir", str(tmp_path)]
    assert cli.main(words) == 0
    capsys.readouterr()
    prefix = rendered[2] + "/"
    missing = [path for path in named if not (path.startswith(prefix) and (tmp_path / path[len(prefix) :]).is_file())]
    assert missing == [], f"{where} names files that app topology does not write into {rendered[2]}"


def test_compose_yaml_takes_every_value_from_the_rendered_env_file_and_restates_no_path_of_the_nodes(tmp_path):
    """compose.yaml holds no defaults: every variable it reads is one the env file renders, the paths the nodes see
    (/cluster, /results, /job, /events: app/contract.py) among them."""
    text = compose.COMPOSE_FILE.read_text()
    rendered = dict(line.split("=", 1) for line in compose.env_file(build({}), tmp_path).splitlines())
    assert set(re.findall(r"\$\{([A-Z_]+)", text)) <= set(rendered)
    assert {rendered[key].strip("'") for key in ("CLUSTER_MOUNT", "RESULTS_MOUNT", "JOB_MOUNT", "EVENTS_MOUNT")} == {
        contract.CLUSTER_DIR, contract.RESULTS_DIR, contract.JOB_DIR, contract.EVENTS_DIR}  # fmt: skip
    body = "\n".join(line.split("#")[0] for line in text.splitlines())  # the comments may name them
    assert not re.findall(r"(?::|target: )/(?:cluster|results|job|events)\b", body)


def test_the_monitor_profiles_prometheus_scrapes_every_torchrun_node_and_keeps_their_labels(tmp_path) -> None:
    files = compose.cluster_files(SPEC, tmp_path, compose.Monitor(image="p:1", port=9999))
    config = json.loads(files["monitor/prometheus.yml"])
    [scrape] = config["scrape_configs"]
    assert scrape["job_name"] == SPEC.job.name and scrape["honor_labels"] is True
    nodes = sorted(h.name for h in compose.torchrun_hosts(SPEC))
    assert scrape["static_configs"] == [{"targets": [f"{name}:{contract.METRICS_PORT}" for name in nodes]}]
    assert "MONITOR_IMAGE='p:1'" in files["compose.env"] and "MONITOR_PORT='9999'" in files["compose.env"]
    assert f"MONITOR_FILES='{tmp_path.resolve()}/monitor'" in files["compose.env"]
    mpi = dataclasses.replace(SPEC, job=dataclasses.replace(SPEC.job, launcher="mpirun"))
    assert json.loads(compose.prometheus_config(mpi))["scrape_configs"][0]["static_configs"] == [{"targets": []}]
