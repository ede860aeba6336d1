"""The auto choices of --precision and --cuda-graphs, every branch on a CPU: the device and its compute
capability are given (a ``cuda`` device needs no GPU to be named); and the rates the summary gives."""

from types import SimpleNamespace

import pytest
import torch

from app.errors import UsageError
from app.train import auto, bench
from app.train.config import ModelConfig, SpeedConfig, StepsConfig, TrainConfig
from app.train.report import format_summary
from app.train.trainer import modes, run_rates

CPU, GPU = torch.device("cpu"), torch.device("cuda", 0)
H100, A100, T4, V100 = (9, 0), (8, 0), (7, 5), (7, 0)


def _cfg(precision: str = "auto", graphs: str = "auto", accum: int = 1, **speed) -> TrainConfig:
    return TrainConfig(
        model=ModelConfig(precision=precision),
        steps=StepsConfig(accum_steps=accum),
        speed=SpeedConfig(cuda_graphs=graphs, **speed),
    )


def test_the_defaults_are_auto() -> None:
    assert (TrainConfig().model.precision, TrainConfig().speed.cuda_graphs) == ("auto", "auto")


@pytest.mark.parametrize(
    ("device", "capability", "chosen"),
    [
        (CPU, None, ("fp32", "cpu")),
        (GPU, H100, ("bf16", "sm_90 has bf16")),
        (GPU, A100, ("bf16", "sm_80 has bf16")),
        (GPU, (12, 0), ("bf16", "sm_120 has bf16")),
        (GPU, (7, 5), ("fp16", "sm_75 has no bf16: fp16 with GradScaler")),
        (GPU, V100, ("fp16", "sm_70 has no bf16: fp16 with GradScaler")),
    ],
)
def test_auto_precision_is_bf16_from_capability_8_fp16_below_and_fp32_on_cpu(device, capability, chosen) -> None:
    assert auto.choose_precision("auto", device, capability) == chosen


@pytest.mark.parametrize("asked", ["fp32", "bf16", "fp16"])
def test_a_named_precision_is_kept_without_a_reason(asked: str) -> None:
    assert auto.choose_precision(asked, GPU, T4) == (asked, "")
    assert auto.choose_precision(asked, CPU, None) == (asked, "")


@pytest.mark.parametrize(
    ("cfg", "device", "capability", "hook", "graphs", "why"),
    [
        (_cfg(), GPU, H100, False, "on", auto.CAPTURABLE),
        (_cfg(precision="fp32"), GPU, H100, False, "on", auto.CAPTURABLE),
        (_cfg(), CPU, None, False, "off", "cpu has no CUDA graphs"),
        (_cfg(), GPU, T4, False, "off", "fp16's GradScaler checks for overflow on the host"),
        (_cfg(precision="fp16"), GPU, H100, False, "off", "fp16's GradScaler checks for overflow on the host"),
        (_cfg(accum=2), GPU, H100, False, "off", "--accum-steps 2"),
        (_cfg(compile=True), GPU, H100, False, "off", "--compile"),
        (_cfg(comm_hook="powersgd"), GPU, H100, False, "off", "--comm-hook powersgd runs in Python"),
        (_cfg(), GPU, H100, True, "off", "a Python comm hook (app scale's timer)"),
        (_cfg(compile=True, accum=2), GPU, H100, False, "off", "--compile"),  # the first reason
    ],
)
def test_auto_cuda_graphs_capture_where_the_whole_step_can_be(cfg, device, capability, hook, graphs, why) -> None:
    resolved, chosen = auto.resolve(cfg, device, python_hook=hook, capability=capability)
    assert resolved.speed.cuda_graphs == graphs and chosen["cuda_graphs"] == why


def test_resolve_makes_every_auto_choice_and_says_why_for_those_only() -> None:
    resolved, chosen = auto.resolve(_cfg(), GPU, capability=H100)
    assert (resolved.model.precision, resolved.speed.cuda_graphs) == ("bf16", "on")
    assert chosen == {"precision": "sm_90 has bf16", "cuda_graphs": auto.CAPTURABLE}
    resolved, chosen = auto.resolve(_cfg(precision="fp32", graphs="off"), GPU, capability=H100)
    assert (resolved.model.precision, resolved.speed.cuda_graphs, chosen) == ("fp32", "off", {})


@pytest.mark.parametrize(
    ("cfg", "device", "capability", "hook"),
    [(_cfg(graphs="off"), GPU, H100, False), (_cfg(graphs="off", precision="fp16"), CPU, None, True)],
)
def test_off_is_eager_whatever_could_be(cfg, device, capability, hook) -> None:
    assert auto.choose_cuda_graphs(cfg, device, "fp32", hook) == ("off", "")


