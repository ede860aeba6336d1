"""The scaling report of ``app scale``: its JSON (``build``, shaped as ``SCHEMA`` says), its text and its plot.

``build`` turns the measured timings into the report: the bare all-reduce fitted to busbw and
latency, and per variant (comm hook x bucket size) the points, speed-ups and the fitted law.
``SCHEMA`` is the JSON Schema of ``--json`` files, each key described: CI jobs that compare runs
may rely on these keys; a change of their meaning bumps ``format``.
"""

import json
import statistics
from pathlib import Path

from app import plots
from app.errors import UsageError
from app.train.config import SpeedConfig
from app.train.scale.law import AllReduceSample, Link, ScalingFit, StepSample, fit_link, fit_scaling, ring_factor

FORMAT = 1
THRESHOLD = 0.5
"""The efficiency that ``max_world_size_50`` keeps."""
CONTENTION = 1.25
"""Compute per step this many times one rank's: the ranks contend for the machine (a note says so)."""
WAITING = 2.0
"""k above this: steps wait far longer than their all-reduce takes alone (a note says why)."""


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 4)


def _allreduce(bare: list[AllReduceSample]) -> tuple[dict, Link | None]:
    points = [
        {
            "world_size": s.world_size,
            "bytes": s.nbytes,
            "ms": _ms(s.seconds),
            "busbw_gbps": round(ring_factor(s.world_size) * s.nbytes / s.seconds / 1e9, 4),
        }
        for s in bare
    ]
    try:
        link = fit_link(bare)
    except ValueError as error:
        return {"points": points, "busbw_gbps": None, "latency_ms": None, "error": str(error)}, None
    return {
        "points": points,
        "busbw_gbps": round(link.busbw / 1e9, 4),
        "latency_ms": _ms(link.latency),
        "error": None,
    }, link


def _fit(times: dict[int, dict], link: Link | None, nbytes: int) -> tuple[dict, ScalingFit | None]:
    if link is None:
        return {"error": "no all-reduce model to fit with (see allreduce.error)"}, None
    try:
        fit = fit_scaling([StepSample(n, t["step"]) for n, t in times.items()], link, nbytes)
    except ValueError as error:
        return {"error": str(error)}, None
    return {
        "t1_ms": _ms(fit.t1),
        "exposed_fraction": round(fit.exposed, 4),
        "rms_error_ms": _ms(fit.rms_error),
        "max_world_size_50": fit.largest_world(THRESHOLD),
        "efficiency_limit": round(fit.efficiency_limit, 4),
        "error": None,
    }, fit


def _speedup(n: int, mine: list[float], one: list[float]) -> float:
    """N t_1 / t_N, the median over rounds of the ratio within each round."""
    return statistics.median(n * a / b for a, b in zip(one, mine, strict=True))


def _points(times: dict[int, dict], fit: ScalingFit | None, context: dict) -> list[dict]:
    one, batch = times[1]["rounds"], context["batch_per_rank"]
    per_sample, peak = context.get("flops_per_sample"), context.get("peak_tflops")
    tflops = {n: per_sample * batch / t["step"] / 1e12 if per_sample else None for n, t in times.items()}
    return [
        {
            "world_size": n,
            "step_ms": _ms(t["step"]),
            "step_ms_rounds": [_ms(x) for x in t["rounds"]],
            "compute_ms": _ms(t["compute"]),
            "comm_ms": _ms(t["comm"]),
            "exposed_comm_ms": _ms(max(0.0, t["step"] - t["compute"])),
            "buckets": t["buckets"],
            "samples_per_s": round(n * batch / t["step"], 1),
            "speedup": round(_speedup(n, t["rounds"], one), 4),
            "efficiency": round(_speedup(n, t["rounds"], one) / n, 4),
            "predicted_step_ms": _ms(fit.step(n)) if fit else None,
            "tflops_per_gpu": tflops[n],
            "mfu": tflops[n] / peak if tflops[n] is not None and peak else None,
        }
        for n, t in sorted(times.items())
    ]


