"""``python -m app node``: one node of a torchrun job: its health gate, then torchrun's agent in the same
process, every rank a fork of one interpreter that imported torch once (app/node/agent.py).

    python -m app node --retry-every 10 -- $(cat /cluster/torchrun.args) -m app train --out /results/x
    python -m app node --records runs/gate -- --standalone --nproc-per-node 2 -m app train --out runs/x
    python -m app node --no-fork -- --standalone --nproc-per-node 2 /job/train.py   # torchrun's own launch

What follows ``--`` is torchrun's command line, read by torchrun's parser: the image's node entrypoint
(docker/bin/ddp-node, on compose, Ansible and Kubernetes) runs this with the rendered arguments of
/cluster/torchrun.args, then the node's own and the job. In order:

  1  the fork server starts: it imports PRELOAD while this process imports torch, reads the arguments and
     runs the gate (the imports take one core: the gate's figures at a start and a restart see it alike)
  2  the health gate (app/diagnostics/gate.py, its flags here too): the node's figures recorded at its
     first start, judged against the job's when it starts again; kept out, one line, judged again every
     --retry-every seconds (0: exit 3)
  3  torch's elastic agent: the rendezvous, the ranks (forks of the server, once it has imported), restarts
  4  with --evict-factor (an elastic job): a node its ranks find a straggler leaves the job at a step the others
     keep (app/evict.py), goes back to 2 and joins the job's next round once its gate passes

    python -m app node --evict-factor 2 --retry-every 10 -- --nnodes 2:3 --rdzv-backend c10d ... -m app train

A restarted node thus pays one torch import, not one per process: with torchrun and a separate gate,
the gate, the agent and every rank each imported torch, and every rank torch._dynamo too.

Exit status: 0 the job finished, 1 a rank failed past the restarts (torchrun's report printed, the ranks
said their lines) or the rendezvous failed (one line), 2 bad input, 3 kept out by the gate.
"""

import argparse
import contextlib
import functools
import io
import os
import runpy
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from app import cli, contract, events, evict, flags, logs, metrics
from app.diagnostics.gate_config import GateConfig
from app.errors import ClusterError, Stopped, UsageError, first_line
from app.node import agent, torch_elastic
from app.runtime import launcher

PRELOAD = (
    "torch",
    "torch._dynamo",  # what torch's optimizer imports when it is built: 1.4-1.9 s of every rank's start
    "torch.distributed",
    "torch.nn.parallel",
    "torch.utils.tensorboard",  # app train's scalars (skipped where tensorboard is not installed)
    "app.cli",
    "app.train.main",
)
"""What the fork server imports before it forks the first rank: torch and the workload's modules."""
OWN_DESCRIPTOR_2 = False
"""The ranks and torch's agent write to this process's standard output and error, as torchrun's do: they are the
node's output (``docker logs``), which the runner reads; this command's log does not take them."""


@dataclass(frozen=True)
class NodeConfig:
    """Node: how its ranks start."""

    fork: bool = True
    """Fork each rank from one server that imported torch once (off: a new interpreter per rank, as torchrun)."""
    serve_metrics: bool = False
    """Serve the node's Prometheus metrics (app/metrics.py) on --metrics-port, read from the job's events file
    (the image's ddp-node does, on every engine)."""
    metrics_port: int = contract.METRICS_PORT
    """The port of --serve-metrics, on the node's --local-addr (else every address of the node)."""
    evict_factor: float | None = None
    """Evict this node from the running job when its ranks are busy per step this many times what the other nodes' would
    be without it (their median rank's x their share of its work), the median of the last 2 x --evict-after - 1
    exchanges of step times, or busy and waiting for a CPU that many times while the job's step is longer than the
    others alone would take (app/evict.py): it leaves at a step the others keep, its gate judges it again every
    --retry-every seconds and it joins the next round once it passes. Needs --nnodes MIN:MAX (c10d). 0 or not
    given: never (every engine's rendering gives the spec's policy, render.node_args)."""
    evict_after: int = evict.AFTER
    """Exchanges at which this node must be that slow, of the last 2 x this - 1 (so that their median is), before
    it leaves."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m app node``: the node's, the gate's, then torchrun's command line after ``--``."""
    flags.add_arguments(parser, NodeConfig)
    flags.add_arguments(parser, GateConfig, exclude=("torchrun_args",))
    parser.add_argument(
        "torchrun", nargs=argparse.REMAINDER, metavar="-- TORCHRUN_ARGS", help="torchrun's arguments, then the job"
    )


