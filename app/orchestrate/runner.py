"""``python -m app cluster``: run one job on the compose mini-cluster and keep it alive until it ends.

    python -m app cluster up                                   # make cluster-up: the spec's default job
    python -m app cluster up --nodes 3 --nproc-per-node 1 --command check
    python -m app cluster up --max-restarts 0 --command 'train --epochs 3 --out /results/x'
    python -m app cluster up --launcher mpirun --command check   # make cluster-mpi
    python -m app cluster status [--json]                      # make cluster-status: the job at a glance
    python -m app cluster logs                                 # make cluster-logs
    python -m app cluster down                                 # make cluster-down

Runs on the host, with the stdlib and the Docker SDK for Python (``app.orchestrate.engine``: no torch; make's
cluster targets run it with build/tools-venv's python). The spec flags are ``python -m app
topology``'s; they are checked once, then every file the cluster needs is rendered once into
build/cluster/<name>/ (``compose.cluster_files``: compose's env file, nodes.yaml with each node's
command, the launch files the nodes read); the containers only exec what was rendered.
``up`` streams rank 0's node (the first torchrun node still in the job; the launcher under mpirun)
and exits with the job's status, whatever happens to the nodes: a node container that is lost (killed,
or stopped by hand) is started again (Docker's restart policy brings back one that crashed) up to
--max-restarts times, the head like any other, and torchrun's agents restart every worker in a new
rendezvous round, the job resuming from its last checkpoint. The rendezvous is a store container of
its own (``compose.RENDEZVOUS``), so no node's loss ends the job; the job ends when a node's torchrun
agent ends by itself (0: the job finished; else torchrun gave up) or mpirun's launcher ends.
What happened to the job is read from its events file (``app.events``: build/cluster/<name>/events, mounted in
every container), where each node's torch agent writes every rank that failed (its exit status or signal, and
its error from torchelastic's error file) and why it gave up, the ranks their one-line errors and resumes, the
gate its verdicts; the nodes' output is never read for a fault, so a torch release that rewords its lines
changes nothing here. The terminal shows the streamed node's standard output only; its standard error
(tracebacks, torch's C++ warnings with their ``frame #`` backtraces, torchrun's report) and every node's output
go to the command's one log (logs/cluster.log, or --log-dir; ``--verbose`` prints the streamed node's standard
error too): the status line and the error line name the same file. A node container that runs under a CPU or
memory limit (``docker update``: the containers are reused from job to job) is one line. Every process and
stream ``up`` starts (the engine's events and logs, compose logs) ends with it. ``down`` says what it removed.

What the user sees of a failure (docs/faults.md):
- one line per restart, once the job runs again: which node or rank failed and why (signal or
  exit status, or the ranks that stopped answering), the step it resumed from and the steps lost:
  ``cluster: restart 1: ddp-cluster-worker-1 (ranks 2-3) stopped with signal 9 (SIGKILL); resumed
  from step 30 (checkpoint ...), 2 steps lost (the failed attempt reached step 32)``;
- a failure that a restart cannot cure (bad input: exit status 2; a full disk; a rank that failed the same way
  on two attempts in a row, which its agent restarts no more) is not restarted: the rank's one line at once,
  and the command's own line ``error: not restarted: ...`` says why;
- the rendezvous store lost ends the job: the nodes are stopped (within STOP_GRACE_S) and the
  command's line names the store;
- a failure the job did not recover from: the ranks' own one-line errors, then the command's.
Results are copied to --results.
"""

import argparse
import dataclasses
import json
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from app import contract, events, flags
from app.atomic import atomic_write_text
from app.errors import ClusterError, UsageError
from app.flags import flag
from app.orchestrate import collect, engine, job, streams, supervise
from app.orchestrate import status as job_status
from app.orchestrate.job import RESULTS_DIR, Run, hint
from app.topology import command as topology
from app.topology import compose
from app.topology.spec import ClusterSpec

STOP_GRACE_S = compose.STOP_GRACE_S
STATE_DIR = Path("build/cluster")
"""Where each job's rendered files, events and log go by default: STATE_DIR/NAME."""


