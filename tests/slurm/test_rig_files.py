"""The Slurm mini-cluster's own files (docker/slurm/): slurm.conf against its golden file,
the node names, the driver's reading of scontrol, and a one-line error for what the mini-cluster cannot be.
No containers: this runs with the unit tests' speed (``pytest tests/slurm/test_rig_files.py``).

Regenerate the golden file after an intended change (then read its diff):
    PYTHONPATH=docker:. python -c 'from slurm import slurmconf; from app.topology.spec import build; \
        print(slurmconf.slurm_conf(build(GOLDEN_TABLES)), end="")' > tests/slurm/golden/slurm.conf
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from slurm import minicluster, slurmconf

from app.errors import UsageError
from app.runtime import hostlist
from app.topology import spec

GOLDEN = Path(__file__).parent / "golden" / "slurm.conf"
GOLDEN_TABLES = {"job": {"name": "lab"}, "nodes": {"nodes": 3, "nproc_per_node": 2}, "slurm": {"cpus_per_rank": 2}}


def test_slurm_conf_is_the_golden_file() -> None:
    assert slurmconf.slurm_conf(spec.build(GOLDEN_TABLES)) == GOLDEN.read_text()


@pytest.mark.parametrize(
    ("tables", "message"),
    [
        ({"nodes": {"nodes": 17}}, "--nodes 17: the Slurm mini-cluster is for one machine"),
        ({"nodes": {"gpus_per_node": 1, "nproc_per_node": 1}}, "the Slurm mini-cluster has no GPUs"),
        ({"slurm": {"mpi": "cray_shasta"}}, "--mpi cray_shasta: the mini-cluster's srun has pmi2, pmix, none"),
    ],
)
def test_mini_cluster_refuses_what_it_cannot_be(tables: dict, message: str) -> None:
    with pytest.raises(UsageError, match=f"^{message}"):
        slurmconf.cluster_files(spec.build(tables))


def test_mini_cluster_node_names_match_the_node_line() -> None:
    two = spec.build({"job": {"name": "t"}, "nodes": {"nodes": 2}})
    assert slurmconf.node_names(two) == ["t-slurm-node-1", "t-slurm-node-2"]
    assert "NodeName=t-slurm-node-[1-2] CPUs=2 " in slurmconf.slurm_conf(two)
    one = spec.build({"job": {"name": "t"}, "nodes": {"nodes": 1}})
    assert "NodeName=t-slurm-node-1 CPUs=2 " in slurmconf.slurm_conf(one)


def test_the_host_renders_the_files_and_compose_gets_their_folder(tmp_path: Path) -> None:
    env = slurmconf.compose_env(spec.build({"job": {"name": "t"}}), "img", tmp_path)
    assert env["SLURM_FILES"] == str(tmp_path.resolve()) and "CLUSTER_SPEC" not in env
    assert sorted(slurmconf.cluster_files(spec.build({}))) == ["nodenames", "nodes.yaml", "slurm.conf"]


def _node_line_names(conf: str) -> list[str]:
    line = next(line for line in conf.splitlines() if line.startswith("NodeName="))
    return hostlist.expand(line.split()[0].removeprefix("NodeName="))


@pytest.mark.parametrize("nodes", [1, 3])
def test_every_node_is_named_alike_by_slurm_its_container_and_its_host(nodes: int) -> None:
    """Host name = container name = NodeName: app check, the doctor and torchrun name a node as Slurm and
    docker ps do (issue 25: they said its container id, 2517b8545cf4, while Slurm said t-slurm-node-[1-2])."""
    files = slurmconf.cluster_files(spec.build({"job": {"name": "t"}, "nodes": {"nodes": nodes}}))
    services = json.loads(files["nodes.yaml"])["services"]
    names = _node_line_names(files["slurm.conf"])
    assert len(names) == nodes and files["nodenames"].split() == names
    assert [(s["hostname"], s["container_name"]) for s in services.values()] == [(n, n) for n in names]
    assert all(s["extends"] == {"file": str(slurmconf.COMPOSE_FILE), "service": "node"} for s in services.values())


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI (compose reads the files; no engine needed)")
def test_compose_reads_the_nodes_as_their_names(tmp_path: Path) -> None:
    """What compose makes of compose.yaml and nodes.yaml: the template runs nothing, each node runs slurmd under
    its NodeName with the template's settings (its health check, the init it waits for)."""
    two = spec.build({"job": {"name": "t"}, "nodes": {"nodes": 2}})
    for name, text in slurmconf.cluster_files(two).items():
        (tmp_path / name).write_text(text)
    env = {**os.environ, **slurmconf.compose_env(two, "img", tmp_path)}
    files = ["-f", str(slurmconf.COMPOSE_FILE), "-f", str(tmp_path / slurmconf.NODES_FILE)]
    cmd = ["docker", "compose", *files, "-p", slurmconf.project(two), "config", "--format", "json"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    assert services["node"]["scale"] == 0
    for name in ("t-slurm-node-1", "t-slurm-node-2"):
        node = services[name.removeprefix("t-slurm-")]
        assert (node["hostname"], node["container_name"], node["command"]) == (name, name, ["slurm-daemon", "node"])
        assert "init" in node["depends_on"] and node["healthcheck"]["test"][1:] == ["slurm-daemon", "ready", "node"]


SCONTROL = (
    "JobId=3 JobName=slx UserId=app(1000) GroupId=app(1000) MCS_label=N/A Priority=1 Nice=0 Account=(null) "
    "QOS=(null) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 "
    "Reboot=0 ExitCode=2:0 RunTime=00:00:31 TimeLimit=00:20:00 NodeList=slx-slurm-node-[1-2] "
    "Command=/results/slurm/slx-20261122-114158.sbatch WorkDir=/results/slurm StdErr=/results/slurm/slx-3.out "
    "StdIn=/dev/null StdOut=/results/slurm/slx-3.out Power="
)
"""`scontrol show job --oneliner 3` on the mini-cluster (abridged), for a job whose ranks exited 2."""


def test_the_job_report_reads_scontrol() -> None:
    fields = minicluster.job_fields(SCONTROL)
    assert (fields["JobState"], fields["StdOut"], fields["NodeList"]) == (
        "FAILED",
        "/results/slurm/slx-3.out",
        "slx-slurm-node-[1-2]",
    )
    assert minicluster.exit_status(fields) == 2
    cancelled = {"JobState": "CANCELLED", "ExitCode": "0:15"}
    assert minicluster.exit_status(cancelled) == 143  # 128 + SIGTERM, as a shell says it
    assert minicluster.exit_status({"JobState": "CANCELLED", "ExitCode": "0:0"}) == 1  # cancelled while pending
    assert minicluster.exit_status({"JobState": "COMPLETED", "ExitCode": "0:0"}) == 0
