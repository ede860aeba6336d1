"""Command-line flags made from configuration dataclasses: each field is defined once, its flag
comes from its name, type and default, and its ``--help`` is the docstring written under it.

    @dataclass(frozen=True)
    class DataConfig:
        \"\"\"Which samples, and how they reach the model.\"\"\"      # the group's title

        dataset: str = "digits"
        \"\"\"digits, mnist or cifar10.\"\"\"                           # --dataset NAME: its help

    add_arguments(parser, DataConfig)          # --dataset, grouped under the class docstring
    cfg = from_args(DataConfig, parser.parse_args())

Types: bool fields become ``--x/--no-x``; ``int``, ``float``, ``str`` and ``Path`` parse as such, and
``X | None`` defaults to None; anything else (a tuple, say) names its parser and how its default
reads in the field's metadata: ``field(default=(1, 28, 28), metadata=flag(parse=parse_shape,
show="1x28x28", metavar="CxHxW"))``. ``flag(hidden=True)`` keeps a field out of ``--help``;
``flag(option="--timeout")`` names a flag other than after its field; ``flag(choices=(...))`` lets
argparse refuse any other value; ``flag(repeat=True)`` makes a tuple field a repeatable flag, each
use parsed on its own (``--inject-fault A --inject-fault B``); ``flag(short="-i")`` adds a short alias;
``flag(positional=True)`` makes the field a positional argument (``app cluster up``); a field with
no default is a required flag; fields with the same ``flag(exclusive="name")`` are mutually
exclusive (argparse refuses two of them together). A bool field with a ``parse`` takes a
value (``--check 0``) instead of ``--x/--no-x``. ``flag(alone="on")`` lets the flag stand without a value,
which then reads ``on`` (``--cuda-graphs`` is ``--cuda-graphs on``).
Values are checked by the dataclass itself (``__post_init__``), so a bad one gets the same
one-line message from the command line and from code; a ``parse`` function may raise ``UsageError``
too, which argparse then reports as its own one-line error about that flag.
"""

import argparse
import ast
import inspect
import itertools
import textwrap
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import MISSING, Field, fields
from functools import cache
from pathlib import Path
from typing import Any

from app.errors import UsageError

FLAG = "flag"
"""The key of a field's metadata that holds its flag settings."""


def flag(
    parse: Callable[[str], Any] | None = None,
    show: str | None = None,
    metavar: str | None = None,
    hidden: bool = False,
    option: str | None = None,
    choices: tuple | None = None,
    repeat: bool = False,
    short: str | None = None,
    positional: bool = False,
    exclusive: str | None = None,
    alone: str | None = None,
) -> dict:
    """Metadata for a field whose flag needs more than its type: a parser, how its default reads, a metavar..."""
    settings = {"parse": parse, "show": show, "metavar": metavar, "hidden": hidden}
    shape = {"short": short, "positional": positional, "exclusive": exclusive, "alone": alone}
    return {FLAG: settings | {"option": option, "choices": choices, "repeat": repeat} | shape}


@cache
def docstrings(cls: type) -> dict[str, str]:
    """The docstring written under each field of a dataclass, by field name (from its source)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    found: dict[str, str] = {}
    for node, after in itertools.pairwise(body):
        named = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        if named and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            found[node.target.id] = " ".join(str(after.value.value).split())
    return found


def option(name: str) -> str:
    """The flag of a field name: ``bucket_cap_mb`` -> ``--bucket-cap-mb``."""
    return "--" + name.replace("_", "-")


def option_of(f: Field) -> str:
    """The flag of a field: its own (``flag(option=...)``) or the one its name gives."""
    return f.metadata.get(FLAG, {}).get("option") or option(f.name)


def default_of(f: Field) -> Any:
    """A field's default value (its factory's product, for a factory)."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return None


