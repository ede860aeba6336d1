"""app scale on real local ranks: as one process it starts 4 ranks and measures 1, 2 and 4; under a
Slurm-style launch it measures the ranks given; the report, its JSON (by its schema) and a real PNG.
Bad flags: one line, exit 2. Figures only, no timed asserts."""

import json
import struct

import pytest

from app.train.scale.report import SCHEMA
from tests.deps import need
from tests.integration.launchers import one_error_line, run_single, run_slurm_style

pytestmark = pytest.mark.integration

QUICK = ["--rounds", "2", "--steps", "4"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (which must come first)."""
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR", data[:16]
    return struct.unpack(">II", data[16:24])


def test_one_process_measures_one_two_and_four_ranks(tmp_path) -> None:
    jsonschema = need("jsonschema")
    report, png = tmp_path / "scale.json", tmp_path / "scale.png"
    args = ["scale", "--world-sizes", "1,2,4", *QUICK, "--json", str(report), "--plot", str(png)]
    done = run_single(args, timeout=420)
    assert done.returncode == 0, done.stderr[-3000:]
    r = json.loads(report.read_text())
    jsonschema.validate(r, SCHEMA)
    assert r["world_sizes"] == [1, 2, 4] and r["launcher"] == "torchrun" and r["gradient_bytes"] == 814_120
    assert {(p["world_size"], p["bytes"]) for p in r["allreduce"]["points"]} == {
        (n, size) for n in (2, 4) for size in (814_120 // 64, 814_120 // 8, 814_120)
    }
    (v,) = r["variants"]
    assert v["name"] == "none, bucket 25 MiB" and [p["world_size"] for p in v["points"]] == [1, 2, 4]
    one, two, four = v["points"]
    assert one["buckets"] == 0 and one["comm_ms"] == 0  # one rank trains without DDP: nothing to send
    assert two["buckets"] == four["buckets"] == 1 and two["comm_ms"] > 0
    assert all(p["step_ms"] > 0 and p["compute_ms"] > 0 for p in v["points"])
    # The fit of real step times taken beside other work may not exist (its error says why, in one line); the law's
    # fit is judged on set figures in tests/unit/test_scaling.py
    fit = v["fit"]
    assert (fit["error"] is None and fit["t1_ms"] > 0) or fit["error"].startswith("no positive compute time fits"), fit
    assert done.stdout.count("scale: mlp on synthetic") == 1  # rank 0 alone prints
    assert "law T_N = T_1/N + T_comm(N)" in done.stdout

    data = png.read_bytes()
    width, height = _png_size(data)
    assert width > 1000 and 400 < height < width and len(data) > 20_000


def test_slurm_ranks_are_measured_as_given_with_a_sweep(tmp_path) -> None:
    jsonschema = need("jsonschema")
    report = tmp_path / "sweep.json"
    args = ["scale", *QUICK, "--sweep", "--sweep-buckets", "25,0.01", "--json", str(report)]
    results = run_slurm_style(2, args, tmp_path / "rdzv", timeout=420)
    for rank, done in enumerate(results):
        assert done.returncode == 0, f"rank {rank}: {done.stderr[-3000:]}"
    assert results[1].stdout == ""
    r = json.loads(report.read_text())
    jsonschema.validate(r, SCHEMA)
    assert r["world_sizes"] == [1, 2] and r["launcher"] == "slurm"
    by_name = {v["name"]: v for v in r["variants"]}
    assert len(by_name) == 9 and by_name["none, bucket 25 MiB, compile"]["compile"] is True  # torch.compile too
    assert "one bucket" in by_name["powersgd, bucket 0.01 MiB"]["skipped"]  # it would hang gloo
    assert by_name["none, bucket 0.01 MiB"]["points"][1]["buckets"] == 2
    assert by_name["fp16, bucket 25 MiB"]["points"][1]["buckets"] == 1
    measured = [v for v in r["variants"] if not v["skipped"]]
    assert r["best"] in {v["name"] for v in measured} and len(measured) >= 5
    assert "sweep: step ms and efficiency" in results[0].stdout


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--world-sizes", "2,4"], "needs 1 (the baseline of speed-up)"),
        (["--powersgd-rank", "0"], "--powersgd-rank 0 must be >= 1"),
        (["--comm-hook", "int8"], "--comm-hook 'int8' is not one of none, fp16, bf16, powersgd"),
        (["--plot", "scale.svg"], "give a path ending in .png"),
    ],
)
def test_bad_flags_are_one_line(flags: list[str], message: str) -> None:
    # Every check is also a unit test (tests/unit/test_scale.py); these prove the exit status and the one line.
    done = run_single(["scale", *flags], timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], done.stderr[-2000:]


def test_more_ranks_than_the_job_has_is_one_line_on_every_rank(tmp_path) -> None:
    results = run_slurm_style(2, ["scale", "--world-sizes", "1,4"], tmp_path / "rdzv", timeout=60)
    for done in results:
        line = one_error_line(done.stderr)
        assert done.returncode == 2 and "goes beyond the 2 ranks this job has" in line["cause"]
