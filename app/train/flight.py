"""Where each rank was when a collective timed out: torch's flight recorder, dumped by every rank, read
with torch's own analysis (``torch.distributed.flight_recorder``, the library of ``fr_trace``).

    torchrun ... -m app train --out runs/x --timeout 60         # dumps in runs/x/flight/ after a hang
    python -m torch.distributed.flight_recorder.fr_trace runs/x/flight --prefix fr-rank --allow-incomplete-ranks

The launchers the project renders set TORCH_FR_BUFFER_SIZE (``app train`` run alone sets it too:
``launcher.record_collectives``), so torch records each rank's last collectives with the Python
stack that called them. NCCL dumps its recorder by itself on a timeout (TORCH_NCCL_DUMP_ON_TIMEOUT);
gloo's collectives go to torch's CPU recorder, which torch 2.13 never dumps by itself, so each rank
watches its own progress: a rank that has been in one stage of a step (``Watch.doing``) longer than
--timeout writes its recorder (``fr-rank<R>``, the file name torch's analysis reads) and its main
thread's Python stack (``stack-<R>.json``) into the dump folder, once per stage. The rank that never
reached the collective dumps too, while it is still where it hangs.

After a failed collective, rank 0's roll call (``Watch.explain``) adds what the dumps say: the first
collective that not every rank joined, its sequence number, the ranks missing from it with their
hosts, and the line each of those ranks was at (its innermost frame outside torch and Python).
A rank that wrote no dump (stopped or paused: its watcher cannot run, as under ``docker pause``) cannot
be placed by the analysis; the line names those ranks instead. ``analysis.txt`` holds what the analysis
said (its tables need ``tabulate``, a dependency of the app and of the image), then the line.

torch 2.11-2.13's CPU recorder names the default group '' in its pg_config while its entries name
it '0': torch's analysis then fails (KeyError) on gloo dumps; ``_name_groups`` fills in the name.
Before 2.13 the analysis reads only nccl and xccl dumps: ``_read_as_nccl`` presents every entry
under nccl's name, on any torch (torch 2.11 on an H200 gave the line without the recorder's part).
"""

import contextlib
import io
import json
import logging
import pickle
import sys
import threading
import time
import traceback
from pathlib import Path

from torch._C._distributed_c10d import _dump_fr_trace

from app.atomic import atomic_write_text
from app.train.watch import ranks_text

POLL_S = 0.5
"""How often a rank's watcher looks at its own progress."""
ANALYSIS = "analysis.txt"
"""What torch's analysis printed while it read the dumps, then the line it led to, in the dumps' folder."""
READ_GRACE_S = 3.0
"""Seconds rank 0 waits for the other ranks' dumps before it reads them."""
NCCL = "nccl:"
"""The profiling-name prefix of NCCL's entries, the one every torch's analysis reads."""


class Recorder:
    """One rank's watcher: dumps the flight recorder and the main thread's stack when a stage runs too long."""

    def __init__(self, prefix: Path, rank: int, timeout_s: float, stage, trace: bool = True) -> None:
        """prefix: the dump files' path less the rank; stage: returns (name, since) of what the rank is doing;
        trace: write the CPU recorder (gloo) too; False under NCCL, whose watchdog dumps its own there."""
        self.prefix, self.rank, self.timeout_s, self.stage, self.trace = prefix, rank, timeout_s, stage, trace
        self.main = threading.main_thread().ident
        self._stop = threading.Event()
        self._dumped: object = None
        self._thread = threading.Thread(target=self._watch, name="flight-recorder", daemon=True)

    def __enter__(self) -> "Recorder":
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            stage = self.stage()
            if stage != self._dumped and time.monotonic() - stage[1] > self.timeout_s:
                self._dumped = stage
                self.dump(stage[0])

    def dump(self, doing: str) -> None:
        """Write this rank's main thread's stack, then its recorder (the folder is made if needed): ``read`` waits
        for the recorders, so a recorder there means its rank's stack is there too (written after it, the stack
        was missing now and then under load: ``no stack dump``)."""
        self.prefix.parent.mkdir(parents=True, exist_ok=True)
        frame = sys._current_frames().get(self.main)
        frames = [{"file": f.filename, "line": f.lineno, "name": f.name} for f in traceback.extract_stack(frame)]
        stack = {"rank": self.rank, "doing": doing, "time": time.time(), "frames": frames}
        atomic_write_text(stack_path(self.prefix, self.rank), json.dumps(stack) + "\n")
        if self.trace:
            path = Path(f"{self.prefix}{self.rank}")
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_bytes(_dump_fr_trace(includeCollectives=True, includeStackTraces=True, onlyActive=False))
            tmp.replace(path)


def stack_path(prefix: Path, rank: int) -> Path:
    return prefix.parent / f"stack-{rank}.json"


def _name_groups(details: dict) -> None:
    """Give the CPU recorder's unnamed group (pg_config '') the name its entries use (torch 2.11-2.13, gloo)."""
    for dump in details.values():
        names = {tuple(entry["process_group"]) for entry in dump["entries"]}
        if "" in dump["pg_config"] and len(names) == 1:
            ((name, desc),) = names
            dump["pg_config"][name] = {**dump["pg_config"].pop(""), "name": name, "desc": desc}


