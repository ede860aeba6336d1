"""Real Slurm: jobs submitted with sbatch on the mini-cluster (slurmctld, 2 slurmd containers,
munge), run by srun across both nodes in either batch style, reported by `make slurm-job`; and an
elastic job on a mini-cluster of 3 nodes, one of them killed.

    make slurm-image && pytest -m slurm tests/slurm        # about 4 minutes on 2 busy cores
"""

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch
from bench import fault_job

from app import contract
from tests.slurm.conftest import JOB_TIMEOUT, ROOT, SlurmCluster, docker, explain, make

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STYLES = [("torchrun", "torchrun"), ("srun", "slurm")]
"""Each batch style and the launcher that app/runtime/launcher.py then finds in every rank."""
TRAIN = "train --dataset digits --epochs 3 --out /results/train-{style}"


@pytest.mark.parametrize(("style", "launcher"), STYLES)
def test_check_runs_four_ranks_on_two_nodes(slurm_cluster: SlurmCluster, style: str, launcher: str) -> None:
    # No device verdict on two equal nodes (it would judge this machine's load): test_measure.py judges it
    proc = slurm_cluster.job(style, f"check --device-seconds 0 --json /results/check-{style}.json")
    assert proc.returncode == 0, explain(proc)
    report = json.loads((slurm_cluster.results / f"check-{style}.json").read_text())
    assert (report["ok"], report["world_size"], report["launcher"]) == (True, 4, launcher), report
    by_host: dict[str, list[int]] = {}
    for rank in report["ranks"]:
        by_host.setdefault(rank["host"], []).append(rank["local_rank"])
    assert sorted(by_host.values()) == [[0, 1], [0, 1]], f"want 2 ranks on each of 2 hosts: {by_host}"
    nodes = [f"{slurm_cluster.project}-node-{i}" for i in (1, 2)]
    assert sorted(by_host) == nodes, f"the hosts named as Slurm names its nodes: {by_host}"  # not container ids
    assert f"COMPLETED on {slurm_cluster.project}-node-[1-2]" in proc.stdout


def test_training_is_the_same_under_both_styles(slurm_cluster: SlurmCluster) -> None:
    summaries = {}
    for style, launcher in STYLES:
        proc = slurm_cluster.job(style, TRAIN.format(style=style))
        assert proc.returncode == 0, explain(proc)
        assert "slurm: summary (" in proc.stdout and "epoch 3/3" in proc.stdout, explain(proc)
        summary = json.loads((slurm_cluster.results / f"train-{style}" / "summary.json").read_text())
        assert (summary["launcher"], summary["world_size"], summary["nodes"]) == (launcher, 4, 2)
        assert summary["params_identical"] and summary["test_accuracy"] > 0.85, summary
        summaries[style] = summary
    # One job, two launch styles: the same ranks see the same data, so the same model comes out, bit for bit
    # (an accuracy alone would match many models).
    final = {style: _model_state(slurm_cluster.results, s["checkpoint"]) for style, s in summaries.items()}
    assert final["torchrun"].keys() == final["srun"].keys()
    differ = [name for name in final["torchrun"] if not torch.equal(final["torchrun"][name], final["srun"][name])]
    assert not differ, f"the final checkpoints differ in {differ}: {summaries['torchrun']['checkpoint']}, " + str(
        summaries["srun"]["checkpoint"]
    )
    assert summaries["torchrun"]["test_accuracy"] == summaries["srun"]["test_accuracy"]


