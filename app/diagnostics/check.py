"""Cluster health check: run every collective once, verify exact values on every rank.

    python -m app check                                     # one process
    torchrun --nproc-per-node 4 -m app check                # one node, 4 ranks
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint node0:29500 -m app check --json check.json
    mpirun -np 4 -H a:2,b:2 -x MASTER_ADDR=a -x MASTER_PORT=29500 python -m app check
    srun -N 2 --ntasks-per-node 8 python -m app check

Each rank writes its own value into its own slot, so a wrong slot names the rank that sent it:
point-to-point from rank 0 to every rank and around a ring, broadcast, all_reduce (SUM, MAX),
all_gather, reduce_scatter and barrier. Rank 0 prints a table (or --json) and the exit status is
non-zero naming the failing operation and rank. A collective that hangs fails after --timeout.

Device health (app/diagnostics/health.py): first, every rank measures its own device for
--device-seconds, in rounds whose samples start on every rank at once: n x n matrix products (bf16
on a GPU, fp32 on a CPU) and a memory copy. The rank table shows TFLOP/s (GFLOP/s on CPU) and copy
GB/s beside each device's name and memory. Nodes are judged as nodes, round by round (their ranks'
sum in each round on CPUs, their median on GPUs): a node that the round's fastest node reads 2x or
more (health.NODE_FACTOR) in the median round fails the check (exit status 1), as ``slow node:
worker-1 (ranks 2, 3): 67.2 GFLOP/s against head-1's 323.0, 5.0x below it in the median round: sure,
2x or more in 5 of 5 round(s) ...``; else ``verdict: no slow node (the slowest: ...; a node is named
at 2x or more in most rounds)``. Ranks: the outlier rule of app links (below median / s^k, --k; on
CPUs also below median / 3) names a slow rank with 3 or more ranks, as ``slow: rank 3 on node1
(cuda:1): 212.0 TFLOP/s against a median of 690.0``; --fail-below FRACTION makes a rank below
FRACTION x the median fail the check. A GPU below a third of its data sheet's bf16 peak fails it
too.

JSON (--json PATH, '-' for stdout; rank 0 writes it; keys are stable, new keys may be added):
  ok, complete        every operation verified (no slow node, no device below --fail-below); every rank reported
  world_size, nodes, backend, launcher, numel
  ranks               per rank: "rank", "local_rank", "node_rank", "host", "device", "backend",
                      "interface", "device_name" (the GPU's, or cpu), "device_memory_bytes",
                      "matmul_flops" (FLOP/s), "copy_gbps" (null with --device-seconds 0; the
                      medians of "matmul_flops_rounds" and "copy_gbps_rounds", each round's figure)
  device_health       null with --device-seconds 0, else: "dtype", "matmul_size" (n), "copy_bytes",
                      "k", "fail_below", "median_flops", "median_copy_gbps" (geometric medians),
                      "threshold_flops", "threshold_copy_gbps" (median / s^k; null below 3 ranks),
                      "slow" and "below_fail": [{"rank", "host", "device", "metric" ("flops" or
                      "copy_gbps"), "value", "median"}], "node_factor", "slow_nodes" and
                      "slowest_node" (null on one node): [{"host", "ranks", "device", "metric",
                      "value" (the node's median round), "fastest_host", "fastest", "factor" (in the
                      median round), "rounds", "slow_rounds" (rounds at node_factor or more)}],
                      "below_peak": GPU ranks below a third of their data sheet's bf16 peak (they
                      fail the check): [{"rank", "host", "device", "value", "peak", "source"}]
  rendezvous          the doctor's checks, merged over ranks: [{"check", "status", "detail"}]
  operations          per operation: "name", "ok", "ran", "time_ms" (slowest rank), "failed_ranks", "detail"
  failures            [{"operation", "ranks", "detail"}]: failed operations, and "device_health"
"""

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

from app.atomic import atomic_write_text
from app.diagnostics import doctor, health, outliers
from app.errors import ClusterError, UsageError, first_line
from app.flags import flag
from app.runtime import devices
from app.runtime.distributed import DistContext, add_command_arguments, command_process, process_group, report_inside

