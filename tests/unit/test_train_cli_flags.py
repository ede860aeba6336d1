"""The flags of every command are its configs' fields: one flag per field, its default the field's
default, its help the docstring under it, one --help group per section (``app.flags``)."""

import argparse
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from app.cli import build_parser
from app.diagnostics.check import CheckConfig
from app.diagnostics.comm import CommConfig
from app.diagnostics.doctor import DoctorConfig
from app.diagnostics.links import LinksConfig
from app.flags import FLAG, docstrings, from_args, option, option_of
from app.orchestrate.deploy import DeployConfig
from app.orchestrate.runner import ClusterFlags
from app.runtime.distributed import DistConfig
from app.topology import spec
from app.topology.command import RenderFlags, SpecSource
from app.train.bench import BenchConfig
from app.train.config import SECTIONS, SpeedConfig, TrainConfig
from app.train.main import config_from_args

EVERY_COMMAND = {"log_dir", "verbose"}
"""app.logs' flags, which every command has."""


def _destinations(parser: argparse.ArgumentParser) -> set[str]:
    return {action.dest for action in parser._actions if action.option_strings and action.dest != "help"}


def _action(parser: argparse.ArgumentParser, name: str) -> argparse.Action:
    return parser._option_string_actions[option(name)]


def _field_action(parser: argparse.ArgumentParser, f) -> argparse.Action:
    return parser._option_string_actions[option_of(f)]


def _group_of(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    return next(g.title for g in parser._action_groups if action in g._group_actions)


@pytest.mark.parametrize(
    ("command", "sections"),
    [
        ("train", [*SECTIONS.values(), DistConfig]),
        ("bench", [BenchConfig, SpeedConfig, DistConfig]),
        ("check", [CheckConfig, DistConfig]),
        ("comm", [CommConfig, DistConfig]),
        ("doctor", [DoctorConfig, DistConfig]),
        ("links", [LinksConfig, DistConfig]),
    ],
)
def test_every_field_is_a_flag_with_its_default_and_docstring(command: str, sections: list[type]) -> None:
    parser, _ = build_parser(command)
    for section in sections:
        title = section.__doc__.splitlines()[0].rstrip(".")
        for f in fields(section):
            action = _field_action(parser, f)
            default = f.default if f.default is not MISSING else f.default_factory()
            repeated = f.metadata.get(FLAG, {}).get("repeat")  # absent until given: the field's default then
            assert action.default == (argparse.SUPPRESS if repeated else default), f.name
            assert docstrings(section)[f.name] and action.help.startswith(docstrings(section)[f.name]), f.name
            assert _group_of(parser, action) == title, f.name
            assert from_args(section, parser.parse_args([])) == section(), section
    # Nothing else: no flag written by hand beside the configs' (app.logs' are every command's).
    generated = {f.name for section in sections for f in fields(section)}
    assert _destinations(parser) == generated | EVERY_COMMAND


@pytest.mark.parametrize(
    ("command", "sections"),
    [
        ("topology", [RenderFlags, SpecSource, *spec.SECTIONS.values()]),
        ("cluster", [ClusterFlags, SpecSource, *spec.SECTIONS.values()]),
        ("deploy", [DeployConfig]),
    ],
)
def test_the_orchestration_commands_flags_come_from_configs(command: str, sections: list[type]) -> None:
    parser, _ = build_parser(command)
    by_dest = {action.dest: action for action in parser._actions if action.dest != "help"}  # positionals too
    for section in sections:
        for f in fields(section):
            if f.metadata.get(FLAG, {}).get("hidden"):
                continue
            assert by_dest[f.name].help.replace("%%", "%").startswith(docstrings(section)[f.name]), f.name
    # Nothing else: no flag or positional written by hand beside the configs' (app.logs' are every command's).
    assert set(by_dest) == {f.name for section in sections for f in fields(section)} | EVERY_COMMAND


def test_the_orchestration_commands_defaults_are_their_configs() -> None:
    topology, _ = build_parser("topology")
    assert from_args(RenderFlags, topology.parse_args([])) == RenderFlags()
    assert from_args(SpecSource, topology.parse_args([])) == SpecSource()
    cluster, _ = build_parser("cluster")
    assert from_args(ClusterFlags, cluster.parse_args(["logs"])) == ClusterFlags("logs")
    deploy, _ = build_parser("deploy")
    args = deploy.parse_args(["-i", "ansible/deploy.yml", "-e", "a=1", "-e", "b=2", "-q", "--timeout", "9"])
    assert from_args(DeployConfig, args, extravars={}) == DeployConfig(
        Path("ansible/deploy.yml"), quiet=True, timeout_s=9
    )
    assert args.extravars == ["a=1", "b=2"]


def test_no_flags_give_the_default_config() -> None:
    parser, _ = build_parser("train")
    assert config_from_args(parser.parse_args([])) == TrainConfig()
    bench_parser, _ = build_parser("bench")
    assert from_args(SpeedConfig, bench_parser.parse_args([])) == SpeedConfig()
    assert from_args(BenchConfig, bench_parser.parse_args([])) == BenchConfig()


def test_flags_reach_their_sections() -> None:
    parser, _ = build_parser("train")
    args = ["--model", "cnn", "--batch-size", "8", "--no-static-graph", "--input-shape", "3x8x8", "--out", "o"]
    cfg = config_from_args(parser.parse_args(args))
    assert (cfg.model.model, cfg.steps.batch_size, cfg.speed.static_graph) == ("cnn", 8, False)
    assert cfg.data.input_shape == (3, 8, 8) and str(cfg.output.out) == "o"


@pytest.mark.parametrize(
    ("argv", "value"), [([], "auto"), (["--cuda-graphs"], "on"), (["--cuda-graphs", "off"], "off")]
)
def test_cuda_graphs_alone_is_on(argv: list[str], value: str) -> None:
    parser, _ = build_parser("train")
    assert config_from_args(parser.parse_args([*argv, "--epochs", "2"])).speed.cuda_graphs == value


def test_help_keeps_the_groups_and_the_launch_examples() -> None:
    parser, _ = build_parser("train")
    text = parser.format_help()
    for section in SECTIONS.values():
        assert section.__doc__.splitlines()[0].rstrip(".") + ":" in text
    assert "torchrun --standalone --nproc-per-node 2 -m app train" in text and "srun -N 2" in text
    assert "--input-shape CxHxW" in text and "(default: 1x28x28)" in text
    assert "python -m app bench --nproc-per-node 4" in build_parser("bench")[0].format_help()
