"""Flags made from dataclasses: every field a flag, defaults and docstrings carried over."""

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from app.errors import UsageError
from app.flags import add_arguments, docstrings, flag, from_args


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("x"))


@dataclass(frozen=True)
class Example:
    """An example section."""

    name: str = "digits"
    """Which one, by name."""
    count: int = 3
    """How many."""
    rate: float = 0.5
    """How fast."""
    fast: bool = True
    """Go fast."""
    out: Path | None = None
    """Where to write."""
    shape: tuple[int, ...] = field(default=(1, 2), metadata=flag(parse=_shape, show="1x2", metavar="AxB"))
    """A shape."""
    secret: int = field(default=0, metadata=flag(hidden=True))
    """Not for users."""

    def __post_init__(self) -> None:
        if self.count < 0:
            raise UsageError(f"--count {self.count} must be >= 0")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="x")
    add_arguments(parser, Example)
    return parser


def test_every_field_has_a_flag_with_its_default() -> None:
    args = _parser().parse_args([])
    assert from_args(Example, args) == Example()


def test_flags_parse_to_the_field_types() -> None:
    args = _parser().parse_args(
        ["--name", "x", "--count", "4", "--rate", "2", "--no-fast", "--out", "o", "--shape", "3x4", "--secret", "1"]
    )
    assert from_args(Example, args) == Example("x", 4, 2.0, False, Path("o"), (3, 4), 1)


def test_help_is_the_docstring_with_the_default() -> None:
    text = _parser().format_help()
    assert "An example section" in text
    assert "--count N" in text and "How many. (default: 3)" in text
    assert "--shape AxB" in text and "A shape. (default: 1x2)" in text
    assert "--fast, --no-fast" in text and "(default: on)" in text
    assert "--secret" not in text
    assert docstrings(Example)["out"] == "Where to write."


def test_the_dataclass_checks_values() -> None:
    with pytest.raises(UsageError, match="--count -1 must be >= 0"):
        from_args(Example, _parser().parse_args(["--count", "-1"]))


def test_given_values_win() -> None:
    assert from_args(Example, _parser().parse_args(["--count", "4"]), count=7).count == 7


def _even(text: str) -> int:
    if int(text) % 2:
        raise UsageError(f"{text} is odd: give an even number")
    return int(text)


@dataclass(frozen=True)
class Checked:
    """A section whose flag's parser raises UsageError."""

    pairs: int = field(default=2, metadata=flag(parse=_even))
    """An even number."""


def test_a_parsers_usage_error_is_argparses_one_line_error(capsys) -> None:
    parser = argparse.ArgumentParser(prog="x")
    add_arguments(parser, Checked)
    assert from_args(Checked, parser.parse_args(["--pairs", "4"])).pairs == 4
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--pairs", "3"])
    assert exit_.value.code == 2
    assert "argument --pairs: 3 is odd: give an even number" in capsys.readouterr().err


@dataclass(frozen=True)
class Shaped:
    """Flags of other shapes: a positional, a required flag, short aliases, an exclusive pair."""

    action: str = field(metadata=flag(positional=True, choices=("up", "down")))
    """What to do."""
    inventory: Path = field(metadata=flag(short="-i"))
    """Required: it has no default."""
    quiet: bool = field(default=False, metadata=flag(short="-q"))
    """Say less."""
    extra: tuple[str, ...] = field(default=(), metadata=flag(short="-e", repeat=True))
    """Repeatable."""
    spec: str | None = field(default=None, metadata=flag(exclusive="source"))
    """One source."""
    spec_json: str | None = field(default=None, metadata=flag(exclusive="source"))
    """The other source."""


def _shaped(argv: list[str]) -> Shaped:
    parser = argparse.ArgumentParser(prog="x")
    add_arguments(parser, Shaped)
    return from_args(Shaped, parser.parse_args(argv))


def test_positional_short_aliases_and_repeats() -> None:
    assert _shaped(["up", "-i", "inv", "-q", "-e", "a", "-e", "b"]) == Shaped("up", Path("inv"), True, ("a", "b"))
    assert _shaped(["down", "--inventory", "inv", "--quiet", "--spec", "s"]) == Shaped(
        "down", Path("inv"), True, spec="s"
    )
    assert _shaped(["up", "-i", "inv"]) == Shaped("up", Path("inv"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sideways", "-i", "inv"], "argument action: invalid choice: 'sideways' (choose from"),
        (["up"], "the following arguments are required: -i/--inventory"),
        ([], "the following arguments are required: action, -i/--inventory"),
        (["up", "-i", "i", "--spec", "a", "--spec-json", "b"], "--spec-json: not allowed with argument --spec"),
    ],
)
def test_positional_required_and_exclusive_are_refused_by_argparse(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        _shaped(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@dataclass(frozen=True)
class Switch:
    """A flag that may stand alone."""

    mode: str = field(default="auto", metadata=flag(alone="on", metavar="auto|on|off"))
    """auto, on or off."""


@pytest.mark.parametrize(("argv", "mode"), [([], "auto"), (["--mode"], "on"), (["--mode", "off"], "off")])
def test_a_flag_alone_takes_its_alone_value(argv: list[str], mode: str) -> None:
    parser = argparse.ArgumentParser(prog="x")
    add_arguments(parser, Switch)
    assert from_args(Switch, parser.parse_args(argv)).mode == mode
    assert "--mode [auto|on|off]" in parser.format_help()