def user_frame(frames: list[dict]) -> dict | None:
    """The innermost frame outside torch, the standard library and this module: the line the rank was at."""
    lib = Path(json.__file__).parent.parent  # the standard library's folder
    for frame in reversed(frames):
        file = frame.get("file") or frame.get("filename", "")
        if "/torch/" in file or (file.startswith(str(lib) + "/") and "site-packages" not in file):
            continue
        if file == __file__:
            continue
        return frame
    return None


def _where(prefix: Path, rank: int) -> str:
    """``at docker/bench/fault_job.py:134 in hook`` from the rank's stack dump, or why not."""
    try:
        stack = json.loads(stack_path(prefix, rank).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "no stack dump"
    frame = user_frame(stack["frames"])
    if frame is None:
        return f"in torch ({stack['doing']})"
    return f"at {_short(frame['file'])}:{frame['line']} in {frame['name']}"


def _short(file: str) -> str:
    """A path from the checkout's root (``app/...``, ``docker/...``) where it is inside it."""
    parts = Path(file).parts
    for root in ("app", "tests", "examples", "docker"):
        if root in parts:
            return str(Path(*parts[parts.index(root) :]))
    return file


def read(prefix: Path, world: int, hosts: list[str], wait_s: float = READ_GRACE_S) -> str | None:
    """What the dumps say, in words (None: no dump, or every rank dumped and joined every collective). Ranks
    that wrote no dump (stopped or paused: their watcher cannot run) are named, as torch's analysis cannot
    place them. The analysis's own words, then this line, go to ANALYSIS in the dumps' folder."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not all(Path(f"{prefix}{r}").exists() for r in range(world)):
        time.sleep(0.2)
    absent = [r for r in range(world) if not Path(f"{prefix}{r}").exists()]
    if len(absent) == world:
        return None
    collective, said = _first_unjoined(prefix)
    if collective is not None:
        missing = sorted(collective.missing_ranks)
        where = "; ".join(f"rank {r} on {_host(hosts, r)} {_where(prefix, r)}" for r in missing)
        line = (
            f"flight recorder: {collective.collective_name} #{collective.collective_seq_id} (sequence number) of "
            f"group {collective.pg_desc} was never joined by {where}; dumps in {prefix.parent}"
        )
    elif absent:
        line = (
            f"flight recorder: no dump from {_on_hosts(absent, hosts)} (a stopped or paused process writes none), "
            f"so torch's analysis cannot place them; the other ranks' dumps in {prefix.parent}"
        )
    else:
        line = None
    with contextlib.suppress(OSError):
        atomic_write_text(prefix.parent / ANALYSIS, f"{said}{line or 'every rank joined every collective'}\n")
    return line


def _host(hosts: list[str], rank: int) -> str:
    return hosts[rank] if rank < len(hosts) else "?"


def _on_hosts(ranks: list[int], hosts: list[str]) -> str:
    """``ranks 2-3 on worker-1`` (and ``rank 5 on worker-2``)."""
    on = dict.fromkeys(_host(hosts, r) for r in ranks)
    return " and ".join(f"{ranks_text([r for r in ranks if _host(hosts, r) == host])} on {host}" for host in on)


def _first_unjoined(prefix: Path):
    """torch's analysis of the dumps: (the first collective with missing ranks or None, what the analysis said
    as it went: its own logger, which writes to the terminal, and print)."""
    said = io.StringIO()
    with _said_into(said):
        found = _analyse(prefix)
    return found, said.getvalue()


@contextlib.contextmanager
def _said_into(stream: io.StringIO):
    """torch's flight-recorder logger (and print) write into ``stream`` instead of the terminal, meanwhile."""
    from torch.distributed.flight_recorder.components.fr_logger import FlightRecorderLogger

    logger = FlightRecorderLogger().logger  # made once, with a handler of its own on stderr
    handlers, logger.handlers = logger.handlers, [logging.StreamHandler(stream)]
    try:
        with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
            yield
    finally:
        logger.handlers = handlers


def _analyse(prefix: Path):
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dump

    args = JobConfig().parse_args([str(prefix.parent), "--prefix", prefix.name, "--allow-incomplete-ranks"])
    details = {}
    for path in sorted(prefix.parent.glob(f"{prefix.name}*")):
        if path.name[len(prefix.name) :].isdigit():
            try:
                details[path.name] = read_dump(prefix.name, str(path))
            except (OSError, pickle.UnpicklingError, EOFError, KeyError):
                continue
    if not details:
        return None
    _name_groups(details)
    version = next(iter(details.values()))["version"]
    backend = _read_as_nccl(details)
    try:
        db = build_db(details, args, version)
    except (AssertionError, KeyError, ValueError, IndexError):  # dumps torch's analysis cannot pair up
        return None
    found = next((c for c in db.collectives if c.missing_ranks), None)
    return found and found._replace(collective_name=found.collective_name.replace(NCCL, f"{backend}:", 1))


def _read_as_nccl(details: dict) -> str:
    """Name every entry as NCCL's for torch's analysis, which before torch 2.13 refuses other backends'
    dumps (``name formatting error? gloo != 'nccl' or 'xccl'``) though it pairs them alike; returns the
    backend's own name, to put back in the result (a job has one backend: app/runtime/backend.py)."""
    backend = "nccl"
    for dump in details.values():
        for entry in dump["entries"]:
            backend, _, operation = entry["profiling_name"].partition(":")
            entry["profiling_name"] = NCCL + operation
    return backend
