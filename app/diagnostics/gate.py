"""``python -m app gate``: a node's health gate before it joins a job again: the doctor's checks toward
the rendezvous host, and its devices against the figures the job's nodes recorded at its start.

    python -m app gate --torchrun-args /cluster/torchrun.args                  # judge once: exit 0, or 3 kept out
    python -m app gate --torchrun-args /cluster/torchrun.args --retry-every 10 # ddp-node's: wait until it passes
    python -m app gate --records runs/gate                                     # devices only (no rendezvous)

The image's node entrypoint (docker/bin/ddp-node) runs it on every node before torchrun:

  first start    no record of this node (RECORDS/<host>.json) yet: it measures its devices as app check
                 does (app/diagnostics/health.py: n x n matrix products, a copy; --device-seconds each
                 device; every visible GPU, else the CPU) and records them, written atomically; it passes.
                 Nodes that share the records folder measure one at a time (a flock on it: containers of
                 one machine started together read a third of a node alone when three measured at once
                 on two cores, and such a bar let a node at 0.3 CPU back in). The job's figures are the
                 best of its nodes' records, device by device (the nodes of a job are alike: the spec
                 gives them one shape; a node measured at a busy moment does not lower the bar); a node
                 that shares no folder with the others (Ansible's per-node /results) has its own
  started again  its record is there (a container started again; a later job on the same results): the
                 doctor's checks (the rendezvous host's name resolves, the interface towards it, this
                 host's name, the rendezvous port answers within --timeout; app/diagnostics/doctor.py),
                 1 MiB to the rendezvous host and back through its store within --timeout (its link
                 works end to end, where the other nodes run), then its devices measured again (twice
                 when the first falls short: each figure's better one counts); still short, the job's
                 figures set against what its running peers measure now (app/diagnostics/peers.py: asked
                 through the rendezvous store; a machine loaded since the start lowers the bar); a figure below
                 --fail-below x the job's, or a failed check, keeps the node out with one line:
                 ``gate: kept out: device check 4.1 GFLOP/s against the job's 36.2 (fail below 0.5)``

With --retry-every S the node kept out says so once (and again when another check keeps it out:
``gate: still kept out, now by: transfer check: ...``) and is judged again every S seconds, in the
same process, against the records as they are then (a record rewritten since counts), until it passes
(``gate: passed after 40 s kept out: ...``); ddp-node then starts
torchrun, whose agent joins the job's next rendezvous round (the running agents restart their
workers with it: the world grows again). Nothing is counted against the job's restarts meanwhile.
The cluster runner shows both lines (docs/faults.md).

Exit status: 0 passed (or recorded), 3 kept out (without --retry-every), 2 bad input.
"""

import argparse
import fcntl
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from app import contract, events, flags
from app.atomic import atomic_write_text
from app.diagnostics import doctor, health, peers
from app.diagnostics.gate_config import GateConfig
from app.errors import ClusterError, UsageError, first_line
from app.runtime import launcher
from app.runtime.distributed import DistConfig, store_client
from app.runtime.launcher import Launcher, Node, ProcessInfo

TRANSFER_BYTES = 1 << 20
"""What a node sends to the rendezvous host and reads back before it rejoins (its link works, end to end)."""
KEPT_OUT = 3
"""Exit status of a node that the gate keeps out."""
Rendezvous = tuple[str, int, bool]
"""(host, port, whether this node serves it)."""


# --- the verdict: pure functions of the figures ---------------------------------------------------


def shortfall(now: list[health.DeviceHealth], start: list[health.DeviceHealth], fail_below: float) -> str | None:
    """Why this node's devices keep it out (the first figure below ``fail_below`` x the job's), or None.

    A device recorded at the start and not measured now fails too. Names the device when there are several.
    """
    measured = {d.device: d for d in now}
    for then in start:
        named = f"{then.device} " if len(start) > 1 else ""
        found = measured.get(then.device)
        if found is None:
            return f"device check {then.device} is missing (the job started with {len(start)} device(s))"
        for metric in health.METRICS:
            value, before = getattr(found, metric), getattr(then, metric)
            if value < fail_below * before:
                reference = health.figure(metric, before, then.device).split(" ")[0]
                return (
                    f"device check {named}{health.figure(metric, value, then.device)} against the job's "
                    f"{reference} (fail below {fail_below:g})"
                )
    return None


def job_figures(mine: list[health.DeviceHealth], records: list[list[health.DeviceHealth]]) -> list[health.DeviceHealth]:
    """The job's figures for this node's devices (``mine``, its own record): the best of every record's and its
    own, device by device (a record taken at a busy moment is not the bar)."""
    found = []
    for own in mine:
        same = [own, *(d for devices in records for d in devices if d.device == own.device)]
        found.append(replace(own, **{m: max(getattr(d, m) for d in same) for m in health.METRICS}))
    return found


