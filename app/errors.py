"""Errors that the command line turns into a one-line message and exit status 2."""


class UsageError(Exception):
    """Bad input (environment, flags, files): the message names the problem and the fix."""


class ClusterError(Exception):
    """The cluster misbehaved (rendezvous timed out, a collective failed): exit status 1."""
