"""``app comm``'s arithmetic: nccl-tests' sizes and bus-bandwidth factors, exact fills, verification, flags."""

import pytest
import torch

from app.diagnostics import collectives as c
from app.diagnostics.comm import CommConfig, failures, format_row, sweep_sizes
from tests.unit.cli_errors import usage_error

# nccl-tests doc/PERFORMANCE.md, written out independently of the product's table.
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}
WORLDS = (2, 3, 4, 8)


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("op", c.OPS)
def test_algbw_is_size_over_time_and_busbw_applies_nccl_tests_factor(op: str, n: int) -> None:
    algbw, busbw = c.bandwidths(op, 8_000_000_000, 4.0, n)
    assert algbw == pytest.approx(2.0)  # 8e9 B in 4 s = 2 GB/s (1e9 bytes, as nccl-tests)
    assert busbw == pytest.approx(2.0 * BUS_FACTOR[op](n))


def test_factors_at_four_ranks_by_hand() -> None:
    # A control with the numbers written out: 2(n-1)/n = 1.5 and (n-1)/n = 0.75 for n = 4.
    assert c.bandwidths("all_reduce", 10**9, 1.0, 4) == pytest.approx((1.0, 1.5))
    assert c.bandwidths("all_gather", 10**9, 1.0, 4) == pytest.approx((1.0, 0.75))
    assert c.bandwidths("broadcast", 10**9, 1.0, 4) == pytest.approx((1.0, 1.0))


@pytest.mark.parametrize("n", WORLDS)
def test_size_is_nccl_tests_s_for_each_collective(n: int) -> None:
    count = c.element_count("all_gather", 1 << 20, 4, n)
    shapes = {}
    for op in c.OPS:
        count = c.element_count(op, 1 << 20, 4, n)
        bufs = c.make_buffers(op, count, 1, n, torch.float32, torch.device("cpu"), 7, fill=True)
        shapes[op] = (count, bufs.send.numel(), bufs.recv.numel())
    per_rank = c.element_count("all_gather", 1 << 20, 4, n) // n
    assert shapes["all_reduce"] == (1 << 18, 1 << 18, 1 << 18)
    assert shapes["broadcast"][0] == shapes["send_recv"][0] == 1 << 18
    # all_gather: S is the gathered output; each rank sends S/n. reduce_scatter: S in, S/n kept.
    assert shapes["all_gather"][1:] == (per_rank, per_rank * n)
    assert shapes["reduce_scatter"][1:] == (per_rank * n, per_rank)
    # all_to_all: S is what each rank sends (S/n to each peer) and receives.
    assert shapes["all_to_all"][1:] == (per_rank * n, per_rank * n)
    assert per_rank * n <= 1 << 18 < (per_rank + 1) * n  # rounded down to a multiple of n


def test_chunked_sizes_never_round_to_nothing() -> None:
    assert c.element_count("all_gather", 8, 4, 8) == 8  # 2 elements asked, 1 per rank given
    assert c.element_count("all_reduce", 1, 4, 8) == 1


def test_sweep_sizes_and_size_parsing() -> None:
    cfg = CommConfig(min_bytes=8, max_bytes=c.parse_size("1K", "--max-bytes"), step_factor=4)
    assert sweep_sizes(cfg) == [8, 32, 128, 512]
    assert [c.parse_size(s, "--x") for s in ("8", "64K", "64M", "64MiB", "1G", "2kb")] == [
        8,
        64 << 10,
        64 << 20,
        64 << 20,
        1 << 30,
        2048,
    ]
    assert [c.format_size(n) for n in (8, 1536, 64 << 20, 1 << 30)] == ["8 B", "1536 B", "64 MiB", "1 GiB"]


@pytest.mark.parametrize("n", WORLDS)
@pytest.mark.parametrize("dtype", list(c.DTYPES))
def test_fill_values_sum_exactly_in_the_dtype(dtype: str, n: int) -> None:
    spec = c.DTYPES[dtype]
    k = c.fill_modulus(dtype, n)
    assert n * (k - 1) <= spec.exact
    numel = 3 * k + 5
    total = torch.zeros(numel, dtype=spec.torch_dtype)
    for rank in range(n):  # summed in the dtype itself, one rank at a time, as a ring would
        total = (total.float() + c.rank_data(rank, numel, k, spec.torch_dtype, torch.device("cpu")).float()).to(
            spec.torch_dtype
        )
    want, senders = c.expected("all_reduce", numel, 0, n, k)
    assert senders is None
    assert torch.equal(total.float(), want)


def test_float32_fills_are_not_all_alike() -> None:
    # A fill constant over elements or ranks would let a misplaced chunk pass unnoticed.
    k = c.fill_modulus("float32", 4)
    assert k == 127
    a = c.rank_data(0, 300, k, torch.float32, torch.device("cpu"))
    b = c.rank_data(1, 300, k, torch.float32, torch.device("cpu"))
    assert len(set(a.tolist())) == k and not torch.equal(a, b)