def _variant(name: str, speed: SpeedConfig, outcomes: dict[int, dict], link: Link | None, context: dict) -> dict:
    found = {"name": name, "comm_hook": speed.comm_hook, "bucket_cap_mb": speed.bucket_cap_mb, "compile": speed.compile}
    skipped = next((o["skipped"] for o in outcomes.values() if "skipped" in o), None)
    if skipped:
        return {**found, "skipped": skipped, "points": [], "fit": {"error": "skipped"}}
    times = {n: o["times"] for n, o in outcomes.items()}
    fit, law = _fit(times, link, context["gradient_bytes"])
    return {**found, "skipped": None, "points": _points(times, law, context), "fit": fit}


def _notes(context: dict, variants: list[dict]) -> list[str]:
    notes = []
    waiting = [v for v in variants if (v["fit"].get("exposed_fraction") or 0) > WAITING]
    if waiting:
        v = waiting[0]
        notes.append(
            f"{v['name']}: k = {v['fit']['exposed_fraction']:.1f}: a step waits that many times as long as a bare "
            "all-reduce of its gradients takes: the time goes to ranks waiting for one another (uneven compute, "
            "cores shared with other work, gloo's threads waiting for a core), not to the bytes on the link"
        )
    for v in variants:
        points = v["points"]
        if not points:
            continue
        grown = max(points, key=lambda p: p["compute_ms"])
        ratio = grown["compute_ms"] / points[0]["compute_ms"]
        if ratio >= CONTENTION:
            notes.append(
                f"{v['name']}: compute per step on {grown['world_size']} ranks is {ratio:.1f}x one rank's: the "
                f"ranks contend for this machine ({context['cpu_count']} CPUs, {context['threads_per_rank']} "
                "thread(s) per rank), which the law (t_1 the same on every N) does not model; its predictions "
                "hold for ranks with a core or GPU each"
            )
            break
    return notes


