"""Collective bandwidth sweep, in the columns nccl-tests users know, for gloo and NCCL, any launcher.

    python -m app comm                                        # one process: says nothing crosses a link
    torchrun --standalone --nproc-per-node 4 -m app comm      # one node, 4 ranks
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint node0:29500 \\
        -m app comm --json comm.json --plot comm.png
    mpirun -np 4 -H a:2,b:2 -x MASTER_ADDR=a -x MASTER_PORT=29500 python -m app comm --ops all_reduce
    srun -N 2 --ntasks-per-node 8 python -m app comm --max-bytes 1G --dtype bf16
    make comm NPROC_PER_NODE=4                                         # local torchrun ranks
    make cluster-comm                                         # across the compose mini-cluster

For each collective of --ops (all_reduce, all_gather, reduce_scatter, broadcast, all_to_all and
send_recv: every rank sends to rank+1 and receives from rank-1 at once) and each size from
--min-bytes to --max-bytes (times --step-factor): one checked call, --warmup untimed calls, then
--iters timed calls. Rank 0 prints one row per size, as nccl-tests does:

  size    bytes of the whole buffer, nccl-tests' S: all_reduce, broadcast, send_recv: the buffer;
          all_gather: the gathered output (each rank sends size/n); reduce_scatter: the input (each
          rank keeps size/n); all_to_all: what each rank sends (size/n to every rank). Sizes of these
          three round down to a multiple of n elements.
  count   elements of that buffer;  type: float, bfloat16, half or f8e4m3;  redop: sum or none;
  root    the broadcast's root (0), else -1
  time    microseconds per call: each rank's mean over --iters, then the mean over ranks
          (nccl-tests' default -a 1) or the slowest rank's (--rank-time max)
  algbw   size / time (GB/s, 1e9 bytes)
  busbw   algbw x the nccl-tests factor for n ranks: all_reduce 2(n-1)/n; all_gather,
          reduce_scatter, all_to_all (n-1)/n; broadcast and send_recv 1
  #wrong  elements, summed over ranks, that differ from the exact expected result (--check 0: -1)

Values are verified as nccl-tests' -c does: rank r fills element i with (i + r) mod K, K the
largest prime (at most 127) that keeps every sum of n such values an exact integer in the dtype,
and every output element is compared with its exact expected value; receive buffers start as NaN.
Any #wrong > 0: rank 0 prints the table, then one line naming each collective, its smallest wrong
size, the ranks that saw wrong values and, where the layout tells it, the rank that sent them;
exit status 1. A bad flag: one line, exit status 2. A collective that hangs fails after --timeout.

The ceiling line is the memory-copy bandwidth of rank 0's device in the same run (a torch copy
of 64 MiB: bytes copied / time), so busbw reads as a fraction of what one machine can move.
--baseline also times a bare torch.distributed.all_reduce loop at --max-bytes, the control that
shows what this harness costs.

JSON (--json PATH; rank 0 writes it; keys are stable, new keys may be added):
  schema                "ddp-cluster/comm/1"
  ok                    true when no collective returned a wrong value
  world_size, nodes     ranks, and distinct host names among them
  hosts                 host name of each rank, by rank
  backend, launcher     gloo or nccl; torchrun, openmpi, mpich, slurm or single
  device                the device type of the buffers (cpu or cuda)
  dtype, type           the --dtype flag (float32, bf16, fp16, fp8) and nccl-tests' name for it
  warmup, iters         the flags
  check                 true unless --check 0
  rank_time             "mean" or "max": how the per-rank times were combined
  memcpy                {"host", "device", "bytes", "gbps"}: the ceiling, measured on rank 0
  results               one object per row, in table order: "op", "size_bytes", "count", "type",
                        "redop", "root", "time_us", "algbw_gbps", "busbw_gbps", "wrong" (-1 when not
                        checked), "wrong_ranks" (ranks that saw a wrong value), "senders" (ranks whose
                        data arrived wrong, where the layout tells it; [] for the reductions)
  summary               per collective: {"avg_busbw_gbps" (mean over its rows, as nccl-tests' "Avg
                        bus bandwidth"), "peak_busbw_gbps", "peak_size_bytes", "peak_of_memcpy"
                        (peak busbw / memcpy gbps)}
  baseline              null, or {"op": "all_reduce", "size_bytes", "time_us", "busbw_gbps",
                        "harness_busbw_gbps", "harness_ratio"} with --baseline
  failures              one string per collective with wrong values (the error line's parts)
  note                  null, or on one rank the line that says nothing crosses a link (results
                        and summary are then empty)
"""

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from app import plots
from app.atomic import atomic_write_text
from app.diagnostics import collectives, health
from app.diagnostics.collectives import COLLECTIVES, DTYPES, OPS, bandwidths, format_size, size_parser, synchronize
from app.errors import ClusterError, UsageError, first_line
from app.flags import flag
from app.runtime.distributed import DistContext, add_command_arguments, command_process, process_group, report_inside

