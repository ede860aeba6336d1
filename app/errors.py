"""Errors that the command line turns into a one-line message and exit status 2."""

import re
import sys
from collections.abc import Callable


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


def first_line(error: BaseException) -> str:
    """The first line of an error's message (its type when empty), without gloo's ``[file:line]`` prefix."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return re.sub(r"^\[[^\]]*\]\s*", "", text)
