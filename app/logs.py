"""Every failure ends in one line on the terminal; the details go to a log file per rank.

    python -m app check                            # error: <cause> [exit 1; log /abs/logs/check.log]
    torchrun --nproc-per-node 2 -m app check       # error: rank 1 on node1: <cause> [exit 1; log .../check-rank1.log]
    python -m app train --out runs/x               # logs in runs/x/logs/train-rank<R>.log
    python -m app check --log-dir /shared/logs     # anywhere else
    python -m app check --verbose                  # tracebacks and torch's own output on the terminal too

What torch prints, and why it is sent to the log rather than filtered: c10d (TCPStore, the socket
layer) and gloo log from C++ through c10's logger, which writes straight to file descriptor 2
(``[W1122 10:50:01 socket.cpp:764] [c10d] ...``). Its level is TORCH_CPP_LOG_LEVEL, read once when
torch is imported; at the default (WARNING) a store that cannot be reached logs every retry, each
with the ``Exception raised from ... frame #0 ...`` backtrace of the C++ error (about 45 lines for
one unreachable MASTER_ADDR). Python's ``sys.stderr`` never sees these lines, so the only complete
way to keep them off the terminal is to point descriptor 2 itself at the log file. That is what
``RunLog`` does for the whole run (and undoes at the end): native output (c10d, gloo, NCCL,
faulthandler dumps) goes to the log, while Python's ``sys.stderr`` is re-opened on the original
terminal, so this command's one-line errors and deliberate progress output still reach the user.
Python warnings and torch's Python loggers (torch.distributed, torchelastic) go to the log through
``logging``. Child processes (``app bench`` starting torchrun) inherit descriptor 2, so their
output lands in this log too and their own error line is repeated on the terminal.

A log file is written under ``--log-dir`` (default: ``OUT/logs`` for commands with ``--out``, else
``./logs``), one per rank: ``<command>-rank<R>.log`` under a launcher, ``<command>.log`` without.
Runs append, and a log holds every run's lines until the user removes it: a run that leaves
nothing in a log it created removes the file again (and the folder, when it made it), so a quiet
success leaves no clutter, but a log that held an earlier run's lines (the traceback of the failure
before a clean ``--resume auto`` run, say) is never removed. Other processes may append to the
same file (``app cluster`` writes every node's output into its own log).
"""

import argparse
import contextlib
import faulthandler
import json
import logging
import os
import re
import sys
import tempfile
import time
import traceback
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import TextIO

from app import events
from app.atomic import atomic_write_text
from app.runtime import launcher

DEFAULT_LOG_DIR = Path("logs")
"""Where logs go for commands without an output folder (relative to the working directory)."""


_ESCAPES = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
"""Terminal escape codes: CSI (colours, ``\\x1b[K`` erase-line), OSC (titles, links), and the two-byte ones."""


def plain(text: str) -> str:
    """``text`` as a log file keeps it: no terminal escape codes, and of a line that carriage returns redrew
    (a progress bar) its last drawing only; empty lines dropped."""
    lines = []
    for line in _ESCAPES.sub("", text).split("\n"):
        drawn = [part for part in line.split("\r") if part.strip()]
        if drawn:
            lines.append(drawn[-1].rstrip())
    return "\n".join(lines)


def node_line(node: str, line: str) -> str | None:
    """``node: line`` for a log of many nodes' output, plain; None when nothing is left to say (no bare ``: ``)."""
    text = plain(line)
    return f"{node}: {text}" if text else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--log-dir and --verbose, on every command."""
    group = parser.add_argument_group("errors and logs")
    group.add_argument(
        "--log-dir",
        metavar="DIR",
        type=Path,
        default=None,
        help=f"folder of this rank's log: tracebacks, torch's C++ output (default OUT/logs, else ./{DEFAULT_LOG_DIR})",
    )
    group.add_argument(
        "--verbose", action="store_true", help="also show tracebacks and torch's C++ output on the terminal"
    )


def log_dir(args: argparse.Namespace) -> Path:
    """--log-dir, else OUT/logs for a command with --out, else ./logs."""
    if args.log_dir is not None:
        return args.log_dir
    out = getattr(args, "out", None)
    return Path(out) / "logs" if out else DEFAULT_LOG_DIR


def file_name(command: str, rank: str | None) -> str:
    """``check-rank3.log`` under a launcher, ``check.log`` for a single process."""
    if rank is None:
        return f"{command}.log"
    return f"{command}-rank{re.sub(r'[^A-Za-z0-9_-]', '_', rank)}.log"


_ERROR_LINE = re.compile(r"^error: (?P<cause>.*?)(?: \[exit \d+(?:; log \S+)?\])?$")


def cause_of(text: str) -> str:
    """The cause told by another app command's one line (``error: CAUSE [exit S; log PATH]``, RunLog.line),
    for a line of one's own that gives its own exit status; any other text as it is."""
    match = _ERROR_LINE.match(text)
    return match["cause"] if match else text


def write_error_file(path: str, message: str, callstack: str) -> None:
    """torchelastic's error file of this rank (TORCHELASTIC_ERROR_FILE), as torch's ``record`` writes it, but whole or
    not at all: a rank stopped while torch wrote it left an empty file, on which torch's agent failed to build the
    rank's failure and ended the job (``unexpected JSONDecodeError``, seen beside two busy loops)."""
    data = {
        "message": {"message": message, "extraInfo": {"py_callstack": callstack, "timestamp": str(int(time.time()))}}
    }
    with contextlib.suppress(OSError):
        atomic_write_text(path, json.dumps(data))