def run(args: argparse.Namespace) -> int:
    """Gate the node, then run its agent until the job ends."""
    node = flags.from_args(NodeConfig, args)
    gate_cfg = flags.from_args(GateConfig, args)
    words = args.torchrun[1:] if args.torchrun[:1] == ["--"] else args.torchrun
    if not words:
        raise UsageError("no job given: python -m app node -- TORCHRUN_ARGS -m app check (see --help)")
    server = agent.start_forkserver(PRELOAD) if node.fork else None  # first: it imports while this process does
    from app.diagnostics import gate, peers  # torch

    torch_elastic.refuse_unproven()
    parsed = agent.parse(words)
    if node.serve_metrics:
        print(serve_metrics(node.metrics_port, parsed), flush=True)
    launcher.export_store_per_round()  # a node that comes back joins a later round (every engine)
    if store := survivors_store(parsed):
        launcher.export_survivors_store(store)
    policy = eviction(node, parsed)
    launcher.export_node_range(*torch_elastic.nnodes_range(parsed.nnodes))  # a round of fewer: no world of one
    launch = agent.prepare(parsed, rank_main, server, policy)  # (torch here read its threads already)
    host, port, serves = gate.rendezvous_of(parsed)
    where = (host, port, serves) if port else None  # port 0 (--standalone): nothing to reach
    peers_at_most = torch_elastic.nnodes_range(parsed.nnodes)[1] - 1
    baseline = gate.admit(gate_cfg, where, expected=peers_at_most)
    if where:  # the gate of a node that (re)joins asks the running ones how they measure now
        mine = launcher.this_node().host
        measure_now = functools.partial(gate.measure, gate_cfg.device_seconds)
        record = functools.partial(gate.read_record, gate_cfg.records / f"{mine}.json")
        peers.answer((host, port), mine, baseline, measure_now, record, gate_cfg.timeout_s)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError

    returned_at, wait = None, 0.0
    while True:
        try:
            agent.launch(launch, evicting=policy is not None)
            return 0
        except ChildFailedError as error:
            print(error, file=sys.stderr, flush=True)  # torchrun's report: which rank, its status, its line
            return 1
        except agent.evicted_error():  # its ranks said why; the others go on without it
            wait = evict.backoff(time.time(), returned_at, wait)
            print(evicted(wait, gate_cfg.retry_every), flush=True)
            time.sleep(max(wait, gate_cfg.retry_every))  # the others start their round without it first
            gate.admit(gate_cfg, where, rejoining=True, expected=peers_at_most)  # kept out while slow (exit 3 ...)
            returned_at = time.time()
            print("node: rejoins the job at its next rendezvous round", flush=True)
            launch = agent.prepare(parsed, rank_main, server, policy)
        except SignalException as error:  # docker stop, Slurm, Kubernetes: torch's agent stopped the ranks (its line)
            raise Stopped("", 128 + error.sigval) from None
        except RendezvousError as error:
            raise ClusterError(rendezvous_failed(error, parsed)) from error


def eviction(node: NodeConfig, parsed: argparse.Namespace) -> evict.Policy | None:
    """The straggler policy that this node's ranks apply to it (None: no --evict-factor, or 0), built once here and
    handed to them whole; UsageError for bad values or a policy that cannot act: the job has a fixed number of
    nodes."""
    if not node.evict_factor:
        return None
    from torch.distributed.run import parse_min_max_nnodes

    least, most = parse_min_max_nnodes(parsed.nnodes)
    policy = evict.Policy(node.evict_factor, node.evict_after, least)
    if least >= most or parsed.rdzv_backend != "c10d":
        raise UsageError(
            f"--evict-factor {node.evict_factor:g} needs an elastic job, torchrun's --nnodes MIN:MAX with MIN below "
            f"MAX and --rdzv-backend c10d (this one: --nnodes {parsed.nnodes}, {parsed.rdzv_backend}): a job of a "
            "fixed number of nodes cannot go on without one; give --evict-factor 0"
        )
    return policy


def evicted(wait: float, retry_every: float) -> str:
    """The agent's line once its node left the job: when its gate judges it again (``wait``: its back-off)."""
    delay = max(wait, retry_every)
    when = f"in {delay:g} s" if delay else "now"
    why = " (evicted again soon after its return)" if wait > retry_every else ""
    then = f", then every {retry_every:g} s" if retry_every else " (no --retry-every: kept out, the node exits 3)"
    joins = "and it joins the job's next round once it passes"
    return f"node: out of the job; its health gate judges it {when}{why}{then}, {joins}"


def serve_metrics(port: int, parsed: argparse.Namespace) -> str:
    """Serve this node's metrics for the job of torchrun's ``parsed`` arguments (its --rdzv-id names the job); the
    line that says where, or why not (the job goes on either way)."""
    events_file = launcher.events_file()
    if events_file is None:
        return "metrics: not served: this job keeps no events file (the engines' nodes do: DDP_CLUSTER_EVENTS_FILE)"
    host = launcher.this_node().host
    return metrics.serve(port, parsed.local_addr or "0.0.0.0", parsed.rdzv_id, host, Path(events_file))


def survivors_store(parsed: argparse.Namespace) -> str | None:
    """The c10d rendezvous store, ``host:port``: where the ranks still alive meet when rank 0's store is gone with
    its node (it outlives every node where it has a host of its own: the compose cluster's rendezvous container).
    None for a static rendezvous (rank 0's own) or a local one (--standalone)."""
    host, _, port = (parsed.rdzv_endpoint or "").rpartition(":")
    return f"{host}:{port}" if parsed.rdzv_backend == "c10d" and host and port.isdigit() and int(port) else None