def _model_state(results: Path, checkpoint: str) -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint that the job names by its path under /results (the host's RESULTS)."""
    path = results / Path(checkpoint).relative_to("/results")
    return torch.load(path, map_location="cpu", weights_only=True)["model_state"]


def test_a_failing_job_shows_its_state_exit_code_and_error_line(slurm_cluster: SlurmCluster) -> None:
    proc = slurm_cluster.job("srun", "check --no-such-flag")
    assert proc.returncode != 0, explain(proc)
    assert "FAILED: ExitCode=" in proc.stdout and "no slurmdbd here, so no sacct" in proc.stdout, explain(proc)
    assert "error: unrecognized arguments: --no-such-flag" in proc.stderr, explain(proc)
    assert "slurm-job] Error" in proc.stderr  # make exits non-zero with the job's status


def test_scancel_stops_a_long_job_and_the_target_says_so(slurm_cluster: SlurmCluster) -> None:
    script = ROOT / "tests" / "slurm" / "jobs" / "wait_forever.py"
    cmd = ["make", "--no-print-directory", "slurm-job", f"CLUSTER={slurm_cluster.name}",
           f"RESULTS={slurm_cluster.results}", "LAUNCHER=torchrun", f"SCRIPT={script}"]  # fmt: skip
    job = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        for line in job.stdout:  # the ranks' own lines, streamed from the job's output file
            seen.append(line)
            if line.startswith("waiting: rank"):
                break
        metrics = _scrape(slurm_cluster, node=1, by=2)
        cancel = slurm_cluster.make("slurm-cancel", timeout=120)
        assert cancel.returncode == 0 and "cancelled job(s)" in cancel.stdout, explain(cancel)
        rest, _ = job.communicate(timeout=180)
    finally:
        job.kill()
    output = "".join(seen) + rest
    # every node serves its metrics on the cluster network, from its own events file (/tmp: its gate's record)
    node_1 = f'node="{slurm_cluster.project}-node-1"'
    served = [s for s in metrics.splitlines() if s.startswith("ddp_node_device_matmul_flops{") and node_1 in s]
    assert served and float(served[0].split()[-1]) > 0, metrics
    assert job.returncode != 0 and "CANCELLED" in output, output
    assert "no slurmdbd here, so no sacct" in output, output
    status = slurm_cluster.make("slurm-status")
    assert status.returncode == 0 and " R " not in status.stdout, explain(status)
    for node in (1, 2):  # slurmd killed the job's processes, which ran as another user (CAP_KILL)
        deadline = time.monotonic() + 60
        while "wait_forever" in _processes(slurm_cluster, node) and time.monotonic() < deadline:
            time.sleep(2)
        assert "wait_forever" not in _processes(slurm_cluster, node)


def _scrape(cluster: SlurmCluster, node: int, by: int) -> str:
    """What node ``node`` serves at its metrics port, read from node ``by`` over the cluster's network."""
    url = f"http://{cluster.project}-node-{node}:{contract.METRICS_PORT}{contract.METRICS_PATH}"
    read = f"import urllib.request; print(urllib.request.urlopen({url!r}, timeout=10).read().decode())"
    done = docker("exec", f"{cluster.project}-node-{by}", "python", "-c", read)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _processes(cluster: SlurmCluster, node: int) -> str:
    return docker("exec", f"{cluster.project}-node-{node}", "ps", "-eo", "args").stdout


HOLD_STEP = 10
"""Where every rank of the killed-node job waits (fault_job.py's hold, at a step boundary, until the test creates
/results/elastic/go): no exchange of step times (every 20 steps) and no epoch's end (8 steps each) at step 10, so the
ranks hold in no collective, and the survivors learn of the dead node when the test lets them go on."""
ELASTIC_JOB = [
    "LAUNCHER=torchrun",
    f"SCRIPT={fault_job.__file__}",
    f"ARGS=--hold-at-step {HOLD_STEP} --hold-until /results/elastic/go -- --dataset digits --epochs 3 "
    "--accum-steps 2 --batch-size 32 --out /results/elastic --resume auto",
]
"""3 ranks x 32 x accum 2: global batch 192, which 2 ranks keep (32 x accum 3); 24 steps."""


def test_an_elastic_job_trains_on_through_a_node_that_died_and_completes(three_nodes: SlurmCluster, tmp_path) -> None:
    """3 nodes x 1 rank, --min-nodes 2: node 3 killed while the ranks hold step 10. Slurm marks it DOWN and takes it
    out of the job (srun: Node failure); the step lives on (srun --no-kill: without it Slurm kills the step on every
    node then), the survivors regroup and resume from step 10 at the same global batch, and the job completes."""
    spec = tmp_path / "elastic.toml"
    spec.write_text("[nodes]\nmin_nodes = 2\n")
    shape = ["NODES=3", "NPROC_PER_NODE=1", f"SPEC={spec}"]
    job, dead = Streamed(three_nodes.make_command("slurm-job", *shape, *ELASTIC_JOB)), three_nodes.node(3)
    try:
        job.wait_for(f"rank 0 at step {HOLD_STEP}", lambda: _progress(three_nodes, "elastic") == HOLD_STEP)
        assert docker("kill", dead).returncode == 0
        job.wait_for(f"Slurm's node failure of {dead}", lambda: f"srun: error: Node failure on {dead}" in job.text)
        assert three_nodes.controller("touch", "/results/elastic/go").returncode == 0
        done = job.finish(JOB_TIMEOUT)
    finally:
        job.stop()
    out = done.stdout
    assert done.returncode == 0 and "COMPLETED, exit status 0" in out and "Force Terminated" not in out, out[-6000:]
    resize = f"train: resize: 3 -> 2 ranks at step {HOLD_STEP} "
    assert resize in out and "global batch 192 kept as per-rank batch 32 x 2 ranks x accum 3" in out, out[-6000:]
    resumed = f"train: resumed from step {HOLD_STEP} (checkpoint /results/elastic/checkpoints/emergency.pt), no steps"
    assert f"{resumed} lost" in out, out[-6000:]
    blamed = [line.split(": ", 2)[2].split(" stopped answering")[0] for line in out.splitlines()
              if line.startswith("error: rank") and " stopped answering" in line]  # fmt: skip
    assert blamed and all(dead in who and three_nodes.node(1) not in who and three_nodes.node(2) not in who
                          for who in blamed), blamed  # fmt: skip  # the living are named by no one
    summary = json.loads((three_nodes.results / "elastic" / "summary.json").read_text())
    assert (summary["world_size"], summary["nodes"], summary["global_batch"], summary["step"]) == (2, 2, 192, 24)
    assert summary["params_identical"], summary


def _progress(cluster: SlurmCluster, out: str) -> int | None:
    """The step that rank 0 of the job writing /results/OUT last reached (its OUT/progress); None before its first."""
    text = cluster.controller("cat", f"/results/{out}/progress").stdout.strip()
    return int(text) if text.isdigit() else None


class Streamed:
    """A command whose output a test reads while it runs (a thread gathers the lines) and waits on."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, what: str, ready, timeout: float = JOB_TIMEOUT) -> None:
        """Poll ``ready`` until it holds; fails at once when the command ended first."""
        deadline = time.monotonic() + timeout
        while not ready():
            assert self.proc.poll() is None, f"the job ended before {what}:\n{self.text[-6000:]}"
            assert time.monotonic() < deadline, f"no {what} within {timeout:g} s:\n{self.text[-6000:]}"
            time.sleep(0.5)

    def finish(self, timeout: float) -> subprocess.CompletedProcess:
        """Its exit status and every line, once it ended."""
        self.proc.wait(timeout)
        self._reader.join(60)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, self.text, "")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_the_munge_key_is_made_at_start_never_in_the_image(slurm_cluster: SlurmCluster) -> None:
    controller = f"{slurm_cluster.project}-slurmctld-1"
    image = docker("inspect", "--format", "{{.Config.Image}}", controller).stdout.strip()
    bare = docker("run", "--rm", "--network", "none", "--entrypoint", "ls", image, "-A", "/etc/munge")
    assert bare.returncode == 0 and bare.stdout.strip() == "", f"the image holds {bare.stdout!r} in /etc/munge"
    key = docker("exec", "--user", "munge", controller, "stat", "-c", "%U %a %s", "/etc/munge/munge.key")
    assert key.stdout.split() == ["munge", "400", "128"], key.stdout + key.stderr


def test_a_job_on_a_cluster_that_is_not_up_is_one_line(tmp_path: Path) -> None:
    proc = make("slurm-job", "CLUSTER=slurm-nowhere", f"RESULTS={tmp_path}", "JOB=check", timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.startswith("error: the Slurm mini-cluster slurm-nowhere-slurm is not running: start it"), proc