FAULT_OFFSET = 1000.0
"""Added by --inject-fault to the value a rank sends, so the check must catch it."""


def parse_fault(text: str) -> tuple[str, int]:
    """``all_reduce_sum@1`` -> ("all_reduce_sum", 1)."""
    op, sep, rank = text.partition("@")
    if not sep or not rank.isdigit():
        raise UsageError(f"--inject-fault {text!r} must look like all_reduce_sum@1")
    return op, int(rank)


@dataclass(frozen=True)
class CheckConfig:
    """Check: what it sends, where it reports."""

    numel: int = 4096
    """Elements per rank in each collective."""
    faults: tuple[tuple[str, int], ...] = field(
        default=(), metadata=flag(parse=parse_fault, option="--inject-fault", metavar="OP@RANK", repeat=True)
    )
    """Make RANK send a wrong value in OP, to prove the check catches it (repeatable)."""
    json: str | None = field(default=None, metadata=flag(metavar="PATH"))
    """Also write the report as JSON to PATH ('-' for stdout)."""
    device_seconds: float = field(default=health.SECONDS, metadata=flag(metavar="S"))
    """Seconds each rank spends measuring its device (matrix product, then copy), all at once; 0 skips it."""
    k: float = outliers.DEFAULT_K
    """A rank's device is slow below median / s^k over the ranks (the outlier rule of app links)."""
    fail_below: float | None = field(default=None, metadata=flag(metavar="FRACTION"))
    """Exit status 1 when a rank's FLOP/s or copy GB/s is below FRACTION x the median."""

    def __post_init__(self) -> None:
        if self.numel < 1:
            raise UsageError(f"--numel {self.numel} must be >= 1")
        if self.device_seconds < 0:
            raise UsageError(f"--device-seconds {self.device_seconds:g} must be >= 0 (0 skips the device health)")
        outliers.check_k(self.k)
        outliers.check_fraction(self.fail_below)
        for op, _ in self.faults:
            if op not in VALUE_OPERATIONS:
                raise UsageError(f"--inject-fault {op!r}: the operation must be one of {', '.join(VALUE_OPERATIONS)}")


@dataclass
class OpResult:
    """One operation as seen by one rank (or merged over all ranks)."""

    name: str
    ok: bool = True
    ran: bool = True
    time_ms: float = 0.0
    failed_ranks: list[int] = field(default_factory=list)
    detail: str = ""