def read(path: Path) -> dict:
    """A report that --json wrote; UsageError for anything else."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UsageError(f"--from-json {path} is not readable JSON ({error}): pass a file that --json wrote") from None
    if not isinstance(report, dict) or report.get("format") != FORMAT or "variants" not in report:
        raise UsageError(
            f"--from-json {path} is not an app scale report of format {FORMAT}: pass a file that --json wrote"
        )
    return report


def build(
    context: dict, bare: list[AllReduceSample], measured: dict[str, dict], speeds: dict[str, SpeedConfig]
) -> dict:
    """The report: ``context`` (the run's shape), the bare all-reduces, every variant's points and fit."""
    allreduce, link = _allreduce(bare)
    variants = [_variant(name, speeds[name], outcomes, link, context) for name, outcomes in measured.items()]
    largest = max(context["world_sizes"])
    ranked = [v for v in variants if v["points"]]
    best = max(ranked, key=lambda v: v["points"][-1]["samples_per_s"])["name"] if len(ranked) > 1 else None
    return {
        "format": FORMAT,
        **context,
        "largest_world_size": largest,
        "allreduce": allreduce,
        "variants": variants,
        "best": best,
        "notes": _notes(context, variants),
    }


# --- text --------------------------------------------------------------------------------------


def _header(r: dict) -> list[str]:
    a = r["allreduce"]
    steps = f"{r['steps_per_round']} steps" if r["steps_per_round"] else "one epoch"
    bare = ", ".join(
        f"N={p['world_size']} {p['ms']:.3f} ms ({p['busbw_gbps']:.2f} GB/s)"
        for p in a["points"]
        if p["bytes"] == r["gradient_bytes"]
    )
    link = (
        f"busbw {a['busbw_gbps']:.3f} GB/s, latency {a['latency_ms']:.3f} ms"
        if a["busbw_gbps"] is not None
        else f"no fit: {a['error']}"
    )
    return [
        f"scale: {r['model']} on {r['dataset']}, batch {r['batch_per_rank']}/rank, {r['backend']} on {r['device']}, "
        f"{r['threads_per_rank']} thread(s)/rank, {r['cpu_count']} CPUs, {r['launcher']}, {r['nodes']} node(s); "
        f"medians of {r['rounds']} rounds of {steps}",
        f"gradients S = {r['gradient_bytes']:,} bytes/step; bare all_reduce of S: {bare or 'none'}",
        f"all_reduce model a_N = 2(N-1)/N * S / busbw + latency: {link}",
    ]


def _mfu(p: dict) -> str:
    """``  123.4 TFLOP/s/GPU, MFU 12.5%`` on CUDA, else ''."""
    return f"  {p['tflops_per_gpu']:.1f} TFLOP/s/GPU, MFU {100 * p['mfu']:.1f}%" if p.get("mfu") is not None else ""


def _variant_table(v: dict) -> list[str]:
    lines = [
        f"{v['name']}:",
        "  ranks  step ms  model ms  compute ms  comm ms  exposed ms  buckets  samples/s  speed-up  efficiency",
    ]
    for p in v["points"]:
        model = f"{p['predicted_step_ms']:8.2f}" if p["predicted_step_ms"] is not None else "       -"
        lines.append(
            f"  {p['world_size']:5d}  {p['step_ms']:7.2f}  {model}  {p['compute_ms']:10.2f}  {p['comm_ms']:7.2f}  "
            f"{p['exposed_comm_ms']:10.2f}  {p['buckets']:7d}  {p['samples_per_s']:9.0f}  {p['speedup']:7.2f}x  "
            f"{100 * p['efficiency']:9.0f}%{_mfu(p)}"
        )
    return [*lines, f"  {_law(v['fit'])}"]


def _largest(fit: dict) -> str:
    n = fit["max_world_size_50"]
    limit = 100 * fit["efficiency_limit"]
    if n is None:
        return f"efficiency stays >= 50% for every N (it tends to {limit:.0f}%)"
    return f"efficiency >= 50% up to N = {n} (it tends to {limit:.0f}% as N grows)"


def _law(fit: dict) -> str:
    if fit.get("error"):
        return f"law: not fitted: {fit['error']}"
    return (
        f"law T_N = T_1/N + T_comm(N), per step t_N = t_1 + k*a_N: t_1 = {fit['t1_ms']:.2f} ms, "
        f"k = {fit['exposed_fraction']:.2f}, rms error {fit['rms_error_ms']:.2f} ms; {_largest(fit)}"
    )


def _sweep_table(r: dict) -> list[str]:
    sizes = r["world_sizes"]
    width = max(len(v["name"]) for v in r["variants"])
    head = "".join(f"{'N=' + str(n):>15}" for n in sizes)
    lines = [
        "sweep: step ms and efficiency per world size; k; largest N at >= 50%",
        f"  {'':<{width}}{head}     k  N>=50%",
    ]
    for v in r["variants"]:
        if v["skipped"]:
            lines.append(f"  {v['name']:<{width}}  skipped (see above)")
            continue
        cells = "".join(f"{p['step_ms']:9.2f} {100 * p['efficiency']:4.0f}%" for p in v["points"])
        fit = v["fit"]
        k = f"{fit['exposed_fraction']:6.2f}" if fit.get("t1_ms") else "     -"
        n = "any" if fit.get("t1_ms") and fit["max_world_size_50"] is None else str(fit.get("max_world_size_50", "-"))
        lines.append(f"  {v['name']:<{width}}{cells}{k}  {n:>6}")
    if r["best"]:
        best = next(v for v in r["variants"] if v["name"] == r["best"])
        top = best["points"][-1]
        lines.append(
            f"best on {top['world_size']} ranks: {best['name']}: {top['samples_per_s']:.0f} samples/s, "
            f"{100 * top['efficiency']:.0f}% efficiency"
        )
    return lines


def format_report(r: dict) -> str:
    """The report as rank 0 prints it."""
    lines = _header(r)
    for v in r["variants"]:
        if v["skipped"]:
            lines.append(f"{v['name']}: skipped: {v['skipped']}")
        else:
            lines += _variant_table(v)
    if len(r["variants"]) > 1:
        lines += _sweep_table(r)
    lines += [f"note: {n}" for n in r["notes"]]
    return "\n".join(lines)


# --- plot --------------------------------------------------------------------------------------


def _curve(fit: dict, r: dict, sizes: list[int]) -> tuple[list[int], list[float], list[float]] | None:
    if not fit.get("t1_ms") or r["allreduce"]["busbw_gbps"] is None:
        return None
    link = Link(busbw=r["allreduce"]["busbw_gbps"] * 1e9, latency=r["allreduce"]["latency_ms"] / 1e3)
    law = ScalingFit(fit["t1_ms"] / 1e3, fit["exposed_fraction"], link, r["gradient_bytes"], 0.0)
    return sizes, [1e3 * law.step(n) for n in sizes], [law.speedup(n) for n in sizes]


def plot(r: dict, path: Path) -> None:
    """Step time and speed-up against ranks: measured points, the fitted law's curves, perfect scaling."""
    from matplotlib.ticker import FuncFormatter

    plt = plots.pyplot()

    largest = max(r["world_sizes"])
    top = max([largest * 4, *[v["fit"].get("max_world_size_50") or 0 for v in r["variants"]]])
    sizes = sorted({*range(1, min(top, 64) + 1), *[2**i for i in range(top.bit_length() + 1)], top})
    fig, (steps, speed) = plt.subplots(1, 2, figsize=(11, 4.5), constrained_layout=True)
    for i, v in enumerate(v for v in r["variants"] if v["points"]):
        color = f"C{i % 10}"
        ns = [p["world_size"] for p in v["points"]]
        steps.plot(ns, [p["step_ms"] for p in v["points"]], "o", color=color, label=f"{v['name']} (measured)")
        speed.plot(ns, [p["speedup"] for p in v["points"]], "o", color=color)
        curve = _curve(v["fit"], r, sizes)
        if curve:
            steps.plot(curve[0], curve[1], "-", color=color, alpha=0.7, label=f"{v['name']} (fitted law)")
            speed.plot(curve[0], curve[2], "-", color=color, alpha=0.7)
    speed.plot(sizes, sizes, ":", color="grey", label="perfect scaling")
    speed.plot(sizes, [THRESHOLD * n for n in sizes], "--", color="grey", alpha=0.6, label="50% efficiency")
    speed.set_yscale("log", base=2)
    for ax in (steps, speed):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks N (world size)")
        ax.grid(True, which="both", alpha=0.3)
    for axis in (steps.xaxis, speed.xaxis, speed.yaxis):
        axis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    steps.set_ylabel("time per optimizer step (ms)")
    speed.set_ylabel("speed-up over one rank (x, samples/s)")
    steps.set_title(f"{r['model']}, batch {r['batch_per_rank']}/rank, {r['backend']} on {r['device']}")
    speed.set_title("t_N = t_1 + k (2(N-1)/N S/busbw + latency)")
    steps.legend(fontsize=7)
    speed.legend(fontsize=7, loc="upper left")
    try:
        plots.save(fig, path)
    finally:
        plt.close(fig)


# --- the JSON schema ----------------------------------------------------------------------------


def _field(kind: str | list[str], description: str, **more) -> dict:
    return {"type": kind, "description": description, **more}


def _object(description: str, properties: dict) -> dict:
    return {
        "type": "object",
        "description": description,
        "required": list(properties),
        "additionalProperties": False,
        "properties": properties,
    }


_POINT = _object(
    "One world size of one variant (times are the slowest rank's medians per optimizer step).",
    {
        "world_size": _field("integer", "N: ranks that trained together."),
        "step_ms": _field("number", "Measured time per optimizer step, ms (the median of step_ms_rounds)."),
        "step_ms_rounds": _field(
            "array",
            "The step time of each round, ms, in order (rounds alternate N and variants).",
            items={"type": "number"},
        ),
        "compute_ms": _field("number", "The same steps without gradient communication (DDP no_sync), ms."),
        "comm_ms": _field("number", "Gradient buckets' comm hook spans per step, call to completion, ms."),
        "exposed_comm_ms": _field("number", "step_ms - compute_ms (>= 0): what communication adds, ms."),
        "buckets": _field("integer", "Gradient buckets per step."),
        "samples_per_s": _field("number", "N * batch_per_rank / step time."),
        "speedup": _field(
            "number", "N x one rank's step / this step: the median over rounds of the same round's ratio."
        ),
        "efficiency": _field("number", "speedup / N."),
        "predicted_step_ms": _field(["number", "null"], "The fitted law's step time, ms (null: not fitted)."),
        "tflops_per_gpu": _field(["number", "null"], "Achieved TFLOP/s per GPU: FLOPs / step time (null off CUDA)."),
        "mfu": _field(["number", "null"], "tflops_per_gpu / peak_tflops (null off CUDA)."),
    },
)
_FIT = {
    "type": "object",
    "description": "The law t_N = t_1 + k * a_N fitted to the step times; only error when it could not be.",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "t1_ms": _field("number", "t_1: one rank's time per step, ms."),
        "exposed_fraction": _field("number", "k: the share of a plain fp32 all-reduce of S that a step waits for."),
        "rms_error_ms": _field("number", "Root mean square of measured minus fitted step times, ms."),
        "max_world_size_50": _field(
            ["integer", "null"], "Largest N with predicted efficiency >= 50% (null: every N keeps it)."
        ),
        "efficiency_limit": _field("number", "Predicted efficiency as N grows without bound."),
        "error": _field(["string", "null"], "Why the law was not fitted (null: it was)."),
    },
}
SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "python -m app scale --json",
    **_object(
        "The scaling report of app train's workload.",
        {
            "format": {"const": FORMAT, "description": "Version of this layout."},
            "world_sizes": _field("array", "The measured N, ascending, with 1.", items={"type": "integer"}),
            "launcher": _field("string", "What started the ranks: torchrun, mpirun, slurm, ..."),
            "backend": _field("string", "gloo or nccl."),
            "device": _field("string", "cpu or cuda:LOCAL_RANK (rank 0's)."),
            "nodes": _field("integer", "Nodes of the job."),
            "threads_per_rank": _field("integer", "torch's intra-op threads per rank."),
            "cpu_count": _field("integer", "CPUs of rank 0's machine."),
            "model": _field("string", "--model."),
            "dataset": _field("string", "synthetic or digits."),
            "batch_per_rank": _field("integer", "Samples per rank per optimizer step (batch size x accum steps)."),
            "gradient_bytes": _field("integer", "S: bytes of one step's gradients."),
            "flops_per_sample": _field(
                ["number", "null"], "FLOPs of one sample's forward and backward (torch's flop counter; null off CUDA)."
            ),
            "peak_tflops": _field(["number", "null"], "The GPU's dense bf16 peak, TFLOP/s (null off CUDA)."),
            "peak_source": _field(["string", "null"], "'data sheet (NAME)' or 'measured (...)' (null off CUDA)."),
            "rounds": _field("integer", "Timed rounds per world size."),
            "steps_per_round": _field(["integer", "null"], "Steps per round (null: one epoch of digits)."),
            "largest_world_size": _field("integer", "The largest measured N."),
            "allreduce": _object(
                "The bare all_reduce on each N > 1 and the model a_N = 2(N-1)/N * bytes / busbw + latency.",
                {
                    "points": _field(
                        "array",
                        "Timed all-reduces.",
                        items=_object(
                            "One size on one N.",
                            {
                                "world_size": _field("integer", "N."),
                                "bytes": _field("integer", "Bytes reduced (float32)."),
                                "ms": _field("number", "Time of one all_reduce, ms (slowest rank's median)."),
                                "busbw_gbps": _field("number", "2(N-1)/N * bytes / time, GB/s (1e9 bytes/s)."),
                            },
                        ),
                    ),
                    "busbw_gbps": _field(["number", "null"], "Fitted bus bandwidth, GB/s (null: not fitted)."),
                    "latency_ms": _field(["number", "null"], "Fitted latency, ms (null: not fitted)."),
                    "error": _field(["string", "null"], "Why the model was not fitted (null: it was)."),
                },
            ),
            "variants": _field(
                "array",
                "Each comm hook x bucket size measured (one without --sweep).",
                items=_object(
                    "One configuration of DDP's gradient communication.",
                    {
                        "name": _field("string", "'HOOK, bucket MB MiB'."),
                        "comm_hook": _field("string", "--comm-hook."),
                        "bucket_cap_mb": _field("number", "--bucket-cap-mb."),
                        "compile": _field("boolean", "--compile (torch.compile)."),
                        "skipped": _field(["string", "null"], "Why it could not run here (null: it ran)."),
                        "points": _field("array", "Per world size, ascending.", items=_POINT),
                        "fit": _FIT,
                    },
                ),
            ),
            "best": _field(["string", "null"], "The variant with the most samples/s on the largest N (null: one)."),
            "notes": _field("array", "What the figures do not show by themselves.", items={"type": "string"}),
        },
    ),
}