def best(a: list[health.DeviceHealth], b: list[health.DeviceHealth]) -> list[health.DeviceHealth]:
    """Each device's better figures of two measurements (a busy moment is not a sick device)."""
    other = {d.device: d for d in b}
    kept = []
    for d in a:
        o = other.get(d.device, d)
        kept.append(replace(d, **{m: max(getattr(d, m), getattr(o, m)) for m in health.METRICS}))
    return kept


def describe(figures: list[health.DeviceHealth]) -> str:
    """``cpu 36.2 GFLOP/s, 3.1 GB/s copy`` for every device."""
    return "; ".join(
        f"{d.device} {health.figure('flops', d.flops, d.device)}, {health.figure('copy_gbps', d.copy_gbps, d.device)}"
        for d in figures
    )


# --- this node -------------------------------------------------------------------------------------


def devices() -> list[torch.device]:
    """Every visible GPU, else the CPU."""
    count = torch.cuda.device_count()
    return [torch.device("cuda", i) for i in range(count)] if count else [torch.device("cpu")]


def measure(seconds: float, folder: Path | None = None) -> list[health.DeviceHealth]:
    """Every device's figures; with ``folder`` (the records), measured holding its lock (``alone``)."""
    with alone(folder):
        return [health.measure(device, seconds) for device in devices()]


@contextmanager
def alone(folder: Path | None) -> Iterator[None]:
    """Hold an exclusive flock on ``folder`` itself (made if missing; no lock file, so nothing is left behind): the
    nodes that share the folder (the containers of one machine) measure one at a time, not under each other's
    load. A folder that cannot be locked (read-only, a file system without flock on folders) measures without it."""
    fd = None
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            if fd is not None:
                os.close(fd)
            fd = None
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


