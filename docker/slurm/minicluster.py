#!/usr/bin/env python3
"""Drive the Slurm mini-cluster (docker/slurm/compose.yaml): start it, run one batch job on it
with real sbatch and srun, cancel, show, remove. ``docker compose`` runs the project; the containers are
reached through the Docker SDK for Python (app/orchestrate/engine.py), which the Python running this needs.

    python3 -m slurm.minicluster up     --image ddp-cluster-slurm:bookworm -- --nodes 2
    python3 -m slurm.minicluster job    --image ... --results build/results -- --command check
    python3 -m slurm.minicluster job    --image ... --results DIR -- --launcher srun --command 'train'
    python3 -m slurm.minicluster cancel --image ... [--job-id 7]
    python3 -m slurm.minicluster status|logs|down --image ...

from the repository's root with ``PYTHONPATH=docker:.`` (docker/ holds this package, ``slurm``; the root holds
the app), as make slurm-* runs it.

Everything after ``--`` is a cluster-spec flag of ``python -m app topology`` (``--help`` there
lists them); the Makefile's knobs pass through as those flags (make slurm-up NODES=3). ``job``
renders the spec's batch script (``--format sbatch``), writes it to /results/slurm on the shared
volume as the job user's file, submits it as that user (app) with ``sbatch --parsable`` in the
controller, streams the job's output file while it runs (bounded by the spec's time limit), prints
the newest summary.json the job wrote under /results, copies /results to --results, and exits with
the job's exit code. A job that did not complete shows its state, exit code and reason from
``scontrol show job`` (the mini-cluster has no slurmdbd, so no sacct) and the first ``error:`` line
of its output.
"""

import argparse
import dataclasses
import functools
import io
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import requests

from app import cli
from app.atomic import atomic_write_text
from app.errors import ClusterError, UsageError, exit_status_of
from app.orchestrate import collect
from app.orchestrate import engine as docker_engine
from app.topology import command as topology
from app.topology import compose, slurm
from app.topology.spec import ClusterSpec
from slurm import slurmconf

COMPOSE_FILE = slurmconf.COMPOSE_FILE
STATE_DIR = Path("build/slurm")
"""Where the host renders each mini-cluster's files (slurm.conf, node names), in a folder per project."""
JOB_DIR = "/results/slurm"
"""The jobs' folder on the shared volume: batch scripts, their outputs, the scripts of SCRIPT jobs."""
JOB_USER = "app"
"""The user that submits (and so runs) the jobs: the image's unprivileged uid 1000."""
UP_TIMEOUT_S = 300
POLL_S = 2.0
GRACE_S = 180
"""Beyond the job's time limit: pending, start-up, KillWait and teardown."""
DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
"""Job states after which a job runs no more (PREEMPTED and NODE_FAIL requeue a --requeue job)."""


