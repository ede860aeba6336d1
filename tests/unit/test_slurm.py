"""Slurm batch scripts rendered from the cluster spec: golden files for both batch styles, and a
one-line error for each bad field. (The Slurm mini-cluster's own files: tests/slurm/test_rig_files.py.)

Regenerate a golden file after an intended change (then read its diff):
    python -m app topology <FLAGS of GOLDEN below> > tests/unit/golden/<name>
"""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from app import cli
from app.topology import slurm, spec

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
}


def _render(flags: str) -> str:
    """What `python -m app topology FLAGS` prints."""
    proc = subprocess.run(
        [sys.executable, "-m", "app", "topology", *shlex.split(flags)],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.parametrize("name", GOLDEN)
def test_golden(name: str) -> None:
    rendered = _render(GOLDEN[name])
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
    elastic = slurm.render_script(
        spec.build({"nodes": {"nodes": 3, "min_nodes": 2}, "job": {"command": "train --accum-steps 2"}})
    )
    assert "--nnodes=2:3 " in elastic and "#SBATCH --no-kill" in elastic
    # the allocation and the step both outlive a node (sbatch's --no-kill alone leaves Slurm killing the step)
    assert "exec srun --ntasks-per-node=1 --kill-on-bad-exit=0 --no-kill \\\n" in elastic, elastic


def test_an_elastic_job_gives_every_nodes_agent_the_straggler_policy_a_fixed_one_none() -> None:
    elastic = spec.build(
        {
            "nodes": {"nodes": 3, "min_nodes": 2, "evict_factor": 4.0, "evict_after": 5},
            "job": {"command": "train --accum-steps 2"},
        }
    )
    said = slurm.render_script(elastic)
    records = '--records="/tmp/ddp-cluster-$SLURM_JOB_ID.gate"'  # this job's own gate figures, on each node
    policy = "--retry-every=10 --evict-factor=4 --evict-after=5"  # judged again until it passes, then it joins
    assert f"-m app node --serve-metrics {records} {policy} -- " in said
    off = spec.build(
        {"nodes": {"nodes": 3, "min_nodes": 2, "evict_factor": 0.0}, "job": {"command": "train --accum-steps 2"}}
    )
    assert "--evict" not in slurm.render_script(off)
    assert "--evict" not in slurm.render_script(spec.build({"nodes": {"nodes": 3}}))  # nothing to go on with


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


def _run_batch_script(tmp_path: Path, text: str) -> tuple[list[str], str | None]:
    """What the batch script starts: srun's words and the events file it passes on, with stand-ins for srun (it
    prints them) and scontrol (two nodes), and the variables Slurm sets."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    said = 'print(json.dumps([sys.argv[1:], os.environ.get("DDP_CLUSTER_EVENTS_FILE")]))'
    (bin_dir / "srun").write_text(f"#!/usr/bin/env python3\nimport json, os, sys\n{said}\n")
    (bin_dir / "scontrol").write_text("#!/bin/sh\nprintf 'n1\\nn2\\n'\n")
    for stand_in in bin_dir.iterdir():
        stand_in.chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-2]"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=True, timeout=30)
    words, events = json.loads(done.stdout.splitlines()[-1])
    return words, events


def test_torchrun_style_runs_the_node_agent_that_serves_metrics_from_a_node_local_events_file(tmp_path: Path) -> None:
    from tests.unit import kube_checks

    two = spec.build({"nodes": {"nodes": 2}, "job": {"command": "check"}})
    words, events = _run_batch_script(tmp_path, slurm.render_script(two))
    agent = words[words.index(two.slurm.python) :]
    args = kube_checks.node_agent_torchrun(agent)  # app node's parser, then torchrun's
    assert (args.rdzv_endpoint, args.rdzv_id, args.nnodes) == ("n1:20007", "7", "2")
    assert (args.training_script, args.training_script_args) == ("app", ["check"])
    assert events == "/tmp/ddp-cluster-7.events.jsonl"  # /tmp: each node's own file; the job id: each job's


def test_srun_style_starts_no_agent_and_keeps_no_events(tmp_path: Path) -> None:
    srun = spec.build({"job": {"launcher": "srun", "command": "check"}})
    words, events = _run_batch_script(tmp_path, slurm.render_script(srun))
    assert words[-4:] == [srun.slurm.python, "-m", "app", "check"] and events is None
