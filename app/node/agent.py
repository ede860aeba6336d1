"""A node's torchrun agent in this process, every rank a fork of one preloaded interpreter: the launch of
``python -m app node`` (app/node/command.py, which runs each rank; the image's ddp-node on every engine).

    python -m app node --records runs/gate -- --standalone --nproc-per-node 2 -m app train --out runs/x
    python -m app node -- --nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=store:29500 /job/train.py

torchrun starts each rank as a new interpreter (``python -u -m app train ...``) that imports torch
again: 1.7-2.2 s of CPU per rank in the image on 2 cores, and 1.4-1.9 s more for ``torch._dynamo``,
which torch's optimizer imports when it is built. An elastic job starts every rank of every node
again at each restart round, so each recovery paid that once per rank, on the cores the new ranks
share. Here torch's elastic agent runs in this process as torchrun runs it (torchrun's own parser,
``config_from_args`` and ``elastic_launch``: the rendezvous, restarts, the ranks' environment and the
failure report are torch's), with a function entrypoint (as torchrun's ``--run-path``) and torch's
``forkserver`` start method: one server per node, started before anything else, imports the preload
once, and each rank of each round is a fork of it, running within milliseconds.

Forking needs a server that never touched a GPU: importing the preload asks CUDA nothing (tested), and
CUDA starts in each rank. ``--no-python`` (a program, not Python) and ``fork=False`` run as torchrun
runs them: a new process per rank.
"""

import argparse
import multiprocessing
import multiprocessing.forkserver
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from app.errors import UsageError
from app.runtime import launcher

START_METHOD = "forkserver"
"""torch's start method of the ranks: forks of one server that imported the preload."""
TORCHRUN_PORT = 29500
"""torchrun's --master-port when none is given."""


@dataclass(frozen=True)
class Server:
    """This process's fork server, started."""

    environment: dict[str, str]
    """The environment it started with: its forks have it, not what this process set since."""


def start_forkserver(preload: Iterable[str]) -> Server:
    """Start this process's fork server now; it imports the modules ``preload`` names (one missing is skipped)
    while this process goes on. Call it before torch is imported here: the two imports then share the cores."""
    multiprocessing.set_forkserver_preload(list(preload))
    multiprocessing.forkserver.ensure_running()
    return Server(launcher.environment())


def _refuse(message: str) -> NoReturn:
    raise UsageError(f"torchrun's arguments: {message} (see 'torchrun --help')")


def parse(words: Sequence[str]) -> argparse.Namespace:
    """torchrun's arguments, read by torchrun's own parser (a bad one: UsageError), with the defaults its
    ``run`` fills in (``--standalone``: c10d on a free local port)."""
    from torch.distributed.run import get_args_parser, parse_min_max_nnodes

    parser = get_args_parser()
    parser.prog = "torchrun"
    parser.error = _refuse  # type: ignore[method-assign]
    args = parser.parse_args(list(words))
    try:
        _, most = parse_min_max_nnodes(args.nnodes)
    except (RuntimeError, ValueError) as error:
        _refuse(f"--nnodes {args.nnodes}: {error}")
    local_only = args.rdzv_backend == "static" and not args.rdzv_endpoint and args.master_port is None and most == 1
    if args.standalone or local_only:
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = TORCHRUN_PORT
    return args


@dataclass(frozen=True)
class Job:
    """What every rank runs, as torchrun was given it: ``-m MODULE`` or a script, and its arguments."""

    target: str
    module: bool
    args: tuple[str, ...]
    environment: tuple[tuple[str, str], ...] = ()
    """What this process set in its environment after its fork server started (torchrun's OMP_NUM_THREADS, the
    survivors' store): a new process per rank would inherit it; a fork sets it first."""

    def words(self) -> list[str]:
        return ["-m", self.target, *self.args] if self.module else [self.target, *self.args]


@dataclass
class Launch:
    """torch's launch configuration and what its agent starts on each rank."""

    config: Any
    """torch.distributed.launcher.api.LaunchConfig."""
    entrypoint: Callable | str
    args: tuple


def prepare(args: argparse.Namespace, entrypoint: Callable[[Job], None] | None, server: Server | None) -> Launch:
    """The launch of parsed torchrun ``args``: each rank runs ``entrypoint(job)`` in a fork of ``server``; None
    (or ``--no-python``): torchrun's own launch, a new process per rank."""
    from torch.distributed.run import config_from_args

    try:
        config, cmd, cmd_args = config_from_args(args)
    except (AssertionError, ValueError) as error:  # torchrun's checks of its values
        _refuse(str(error) or type(error).__name__)
    if entrypoint is None or server is None or args.no_python:
        return Launch(config, cmd, tuple(cmd_args))
    config.start_method = START_METHOD
    rest = cmd_args[cmd_args.index(args.training_script) + 1 :]  # after the script: --local-rank when asked
    since = tuple(sorted(kv for kv in launcher.environment().items() if server.environment.get(kv[0]) != kv[1]))
    return Launch(config, entrypoint, (Job(args.training_script, bool(args.module), tuple(rest), since),))


def launch(run: Launch) -> dict:
    """Run torch's elastic agent until the job ends: each local rank's return value (ChildFailedError when a
    rank failed past the restarts, a rendezvous error when the nodes never met)."""
    from torch.distributed.launcher.api import elastic_launch

    return elastic_launch(run.config, run.entrypoint)(*run.args)
