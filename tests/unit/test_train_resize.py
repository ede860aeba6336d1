"""The global batch kept on a resume on another number of ranks (app/train/resize.py): the accumulation,
the mid-epoch position, and a world that cannot keep it (one line)."""

import argparse
import shlex
import subprocess
import sys

import pytest

from app import batch, events, flags
from app.errors import ClusterError, UsageError
from app.topology.spec import build
from app.train.config import StepsConfig, TrainConfig
from app.train.resize import keep_global_batch


def _state(world: int, accum: int, batch: int = 64, position: int = 6) -> dict:
    return {"world_size": world, "batch_size": batch, "accum_steps": accum, "batch": position, "step": 40}


def _cfg(batch: int = 64, accum: int = 1) -> TrainConfig:
    return TrainConfig(steps=StepsConfig(batch_size=batch, accum_steps=accum))


def test_fewer_ranks_accumulate_more_and_continue_at_the_same_step() -> None:
    cfg, state, change = keep_global_batch(_cfg(), _state(4, 1), world=2, nodes=1)
    assert cfg.steps.accum_steps == 2 and (state["batch"], state["world_size"], state["accum_steps"]) == (12, 2, 2)
    assert change is not None and change.record()["from"] == 4 and change.record()["to"] == 2
    assert change.line(64).startswith("train: resize: 4 -> 2 ranks at step 40 (the job restarted on 1 node(s)")
    assert change.line(64).endswith("global batch 256 kept as per-rank batch 64 x 2 ranks x accum 2")
    grown, state, change = keep_global_batch(_cfg(), _state(2, 2, position=12), world=4, nodes=2)
    assert grown.steps.accum_steps == 1 and state["batch"] == 6 and change and change.accum_now == 1


def test_the_same_world_keeps_the_checkpoints_accumulation_without_a_line() -> None:
    cfg, _, change = keep_global_batch(_cfg(), _state(2, 2), world=2, nodes=1)  # a restart while still shrunk
    assert cfg.steps.accum_steps == 2 and change is None
    same = _cfg()
    assert keep_global_batch(same, _state(4, 1), world=4, nodes=2)[0] is same


def test_a_new_batch_size_sets_a_new_global_batch() -> None:
    cfg = _cfg(batch=32)
    assert keep_global_batch(cfg, _state(4, 1), world=2, nodes=1) == (cfg, _state(4, 1), None)


def test_a_world_that_cannot_keep_the_global_batch_is_one_line() -> None:
    with pytest.raises(ClusterError) as caught:
        keep_global_batch(_cfg(), _state(2, 1), world=3, nodes=3)
    assert str(caught.value) == (
        "cannot keep the global batch 128 on 3 ranks of per-rank batch 64 (128 is not a multiple of 192): "
        "run on 1, 2 ranks, or start a new run (--out) with another --batch-size"
    )
    assert caught.value.reason == events.BATCH_NOT_KEPT  # the runner's final line names it, not the node loss


# --- the spec refuses an elastic shape that cannot shrink (issue 36, item 2) -------------------------------------


def _elastic(nodes: int, min_nodes: int, nproc: int, command: str):
    return build(
        {"nodes": {"nodes": nodes, "min_nodes": min_nodes, "nproc_per_node": nproc}, "job": {"command": command}}
    )


def test_an_elastic_spec_whose_batch_no_smaller_world_keeps_is_refused_with_the_fix() -> None:
    with pytest.raises(UsageError) as caught:  # the shape: 3 nodes x 1 rank, --min-nodes 2, the default batch
        _elastic(3, 2, 1, "train --dataset digits --out /results/digits --resume auto")
    assert str(caught.value) == (
        "--min-nodes 2: the global batch 192 (per-rank batch 64 x 3 ranks x accum 1) cannot be kept on 2 node(s), "
        "where the per-rank batch stays: give the train command --accum-steps 2 (global batch 384) or --batch-size 32 "
        "--accum-steps 2 (global batch 192 kept), a batch that every world from 2 to 3 nodes divides"
    )
    for fixed in (
        "train --accum-steps 2",
        "train --batch-size 32 --accum-steps 2",
        "train --batch-size=32 --accum-steps=2",
    ):
        assert _elastic(3, 2, 1, fixed).nodes.min_nodes == 2  # each fix the line names is taken


def test_every_world_from_min_nodes_must_keep_the_batch_not_only_one() -> None:
    # 4 nodes x 2, --min-nodes 2, accum 2: 2 nodes keep 1024, 3 do not (an eviction from 4 leaves 3)
    with pytest.raises(
        UsageError, match=r"cannot be kept on 3 node\(s\).* --accum-steps 3 \(global batch 1536\), a batch"
    ):
        _elastic(4, 2, 2, "train --accum-steps 2")
    assert _elastic(4, 2, 2, "train --accum-steps 3").nodes.elastic
    assert _elastic(4, 1, 2, "train --accum-steps 6").nodes.elastic  # 1, 2 and 3 nodes keep 64 x 8 x 6


def test_what_the_spec_cannot_read_or_what_cannot_shrink_is_not_judged() -> None:
    assert _elastic(3, 3, 1, "train").nodes.nodes == 3  # all or none: no smaller world
    assert _elastic(3, 2, 1, "check").job.command == "check"  # no global batch
    script = {"nodes": {"nodes": 3, "min_nodes": 2, "nproc_per_node": 1}, "job": {"script": "job/train.py"}}
    assert build(script).job.script == "job/train.py"  # a user's script: its batch is its own


def test_a_bad_train_flag_in_the_command_is_one_line_naming_the_command() -> None:
    with pytest.raises(UsageError, match=r"^--command 'train --accum-steps x': argument --accum-steps: invalid int"):
        _elastic(3, 2, 1, "train --accum-steps x")


def test_the_spec_reads_a_train_commands_steps_as_app_train_does() -> None:
    words = ["--epochs", "3", "--batch-size", "8", "--accum-steps", "3", "--out", "/results/x"]
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser, StepsConfig)
    steps = flags.from_args(StepsConfig, parser.parse_known_args(words)[0])
    assert batch.steps_of(shlex.join(["train", *words])) == (steps.batch_size, steps.accum_steps) == (8, 3)
    assert batch.steps_of("train --epochs 1") == (StepsConfig().batch_size, StepsConfig().accum_steps)


def test_the_topology_command_refuses_it_before_anything_starts_with_exit_2() -> None:
    argv = ["--nodes", "3", "--nproc-per-node", "1", "--min-nodes", "2", "--format", "compose"]
    done = subprocess.run([sys.executable, "-m", "app", "topology", *argv], capture_output=True, text=True, timeout=60,
                          check=False)  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith("error: --min-nodes 2: the global batch 192 ") and "--accum-steps 2" in done.stderr
