"""Defaults that the README and docs/ state in prose (`--timeout`, default 120 s; `--backend auto` (the
default)) are the code's: every such mention is checked against the flags of the `app` commands, so a
default is written once, in its config class, and the prose follows it."""

import argparse
import re
from pathlib import Path

import pytest

from app import cli

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    ROOT / "docs/cluster.md",
    ROOT / "docker/README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]

# `--flag`, default 3 / `--flag` (default 30 / `--flag` steps (default 20 / `--flag`\n(default 50
AFTER_FLAG = re.compile(r"`(--[a-z][a-z-]*)`[^`(.;]{0,20}(?:\(|, )default:? `?([\w./]+)")
# `--flag value` (default) / `--flag value` (the default  and  the default `--flag value`
VALUE_THEN_DEFAULT = re.compile(r"`(--[a-z][a-z-]*) ([\w./]+)`\)? \((?:the )?default\b")
DEFAULT_THEN_VALUE = re.compile(r"\bthe default `(--[a-z][a-z-]*) ([\w./]+)`")


def stated_defaults(text: str) -> list[tuple[str, str]]:
    """(flag, value) for every default the prose states, lines joined (a mention may wrap)."""
    flat = " ".join(text.split())
    return [
        m.groups() for pattern in (AFTER_FLAG, VALUE_THEN_DEFAULT, DEFAULT_THEN_VALUE) for m in pattern.finditer(flat)
    ]


def code_defaults() -> dict[str, set[str]]:
    """Every option of every `app` command and its default(s) as text (120.0 reads 120), as parsed and as
    its --help shows it (a spec flag's default lives in the spec: its parser holds none)."""
    found: dict[str, set[str]] = {}
    for name in cli.COMMANDS:
        parser, _ = cli.build_parser(name)
        for action in parser._actions:
            shown = re.search(r"\(default:? ([^),]*)[),]", action.help or "")  # what --help says (app.flags)
            values = {shown[1]} if shown else set()
            if action.default not in (None, argparse.SUPPRESS):
                values.add(_text(action.default))
            for option in action.option_strings:
                found.setdefault(option, set()).update(values)
    return found


def _text(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def wrong_defaults(text: str, defaults: dict[str, set[str]]) -> list[str]:
    """The stated defaults that no command has: ``--flag says X, the code Y``."""
    wrong = []
    for option, value in stated_defaults(text):
        have = defaults.get(option)
        if not have:
            wrong.append(f"{option} is no flag of any app command")
        elif value not in have:
            wrong.append(f"{option}: the prose says {value}, the code {' or '.join(sorted(have))}")
    return wrong


@pytest.fixture(scope="module")
def defaults() -> dict[str, set[str]]:
    return code_defaults()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_defaults_a_page_states_are_the_codes(page: Path, defaults) -> None:
    assert wrong_defaults(page.read_text(), defaults) == []


def test_the_pages_state_defaults_at_all() -> None:
    """The check reads real mentions (a pattern that matches nothing would pass every page)."""
    stated = {option for page in PAGES for option, _ in stated_defaults(page.read_text())}
    assert {"--timeout", "--max-restarts", "--backend", "--checkpoint-every-seconds"} <= stated


@pytest.mark.parametrize(
    "text",
    [
        "A collective that times out (`--timeout`, default 60 s) fails.",
        "bounded by `--checkpoint-every-seconds` (default 45, in app train's settings)",
        "`--backend gloo` (the default) is used",
        "the memory loader (the default `--loader disk`) copies",
        "`--no-such-flag` (default 3)",
    ],
)
def test_a_wrong_default_in_the_prose_is_caught(text: str, defaults) -> None:
    assert len(wrong_defaults(text, defaults)) == 1
