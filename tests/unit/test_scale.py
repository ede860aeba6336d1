"""app scale without processes: its flags and their checks, the variants it measures, and the report it
builds from timings (the JSON Schema it promises, the text, the notes)."""

from dataclasses import fields
from pathlib import Path

import pytest

from app.cli import build_parser
from app.errors import UsageError
from app.flags import from_args, option
from app.train.config import COMM_HOOKS, SpeedConfig, TrainConfig
from app.train.scale import report as scale_report
from app.train.scale.command import ScaleConfig, default_sizes, parse_buckets, parse_sizes, variants
from app.train.scale.law import AllReduceSample, Link
from tests.deps import need

S = 814_120
LINK = Link(busbw=2.5e8, latency=3e-4)


@pytest.mark.parametrize(("text", "sizes"), [("1,2,4", (1, 2, 4)), (" 4, 1 ,2", (1, 2, 4)), ("1,3", (1, 3))])
def test_parse_sizes(text: str, sizes: tuple) -> None:
    assert parse_sizes(text) == sizes


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1,a", "must be rank counts"),
        ("", "must be rank counts"),
        ("0,2", "must be >= 1"),
        ("1,2,2", "twice"),
        ("2,4", "needs 1"),
        ("1", "needs 1 (the baseline of speed-up) and at least one more"),
    ],
)
def test_parse_sizes_rejects(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_sizes(text)


def test_parse_buckets() -> None:
    assert parse_buckets("25,0.01") == (25.0, 0.01)
    for bad in ("0", "25,x", "-1"):
        with pytest.raises(UsageError, match="MiB"):
            parse_buckets(bad)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"dataset": "mnist"}, "--dataset 'mnist' is not one of synthetic, digits"),
        ({"steps": 1}, "--steps 1 must be >= 2"),
        ({"rounds": 0}, "--rounds 0 must be >= 1"),
        ({"launch_timeout": 0}, "--launch-timeout 0"),
        ({"json": "/no/such/folder/scale.json"}, "no folder /no/such/folder"),
    ],
)
def test_bad_values_name_the_flag(values: dict, message: str) -> None:
    values = {k: Path(v) if k in ("plot", "json") else v for k, v in values.items()}
    with pytest.raises(UsageError, match=message):
        ScaleConfig(**values)


def test_default_world_sizes_double_up_to_the_job() -> None:
    assert default_sizes(2) == (1, 2) and default_sizes(4) == (1, 2, 4) and default_sizes(6) == (1, 2, 4, 6)


def test_every_field_is_a_flag_and_help_shows_the_launchers() -> None:
    parser, _ = build_parser("scale")
    for f in fields(ScaleConfig):
        assert option(f.name) in parser._option_string_actions, f.name
    for speed_flag in ("--comm-hook", "--powersgd-rank", "--powersgd-warmup", "--bucket-cap-mb", "--batch-size"):
        assert speed_flag in parser._option_string_actions
    assert "--epochs" not in parser._option_string_actions  # a timing run sets its own length
    text = parser.format_help()
    for launch in ("python -m app scale", "torchrun --standalone", "mpirun -np 4", "srun -N 2", "make cluster-scale"):
        assert launch in text, launch
    assert from_args(ScaleConfig, parser.parse_args([])) == ScaleConfig()


def test_sweep_is_every_hook_with_every_bucket_size() -> None:
    cfg = TrainConfig()
    assert list(variants(cfg, ScaleConfig())) == ["none, bucket 25 MiB"]
    swept = variants(cfg, ScaleConfig(sweep=True, sweep_buckets=(25.0, 0.01)))
    assert len(swept) == 2 * len(COMM_HOOKS) + 1
    assert swept["powersgd, bucket 0.01 MiB"].speed == SpeedConfig(comm_hook="powersgd", bucket_cap_mb=0.01)
    assert swept["none, bucket 25 MiB, compile"].speed == SpeedConfig(compile=True)


def _context(sizes=(1, 2, 4)) -> dict:
    return {
        "world_sizes": list(sizes),
        "launcher": "torchrun",
        "backend": "gloo",
        "device": "cpu",
        "nodes": 1,
        "threads_per_rank": 1,
        "cpu_count": 2,
        "model": "mlp",
        "dataset": "synthetic",
        "batch_per_rank": 64,
        "gradient_bytes": S,
        "flops_per_sample": None,
        "peak_tflops": None,
        "peak_source": None,
        "rounds": 5,
        "steps_per_round": 20,
    }


