"""Slurm batch scripts and the Slurm mini-cluster's files, rendered from the cluster spec: golden
files for both batch styles and slurm.conf, and a one-line error for each bad field.

Regenerate a golden file after an intended change (then read its diff):
    python -m app topology <FLAGS of GOLDEN below> > tests/unit/golden/<name>   (slurm.conf: from --output-dir)
"""

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from app import cli
from app.topology import slurm, slurmcluster, spec

GOLDEN_DIR = Path(__file__).parent / "golden"
GOLDEN = {
    "sbatch-torchrun.sh": (
        "--name lab --nodes 4 --nproc-per-node 8 --gpus-per-node 8 --partition gpu --account ml "
        "--max-restarts 2 --time-limit 5401 --python /shared/venv/bin/python --cpus-per-rank 6 --exclusive "
        "--command 'train --dataset mnist --out /shared/runs/lab --resume auto' --format sbatch"
    ),
    "sbatch-srun.sh": (
        "--name lab --launcher srun --nodes 2 --nproc-per-node 4 --master-port 29400 --ifname ib0 --no-requeue "
        "--output-pattern logs/%x-%j.out --error-pattern logs/%x-%j.err "
        "--command \"check --json '/shared/runs/lab check.json'\" --format sbatch"
    ),
    "slurm.conf": "--name lab --nodes 3 --nproc-per-node 2 --cpus-per-rank 2 --format slurm-files --output-dir {dir}",
}


def _render(flags: str, tmp_path: Path) -> str:
    """What `python -m app topology FLAGS` prints (or writes, for the formats with files)."""
    proc = subprocess.run(
        [sys.executable, "-m", "app", "topology", *shlex.split(flags.format(dir=tmp_path))],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr
    return (tmp_path / "slurm.conf").read_text() if "--output-dir" in flags else proc.stdout


@pytest.mark.parametrize("name", GOLDEN)
def test_golden(name: str, tmp_path: Path) -> None:
    rendered = _render(GOLDEN[name], tmp_path)
    expected = (GOLDEN_DIR / name).read_text()
    assert rendered == expected, f"regenerate: python -m app topology {GOLDEN[name]} > tests/unit/golden/{name}"


def test_srun_style_without_custom_port_leaves_it_to_the_launcher() -> None:
    text = slurm.render_script(spec.build({"job": {"launcher": "srun", "command": "check"}}))
    assert "MASTER_PORT" not in text and "exec srun --kill-on-bad-exit=1 --mpi=pmi2" in text
    assert "#SBATCH --ntasks-per-node=2" in text and "#SBATCH --requeue" in text


def test_torchrun_style_takes_its_port_from_the_job_id_and_runs_the_script_unchanged() -> None:
    job = {"script": "/shared/jobs/train.py", "args": "--lr 0.1 --tag 'a b'"}
    text = slurm.render_script(spec.build({"job": job}))
    assert "port=$((20000 + SLURM_JOB_ID % 10000))" in text
    assert '--rdzv-endpoint="$head:$port" --rdzv-id="$SLURM_JOB_ID"' in text
    assert text.rstrip().endswith("/shared/jobs/train.py --lr 0.1 --tag 'a b'")
    assert "#SBATCH --time=20" in text  # 1200 s


def test_min_nodes_lets_the_other_agents_go_on() -> None:
    all_or_none = slurm.render_script(spec.build({"nodes": {"nodes": 3}}))
    assert "--nnodes=3 " in all_or_none and "--kill-on-bad-exit=1" in all_or_none and "--no-kill" not in all_or_none
    elastic = slurm.render_script(spec.build({"nodes": {"nodes": 3, "min_nodes": 2}}))
    assert "--nnodes=2:3 " in elastic and "--kill-on-bad-exit=0" in elastic and "#SBATCH --no-kill" in elastic


def test_the_job_command_is_quoted_for_the_shell() -> None:
    text = slurm.render_script(spec.build({"job": {"command": "check --json '/tmp/x y.json'; rm -rf /"}}))
    last = text.rstrip().splitlines()[-1]
    assert shlex.split(last) == ["-m", "app", "check", "--json", "/tmp/x y.json;", "rm", "-rf", "/"]


BAD = [
    ("--launcher mpirun", "--launcher mpirun has no Slurm batch style"),
    ("--hosts a:2,b:2", "--hosts: Slurm picks a job's nodes"),
    ("--master-addr node0", "--master-addr: under Slurm"),
    ("--launcher srun --script t.py", "--script is a torchrun script"),
    ("--partition 'gpu a'", "--partition 'gpu a' is not a Slurm name"),
    ("--account 'ml;x'", "--account 'ml;x' is not a Slurm name"),
    ("--output-pattern 'a b.out'", "--output-pattern 'a b.out' must be a file name pattern"),
    ("--error-pattern ''", "--error-pattern '' must be a file name pattern"),
    ("--python '/opt/venv/bin/python -u'", "--python '/opt/venv/bin/python -u' must be one path"),
    ("--cpus-per-rank 0", "--cpus-per-rank 0 must be >= 1"),
    ("--mpi 'pmi 2'", "--mpi 'pmi 2' must be an srun MPI plugin"),
    ("--time-limit 0", "--time-limit 0 must be >= 1"),
]


@pytest.mark.parametrize(("flags", "message"), BAD)
def test_bad_field_is_one_line_naming_it(flags: str, message: str, capsys: pytest.CaptureFixture) -> None:
    status = cli.main(["topology", *shlex.split(flags), "--format", "sbatch"])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ("--nodes 17", "--nodes 17: the Slurm mini-cluster is for one machine"),
        ("--gpus-per-node 1 --nproc-per-node 1", "the Slurm mini-cluster has no GPUs"),
        ("--mpi cray_shasta", "--mpi cray_shasta: the mini-cluster's srun has pmi2, pmix, none"),
    ],
)
def test_mini_cluster_refuses_what_it_cannot_be(flags: str, message: str, tmp_path: Path, capsys) -> None:
    status = cli.main(["topology", *shlex.split(flags), "--format", "slurm-files", "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith(f"error: {message}") and err.count("\n") == 1, err


def test_mini_cluster_node_names_match_the_node_line() -> None:
    two = spec.build({"job": {"name": "t"}, "nodes": {"nodes": 2}})
    assert slurmcluster.node_names(two) == ["t-slurm-node-1", "t-slurm-node-2"]
    assert "NodeName=t-slurm-node-[1-2] CPUs=2 " in slurmcluster.slurm_conf(two)
    one = spec.build({"job": {"name": "t"}, "nodes": {"nodes": 1}})
    assert "NodeName=t-slurm-node-1 CPUs=2 " in slurmcluster.slurm_conf(one)


SCONTROL = (
    "JobId=3 JobName=slx UserId=app(1000) GroupId=app(1000) MCS_label=N/A Priority=1 Nice=0 Account=(null) "
    "QOS=(null) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 "
    "Reboot=0 ExitCode=2:0 RunTime=00:00:31 TimeLimit=00:20:00 NodeList=slx-slurm-node-[1-2] "
    "Command=/results/slurm/slx-20261122-114158.sbatch WorkDir=/results/slurm StdErr=/results/slurm/slx-3.out "
    "StdIn=/dev/null StdOut=/results/slurm/slx-3.out Power="
)
"""`scontrol show job --oneliner 3` on the mini-cluster (abridged), for a job whose ranks exited 2."""


def test_the_job_report_reads_scontrol() -> None:
    from cluster.slurm import minicluster

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