def rendezvous_failed(error: Exception, parsed: argparse.Namespace) -> str:
    """The line of a rendezvous that failed (the nodes never met, or another node closed it)."""
    from torch.distributed.elastic.rendezvous.api import RendezvousClosedError, RendezvousTimeoutError

    endpoint = parsed.rdzv_endpoint or f"{parsed.master_addr}:{parsed.master_port}"
    if isinstance(error, RendezvousTimeoutError):
        return (
            f"the rendezvous at {endpoint} timed out: not all nodes (--nnodes {parsed.nnodes}) joined within its "
            "join timeout: a node that did not start, or cannot reach it"
        )
    if isinstance(error, RendezvousClosedError):
        return f"the rendezvous at {endpoint} was closed: another node ended the job"
    return f"the rendezvous at {endpoint} failed: {type(error).__name__}: {first_line(error)}"


# --- each rank: a fork of the server ---------------------------------------------------------------


def name_process(title: str) -> None:
    """What ``ps`` shows for this rank; where setproctitle (the package's dependency) is missing, as on a GPU machine
    that has only torch, the rank keeps the server's title."""
    try:
        from setproctitle import setproctitle
    except ImportError:
        return
    setproctitle(title)


def rank_main(job: agent.Job) -> None:
    """One rank of ``job`` in a fork of the server (torch's agent set its environment): as ``python -u``."""
    import torch

    launcher.set_environment(dict(job.environment))
    launcher.hand_eviction(job.eviction)
    name_process(f"python -u {' '.join(job.words())} [rank {launcher.identity().rank}]")
    if threads := launcher.cpu_threads():
        torch.set_num_threads(threads)  # as a new interpreter would read OMP_NUM_THREADS (the server read none)
    sys.stdout, sys.stderr = whole_lines(sys.stdout), whole_lines(sys.stderr)
    try:
        status = run_job(job)
        if status:  # before this process exits and its peers lose it
            events.write(events.RANK_ENDED, launcher.identity().number, exitcode=status)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a line left without its newline
                stream.flush()
    cli.finish()
    if status:
        raise SystemExit(status)  # torch's agent reads it as the exit status of torchrun's worker process


def whole_lines(stream: TextIO) -> TextIO:
    """``stream`` line-buffered, so that each line reaches its file in one write. Under ``python -u`` (the image's
    PYTHONUNBUFFERED) the stream has no buffer and print() writes the text and its newline apart: the ranks of a
    node share one pipe, and two ranks' lines came out joined (``rank 3 of 4 uprank 2 of 4 up``)."""
    if not isinstance(getattr(stream, "buffer", None), io.FileIO):
        with contextlib.suppress(AttributeError, ValueError):  # not a text file: left as it is
            stream.reconfigure(line_buffering=True)
        return stream
    stream.flush()
    raw = io.FileIO(stream.fileno(), "w", closefd=False)  # sys.__stdout__ keeps the original (and its descriptor)
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding=stream.encoding, errors=stream.errors, line_buffering=True)


class _Exited(BaseException):
    """``os._exit(0)`` called in a rank's main thread: the rank ends here, as a return from the job."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _exit_by_returning(status: int) -> None:
    raise _Exited(status)


def run_job(job: agent.Job) -> int:
    """Run ``job`` in this process as ``python -u`` would: ``-m app`` as app's own entry point, another module or a
    script through runpy; its exit status (an uncaught exception printed as the interpreter prints it: 1).

    ``os._exit(0)`` in the job's main thread (``python -m app``'s own way out, a script skipping its teardown)
    ends the job as a return: a forked rank that vanished with status 0 would leave torch's agent waiting
    forever for its return value. Any other status (a crash) and any other thread: the real ``os._exit``."""
    sys.argv = [job.target, *job.args]
    real_exit = os._exit
    main = threading.current_thread()
    os._exit = lambda status: (
        _exit_by_returning(status) if status == 0 and threading.current_thread() is main else real_exit(status)
    )
    try:
        if job.module and job.target == "app":
            return cli.main(list(job.args))
        if job.module:
            runpy.run_module(job.target, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, str(Path(job.target).resolve().parent))  # as `python SCRIPT` puts it first
            runpy.run_path(job.target, run_name="__main__")
        return 0
    except _Exited as exited:
        return exited.status
    except SystemExit as stop:
        return exit_status(stop.code)
    except KeyboardInterrupt:
        return 130
    except BaseException as error:
        sys.excepthook(*sys.exc_info())  # the interpreter's report (torch's [rankN]: prefix once it has a group)
        record_error(error)
        return 1
    finally:
        os._exit = real_exit


def record_error(error: BaseException) -> None:
    """Write ``error`` to torchelastic's error file (TORCHELASTIC_ERROR_FILE, as ``@record`` does, whole or not at
    all: ``logs.write_error_file``): the agent reads the rank's failure there, not in its output."""
    if where := launcher.identity().error_file:
        logs.write_error_file(where, f"{type(error).__name__}: {error}", traceback.format_exc())


def exit_status(code: object) -> int:
    """The status ``sys.exit(code)`` gives a process (a message is printed, and gives 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