@dataclass(frozen=True)
class ClusterFlags:
    """What to do with the compose cluster, and where its files go."""

    action: str = field(metadata=flag(positional=True, choices=("up", "status", "logs", "down")))
    """Run a job, show the job at a glance, show every node's output, remove."""
    json: bool = False
    """status: print JSON (for scripts) rather than the table."""
    results: Path = field(default=RESULTS_DIR, metadata=flag(metavar="DIR"))
    """Results go here."""
    state_dir: Path = field(default=STATE_DIR, metadata=flag(metavar="DIR"))
    """Rendered files, logs."""
    image_name: str | None = field(default=None, metadata=flag(metavar="NAME"))
    """Without --image: the image is NAME:cpu, or NAME:cuda with --gpus-per-node > 0 (default: IMAGE_NAME of
    docker/versions.env)."""
    build: str | None = field(default=None, metadata=flag(metavar="COMMAND"))
    """up: once the spec is checked, build the image with COMMAND plus ``--flavour cpu|cuda`` (the spec's) before
    the nodes start (make cluster-up gives the image builder)."""
    monitor: bool = False
    """up: also start Prometheus (compose profile monitor, make cluster-up MONITOR=1), scraping every node's metrics;
    its UI on the host's loopback at --monitor-port; it stays up after the job, until cluster down."""
    monitor_image: str | None = field(default=None, metadata=flag(metavar="IMAGE"))
    """The Prometheus image of --monitor (default: MONITOR_IMAGE of docker/versions.env; make monitor-image)."""
    monitor_port: int = field(default=contract.MONITOR_PORT, metadata=flag(metavar="PORT"))
    """--monitor: Prometheus's UI at http://127.0.0.1:PORT."""
    make: bool = False
    """The lines' hints name make's targets (make cluster-down CLUSTER=x), as make's cluster targets ask; else this
    command's own (python -m app cluster down --name x)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m app cluster``: the action, where results go, then the spec's flags."""
    flags.add_arguments(parser, ClusterFlags)
    topology.add_spec_arguments(parser)


def _prepare(args: argparse.Namespace) -> Run:
    """The spec, checked once, and every file the cluster needs, rendered once into STATE_DIR/NAME/. ``down`` and
    ``logs`` keep the files that the cluster's ``up`` rendered (its nodes, as many as it had): they name the cluster,
    not its shape; rendered only where none are there yet."""
    spec = topology.spec_from_args(args)
    engine.sdk()  # missing: one line before anything is written
    if getattr(args, "image", None) is None and args.image_name:  # (spec flags are absent unless given)
        image = f"{args.image_name}:{contract.flavour(spec.nodes.gpus_per_node)}"
        spec = dataclasses.replace(spec, job=dataclasses.replace(spec.job, image=image))
    folder = (args.state_dir / spec.job.name).resolve()
    monitor = compose.Monitor(**({"image": args.monitor_image} if args.monitor_image else {}), port=args.monitor_port)
    files = compose.cluster_files(spec, folder, monitor)
    if args.action == "up" or not all((folder / name).is_file() for name in files):
        for name, text in files.items():
            atomic_write_text(folder / name, text)
    log_file = getattr(args, "log_file", None) or args.state_dir / f"{spec.job.name}.log"  # the command's log
    events_file = compose.events_file(folder)  # every container's agent and ranks append to it, as their user
    events_file.parent.mkdir(parents=True, exist_ok=True)
    events_file.touch()
    events_file.parent.chmod(0o777)
    events_file.chmod(0o666)
    monitor = monitor if args.monitor else None
    return Run(spec, folder, Path(log_file).resolve(), args.verbose, monitor, args.results, args.make)