def _base_type(annotation: Any) -> tuple[Any, bool]:
    """(the type, whether None is allowed) of ``X`` or ``X | None``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return (args[0] if len(args) == 1 else str), True
    return annotation, False


def _metavar(f: Field, kind: Any) -> str:
    settings = f.metadata.get(FLAG, {})
    if settings.get("metavar") or settings.get("choices"):
        return settings.get("metavar")  # with choices and no metavar, argparse shows {a,b,c}
    return {int: "N", float: "X", Path: "PATH"}.get(kind, f.name.split("_")[-1].upper())


def shown(f: Field) -> str:
    """How a field's default reads in --help and documentation."""
    default = default_of(f)
    settings = f.metadata.get(FLAG, {})
    if settings.get("show") is not None:
        return settings["show"]
    if isinstance(default, bool):
        return "on" if default else "off"
    if isinstance(default, tuple):
        return ",".join(map(str, default)) or "none"
    return "none" if default is None else f"{default:g}" if isinstance(default, float) else str(default)


def _checked(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as argparse wants it: its ``UsageError`` becomes argparse's own error (one line, exit 2)."""

    def checked(text: str) -> Any:
        try:
            return parse(text)
        except UsageError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    checked.__name__ = getattr(parse, "__name__", "value")
    return checked


def add_arguments(
    parser: argparse.ArgumentParser,
    cls: type,
    *,
    title: str | None = None,
    exclude: Iterable[str] = (),
    overrides_only: bool = False,
) -> argparse._ArgumentGroup:
    """Add one flag per field of dataclass ``cls`` (but ``exclude``), in a group titled by its docstring.

    overrides_only: a flag not given stays out of the parsed namespace (``given`` then tells what
    the user set, e.g. to lay flags over a file); ``--help`` still shows the dataclass's defaults.
    """
    group = parser.add_argument_group(title or (inspect.getdoc(cls) or cls.__name__).splitlines()[0].rstrip("."))
    hints = typing.get_type_hints(cls)
    helps = docstrings(cls)
    exclusive: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for f in fields(cls):
        if f.name in exclude or not f.init:
            continue
        settings = f.metadata.get(FLAG, {})
        kind, _ = _base_type(hints[f.name])
        required = f.default is MISSING and f.default_factory is MISSING
        default = default_of(f)
        text = helps.get(f.name, "") + ("" if required else f" (default: {shown(f)})")
        text = argparse.SUPPRESS if settings.get("hidden") else text.replace("%", "%%")  # argparse formats help
        initial = argparse.SUPPRESS if overrides_only else default
        where: argparse._ActionsContainer = group
        if settings.get("exclusive"):
            if settings["exclusive"] not in exclusive:
                exclusive[settings["exclusive"]] = group.add_mutually_exclusive_group()
            where = exclusive[settings["exclusive"]]
        if settings.get("positional"):
            where.add_argument(f.name, type=kind, choices=settings.get("choices"), help=text)
            continue
        names = [settings["short"], option_of(f)] if settings.get("short") else [option_of(f)]
        if kind is bool and not settings.get("parse"):
            where.add_argument(*names, dest=f.name, action=argparse.BooleanOptionalAction, default=initial, help=text)
            continue
        parse = (
            _checked(settings["parse"]) if settings.get("parse") else kind if kind in (int, float, str, Path) else str
        )
        extra = {"action": "append", "default": argparse.SUPPRESS} if settings.get("repeat") else {"default": initial}
        if settings.get("alone") is not None:
            extra |= {"nargs": "?", "const": settings["alone"]}
        where.add_argument(
            *names,
            dest=f.name,
            type=parse,
            choices=settings.get("choices"),
            metavar=_metavar(f, kind),
            help=text,
            **({"required": True} if required else {}),
            **extra,
        )
    return group


def given(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The fields of ``cls`` that the command line set (with ``add_arguments(..., overrides_only=True)``)."""
    found = {f.name: getattr(args, f.name) for f in fields(cls) if f.init and hasattr(args, f.name)}
    return {name: tuple(v) if isinstance(v, list) else v for name, v in found.items()}  # a repeated flag


def from_args(cls: type, args: argparse.Namespace, **values: Any) -> Any:
    """An instance of ``cls`` from the flags that ``add_arguments`` added (``values`` win)."""
    return cls(**(given(cls, args) | values))