class _Probe:
    """Values and verification shared by the operations of one rank."""

    def __init__(self, ctx: DistContext, cfg: CheckConfig, op: str) -> None:
        self.rank, self.world, self.device = ctx.proc.rank, ctx.proc.world_size, ctx.device
        self.width = max(1, cfg.numel // self.world)
        self.faulty = (op, self.rank) in cfg.faults
        self.bad: dict[int, str] = {}

    def value(self, v: float) -> float:
        """What this rank sends: ``v``, or a wrong value when it is the injected fault."""
        return v + FAULT_OFFSET if self.faulty else v

    def full(self, shape: tuple[int, ...], v: float) -> torch.Tensor:
        return torch.full(shape, v, dtype=torch.float32, device=self.device)

    def expect(self, got: torch.Tensor, expected: float, sender: int) -> None:
        """Record ``sender`` as failed when ``got`` is not exactly ``expected`` everywhere."""
        wrong = got != expected
        if bool(wrong.any()) and sender not in self.bad:
            seen = got[wrong].flatten()[0].item()
            self.bad[sender] = f"wrong value from rank {sender}: got {seen:g}, expected {expected:g}"


def _send_recv_from_0(p: _Probe) -> None:
    if p.rank == 0:
        for dst in range(1, p.world):
            dist.send(p.full((p.width,), p.value(dst + 1.0)), dst=dst)
    else:
        buf = p.full((p.width,), 0.0)
        dist.recv(buf, src=0)
        p.expect(buf, p.rank + 1.0, sender=0)


def _ring_send_recv(p: _Probe) -> None:
    if p.world == 1:
        return
    right, left = (p.rank + 1) % p.world, (p.rank - 1) % p.world
    buf = p.full((p.width,), 0.0)
    ops = [dist.P2POp(dist.isend, p.full((p.width,), p.value(p.rank + 1.0)), right), dist.P2POp(dist.irecv, buf, left)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    p.expect(buf, left + 1.0, sender=left)


def _broadcast(p: _Probe, src: int) -> None:
    buf = p.full((p.width,), p.value(src + 1.0) if p.rank == src else 0.0)
    dist.broadcast(buf, src=src)
    p.expect(buf, src + 1.0, sender=src)


def _slots(p: _Probe, mine: float, others: float) -> torch.Tensor:
    """One row per rank: this rank's row holds ``mine``, the others ``others``."""
    rows = p.full((p.world, p.width), others)
    rows[p.rank] = p.value(mine)
    return rows


def _all_reduce(p: _Probe, op: dist.ReduceOp, others: float) -> None:
    rows = _slots(p, p.rank + 1.0, others)
    dist.all_reduce(rows, op=op)
    for sender in range(p.world):
        p.expect(rows[sender], sender + 1.0, sender)


def _all_gather(p: _Probe) -> None:
    out = [p.full((p.width,), 0.0) for _ in range(p.world)]
    dist.all_gather(out, p.full((p.width,), p.value(p.rank + 1.0)))
    for sender, got in enumerate(out):
        p.expect(got, sender + 1.0, sender)


def _reduce_scatter(p: _Probe) -> None:
    # Chunk i goes to rank i; in it, row r is rank r's alone: 100 * i + r + 1.
    chunks = []
    for dest in range(p.world):
        chunk = p.full((p.world, p.width), 0.0)
        chunk[p.rank] = p.value(100.0 * dest + p.rank + 1.0)
        chunks.append(chunk)
    out = p.full((p.world, p.width), -1.0)
    dist.reduce_scatter(out, chunks)
    for sender in range(p.world):
        p.expect(out[sender], 100.0 * p.rank + sender + 1.0, sender)


OPERATIONS: dict[str, Callable[[_Probe], None]] = {
    "send_recv_from_0": _send_recv_from_0,
    "ring_send_recv": _ring_send_recv,
    "broadcast_from_0": lambda p: _broadcast(p, 0),
    "broadcast_from_last": lambda p: _broadcast(p, p.world - 1),
    "all_reduce_sum": lambda p: _all_reduce(p, dist.ReduceOp.SUM, 0.0),
    "all_reduce_max": lambda p: _all_reduce(p, dist.ReduceOp.MAX, -1.0),
    "all_gather": _all_gather,
    "reduce_scatter": _reduce_scatter,
    "barrier": lambda p: dist.barrier(),
}
VALUE_OPERATIONS = tuple(name for name in OPERATIONS if name != "barrier")
"""The operations that carry values, so a fault can be injected into them."""


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run_one(ctx: DistContext, cfg: CheckConfig, name: str) -> OpResult:
    probe = _Probe(ctx, cfg, name)
    start = time.perf_counter()
    OPERATIONS[name](probe)
    _synchronize(ctx.device)
    elapsed = (time.perf_counter() - start) * 1000
    detail = "; ".join(probe.bad[r] for r in sorted(probe.bad))
    return OpResult(name, ok=not probe.bad, time_ms=elapsed, failed_ranks=sorted(probe.bad), detail=detail)


def run_operations(ctx: DistContext, cfg: CheckConfig) -> list[OpResult]:
    """Run every operation on this rank; stop at the first one that raises (timeout, lost peer)."""
    results = []
    for name in OPERATIONS:
        try:
            results.append(_run_one(ctx, cfg, name))
        except (RuntimeError, ValueError) as error:  # gloo/NCCL errors and timeouts
            results.append(OpResult(name, False, failed_ranks=[ctx.proc.rank], detail=first_line(error)))
            done = {r.name for r in results}
            results += [OpResult(n, False, ran=False, detail="not run") for n in OPERATIONS if n not in done]
            break
    return results


def merge(per_rank: list[list[OpResult]]) -> list[OpResult]:
    """One result per operation: ok only if ok everywhere, with every failed rank named."""
    merged = []
    for i, name in enumerate(OPERATIONS):
        views = [rank_results[i] for rank_results in per_rank]
        failed = sorted({r for v in views for r in v.failed_ranks})
        details = [v.detail for v in views if v.detail and v.ran]
        seen = sum(not v.ok for v in views)
        detail = details[0] if details else ("not run" if not all(v.ran for v in views) else "")
        if seen > 1 and details:
            detail += f" (seen on {seen} of {len(views)} ranks)"
        merged.append(
            OpResult(
                name,
                ok=all(v.ok for v in views),
                ran=all(v.ran for v in views),
                time_ms=max(v.time_ms for v in views),
                failed_ranks=failed,
                detail=detail,
            )
        )
    return merged


def _rank_info(ctx: DistContext) -> dict:
    p = ctx.proc
    name, memory = devices.describe(ctx.device)
    return {
        "rank": p.rank,
        "local_rank": p.local_rank,
        "node_rank": p.node_rank,
        "host": p.host,
        "device": str(ctx.device),
        "backend": ctx.backend,
        "device_name": name,
        "device_memory_bytes": memory,
    }


def _device_health(ctx: DistContext, cfg: CheckConfig, operations: list[OpResult]) -> dict | None:
    """This rank's device figures, measured while every other rank measures its own (None: skipped, or
    an operation failed: a rank that does not answer would hang the barrier until the timeout)."""
    if cfg.device_seconds <= 0 or not all(r.ok for r in operations):
        return None
    return asdict(health.measure(ctx.device, cfg.device_seconds, together=dist.barrier))


def _gather(ctx: DistContext, local: dict) -> list[dict] | None:
    """Every rank's report, or None when the group is too broken to gather."""
    if any(not r.ok and not r.failed_ranks for r in local["operations"]):
        return None  # this rank's group is broken; gathering would only hang until the timeout
    out: list = [None] * ctx.proc.world_size
    try:
        dist.all_gather_object(out, local)
    except (RuntimeError, ValueError):
        return None
    return out


def build_report(ctx: DistContext, cfg: CheckConfig, diagnosis: doctor.Diagnosis | None = None) -> dict:
    """Run the check on this rank and return the whole cluster's report (or this rank's view).

    diagnosis: the rendezvous doctor's findings on this rank, merged into the report's ``rendezvous``.
    """
    found = doctor.view(diagnosis, ctx.proc) if diagnosis else None
    interface = diagnosis.ifname if diagnosis else ctx.proc.ifname
    local = {**_rank_info(ctx), "interface": interface, "doctor": found}
    local["operations"] = run_operations(ctx, cfg)
    local["health"] = _device_health(ctx, cfg, local["operations"])
    gathered = _gather(ctx, local)
    if gathered is None:
        ctx.mark_broken("the check could not gather every rank's report")
    reports = gathered if gathered is not None else [local]
    operations = merge([r["operations"] for r in reports])
    failures = [
        {"operation": op.name, "ranks": op.failed_ranks, "detail": op.detail}
        for op in operations
        if not op.ok and op.ran
    ]
    measured = all(r["health"] for r in reports)
    device_health = health.section(reports, cfg.k, cfg.fail_below) if measured else None
    report = {
        "ok": not failures and gathered is not None,
        "complete": gathered is not None,
        "world_size": ctx.proc.world_size,
        "nodes": len({r["host"] for r in reports}),
        "backend": ctx.backend,
        "launcher": ctx.proc.launcher.value,
        "numel": cfg.numel,
        "ranks": [_rank_row(r) for r in reports],
        "device_health": device_health,
        "rendezvous": [asdict(f) for f in doctor.merge([r["doctor"] for r in reports])] if found else [],
        "operations": [asdict(op) for op in operations],
        "failures": failures,
    }
    if device_health:
        report["failures"] += health.failures(report)
        report["ok"] = report["ok"] and not health.flagged(device_health)
    return report


def _rank_row(report: dict) -> dict:
    """One rank's row of the report: who it is, its device and the device's figures."""
    row = {k: v for k, v in report.items() if k not in ("operations", "doctor", "health")}
    figures = report["health"] or {}
    return row | {
        "matmul_flops": figures.get("flops"),
        "copy_gbps": figures.get("copy_gbps"),
        "matmul_flops_rounds": figures.get("flops_rounds"),
        "copy_gbps_rounds": figures.get("copy_gbps_rounds"),
    }


def format_table(report: dict) -> str:
    """The human-readable report that rank 0 prints."""
    lines = [
        f"ddp-cluster check: {report['world_size']} ranks on {report['nodes']} host(s), "
        f"backend {report['backend']}, launcher {report['launcher']}",
        "",
        *_rank_rows(report),
    ]
    if not report["complete"]:
        lines.append("(only rank 0's view: the other ranks could not report)")
    if report["device_health"]:
        lines += ["", *health.format_lines(report)]
    if report["rendezvous"]:
        lines += ["", *doctor.format_rows(report["rendezvous"])]
    lines += ["", f"{'operation':<20}  {'result':<7}  {'max ms':>8}  detail"]
    lines += [
        f"{op['name']:<20}  {_status(op):<7}  {op['time_ms']:>8.2f}  {op['detail']}" for op in report["operations"]
    ]
    lines += ["", f"result: {'ok' if report['ok'] else 'FAILED: ' + summary(report)}"]
    return "\n".join(lines)


def _rank_rows(report: dict) -> list[str]:
    """The rank table: who each rank is, its device (name, memory) and the device's figures."""
    gpu = report["ranks"][0]["device"].startswith("cuda")
    flops_unit, scale = ("TFLOP/s", 1e12) if gpu else ("GFLOP/s", 1e9)
    name_width = max(8, *(len(r["device_name"]) for r in report["ranks"]))
    host_width = max(16, *(len(r["host"]) for r in report["ranks"]))
    lines = [
        f"{'rank':>4}  {'node':>4}  {'local':>5}  {'host':<{host_width}}  {'device':<8}  {'backend':<7}  "
        f"{'interface':<9}  {'name':<{name_width}}  {'memory':>9}  {flops_unit:>8}  {'copy GB/s':>9}"
    ]
    for r in report["ranks"]:
        flops = f"{r['matmul_flops'] / scale:.1f}" if r["matmul_flops"] is not None else "-"
        copy = f"{r['copy_gbps']:.1f}" if r["copy_gbps"] is not None else "-"
        memory = f"{r['device_memory_bytes'] / (1 << 30):.1f} GiB"
        lines.append(
            f"{r['rank']:>4}  {r['node_rank']:>4}  {r['local_rank']:>5}  {r['host']:<{host_width}}  {r['device']:<8}  "
            f"{r['backend']:<7}  {r.get('interface') or '-':<9}  {r['device_name']:<{name_width}}  {memory:>9}  "
            f"{flops:>8}  {copy:>9}"
        )
    return lines


def _status(op: dict) -> str:
    return "ok" if op["ok"] else ("FAILED" if op["ran"] else "not run")


def summary(report: dict) -> str:
    """One line naming each failing operation and rank."""
    parts = []
    for failure in report["failures"]:
        ranks = ", ".join(map(str, failure["ranks"]))
        parts.append(f"{failure['operation']} on rank {ranks}: {failure['detail']}")
    return "; ".join(parts) or "not every rank could report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m app check``."""
    add_command_arguments(parser, CheckConfig)


def _publish(report: dict, cfg: CheckConfig) -> None:
    """Rank 0's report: the table (or the JSON on stdout), and the JSON at --json."""
    if cfg.json == "-":
        json.dump(report, sys.stdout, indent=2)
        print(flush=True)
        return
    print(format_table(report), flush=True)
    if cfg.json:
        atomic_write_text(cfg.json, json.dumps(report, indent=2) + "\n")


def run(args: argparse.Namespace) -> int:
    """Run the check on this rank; rank 0 reports (before the ranks leave: ``report_inside``). Exit 0 only when every
    operation verified."""
    cfg, dist_cfg, proc = command_process(CheckConfig, args)
    diagnosis = doctor.preflight(proc, dist_cfg, announce=False)
    with process_group(proc, dist_cfg) as ctx:
        report = build_report(ctx, cfg, diagnosis)
        published = report_inside(lambda: _publish(report, cfg), proc.is_main)
    published()
    if proc.is_main and not report["ok"]:
        raise ClusterError(f"check failed: {summary(report)}")
    return 0 if report["ok"] else 1