def _down(run: Run) -> int:
    """Remove the project's containers, network and volumes; one line says what was removed."""
    there = engine.project_objects(run.spec.job.name)
    done = subprocess.run(
        run.compose("down", "--volumes", "--remove-orphans", "--timeout", str(STOP_GRACE_S), every_profile=True),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    left = engine.project_objects(run.spec.job.name)
    if done.returncode != 0 or left:
        detail = (done.stderr.strip().splitlines() or [""])[-1]
        names = " ".join(name for _, name in left)
        raise ClusterError(f"cluster-down left {names or 'an error'} behind for {run.spec.job.name}: {detail}")
    run.say(f"cluster: {run.spec.job.name}: {removed(there)}")
    return 0


def removed(objects: list[tuple[str, str]]) -> str:
    """``removed 3 containers (a, b, c), 1 network (n), 2 volumes (v, w)``, or that there was nothing to remove."""
    parts = []
    for kind in ("container", "network", "volume"):
        names = sorted(name for k, name in objects if k == kind)
        if names:
            parts.append(f"{len(names)} {kind}{'s' if len(names) > 1 else ''} ({', '.join(names)})")
    return f"removed {', '.join(parts)}" if parts else "nothing to remove (no container, network or volume)"


def _limits(run: Run) -> None:
    """One line for each node container that runs under a CPU or memory limit: the containers are reused from job
    to job, so a ``docker update --cpus`` of an earlier one would silently slow this job."""
    torchrun = run.spec.job.launcher != "mpirun"
    for name in compose.rank_order(run.spec) if torchrun else [run.container_of(s) for s in run.nodes]:
        host = (engine.inspect(name) or {}).get("HostConfig") or {}
        numbers = (host.get(key) or 0 for key in ("NanoCpus", "CpuQuota", "CpuPeriod", "Memory"))
        if limit := describe_limits(*numbers):
            run.say(f"cluster: {name} runs under a limit: {limit}; it slows the job (it was set on "
                    f"the container, which jobs reuse): {run.hint('down')} removes it")  # fmt: skip


def describe_limits(nano_cpus: int, cpu_quota: int, cpu_period: int, memory: int) -> str:
    """``0.5 CPUs, 512 MiB of memory`` for a container's HostConfig limits ("" for none)."""
    cpus = nano_cpus / 1e9 if nano_cpus else cpu_quota / (cpu_period or 100_000) if cpu_quota > 0 else 0
    parts = [f"{cpus:g} CPUs"] if cpus else []
    if memory > 0:
        parts.append(f"{memory / 2**20:g} MiB of memory")
    return ", ".join(parts)


def _up(run: Run) -> int:
    spec = run.spec
    if not engine.has_image(spec.job.image):
        raise UsageError(f"image {spec.job.image} is missing: build it with `make images`")
    if run.monitor and not engine.has_image(run.monitor.image):
        raise UsageError(f"image {run.monitor.image} is missing: build it with `make monitor-image` (MONITOR=1 does)")
    shape = f"{spec.nodes.nodes} node(s) x {spec.nodes.nproc_per_node}"
    run.say(f"cluster: {spec.job.name}: {spec.job.launcher}, {shape}: {compose.job_line(spec)}")
    run.log_file.parent.mkdir(parents=True, exist_ok=True)
    run.log(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} cluster up {spec.job.name}")  # a log holds every run's lines
    stop = threading.Event()
    start, since, offset = time.monotonic(), time.time(), events.size(compose.events_file(run.folder))
    # Detached: compose starts the store and the nodes (once the store is healthy) and returns; the
    # job's end is a node's agent ending by itself (mpirun's launcher ending), whatever is lost meanwhile.
    services = [compose.LAUNCHER] if spec.job.launcher == "mpirun" else []  # mpirun: the launcher and its workers
    started = subprocess.run(run.compose("up", "--detach", *services), capture_output=True, text=True,
                             timeout=spec.rendezvous.join_timeout + 300, check=False)  # fmt: skip
    run.log(f"compose up: exit {started.returncode}: {started.stdout}{started.stderr}")
    if engine.inspect(run.main_container) is None:
        detail = (started.stderr.strip().splitlines() or ["no output"])[-1]
        raise ClusterError(f"the cluster did not start: {detail}: see {run.log_file}")
    _limits(run)
    shape = {"launcher": spec.job.launcher, "nodes": spec.nodes.nodes, "nproc_per_node": spec.nodes.nproc_per_node}
    events.write(events.JOB_STARTED, events_file=compose.events_file(run.folder), job=spec.job.name, **shape)
    if run.monitor:  # (after the start's record: no scrape of it shows the last job's figures)
        _start_monitor(run)
    threads = [
        threading.Thread(target=supervise.watch_nodes, args=(run, stop, since), daemon=True),
        threading.Thread(target=supervise.read_events, args=(run, stop, offset), daemon=True),
        threading.Thread(target=streams.follow, args=(run, stop, since), daemon=True),
        threading.Thread(target=streams.stream, args=(run, stop, since), daemon=True),
    ]
    try:
        for thread in threads:
            thread.start()
        if not run.ended.wait(max(spec.job.time_limit - (time.monotonic() - start), 1)):
            run.end(124)
        if run.status == 0 and not run.gave_up and spec.job.launcher != "mpirun":
            engine.wait(compose.rank_order(spec), STOP_GRACE_S)  # the other agents are leaving torchrun's exit barrier
        # The job is over: the nodes still up cannot go on without it; stopped first, reported after.
        subprocess.run(run.compose("stop", "--timeout", str(STOP_GRACE_S)), capture_output=True, timeout=180,
                       check=False)  # fmt: skip
    except BaseException:  # the runner itself stopped (Ctrl-C): the job's end, status unknown
        events.write(events.JOB_ENDED, events_file=compose.events_file(run.folder), status=None)
        raise
    finally:
        stop.set()  # ends the streams the threads read (the engine's events and logs, compose logs)
    elapsed = time.monotonic() - start
    for thread in threads[1:]:
        thread.join(timeout=60)  # their last pass: the records and lines of this run not yet read
    status = run.gave_up.status if run.gave_up else run.status
    events.write(events.JOB_ENDED, events_file=compose.events_file(run.folder), status=status)
    if 0 < status < 128 and not run.gave_up:
        run.unresolved()
    _collect(run, elapsed)
    run.say(f"cluster: job exit status {status} after {elapsed:.0f}s; logs: {run.log_file} and {run.hint('logs')}; "
            f"remove: {run.hint('down')}")  # fmt: skip
    if status:
        raise ClusterError(job.failure_line(run, status), status)
    return 0


def _start_monitor(run: Run) -> None:
    """Start the monitor profile's Prometheus beside the running nodes; one line says where its UI is, or why it
    did not start (the job goes on either way)."""
    started = subprocess.run(run.compose("--profile", compose.MONITOR, "up", "--detach", "--wait", compose.PROMETHEUS),
                             capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    run.log(f"compose up prometheus: exit {started.returncode}: {started.stdout}{started.stderr}")
    if started.returncode == 0:
        run.say(f"monitor: Prometheus at http://127.0.0.1:{run.monitor.port} scrapes every node's metrics "
                f"(e.g. the graph of ddp_job_samples_per_second); it stays up until {run.hint('down')}")  # fmt: skip
        return
    detail = (started.stderr.strip().splitlines() or ["no output"])[-1]
    run.say(f"monitor: Prometheus did not start ({detail}); the job goes on without it: free port "
            f"{run.monitor.port} or give MONITOR_PORT, see {run.log_file}")  # fmt: skip


def _collect(run: Run, elapsed: float) -> None:
    """Copy the results volume home (through rank 0's node: each run's folder as the job left it, ``collect``) and
    print the newest summary written during this job."""
    results, main = run.results, run.main_container
    if not collect.bring_home(lambda into: engine.copy_out(main, str(contract.RESULTS_DIR), into), results):
        run.say(f"cluster: the results were not copied to {results}: {main}'s {contract.RESULTS_DIR} "
                f"could not be read; the volume {run.spec.job.name}_results keeps them until cluster-down")  # fmt: skip
        return
    fresh = [p for p in results.rglob("summary.json") if p.stat().st_mtime >= time.time() - elapsed - 5]
    if fresh:
        newest = max(fresh, key=lambda p: p.stat().st_mtime)
        run.say(f"cluster: summary ({newest}):\n{newest.read_text().rstrip()}")
    run.say(f"cluster: results in {results} (the volume {run.spec.job.name}_results keeps them until cluster-down)")


def run(args: argparse.Namespace) -> int:
    """Run the action; exit with the job's status (up), 0 (status, logs, down), 2 for bad input."""
    if args.action == "status":
        return _status(topology.spec_from_args(args), args.state_dir, args.json, args.make)
    job = _prepare(args)
    if args.action == "down":
        return _down(job)
    if args.action == "logs":
        status = subprocess.run(
            job.compose("logs", "--no-color", "--timestamps", every_profile=True), check=False
        ).returncode
        records, _ = events.read(compose.events_file(job.folder))
        for record in records:  # what happened to the jobs, after what their nodes said (progress: cluster status)
            if record.get("kind") != events.EXCHANGE:
                print(describe_event(record))
        return status
    if args.build:
        _build(args.build, contract.flavour(job.spec.nodes.gpus_per_node))
    return _up(job)


def _status(spec: ClusterSpec, state_dir: Path, as_json: bool, make: bool = False) -> int:
    """``cluster status``: the job at a glance from its events and its containers' states (nothing is rendered)."""
    name = spec.job.name
    path = compose.events_file((state_dir / name).resolve())
    containers = engine.project_containers(name)
    if not path.exists() and not containers:
        raise UsageError(
            f"no cluster named {name} here (no {path}, no containers of compose project {name}): start one with "
            f"{hint(name, 'up', make)}, or name yours with --name"
        )
    records, _ = events.read(path)
    for service in (compose.RENDEZVOUS, compose.PROMETHEUS):  # no node of the job
        containers.pop(compose.container(spec, service), None)
    print(job_status.show(name, records, containers, as_json))
    return 0


def _build(command: str, flavour: str) -> None:
    """Build the image the spec's nodes need: COMMAND with ``--flavour FLAVOUR``; its own lines are the user's."""
    argv = [*shlex.split(command), "--flavour", flavour]
    try:
        status = subprocess.run(argv, check=False).returncode
    except OSError as error:
        raise UsageError(
            f"--build {command!r} does not run ({error.strerror}): give a command that builds the image"
        ) from None
    if status != 0:
        raise ClusterError(f"the image build (--build) failed with exit status {status}; its lines are above", status)


def describe_event(record: dict) -> str:
    """``events | 2026-11-27T06:10:01 ddp-cluster-worker-1 rank 3: worker_failed exitcode=-9 ...``: one record of
    the events file, as ``cluster logs`` prints it after the nodes' output."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(float(record.get("time", 0))))
    who = f"{record.get('node')}" + (f" rank {record['rank']}" if record.get("rank") is not None else "")
    fields = " ".join(f"{key}={json.dumps(value)}" for key, value in record.items()
                      if key not in ("time", "node", "rank", "kind"))  # fmt: skip
    return f"events | {stamp} {who}: {record.get('kind')} {fields}".rstrip()