SCHEMA = "ddp-cluster/comm/1"
MIB = 1 << 20
MEMCPY_BYTES = 64 * MIB
"""Size of the copy that measures the memory-copy ceiling."""
MEMCPY_SECONDS = 0.5
"""Time spent measuring it (app.diagnostics.health.memcpy_gbps: the median of samples)."""

RANK_TIMES = ("mean", "max")
ONE_RANK = (
    "1 rank: nothing crosses a link, so there is no bus bandwidth to measure (no sweep, no --plot); "
    "start 2 or more ranks, e.g. torchrun --standalone --nproc-per-node 2 -m app comm"
)
"""What app comm says on one rank instead of a sweep."""


def parse_ops(text: str) -> tuple[str, ...]:
    """``all_reduce,broadcast`` -> ("all_reduce", "broadcast"); CommConfig checks the names."""
    return tuple(op.strip() for op in text.split(",") if op.strip())


def parse_switch(text: str) -> bool:
    """``1`` -> True, ``0`` -> False (nccl-tests' -c 0/1)."""
    if text not in ("0", "1"):
        raise UsageError(f"invalid choice: {text!r} (choose from 0, 1)")
    return text == "1"


@dataclass(frozen=True)
class CommConfig:
    """Sweep: what it measures, where it reports."""

    ops: tuple[str, ...] = field(default=OPS, metadata=flag(parse=parse_ops, metavar="OPS"))
    """Comma-separated collectives, run in this default's order."""
    min_bytes: int = field(default=8, metadata=flag(parse=size_parser("--min-bytes"), show="8 B", metavar="SIZE"))
    """Smallest size, e.g. 8, 1K."""
    max_bytes: int = field(
        default=64 * MIB, metadata=flag(parse=size_parser("--max-bytes"), show="64 MiB", metavar="SIZE")
    )
    """Largest size, e.g. 64M, 1G."""
    step_factor: int = field(default=2, metadata=flag(metavar="F"))
    """Multiply the size by F at each step."""
    dtype: str = "float32"
    """Element type: float32, bf16, fp16 or fp8."""
    warmup: int = 2
    """Untimed calls before the timed ones, at every size."""
    iters: int = 10
    """Timed calls at every size; the time is their mean."""
    check: bool = field(default=True, metadata=flag(parse=parse_switch, show="1", metavar="{0,1}"))
    """1: verify every element (#wrong, nccl-tests -c 1), 0: skip it for speed."""
    rank_time: str = field(default="mean", metadata=flag(choices=RANK_TIMES))
    """Combine the ranks' times: mean (nccl-tests -a 1) or max, the slowest rank."""
    baseline: bool = False
    """Also time a bare torch.distributed.all_reduce loop at the largest size (harness cost)."""
    json: str | None = field(default=None, metadata=flag(metavar="PATH"))
    """Also write the report as JSON (keys: see below)."""
    plot: str | None = field(default=None, metadata=flag(metavar="PATH.png", parse=plots.png_path))
    """Also draw busbw against size per collective (PNG)."""

    def __post_init__(self) -> None:
        unknown = [op for op in self.ops if op not in COLLECTIVES]
        if unknown or not self.ops:
            raise UsageError(f"--ops {','.join(self.ops)!r}: choose from {','.join(OPS)} (comma-separated)")
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.min_bytes < 1:
            raise UsageError(f"--min-bytes {self.min_bytes} must be >= 1")
        if self.min_bytes > self.max_bytes:
            raise UsageError(f"--min-bytes {self.min_bytes} is larger than --max-bytes {self.max_bytes}: swap them")
        if self.step_factor < 2:
            raise UsageError(f"--step-factor {self.step_factor} must be a whole number >= 2 (2 or 4 are usual)")
        if self.warmup < 0 or self.iters < 1:
            raise UsageError(f"--warmup {self.warmup} must be >= 0 and --iters {self.iters} >= 1")
        if self.rank_time not in RANK_TIMES:
            raise UsageError(f"--rank-time {self.rank_time!r} is not one of {', '.join(RANK_TIMES)}")


