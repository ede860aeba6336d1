"""The Slurm mini-cluster's own files (a test rig: tests/rigs/slurm/): slurm.conf against its golden file,
the node names, the driver's reading of scontrol, and a one-line error for what the rig cannot be.
No containers: this runs with the unit tests' speed (``pytest tests/slurm/test_rig_files.py``).

Regenerate the golden file after an intended change (then read its diff):
    PYTHONPATH=. python -c 'from tests.rigs.slurm import slurmconf; from app.topology.spec import build; \
        print(slurmconf.slurm_conf(build(GOLDEN_TABLES)), end="")' > tests/slurm/golden/slurm.conf
"""

from pathlib import Path

import pytest

from app.errors import UsageError
from app.topology import spec
from tests.rigs.slurm import minicluster, slurmconf

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
    assert sorted(slurmconf.cluster_files(spec.build({}))) == ["nodenames", "slurm.conf"]


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