@dataclasses.dataclass
class MiniCluster:
    """One mini-cluster: its spec, image and compose project."""

    spec: ClusterSpec
    image: str
    container: str = ""
    """The running controller container (``attach`` finds it)."""
    slurmd_timeout: int = slurmconf.SLURMD_TIMEOUT_S
    """slurm.conf's SlurmdTimeout, which `up` renders."""

    @property
    def project(self) -> str:
        return slurmconf.project(self.spec)

    @property
    def folder(self) -> Path:
        """The mini-cluster's rendered files, which the init service copies into /etc/slurm."""
        return (STATE_DIR / self.project).resolve()

    def render(self) -> None:
        """Render the mini-cluster's files once, on the host."""
        for name, text in slurmconf.cluster_files(self.spec, self.slurmd_timeout).items():
            atomic_write_text(self.folder / name, text)

    def compose(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        """``docker compose`` of the project: compose.yaml and the rendered nodes (rendered first if missing)."""
        nodes = self.folder / slurmconf.NODES_FILE
        if not nodes.is_file():
            self.render()
        env = {**os.environ, **slurmconf.compose_env(self.spec, self.image, self.folder, self.slurmd_timeout)}
        files = ["-f", str(COMPOSE_FILE), "-f", str(nodes)]
        cmd = ["docker", "compose", *files, "-p", self.project, *args]
        return _run(cmd, timeout, check, env=env)

    def attach(self) -> None:
        """Find the running controller, or say how to start it."""
        found = self.compose("ps", "-q", "--status", "running", "slurmctld", check=False).stdout.split()
        if not found:
            raise UsageError(f"the Slurm mini-cluster {self.project} is not running: start it with make slurm-up")
        self.container = found[0]

    @functools.cached_property
    def engine(self) -> Any:
        """The Docker engine as the SDK gives it (a ``docker.DockerClient``)."""
        return docker_engine.client()

    def run(self, *cmd: str, user: str = JOB_USER, check: bool = True) -> subprocess.CompletedProcess:
        """A command in the controller container (as the job user, in the jobs' folder), as a login node would run
        it; its exit status and output as text (the engine's request timeout bounds it)."""
        try:
            code, (out, err) = self.engine.containers.get(self.container).exec_run(
                list(cmd), user=user, workdir=JOB_DIR, demux=True
            )
        except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
            raise ClusterError(f"`{' '.join(cmd[:6])} ...` in {self.project}'s controller failed: {error}") from None
        proc = subprocess.CompletedProcess(list(cmd), code, (out or b"").decode(), (err or b"").decode())
        if check and code != 0:
            detail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
            raise ClusterError(f"`{' '.join(cmd[:6])} ...` failed: {detail[-1] if detail else f'exit {code}'}")
        return proc

    @functools.cached_property
    def job_owner(self) -> tuple[int, int]:
        """The job user's uid and gid in the controller."""
        uid, gid = self.run("sh", "-c", "id -u; id -g").stdout.split()
        return int(uid), int(gid)

    def write(self, path: str, text: str) -> None:
        """Write a file of the job user's into the controller (its folder must exist), through the engine's archive
        upload: no size limit, no shell in between."""
        data = text.encode()
        member = tarfile.TarInfo(PurePosixPath(path).name)
        member.size, member.mode, member.mtime = len(data), 0o644, time.time()
        member.uid, member.gid = self.job_owner
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            tar.addfile(member, io.BytesIO(data))
        try:
            self.engine.containers.get(self.container).put_archive(str(PurePosixPath(path).parent), archive.getvalue())
        except (docker.errors.DockerException, requests.exceptions.RequestException) as error:
            raise ClusterError(f"could not write {path} in {self.project}'s controller: {error}") from None


def _run(cmd: list[str], timeout: float, check: bool, **kwargs) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"`{' '.join(cmd[:6])} ...` did not finish in {timeout:.0f}s") from None
    if check and proc.returncode != 0:
        detail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise ClusterError(f"`{' '.join(cmd[:6])} ...` failed: {detail[-1] if detail else f'exit {proc.returncode}'}")
    return proc


def _say(text: str) -> None:
    print(f"slurm: {text}", flush=True)


def up(mc: MiniCluster) -> int:
    """Start the controller and the nodes; ready when every node is up in sinfo."""
    if not docker_engine.has_image(mc.image):
        raise UsageError(f"image {mc.image} is missing: build it with make slurm-image")
    start = time.monotonic()
    mc.render()
    wait = ["--wait", "--wait-timeout", str(UP_TIMEOUT_S)]
    proc = mc.compose("up", "--detach", "--remove-orphans", *wait, timeout=UP_TIMEOUT_S + 60, check=False)
    if proc.returncode != 0:
        print(mc.compose("logs", "--no-color", "--tail", "5", check=False).stdout, end="")
        why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise ClusterError(
            f"{mc.project} did not come up ({why}): make slurm-logs shows why; make slurm-down removes it"
        )
    mc.attach()
    _say(
        f"{mc.project} is up in {time.monotonic() - start:.0f}s: controller {slurmconf.CONTROLLER}, "
        f"{mc.spec.nodes.nodes} node(s); jobs run as {JOB_USER}, files in {JOB_DIR} (volume {mc.project}_results)"
    )
    print(mc.run("sinfo").stdout, end="")
    return 0


def down(mc: MiniCluster) -> int:
    mc.compose("down", "--volumes", "--remove-orphans", "--timeout", str(compose.STOP_GRACE_S), timeout=180)
    left = [name for _, name in docker_engine.project_objects(mc.project)]
    if left:
        raise ClusterError(f"left behind by {mc.project}: {' '.join(left)}")
    _say(f"{mc.project} removed (containers, network, volumes)")
    return 0