@pytest.mark.parametrize(
    ("cfg", "device", "capability", "hook", "error"),
    [
        (_cfg(graphs="on"), CPU, None, False, "--cuda-graphs needs a CUDA GPU, and this rank trains on cpu: drop"),
        (_cfg(graphs="on"), GPU, T4, False, "--cuda-graphs with --precision auto (fp16 on a GPU without bf16)"),
        (_cfg(graphs="on"), GPU, H100, True, "--cuda-graphs with a Python comm hook (app scale times the buckets"),
    ],
)
def test_on_where_it_cannot_be_is_one_error_naming_the_fix(cfg, device, capability, hook, error: str) -> None:
    with pytest.raises(UsageError, match=error.replace("(", r"\(").replace(")", r"\)")):
        auto.resolve(cfg, device, python_hook=hook, capability=capability)


def test_on_where_it_can_be_is_kept_without_a_reason() -> None:
    resolved, chosen = auto.resolve(_cfg(graphs="on"), GPU, capability=H100)
    assert resolved.speed.cuda_graphs == "on" and chosen == {"precision": "sm_90 has bf16"}


@pytest.mark.parametrize(
    ("build", "error"),
    [
        (lambda: _cfg(graphs="on", compile=True), "--cuda-graphs with --compile: choose one"),
        (lambda: _cfg(graphs="on", comm_hook="fp16"), "--cuda-graphs with --comm-hook fp16: a Python comm hook"),
        (lambda: _cfg(graphs="on", accum=2), "--cuda-graphs with --accum-steps 2: the graph is one whole"),
        (lambda: _cfg(graphs="on", precision="fp16"), "--cuda-graphs with --precision fp16: GradScaler checks"),
        (lambda: _cfg(graphs="yes"), "--cuda-graphs 'yes' is not one of auto, on, off"),
    ],
)
def test_on_that_the_config_alone_rules_out_is_refused_on_construction(build, error: str) -> None:
    with pytest.raises(UsageError, match=error):
        build()


def _described(**changes) -> dict:
    base = {"precision": "fp32", "comm_hook": "none", "compile": False, "cuda_graphs": False}
    return {**base, "channels_last": False, "device": "cpu", "auto": {}, **changes}


@pytest.mark.parametrize(
    ("described", "line"),
    [
        (_described(auto={"precision": "cpu", "cuda_graphs": "cpu has no CUDA graphs"}), "fp32 (auto: cpu)"),
        (_described(), "fp32"),
        (
            _described(
                precision="bf16",
                cuda_graphs=True,
                device="cuda:0",
                channels_last=True,
                auto={"precision": "sm_90 has bf16", "cuda_graphs": auto.CAPTURABLE},
            ),
            "bf16 (auto: sm_90 has bf16), cuda_graphs (auto: the whole step can be captured), channels_last",
        ),
        (
            _described(
                precision="bf16",
                device="cuda:0",
                compile=True,
                auto={"precision": "sm_90 has bf16", "cuda_graphs": "--compile"},
            ),
            "bf16 (auto: sm_90 has bf16), compile, eager (auto: --compile)",
        ),
        (_described(precision="bf16", cuda_graphs=True, device="cuda:0"), "bf16, cuda_graphs"),
        (_described(device="cuda:0", comm_hook="fp16"), "fp32, fp16 gradients"),
    ],
)
def test_the_start_line_says_what_was_chosen_and_why(described: dict, line: str) -> None:
    assert modes(described) == line


def test_the_steady_rate_leaves_the_first_epoch_out() -> None:
    # An epoch of compiling (100 samples in 2 s), then two at 300 samples/s.
    rates = run_rates([(100, 2.0), (300, 1.0), (300, 1.0)])
    assert rates == {"samples_per_s": 700 / 4.0, "steady_samples_per_s": 300.0, "train_seconds": 4.0}


@pytest.mark.parametrize("epochs", [[], [(100, 2.0)]])
def test_one_epoch_or_none_has_no_steady_rate(epochs: list) -> None:
    rates = run_rates(epochs)
    assert rates["steady_samples_per_s"] is None and rates["samples_per_s"] == (50.0 if epochs else 0.0)


def test_the_done_line_gives_the_steady_rate_beside_the_whole_runs() -> None:
    s = {"step": 3, "epochs_completed": 3, "test_accuracy": 0.5, "params_identical": True, "summary_path": "s.json"}
    assert "175 samples/s (steady 300 after the first epoch), params" in format_summary(
        {**s, **run_rates([(100, 2.0), (300, 1.0), (300, 1.0)])}
    )
    assert "50 samples/s, params" in format_summary({**s, **run_rates([(100, 2.0)])})


def _trainer(steps_per_epoch: int, graphed: bool) -> SimpleNamespace:
    return SimpleNamespace(loader=range(steps_per_epoch), graphed=object() if graphed else None)


@pytest.mark.parametrize(
    ("trainers", "rounds"),
    [
        ([], 1),
        ([_trainer(4, False)], 1),
        ([_trainer(64, True)], 1),  # 11 eager steps and the capture in the first epoch
        ([_trainer(12, True)], 1),
        ([_trainer(11, True)], 2),  # the capture is step 12: in the second epoch
        ([_trainer(64, True), _trainer(4, True)], 3),
    ],
)
def test_bench_warms_up_until_every_graph_is_captured(trainers: list, rounds: int) -> None:
    assert bench.warmup_rounds(trainers) == rounds