def _correct_result(op: str, count: int, rank: int, n: int, k: int) -> c.Buffers:
    bufs = c.make_buffers(op, count, rank, n, torch.float32, torch.device("cpu"), k, fill=True)
    want, _ = c.expected(op, count, rank, n, k)
    bufs.recv.copy_(want)
    return bufs


@pytest.mark.parametrize("op", c.OPS)
def test_verify_passes_the_right_result_and_counts_a_wrong_element(op: str) -> None:
    n, rank, k = 4, 2, 127
    count = c.element_count(op, 4096, 4, n)
    bufs = _correct_result(op, count, rank, n, k)
    assert c.verify(op, bufs, count, rank, n, k) == (0, [])
    bufs.recv[-1] += 1  # the last element: from the last chunk's sender
    wrong, senders = c.verify(op, bufs, count, rank, n, k)
    assert wrong == 1
    expected_sender = {"all_gather": [3], "all_to_all": [3], "broadcast": [0], "send_recv": [1]}
    assert senders == expected_sender.get(op, [])


def test_verify_counts_a_chunk_from_the_wrong_rank() -> None:
    n, rank, k = 4, 0, 127
    count = c.element_count("all_gather", 4096, 4, n)
    bufs = _correct_result("all_gather", count, rank, n, k)
    chunk = count // n
    bufs.recv[chunk : 2 * chunk] = bufs.recv[2 * chunk : 3 * chunk].clone()  # rank 2's data where rank 1's goes
    wrong, senders = c.verify("all_gather", bufs, count, rank, n, k)
    assert wrong == chunk and senders == [1]


def test_unfilled_receive_buffer_is_all_wrong() -> None:
    bufs = c.make_buffers("all_to_all", 64, 1, 4, torch.float32, torch.device("cpu"), 127, fill=True)
    assert c.verify("all_to_all", bufs, 64, 1, 4, 127) == (64, [0, 1, 2, 3])


def _row(op: str, size: int, wrong: int, ranks: list[int], senders: list[int]) -> dict:
    return {"op": op, "size_bytes": size, "wrong": wrong, "wrong_ranks": ranks, "senders": senders}


def test_failures_name_collective_size_ranks_and_sender() -> None:
    rows = [
        _row("all_reduce", 8, 0, [], []),
        _row("all_reduce", 16, 4, [0, 1], []),
        _row("all_reduce", 32, 4, [0, 1], []),
        _row("all_gather", 1 << 20, 2, [0, 1], [1]),
        _row("broadcast", 8, 0, [], []),
    ]
    assert failures(rows) == [
        "all_reduce at 16 B (and 1 more size(s)): 8 wrong element(s) seen on rank(s) 0, 1",
        "all_gather at 1 MiB: 2 wrong element(s) seen on rank(s) 0, 1, in the data sent by rank(s) 1",
    ]
    assert failures(rows[:1]) == []


def test_row_has_nccl_tests_columns() -> None:
    row = {
        "size_bytes": 1024,
        "count": 256,
        "type": "float",
        "redop": "sum",
        "root": -1,
        "time_us": 12.5,
        "algbw_gbps": 0.08,
        "busbw_gbps": 0.12,
        "wrong": 0,
    }
    assert format_row(row).split() == ["1024", "256", "float", "sum", "-1", "12.50", "0.08", "0.12", "0"]
    assert format_row({**row, "wrong": -1}).split()[-1] == "N/A"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--min-bytes", "lots"], "--min-bytes 'lots' is not a size: write bytes as 8, 64K, 64M or 1G"),
        (["--max-bytes", "64X"], "--max-bytes '64X' is not a size"),
        (["--max-bytes", "-8"], "--max-bytes '-8' is not a size"),
        (["--min-bytes", "0"], "--min-bytes 0 must be >= 1"),
        (["--min-bytes", "1M", "--max-bytes", "1K"], "--min-bytes 1048576 is larger than --max-bytes 1024: swap them"),
        (["--step-factor", "1"], "--step-factor 1 must be a whole number >= 2"),
        (["--step-factor", "1.5"], "argument --step-factor: invalid int value"),
        (["--ops", "all_reduce,allreduce"], "--ops 'all_reduce,allreduce': choose from all_reduce,all_gather"),
        (["--ops", ","], "--ops '': choose from"),
        (["--dtype", "int8"], "--dtype 'int8' is not one of float32, bf16, fp16, fp8"),
        (["--iters", "0"], "--iters 0 >= 1"),
        (["--check", "2"], "argument --check: invalid choice"),
        (["--rank-time", "min"], "argument --rank-time: invalid choice"),
        (["--plot", "comm.svg"], "argument --plot: comm.svg: the picture is a PNG"),
    ],
)
def test_bad_flag_is_one_line(capsys, args: list[str], message: str) -> None:
    assert message in usage_error(capsys, "comm", *args)
