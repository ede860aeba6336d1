"""Errors that the command line turns into a one-line message and exit status 2."""

import os
import re
import shlex
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

DISTRIBUTION = "ddp-cluster"
"""The project's name to pip (pyproject.toml's [project] name), whose extras add what a command needs."""


class UsageError(Exception):
    """Bad input (environment, flags, files): the message names the problem and the fix."""


class ClusterError(Exception):
    """The cluster misbehaved (rendezvous timed out, a collective failed): exit status 1, or the
    failed job's own status where one is known (a cluster job that ended with 137, say)."""

    def __init__(self, message: str, status: int = 1, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        """What kind of failure, for the job's events (``app.events``: PEERS_LOST, NO_SPACE; "": another)."""


class Stopped(Exception):
    """The launcher stopped this process (SIGTERM): not a failure of the job. The message (empty on all
    ranks but the one that kept the step) is said as it is; the exit status is 128 + the signal's number."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def exit_status_of(action: Callable[[], int]) -> int:
    """Run ``action`` (a script's main, not an app command: those have app.logs): its status, or one
    line on stderr and 2 for a UsageError, the ClusterError's status (1 unless it names one)."""
    try:
        return int(action())
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except ClusterError as error:
        print(f"error: {error}", file=sys.stderr)
        return error.status


def first_line(error: BaseException, limit: int | None = None) -> str:
    """The first line of an error's message (its type when empty), without gloo's ``[file:line]`` prefix;
    with ``limit``, at most that many characters, cut between words (``clip``)."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)
    return clip(text, limit) if limit else text


ELLIPSIS = "..."
"""What ends a clipped text."""


def clip(text: str, limit: int) -> str:
    """``text`` when it has at most ``limit`` characters, else its words that fit with ELLIPSIS after them: never
    a word cut in two (``... Check the logs of the r``); a first word longer than ``limit`` is cut."""
    if len(text) <= limit:
        return text
    room = limit - len(ELLIPSIS)
    whole = text[room : room + 1].isspace()  # the word before the cut ends there
    words = text[:room] if whole else (text[:room].rpartition(" ")[0] or text[:room])
    return words.rstrip(" ,;:.") + ELLIPSIS


def install_extra(extra: str) -> str:
    """The exact command that adds the packages of pyproject.toml's extra ``extra`` to this Python:
    ``/venv/bin/python -m pip install 'ddp-cluster[cluster]'``, or this checkout's folder where the app runs from
    a checkout that pip never installed (PYTHONPATH)."""
    try:
        metadata.distribution(DISTRIBUTION)
        target = DISTRIBUTION
    except metadata.PackageNotFoundError:
        target = str(Path(__file__).resolve().parents[1])
    return f"{shlex.quote(os.path.normpath(sys.executable))} -m pip install {shlex.quote(f'{target}[{extra}]')}"