def status(mc: MiniCluster) -> int:
    mc.attach()
    print(mc.run("sinfo", "--Node", "--long").stdout + mc.run("squeue").stdout, end="")
    return 0


def logs(mc: MiniCluster) -> int:
    print(mc.compose("logs", "--no-color", "--timestamps", check=False).stdout, end="")
    return 0


def cancel(mc: MiniCluster, job_id: str | None) -> int:
    """scancel one job, or every job of the spec's job name."""
    mc.attach()
    selector = ["--jobs", job_id] if job_id else ["--name", mc.spec.job.name]
    listed = mc.run("squeue", "--noheader", "--format", "%i", *selector).stdout
    mc.run("scancel", *([job_id] if job_id else selector))
    ids = " ".join(listed.split())
    _say(f"cancelled {'job(s) ' + ids if ids else 'nothing (no such job in the queue)'}")
    return 0


def job_fields(text: str) -> dict[str, str]:
    """``scontrol show job -o``'s Key=Value words (values without spaces: what is read here)."""
    return dict(re.findall(r"(\w+)=(\S*)", text))


def exit_status(fields: dict[str, str]) -> int:
    """The job's exit status as a shell gives it: the code, else 128 + the signal; 1 if it did not complete."""
    code, _, signal = fields.get("ExitCode", "0:0").partition(":")
    if code.isdigit() and int(code):
        return int(code)
    if signal.isdigit() and int(signal):
        return 128 + int(signal)
    return 0 if fields.get("JobState") == "COMPLETED" else 1


def _submit(mc: MiniCluster, spec: ClusterSpec) -> tuple[str, str]:
    """Write the job's batch script to the shared volume and sbatch it; (job id, script path)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if spec.job.script:
        source = Path(spec.job.script)
        if not source.is_file():
            raise UsageError(f"--script {source}: no such file")
        copy = f"{JOB_DIR}/jobs/{stamp}-{source.name}"
        mc.run("mkdir", "-p", f"{JOB_DIR}/jobs")
        mc.write(copy, source.read_text())
        spec = dataclasses.replace(spec, job=dataclasses.replace(spec.job, script=copy))
    text = slurm.render_script(spec)
    path = f"{JOB_DIR}/{spec.job.name}-{stamp}.sbatch"
    mc.write(path, text)
    proc = mc.run("sbatch", "--parsable", path, check=False)
    if proc.returncode != 0:
        refusal = proc.stderr.strip().splitlines()[-1].removeprefix("sbatch: error: ")
        raise UsageError(f"sbatch refused {path}: {refusal} (make slurm-status shows the nodes and their CPUs)")
    return proc.stdout.strip().split(";")[0], path


def _show(mc: MiniCluster, job_id: str) -> dict[str, str]:
    return job_fields(mc.run("scontrol", "show", "job", "--oneliner", job_id).stdout)


def _stream(mc: MiniCluster, path: str, shown: int) -> int:
    """Print what the job's output file gained since ``shown`` bytes; the new count."""
    if not path:
        return shown
    new = mc.run("tail", "-c", f"+{shown + 1}", path, check=False).stdout
    if new:
        print(new, end="", flush=True)
    return shown + len(new.encode())


def _summary(mc: MiniCluster, script: str) -> None:
    """Print the newest summary.json written under /results since the job's script."""
    found = mc.run("find", "/results", "-name", "summary.json", "-newer", script, "-printf", "%T@ %p\n").stdout
    newest = sorted(found.splitlines())[-1].split(" ", 1)[1] if found.strip() else ""
    if newest:
        _say(f"summary ({newest}):")
        print(mc.run("cat", newest).stdout.strip())


def _copy_results(mc: MiniCluster, results: Path) -> None:
    if not collect.bring_home(lambda into: docker_engine.copy_out(mc.container, "/results", into), results):
        raise ClusterError(f"could not copy /results of {mc.project}'s controller to {results}")
    _say(f"results in {results} (the volume {mc.project}_results keeps them until make slurm-down)")


