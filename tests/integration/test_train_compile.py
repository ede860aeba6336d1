"""--compile trains as eager does: 2 gloo ranks, DDP with its static graph, torch.compile (inductor) on the CPU.

The compiled model runs other kernels (inductor's fused C++ for the elementwise work), so equality is
within rounding: per-epoch training losses within 1e-5 (relative) and final parameters within 1e-5,
where a run with another learning rate is far outside both. Compiling takes a minute or two here.
"""

import pytest

from tests.integration.train_runs import assert_params_close, final_params, metrics, summary, synthetic, train

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COMMON = ["--train-samples", "512", "--test-samples", "64", "--epochs", "3", "--batch-size", "32"]


def _losses(out) -> list[float]:
    return [r["train_loss"] for r in metrics(out) if r["event"] == "epoch"]


def test_compiled_ddp_gives_the_eager_loss_curve(tmp_path) -> None:
    eager, compiled, other = tmp_path / "eager", tmp_path / "compiled", tmp_path / "other"
    train(2, synthetic(eager, *COMMON), tmp_path)
    train(2, synthetic(compiled, *COMMON, "--compile"), tmp_path)
    assert summary(compiled)["static_graph"] and summary(compiled)["params_identical"]
    assert _losses(compiled) == pytest.approx(_losses(eager), rel=1e-5)
    assert_params_close(final_params(compiled), final_params(eager), rtol=0, atol=1e-5)
    # The comparison can fail: another learning rate gives another curve.
    train(2, synthetic(other, *COMMON, "--lr", "0.002"), tmp_path)
    assert _losses(other) != pytest.approx(_losses(eager), rel=1e-5)
