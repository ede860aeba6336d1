"""Test-only commands that fail in ways no product command should, run through the real ``app.cli.main``.

python -m tests.integration.error_commands bug           # a Python bug: ZeroDivisionError
python -m tests.integration.error_commands native        # torch's C++ store client retries an unknown host
"""

import argparse
import sys
from datetime import timedelta
from types import SimpleNamespace

from app import cli


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No flags of their own."""


def run_bug(args: argparse.Namespace) -> int:
    return 1 // 0


def run_native(args: argparse.Namespace) -> int:
    import torch.distributed as dist

    # c10d logs every retry from C++, each with a backtrace, on file descriptor 2.
    dist.TCPStore("nonexistent.invalid", 29500, 2, is_master=False, timeout=timedelta(seconds=1))
    return 0


if __name__ == "__main__":
    for name, run in {"bug": run_bug, "native": run_native}.items():
        # cli imports a command's module by name: register one that holds these functions
        sys.modules[f"_failing_{name}"] = SimpleNamespace(__doc__=__doc__, add_arguments=add_arguments, run=run)
        cli.COMMANDS[name] = (f"_failing_{name}", "a failing test command")
    sys.exit(cli.main())