def sweep_sizes(cfg: CommConfig) -> list[int]:
    """The requested sizes: min_bytes, times step_factor, up to max_bytes."""
    sizes, size = [], cfg.min_bytes
    while size <= cfg.max_bytes:
        sizes.append(size)
        size *= cfg.step_factor
    return sizes


def time_calls(step: Callable[[], object], iters: int, warmup: int, device: torch.device) -> float:
    """Seconds per call on this rank: ``warmup`` untimed calls, a barrier, then ``iters`` timed ones."""
    for _ in range(warmup):
        step()
    synchronize(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    synchronize(device)
    return (time.perf_counter() - start) / iters


def bare_all_reduce_seconds(numel: int, iters: int, warmup: int, device: torch.device) -> float:
    """The control: torch.distributed.all_reduce in a plain loop, as one writes it by hand."""
    tensor = torch.ones(numel, device=device)
    for _ in range(warmup):
        dist.all_reduce(tensor)
    synchronize(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    synchronize(device)
    return (time.perf_counter() - start) / iters


class _Sweep:
    """One rank's share of the sweep; rank 0 also prints rows as they complete."""

    def __init__(self, ctx: DistContext, cfg: CommConfig, printer: Callable[[str], None]) -> None:
        self.ctx, self.cfg, self.print = ctx, cfg, printer
        self.rank, self.world, self.device = ctx.proc.rank, ctx.proc.world_size, ctx.device
        self.dtype = DTYPES[cfg.dtype]
        self.modulus = collectives.fill_modulus(cfg.dtype, self.world)
        self.rows: list[dict] = []

    def buffers(self, op: str, count: int, fill: bool) -> collectives.Buffers:
        return collectives.make_buffers(
            op, count, self.rank, self.world, self.dtype.torch_dtype, self.device, self.modulus, fill
        )

    def ops(self) -> list[str]:
        """The collectives to run: send_recv needs a peer."""
        return [op for op in OPS if op in self.cfg.ops and not (op == "send_recv" and self.world == 1)]

    def refused(self) -> dict[str, str]:
        """Collectives that the backend refuses for this dtype (tried on a few elements), with the reason."""
        refused = {}
        for op in self.ops():
            bufs = self.buffers(op, self.world, fill=False)
            try:
                bufs.step()
                synchronize(self.device)
            except (RuntimeError, ValueError, TypeError) as error:
                if "type" not in str(error).lower():
                    raise
                refused[op] = first_line(error)
        return refused

    def combine(self, seconds: float, wrong: int) -> tuple[float, int, list[int]]:
        """(time over ranks per --rank-time, total wrong, ranks with wrong values) from every rank's figures."""
        mine = torch.tensor([seconds, float(wrong)], dtype=torch.float64, device=self.device)
        every = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(every, mine)
        times = [float(t[0]) for t in every]
        wrongs = [int(t[1]) for t in every]
        combined = max(times) if self.cfg.rank_time == "max" else sum(times) / len(times)
        return combined, sum(wrongs), [r for r, w in enumerate(wrongs) if w > 0]

    def measure(self, op: str, count: int) -> dict:
        """One row: the checked call, then warm-up and timed calls, combined over ranks."""
        bufs = self.buffers(op, count, fill=self.cfg.check)
        wrong, senders = -1, []
        if self.cfg.check:
            bufs.step()
            synchronize(self.device)
            wrong, senders = collectives.verify(op, bufs, count, self.rank, self.world, self.modulus)
        seconds = time_calls(bufs.step, self.cfg.iters, self.cfg.warmup, self.device)
        del bufs
        seconds, total_wrong, wrong_ranks = self.combine(seconds, max(wrong, 0))
        nbytes = count * self.dtype.torch_dtype.itemsize
        algbw, busbw = bandwidths(op, nbytes, seconds, self.world)
        spec = COLLECTIVES[op]
        return {
            "op": op,
            "size_bytes": nbytes,
            "count": count,
            "type": self.dtype.label,
            "redop": spec.redop,
            "root": spec.root,
            "time_us": seconds * 1e6,
            "algbw_gbps": algbw,
            "busbw_gbps": busbw,
            "wrong": total_wrong if self.cfg.check else -1,
            "wrong_ranks": wrong_ranks,
            "senders": senders,
        }

    def run(self) -> list[dict]:
        """Every row of the sweep on this rank (rank 0's rows carry the combined figures)."""
        elem = self.dtype.torch_dtype.itemsize
        for op in self.ops():
            counts = dict.fromkeys(collectives.element_count(op, s, elem, self.world) for s in sweep_sizes(self.cfg))
            self.print(format_header(op))
            for count in counts:
                try:
                    row = self.measure(op, count)
                except (RuntimeError, ValueError) as error:
                    self.ctx.mark_broken(f"{op} failed")
                    size = format_size(count * elem)
                    raise ClusterError(
                        f"comm: {op} at {size} failed on rank {self.rank}: {first_line(error)}"
                    ) from None
                self.rows.append(row)
                self.print(format_row(row))
        return self.rows


def _merge_senders(ctx: DistContext, rows: list[dict]) -> None:
    """Every rank's senders of wrong data, into rank 0's rows (one gather, only when something was wrong)."""
    if not any(row["wrong"] > 0 for row in rows):
        return
    mine = [row["senders"] for row in rows]
    every: list = [None] * ctx.proc.world_size
    dist.all_gather_object(every, mine)
    for i, row in enumerate(rows):
        row["senders"] = sorted({s for per_rank in every for s in per_rank[i]})


def _hosts(ctx: DistContext) -> list[str]:
    every: list = [None] * ctx.proc.world_size
    dist.all_gather_object(every, ctx.proc.host)
    return every


def _ceiling(ctx: DistContext) -> dict:
    """Rank 0's memory-copy bandwidth, measured while the other ranks wait."""
    gbps = health.memcpy_gbps(ctx.device, MEMCPY_BYTES, MEMCPY_SECONDS) if ctx.proc.is_main else 0.0
    dist.barrier()
    return {"host": ctx.proc.host, "device": str(ctx.device), "bytes": MEMCPY_BYTES, "gbps": gbps}


def _baseline(ctx: DistContext, cfg: CommConfig, sweep: _Sweep, rows: list[dict]) -> dict | None:
    """The bare all_reduce loop at the largest all_reduce size of the sweep, beside that row."""
    harness = [row for row in rows if row["op"] == "all_reduce"]
    if not harness:
        return None
    row = harness[-1]
    seconds = bare_all_reduce_seconds(row["count"], cfg.iters, cfg.warmup, ctx.device)
    seconds, _, _ = sweep.combine(seconds, 0)
    _, busbw = bandwidths("all_reduce", row["size_bytes"], seconds, ctx.proc.world_size)
    return {
        "op": "all_reduce",
        "size_bytes": row["size_bytes"],
        "time_us": seconds * 1e6,
        "busbw_gbps": busbw,
        "harness_busbw_gbps": row["busbw_gbps"],
        "harness_ratio": row["busbw_gbps"] / busbw if busbw > 0 else 0.0,
    }


def _summary(rows: list[dict], memcpy: float) -> dict:
    summary = {}
    for op in dict.fromkeys(row["op"] for row in rows):
        mine = [row for row in rows if row["op"] == op]
        peak = max(mine, key=lambda row: row["busbw_gbps"])
        summary[op] = {
            "avg_busbw_gbps": sum(row["busbw_gbps"] for row in mine) / len(mine),
            "peak_busbw_gbps": peak["busbw_gbps"],
            "peak_size_bytes": peak["size_bytes"],
            "peak_of_memcpy": peak["busbw_gbps"] / memcpy if memcpy > 0 else 0.0,
        }
    return summary


def failures(rows: list[dict]) -> list[str]:
    """Per collective with wrong values: its smallest wrong size, how many sizes, the ranks, the senders."""
    out = []
    for op in dict.fromkeys(row["op"] for row in rows):
        bad = [row for row in rows if row["op"] == op and row["wrong"] > 0]
        if not bad:
            continue
        first = bad[0]
        ranks = sorted({r for row in bad for r in row["wrong_ranks"]})
        senders = sorted({s for row in bad for s in row["senders"]})
        text = f"{op} at {format_size(first['size_bytes'])}"
        text += f" (and {len(bad) - 1} more size(s))" if len(bad) > 1 else ""
        text += f": {sum(row['wrong'] for row in bad)} wrong element(s) seen on rank(s) {_ranks(ranks)}"
        text += f", in the data sent by rank(s) {_ranks(senders)}" if senders else ""
        out.append(text)
    return out


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def build_report(ctx: DistContext, cfg: CommConfig, printer: Callable[[str], None]) -> dict:
    """Run the sweep on this rank; rank 0's return value is the whole report."""
    hosts = _hosts(ctx)
    sweep = _Sweep(ctx, cfg, printer)
    refused = sweep.refused()
    if refused:
        ops = ", ".join(refused)
        reason = next(iter(refused.values()))
        raise UsageError(
            f"--dtype {cfg.dtype}: the {ctx.backend} backend refuses it for {ops} ({reason}): "
            f"use --dtype float32, or leave those out of --ops"
        )
    memcpy = _ceiling(ctx)
    report = {
        "schema": SCHEMA,
        "world_size": ctx.proc.world_size,
        "nodes": len(set(hosts)),
        "hosts": hosts,
        "backend": ctx.backend,
        "launcher": ctx.proc.launcher.value,
        "device": ctx.device.type,
        "dtype": cfg.dtype,
        "type": DTYPES[cfg.dtype].label,
        "warmup": cfg.warmup,
        "iters": cfg.iters,
        "check": cfg.check,
        "rank_time": cfg.rank_time,
        "memcpy": memcpy,
    }
    printer(format_preamble(report, sweep.ops()))
    report["note"] = ONE_RANK if ctx.proc.world_size == 1 else None
    if report["note"]:
        printer(f"# {report['note']}")
    rows = [] if report["note"] else sweep.run()
    _merge_senders(ctx, rows)
    report["results"] = rows
    report["summary"] = _summary(rows, memcpy["gbps"])
    report["baseline"] = _baseline(ctx, cfg, sweep, rows) if cfg.baseline else None
    report["failures"] = failures(rows)
    report["ok"] = not report["failures"]
    return report


# --- output ------------------------------------------------------------------------------------

_COLUMNS = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong")
_UNITS_ROW = ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "")
_WIDTHS = (12, 12, 9, 6, 5, 11, 8, 8, 7)


def _line(cells: tuple) -> str:
    return "  ".join(f"{cell:>{width}}" for cell, width in zip(cells, _WIDTHS, strict=True))


def format_header(op: str) -> str:
    """The block header of one collective, in nccl-tests' columns."""
    return "\n".join([f"# {op}", "#" + _line(_COLUMNS)[1:], "#" + _line(_UNITS_ROW)[1:]])


def format_row(row: dict) -> str:
    """One size of one collective."""
    cells = (
        row["size_bytes"],
        row["count"],
        row["type"],
        row["redop"],
        row["root"],
        f"{row['time_us']:.2f}",
        f"{row['algbw_gbps']:.2f}",
        f"{row['busbw_gbps']:.2f}",
        row["wrong"] if row["wrong"] >= 0 else "N/A",
    )
    return _line(cells)


def format_preamble(report: dict, ops: list[str]) -> str:
    """What runs where, and the ceiling."""
    m = report["memcpy"]
    return "\n".join(
        [
            f"# ddp-cluster comm: {report['world_size']} rank(s) on {report['nodes']} host(s), backend "
            f"{report['backend']} on {report['device']}, launcher {report['launcher']}, dtype {report['dtype']}",
            f"# ops {','.join(ops)}; warmup {report['warmup']}, iters {report['iters']}, "
            f"check {'on' if report['check'] else 'off'}, time: {report['rank_time']} over ranks",
            f"# memcpy ceiling: {m['gbps']:.2f} GB/s (torch copy of {format_size(m['bytes'])} on {m['device']}, "
            f"host {m['host']})",
            "#",
        ]
    )


def format_summary(report: dict) -> str:
    """The lines after the table: wrong values, average and peak bus bandwidth against the ceiling."""
    memcpy = report["memcpy"]["gbps"]
    wrong = sum(max(row["wrong"], 0) for row in report["results"])
    lines = ["#", f"# #wrong: {wrong}" + ("" if report["check"] else " (not checked: --check 0)")]
    lines.append(
        "# Avg bus bandwidth (GB/s): "
        + ", ".join(f"{op} {s['avg_busbw_gbps']:.2f}" for op, s in report["summary"].items())
    )
    for op, s in report["summary"].items():
        lines.append(
            f"# {op}: peak busbw {s['peak_busbw_gbps']:.2f} GB/s at {format_size(s['peak_size_bytes'])} "
            f"= {100 * s['peak_of_memcpy']:.0f}% of memcpy {memcpy:.2f} GB/s"
        )
    base = report["baseline"]
    if base:
        lines.append(
            f"# baseline: bare torch.distributed.all_reduce loop at {format_size(base['size_bytes'])}: "
            f"{base['time_us']:.2f} us, busbw {base['busbw_gbps']:.2f} GB/s; app comm {base['harness_busbw_gbps']:.2f}"
            f" GB/s = {100 * base['harness_ratio']:.1f}% of it"
        )
    return "\n".join(lines)


def plot(path: str, report: dict) -> None:
    """busbw against size, one line per collective, with the memcpy ceiling."""
    series: dict[str, list[tuple[float, float]]] = {}
    for row in report["results"]:
        series.setdefault(row["op"], []).append((row["size_bytes"], row["busbw_gbps"]))
    plots.curves(
        path,
        series,
        xlabel="message size (bytes, log scale)",
        ylabel="bus bandwidth busbw (GB/s)",
        title=f"app comm: {report['world_size']} rank(s) on {report['nodes']} host(s), "
        f"{report['backend']}, {report['dtype']}",
        logx=True,
        hlines={f"memcpy {report['memcpy']['gbps']:.2f} GB/s": report["memcpy"]["gbps"]},
    )


# --- command line ------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m app comm``."""
    add_command_arguments(parser, CommConfig)


def _publish(report: dict, cfg: CommConfig, printer) -> None:
    """Rank 0's summary, --json and --plot."""
    if report["results"]:
        printer(format_summary(report))
    if cfg.json:
        atomic_write_text(cfg.json, json.dumps(report, indent=2) + "\n")
    if cfg.plot and report["results"]:
        plot(cfg.plot, report)


def run(args: argparse.Namespace) -> int:
    """Sweep on this rank; rank 0 prints, writes --json/--plot, and fails on wrong values."""
    cfg, dist_cfg, proc = command_process(CommConfig, args)
    printer = (lambda text: print(text, flush=True)) if proc.is_main else (lambda text: None)
    with process_group(proc, dist_cfg) as ctx:
        report = build_report(ctx, cfg, printer)
        published = report_inside(lambda: _publish(report, cfg, printer), proc.is_main)
    published()
    if not proc.is_main:
        return 0 if report["ok"] else 1
    if not report["ok"]:
        raise ClusterError(f"comm: wrong values: {'; '.join(report['failures'])}")
    return 0