def read_record(path: Path) -> list[health.DeviceHealth] | None:
    """The figures recorded at the job's start; None when there are none (or they do not read: recorded again)."""
    try:
        return [health.DeviceHealth.of(d) for d in json.loads(path.read_text())["devices"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_records(folder: Path) -> list[list[health.DeviceHealth]]:
    """Every node's record in ``folder``."""
    return [found for path in sorted(folder.glob("*.json")) if (found := read_record(path))]


def record(path: Path, host: str, figures: list[health.DeviceHealth]) -> str:
    """Write the start figures; the line that says so (or why they could not be kept)."""
    body = {"host": host, "time": time.time(), "devices": [asdict(d) for d in figures]}
    try:
        atomic_write_text(path, json.dumps(body, indent=2) + "\n")
    except OSError as error:
        why = error.strerror or error
        return f"gate: cannot record {host}'s figures in {path.parent} ({why}): not judged on a restart"
    return f"gate: {host} at the job's start: {describe(figures)}; recorded in {path}"


def rendezvous(args_file: Path) -> Rendezvous:
    """(host, port, whether this node serves it) of the torchrun arguments in ``args_file`` (torchrun's parser)."""
    from torch.distributed.run import get_args_parser  # torchrun's own reading of its arguments

    try:
        words = args_file.read_text().split()
    except OSError as error:
        raise UsageError(f"--torchrun-args {args_file}: {error.strerror or error}") from None
    parsed, _ = get_args_parser().parse_known_args([*words, "job"])
    return rendezvous_of(parsed)


def rendezvous_of(parsed: argparse.Namespace) -> Rendezvous:
    """(host, port, whether this node serves it) of parsed torchrun arguments."""
    if parsed.rdzv_backend == "static":
        return parsed.master_addr, parsed.master_port or contract.RENDEZVOUS_PORT, parsed.node_rank == 0
    endpoint = parsed.rdzv_endpoint
    host, colon, port = endpoint.rpartition(":")
    return (host, int(port), False) if colon else (endpoint, contract.C10D_PORT, False)


def doctor_view(mine: Node, host: str, port: int, serves: bool) -> ProcessInfo:
    """This node as the doctor sees one node of a job across nodes before its agent starts: it joins the
    rendezvous at ``host:port``, or (``serves``: the rendezvous host) is to serve it."""
    return ProcessInfo(
        rank=0 if serves else 1,
        local_rank=0,
        world_size=2,
        local_world_size=1,
        node_rank=0 if serves else 1,
        master_addr=host,
        master_port=port,
        launcher=Launcher.TORCHRUN,
        torchelastic=True,
        agent_store=not serves,
        ifname=mine.ifname,
        host=mine.host,
    )


def checks(cfg: GateConfig, mine: Node, where: Rendezvous | None, rejoining: bool = False) -> tuple[str | None, str]:
    """The doctor's checks towards the rendezvous ``where`` (names, interface, port), then a short transfer
    to it and back: (the first failure's line or None, what the transfer took, for the pass line). ``rejoining``:
    the node left a running job (evicted), whose store is up, held by another node or by this node's agent."""
    if where is None:
        return None, ""
    host, port, serves = where
    serves = not rejoining and (serves or host in (mine.host, "localhost", "127.0.0.1"))
    proc = doctor_view(mine, host, port, serves)
    dist_cfg = DistConfig(timeout_s=cfg.timeout_s)
    net = doctor.Network()
    diag = doctor.Diagnosis(proc.rank, proc.host)
    doctor.check_master_address(diag, proc, (host, port), net)
    doctor.check_interface(diag, proc, dist_cfg, net)
    doctor.check_host_name(diag, proc, net)
    doctor.check_port(diag, proc, (host, port), cfg.timeout_s)
    failed = diag.failure()
    if failed:
        return f"doctor's {failed.check} check: {failed.detail}", ""
    return (None, "") if serves else transfer(mine.host, host, port, cfg.timeout_s)


def transfer(me: str, host: str, port: int, timeout_s: float) -> tuple[str | None, str]:
    """TRANSFER_BYTES to the rendezvous host and back through its store (torch's TCPStore: the rendezvous'
    own server), within ``timeout_s``: (why it failed or None, ``1 MiB to host and back in 12 ms``)."""
    size, key = f"{TRANSFER_BYTES >> 20} MiB", f"ddp-cluster/gate/{me}"
    start = time.perf_counter()
    try:
        store = store_client(host, port, timeout_s)
        store.set(key, bytes(TRANSFER_BYTES))
        back = len(store.get(key))
        store.delete_key(key)
    except ClusterError as error:
        return f"transfer check: {size} to {host}:{port} and back: {error}", ""
    except (RuntimeError, ValueError) as error:  # an operation timed out, the server went away
        return f"transfer check: {size} to {host}:{port} and back: failed ({first_line(error, 160)})", ""
    if back != TRANSFER_BYTES:
        return f"transfer check: {size} to {host}:{port} came back as {back} bytes", ""
    return None, f"{size} to {host} and back in {1000 * (time.perf_counter() - start):.0f} ms"


@dataclass(frozen=True)
class Judged:
    why: str | None
    """The failing check's line; None: passed."""
    figures: list[health.DeviceHealth]
    transfer: str = ""
    """What the transfer to the rendezvous host took (empty: none was made)."""
    against: list[health.DeviceHealth] | None = None
    """The job's figures as its peers are now (``peers.scaled``), when they lowered them; None: as recorded."""
    paced: str = ""
    """How: ``x 0.46: the best of its 2 running peer(s) now`` (empty: as recorded)."""
    paces: tuple[dict, ...] = ()
    """Its peers' answers (``peers.ask``), kept in its gate event (``paces``)."""


def judge(
    cfg: GateConfig,
    mine: Node,
    where: Rendezvous | None,
    start: list[health.DeviceHealth],
    rejoining: bool = False,
    expected: int = 0,
) -> Judged:
    """The doctor's checks and the transfer, then this node's devices against the job's figures ``start``: measured
    twice when the first falls short; still short, against ``start`` as the job's running nodes are now (the best
    they answer, ``peers.ask``: ``expected`` of them at most)."""
    why, moved = checks(cfg, mine, where, rejoining)
    if why is not None:
        return Judged(why, [])
    figures = measure(cfg.device_seconds, cfg.records)
    if shortfall(figures, start, cfg.fail_below) is not None:  # measured once more before it counts
        figures = best(figures, measure(cfg.device_seconds, cfg.records))
    why = shortfall(figures, start, cfg.fail_below)
    if why is None or where is None:
        return Judged(why, figures, moved)
    wait_s = cfg.device_seconds * len(figures) + 2 * peers.POLL_S  # their measurement, and their next look
    answers = peers.ask(where[:2], mine.host, cfg.timeout_s, wait_s, expected)
    if not answers:
        return Judged(why, figures, moved)
    against, lowered = peers.scaled(start, answers)
    if lowered >= 1:  # its peers measure the job's figures or more now: the bar stands
        return Judged(why, figures, moved, paces=tuple(answers))
    paced = f"x {lowered:.2g}: the best of its {len(answers)} running peer(s) now"
    why = shortfall(figures, against, cfg.fail_below)
    return Judged(f"{why}; the job's figures {paced}" if why else None, figures, moved, against, paced, tuple(answers))


def check_of(why: str) -> str:
    """The check that a keep-out line names (``device check``, ``transfer check:``, ``doctor's port``): a node kept
    out by another check than the one its line named is said again; the same check with new figures is not."""
    return " ".join(why.split()[:2])


def passed(judged: Judged, start: list[health.DeviceHealth], took: str) -> str:
    return f"gate: passed {took}: {judged_figures(judged, start)}"


def gate_event(verdict: str, detail: str, figures: list[health.DeviceHealth], **fields: object) -> None:
    """The gate's record in the job's events: its verdict, its line's figures, and each device's ``device``,
    ``flops`` (FLOP/s) and ``copy_gbps``; ``paces``: its peers' answers, where they were asked."""
    measured = [{"device": d.device, "flops": d.flops, "copy_gbps": d.copy_gbps} for d in figures]
    events.write(events.GATE, verdict=verdict, detail=detail, figures=measured, **fields)


def asked(judged: Judged) -> dict:
    """The peers' answers of a judgment, for its gate event (none asked: nothing)."""
    return {"paces": list(judged.paces)} if judged.paces else {}


def judged_figures(judged: Judged, start: list[health.DeviceHealth]) -> str:
    """``cpu 35.0 GFLOP/s, 3.1 GB/s copy against the job's cpu 36.2 GFLOP/s, 3.0 GB/s copy`` (as its peers are now:
    ``... against the job's cpu 46.0 GFLOP/s, ... (x 0.46: the best of its 2 running peer(s) now)``), and the
    transfer."""
    moved = f"; {judged.transfer}" if judged.transfer else ""
    paced = f" ({judged.paced})" if judged.paced else ""
    return f"{describe(judged.figures)} against the job's {describe(judged.against or start)}{paced}{moved}"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m app gate``."""
    flags.add_arguments(parser, GateConfig)


def run(args: argparse.Namespace) -> int:
    """Record this node's figures (first start), or judge it: 0 passed, 3 kept out (ClusterError)."""
    cfg = flags.from_args(GateConfig, args)
    admit(cfg, rendezvous(cfg.torchrun_args) if cfg.torchrun_args else None)  # bad input fails at any start
    return 0


def admit(
    cfg: GateConfig, where: Rendezvous | None, rejoining: bool = False, expected: int = 0
) -> list[health.DeviceHealth]:
    """Record this node's figures at its first start, or judge it against the job's: return once it passed, with
    the figures it measured (what its peers' asks are answered against: ``peers.answer``); kept out, a ClusterError
    (status KEPT_OUT), or with ``cfg.retry_every`` judged again until it passes. ``rejoining``: after its eviction
    from the running job (``checks``); ``expected``: how many running nodes may answer its ask (``judge``)."""
    mine = launcher.this_node()  # (no rank before torchrun: Ansible's env file holds WORLD_SIZE alone)
    began = time.monotonic()
    path = cfg.records / f"{mine.host}.json"
    start = read_record(path)
    if start is None:
        figures = measure(cfg.device_seconds, cfg.records)
        print(record(path, mine.host, figures), flush=True)
        gate_event(events.RECORDED, describe(figures), figures)
        return figures
    start = job_figures(start, read_records(cfg.records))
    judged = judge(cfg, mine, where, start, rejoining, expected)
    if judged.why is None:
        print(passed(judged, start, f"in {time.monotonic() - began:.1f} s"), flush=True)
        gate_event(events.PASSED, judged_figures(judged, start), judged.figures, **asked(judged))
        return judged.figures
    if not cfg.retry_every:
        raise ClusterError(f"{mine.host} kept out: {judged.why}", KEPT_OUT)
    kept_line, still_line, _ = events.GATE_LINES_SAID_AGAIN
    print(f"{kept_line}{judged.why}; tried again every {cfg.retry_every:g} s", flush=True)
    gate_event(events.KEPT_OUT, judged.why, judged.figures, retry_every=cfg.retry_every, **asked(judged))
    kept, said = time.monotonic(), check_of(judged.why)
    while judged.why is not None:
        time.sleep(cfg.retry_every)
        start = job_figures(read_record(path) or start, read_records(cfg.records))  # the records as they are now
        judged = judge(cfg, mine, where, start, rejoining, expected)
        if judged.why is not None and check_of(judged.why) != said:  # kept out now by another check: say which
            said = check_of(judged.why)
            print(f"{still_line}{judged.why}", flush=True)
            gate_event(events.KEPT_OUT, judged.why, judged.figures, retry_every=cfg.retry_every, **asked(judged))
    waited = round(time.monotonic() - kept)
    print(passed(judged, start, f"after {waited} s kept out"), flush=True)
    gate_event(events.PASSED_AFTER, judged_figures(judged, start), judged.figures, waited=waited, **asked(judged))
    return judged.figures