def _error_line(mc: MiniCluster, path: str) -> str:
    """The first ``error:`` line of the job's output."""
    text = mc.run("cat", path, check=False).stdout if path else ""
    return next((line.strip() for line in text.splitlines() if "error:" in line), "")


def _wait(mc: MiniCluster, job_id: str) -> dict[str, str]:
    """Follow the job until it ends (its state changes and its output as they come); its last fields."""
    deadline = time.monotonic() + mc.spec.job.time_limit + GRACE_S
    state, shown, fields = "", 0, {}
    while state not in DONE:
        if time.monotonic() > deadline:
            mc.run("scancel", job_id, check=False)
            raise ClusterError(f"job {job_id} still {state} past its time limit: cancelled it")
        fields = _show(mc, job_id)
        if fields.get("JobState") != state:
            state = fields.get("JobState", "")
            where = f" on {fields['NodeList']}" if fields.get("NodeList") not in (None, "", "(null)") else ""
            why = f" ({fields['Reason']})" if state == "PENDING" and fields.get("Reason", "None") != "None" else ""
            _say(f"job {job_id} {state}{where}{why}")
        shown = _stream(mc, fields.get("StdOut", ""), shown)
        if state not in DONE:
            time.sleep(POLL_S)
    return fields


def _report(mc: MiniCluster, job_id: str, fields: dict[str, str], seconds: float) -> int:
    """Say how the job ended (why, when it did not complete); its exit status."""
    state, status = fields.get("JobState"), exit_status(fields)
    if state != "COMPLETED":
        reason = f"ExitCode={fields.get('ExitCode')} Reason={fields.get('Reason')}"
        _say(f"job {job_id} {state}: {reason} (scontrol show job; no slurmdbd here, so no sacct)")
        line = _error_line(mc, fields.get("StdOut", ""))
        if line:
            print(line, file=sys.stderr)
    _say(f"job {job_id} {state}, exit status {status} after {seconds:.0f}s; output {fields.get('StdOut')}")
    return status


def job(mc: MiniCluster, results: Path) -> int:
    """Submit the spec's job, stream its output until it ends, report, and return its exit status."""
    slurm.check(mc.spec)
    mc.attach()
    job_id, script = _submit(mc, mc.spec)
    shape = f"{mc.spec.nodes.nodes} x {mc.spec.nodes.nproc_per_node}"
    _say(f"submitted job {job_id} ({mc.spec.job.launcher} style, {shape}): {script}")
    start = time.monotonic()
    try:
        fields = _wait(mc, job_id)
    except KeyboardInterrupt:
        _say(f"stopped waiting; job {job_id} goes on: make slurm-status, make slurm-cancel SLURM_JOBID={job_id}")
        return 130
    seconds = time.monotonic() - start
    _summary(mc, script)
    _copy_results(mc, results)
    return _report(mc, job_id, fields, seconds)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ours, spec_flags = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["up", "down", "status", "logs", "job", "cancel"])
    parser.add_argument("--image", required=True, help="the mini-cluster's image (make slurm-image builds it)")
    parser.add_argument("--results", type=Path, help="job: the host folder that /results is copied to (make: RESULTS)")
    parser.add_argument("--job-id", help="cancel: this job (default: every job of the spec's job name)")
    parser.add_argument(
        "--slurmd-timeout",
        type=int,
        default=slurmconf.SLURMD_TIMEOUT_S,
        help="up: slurm.conf's SlurmdTimeout, seconds before a silent node is DOWN (make: SLURMD_TIMEOUT)",
    )
    args = parser.parse_args(ours)
    return exit_status_of(lambda: _act(args, spec_flags))


def _act(args: argparse.Namespace, spec_flags: list[str]) -> int:
    spec_parser, _ = cli.build_parser("topology")
    spec = topology.spec_from_args(spec_parser.parse_args(spec_flags))
    mc = MiniCluster(spec, args.image, slurmd_timeout=args.slurmd_timeout)
    if args.action == "job":
        if args.results is None:
            raise UsageError("job copies /results to the host: give --results DIR (make slurm-job gives RESULTS)")
        return job(mc, args.results)
    if args.action == "cancel":
        return cancel(mc, args.job_id)
    return {"up": up, "down": down, "status": status, "logs": logs}[args.action](mc)


if __name__ == "__main__":
    sys.exit(main())