def _times(n: int, t1: float, exposed: float, compute_growth: float = 1.0) -> dict:
    comm = LINK.seconds(n, S)
    compute = t1 * (compute_growth if n > 1 else 1.0)
    step = compute + exposed * comm
    return {"times": {"step": step, "compute": compute, "comm": comm, "buckets": 1, "steps": 20, "rounds": [step] * 3}}


def _report(compute_growth: float = 1.0, exposed: float = 1.0, context: dict | None = None) -> dict:
    bare = [AllReduceSample(n, size, LINK.seconds(n, size)) for n in (2, 4) for size in (S // 64, S // 8, S)]
    measured = {
        "none, bucket 25 MiB": {n: _times(n, 5.7e-3, exposed, compute_growth) for n in (1, 2, 4)},
        "fp16, bucket 25 MiB": {n: _times(n, 5.7e-3, 0.5, compute_growth) for n in (1, 2, 4)},
        "bf16, bucket 25 MiB": {1: {"skipped": "--comm-hook bf16: refused"}, 2: {}, 4: {}},
    }
    speeds = {name: SpeedConfig(comm_hook=name.split(",")[0]) for name in measured}
    return scale_report.build(context or _context(), bare, measured, speeds)


def test_on_a_gpu_each_point_has_its_tflops_and_mfu() -> None:
    jsonschema = need("jsonschema")
    gpu = {**_context(), "device": "cuda:0", "flops_per_sample": 2e9, "peak_tflops": 100.0, "peak_source": "x"}
    report = _report(context=gpu)
    jsonschema.validate(report, scale_report.SCHEMA)
    one = report["variants"][0]["points"][0]  # 64 samples x 2e9 FLOPs in a 5.7 ms step: 22.5 TFLOP/s
    assert one["tflops_per_gpu"] == pytest.approx(64 * 2e9 / 5.7e-3 / 1e12) and one["mfu"] == pytest.approx(
        0.2246, 1e-3
    )
    assert "22.5 TFLOP/s/GPU, MFU 22.5%" in scale_report.format_report(report)
    cpu = _report()
    assert cpu["variants"][0]["points"][0]["mfu"] is None and "TFLOP/s" not in scale_report.format_report(cpu)


def test_the_report_keeps_its_schema_and_its_figures() -> None:
    jsonschema = need("jsonschema")
    report = _report()
    jsonschema.validate(report, scale_report.SCHEMA)
    none, fp16, bf16 = report["variants"]
    assert none["fit"]["exposed_fraction"] == pytest.approx(1.0) and none["fit"]["t1_ms"] == pytest.approx(5.7)
    assert fp16["fit"]["exposed_fraction"] == pytest.approx(0.5)
    assert [p["world_size"] for p in none["points"]] == [1, 2, 4] and none["points"][0]["speedup"] == 1.0
    assert none["points"][2]["predicted_step_ms"] == pytest.approx(none["points"][2]["step_ms"])
    assert bf16["skipped"] and bf16["points"] == [] and report["best"] == "fp16, bucket 25 MiB"
    assert report["allreduce"]["busbw_gbps"] == pytest.approx(0.25) and report["notes"] == []
    text = scale_report.format_report(report)
    assert "efficiency >= 50% up to N = " in text and "skipped: --comm-hook bf16" in text
    assert "best on 4 ranks: fp16, bucket 25 MiB" in text


def test_a_schema_violation_is_caught() -> None:
    # Negative control for the schema: an unknown key and a missing one are refused.
    jsonschema = need("jsonschema")
    report = _report()
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**report, "surprise": 1}, scale_report.SCHEMA)
    del report["variants"][0]["points"][0]["step_ms"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, scale_report.SCHEMA)


def test_contending_ranks_are_noted() -> None:
    notes = _report(compute_growth=1.9)["notes"]
    assert any("compute per step on 2 ranks is 1.9x one rank's" in n for n in notes), notes


def test_steps_that_wait_longer_than_their_all_reduce_are_noted() -> None:
    (note,) = _report(exposed=3.0)["notes"]
    assert note.startswith("none, bucket 25 MiB: k = 3.0: a step waits") and "not to the bytes" in note
