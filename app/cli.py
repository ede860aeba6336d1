"""``python -m app <command>``: parse, run, and turn errors into one line and an exit status.

python -m app --help
python -m app check --help
"""

import argparse
import atexit
import contextlib
import gc
import importlib
import os
import sys
import threading
from collections.abc import Sequence
from typing import NoReturn

from app import logs
from app.errors import ClusterError, Stopped, UsageError, first_line, install_extra

# name -> (module, one-line summary). Modules load only when their command runs, so the host side's commands
# (cluster, topology, deploy) run on the stdlib: pip's light install, without the [node] extra and torch.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("app.diagnostics.check", "cluster health check: every collective, verified values, a table or JSON"),
    "comm": ("app.diagnostics.comm", "collective bandwidth sweep (nccl-tests columns): time, algbw, busbw, #wrong"),
    "links": ("app.diagnostics.links", "bandwidth and latency between every pair of nodes; names a slow node or link"),
    "topology": ("app.topology.command", "render hostfile, env file and launcher arguments for a set of hosts"),
    "train": ("app.train", "train a model with DDP: digits/MNIST/CIFAR-10, checkpoints, --resume auto"),
    "bench": ("app.train.bench", "samples/s of app train vs a plain tutorial DDP loop, and the ratio"),
    "scale": ("app.train.scale.command", "scaling report: step time at 1, 2, 4... ranks, the fitted law, comm hooks"),
    "cluster": ("app.orchestrate.runner", "run a job on the compose mini-cluster and keep it alive; logs; down"),
    "deploy": (
        "app.orchestrate.deploy",
        "provision nodes and run the job across them with Ansible (ansible/deploy.yml)",
    ),
    "doctor": ("app.diagnostics.doctor", "rendezvous doctor: MASTER_ADDR, port, interface, host names, world of one"),
    "gate": (
        "app.diagnostics.gate",
        "a node's health gate before it rejoins: the doctor's checks, devices vs the job's start",
    ),
    "node": (
        "app.node.command",
        "a node of a torchrun job: its health gate, then torchrun's agent with ranks forked preloaded",
    ),
}

NODE_EXTRA = "node"
"""pyproject.toml's extra with what every other command imports (torch, numpy, ...)."""


def _top_help() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {summary}" for name, (_, summary) in COMMANDS.items()]
    return "\n".join(
        [
            "usage: python -m app <command> [options]",
            "",
            "commands:",
            *lines,
            "",
            "Run 'python -m app <command> --help' for a command's options and launch examples.",
        ]
    )


class _OneLineParser(argparse.ArgumentParser):
    """argparse with its errors as one line, like every other bad input (exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see '{self.prog} --help')\n")


def build_parser(name: str) -> tuple[argparse.ArgumentParser, object]:
    """The parser and module of one command."""
    module = importlib.import_module(COMMANDS[name][0])
    parser = _OneLineParser(
        prog=f"python -m app {name}",
        description=COMMANDS[name][1],
        epilog=module.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    module.add_arguments(parser)
    logs.add_arguments(parser)
    return parser, module


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit status (2: bad input, 1: the cluster failed)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_top_help())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}: choose one of {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        parser, module = build_parser(name)
    except ModuleNotFoundError as error:  # a node-side command (train, check, ...) in a light install
        if (error.name or "app").partition(".")[0] == "app":
            raise
        print(f"error: python -m app {name} needs {error.name}, which this Python lacks (the [{NODE_EXTRA}] extra): "
              f"{install_extra(NODE_EXTRA)}", file=sys.stderr)  # fmt: skip
        return 2
    args = parser.parse_args(rest)
    args.argv = rest  # the command's arguments as given (app bench passes them on to the ranks it starts)
    own_output = getattr(module, "OWN_DESCRIPTOR_2", True)
    with logs.RunLog(name, logs.log_dir(args), verbose=args.verbose, redirect=own_output) as log:
        args.log_file = log.path  # the one log of this command (app cluster writes its nodes' output there too)
        try:
            return _run(module, args, log)
        finally:
            release_process_groups()


def _run(module, args: argparse.Namespace, log: logs.RunLog) -> int:
    """The command's exit status; every failure becomes one line on the terminal, its details go to the log."""
    try:
        status = int(module.run(args))
    except UsageError as error:
        return log.fail(str(error), 2)
    except ClusterError as error:
        return log.fail(str(error), error.status, error)
    except Stopped as stopped:  # SIGTERM while training: the step was kept; no error
        if str(stopped):
            print(stopped, file=sys.stderr, flush=True)
        return stopped.status
    except KeyboardInterrupt:
        return log.fail("interrupted (SIGINT)", 130)
    except Exception as error:  # a bug, or a backend error no command expected: one line, the traceback in the log
        return log.fail(f"unexpected {type(error).__name__}: {first_line(error)}", 1, error)
    if status and log.who.rank is None and log.redirect:  # its ranks failed; they wrote their line into our log
        child = log.child_error()
        if child is None:
            return log.fail(f"{log.command} exited with status {status}", status)
        print(child, file=sys.stderr)
    return status


def entry() -> NoReturn:
    """``python -m app`` and the ddp-cluster script: run the command, then leave at once (``leave``)."""
    leave(main())


def leave(status: int) -> NoReturn:
    """Exit with ``status`` without the interpreter's teardown, which takes 0.5-0.9 s of every exit once torch
    is imported (its modules and objects taken apart one by one; an agent restarting a job waits for it)."""
    finish()
    os._exit(status)


def finish() -> None:
    """What an interpreter's exit does before its teardown, in its order: threading's shutdown (thread pools
    told to end, other threads joined, daemon threads left), exit handlers (logging's flush,
    multiprocessing's children), then standard output and error flushed."""
    threading._shutdown()  # what the interpreter's exit calls first (a pool's threads wait for its word)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe: nothing more can be said
            stream.flush()


def release_process_groups() -> None:
    """Free what still holds a destroyed process group (a DDP model in a reference cycle) now.

    gloo's worker threads live as long as their process group object; left to the interpreter's
    shutdown, one of them may release a tensor after Python stopped handing out the GIL, and the
    process aborts ("terminate called without an active exception", torch 2.13). Freed here, the
    group's destructor joins them while Python is alive, with the GIL released
    (``app.runtime.distributed.release_groups``; a command that joined no group imports no torch).
    """
    groups = sys.modules.get("app.runtime.distributed")
    if groups is None:
        gc.collect()
    else:
        groups.release_groups()