class RunLog:
    """The log of one run of one command on one rank; while entered, native output goes to it.

    with RunLog("check", Path("logs")) as log:
        ...
        return log.fail("the rendezvous timed out", 1)   # prints the one line, keeps the details
    """

    def __init__(self, command: str, folder: Path, *, verbose: bool = False, redirect: bool = True) -> None:
        self.command = command
        self.verbose = verbose
        self.redirect = redirect and not verbose
        """Native output and loggers go to the log while entered (not for a launcher whose ranks share its
        descriptor 2: app node, whose output is its ranks' as torchrun's is)."""
        self.who = launcher.identity()
        self.path = self._open(folder.absolute() / file_name(command, self.who.rank))
        self._start = self._file.tell()
        self._fd2: int | None = None
        self._stderr: TextIO | None = None
        self._handler: logging.Handler | None = None
        self._faulthandler = False

    def _open(self, path: Path) -> Path:
        """Open ``path`` for appending and reading back (child_error), creating its folder, or a new temp
        folder's file if that fails."""
        self._made = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a+", buffering=1, encoding="utf-8", errors="backslashreplace")
            return path
        except OSError:  # a read-only or foreign folder: the error line names where the log went instead
            path = Path(tempfile.mkdtemp(prefix="ddp-cluster-logs-")) / path.name
            self._made = [path.parent]
            self._file = path.open("a+", buffering=1, encoding="utf-8", errors="backslashreplace")
            return path

    def __enter__(self) -> "RunLog":
        if self.redirect:
            self._redirect()
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._restore()
        written = self._written()
        with contextlib.suppress(OSError):  # a full disk: what could not be written is lost, nothing else
            self._file.close()
        if not written and self._start == 0:  # a log that held earlier runs' lines is kept
            self._remove()

    def _written(self) -> bool:
        """Whether the log grew during this run, by this process or another (True when the disk refuses even to
        say: keep the file)."""
        try:
            self._file.flush()
            return os.fstat(self._file.fileno()).st_size > self._start
        except OSError:
            return True

    def _redirect(self) -> None:
        """Descriptor 2 -> the log; Python's sys.stderr -> the terminal; warnings and loggers -> the log."""
        sys.stdout.flush()
        sys.stderr.flush()
        self._fd2 = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        try:
            on_fd2 = sys.stderr.fileno() == 2
        except (AttributeError, OSError, ValueError):  # already replaced (pytest's capture): leave it
            on_fd2 = False
        if on_fd2:
            self._stderr = sys.stderr
            terminal = os.fdopen(os.dup(self._fd2), "w", buffering=1, encoding=sys.stderr.encoding, errors="replace")
            sys.stderr = terminal
        self._handler = logging.StreamHandler(self._file)
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logging.getLogger().addHandler(self._handler)
        logging.captureWarnings(True)
        if not faulthandler.is_enabled():
            faulthandler.enable(self._file)
            self._faulthandler = True

    def _restore(self) -> None:
        if self._faulthandler:
            faulthandler.disable()
        if self._handler is not None:
            logging.captureWarnings(False)
            logging.getLogger().removeHandler(self._handler)
        if self._stderr is not None:  # the terminal stream stays open: a late thread may still print
            sys.stderr.flush()
            sys.stderr = self._stderr
        if self._fd2 is not None:
            os.dup2(self._fd2, 2)
            os.close(self._fd2)

    def _remove(self) -> None:
        """Remove the untouched log file and the folders made for it, when nothing else is in them."""
        try:
            self.path.unlink()
            for folder in self._made:
                folder.rmdir()
        except OSError:
            pass  # another rank's file is there, or it was never ours to remove

    def child_error(self) -> str | None:
        """The first one-line error that a child process (a rank this command started) wrote into this log."""
        self._file.flush()
        fd = self._file.fileno()  # this run's own file, also when another run of the command unlinked its path
        grown = os.fstat(fd).st_size - self._start
        text = os.pread(fd, max(grown, 0), self._start).decode("utf-8", errors="replace")
        return next((line for line in text.splitlines() if line.startswith("error: ")), None)

    def line(self, message: str, status: int, details: bool) -> str:
        """``error: rank R on HOST: MESSAGE [exit S; log PATH]`` (rank: under a launcher; log: when it has details)."""
        who = f"rank {self.who.rank} on {self.who.host}: " if self.who.rank is not None else ""
        where = f"; log {self.path}" if details else ""
        return f"error: {who}{message} [exit {status}{where}]"

    def fail(self, message: str, status: int, error: BaseException | None = None) -> int:
        """Print the one line on the terminal, the traceback of ``error`` (if any) in the log; returns ``status``."""
        if error is not None:
            with contextlib.suppress(OSError):  # the log's disk is full: the details are lost, not the line
                self._record(error)
        if self.verbose and error is not None:
            traceback.print_exception(error, file=sys.stderr)
        details = self._written()
        text = self.line(message, status, details)
        if details:
            with contextlib.suppress(OSError):
                self._file.write(text + "\n")
        print(text, file=sys.stderr, flush=True)
        self._tell_torchrun(text)
        reason = getattr(error, "reason", "")
        events.write(events.ERROR, self.who.number, line=text, cause=message, status=status, reason=reason)
        return status

    def _tell_torchrun(self, text: str) -> None:
        """Give torchrun's agent the one line, so that its failure report names the root cause."""
        if self.who.error_file is not None:
            write_error_file(self.who.error_file, text, text)

    def _record(self, error: BaseException) -> None:
        stamp = datetime.now().isoformat(timespec="seconds")
        self._file.write(f"--- {stamp} pid {os.getpid()} on {self.who.host}: python -m app {self.command}\n")
        self._file.write("".join(traceback.format_exception(error)))
