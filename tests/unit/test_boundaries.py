"""Rules over every module of app/, read from the sources: only app/runtime/launcher.py reads
the environment, and the workload (app/train) never imports the launcher module (it gets the
process's ProcessInfo from the process group, ``ctx.proc``); no package imports from a higher floor. And,
from a fresh process: the host side's commands import only the stdlib (pip's light install)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import app

APP = Path(app.__file__).parent
LAUNCHER = "app.runtime.launcher"
ENVIRONMENT = {"environ", "environb", "getenv", "getenvb"}


def _module(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(path: Path) -> str:
    module = _module(path)
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def env_reads(source: str) -> list[str]:
    """Where ``source`` reaches the process environment: os.environ, os.getenv, or those imported from os."""
    tree = ast.parse(source)
    os_names = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name == "os"
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ENVIRONMENT:
            if isinstance(node.value, ast.Name) and node.value.id in os_names:
                found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os" and node.level == 0:
            found += [f"line {node.lineno}: from os import {a.name}" for a in node.names if a.name in ENVIRONMENT]
    return found


def launcher_imports(source: str, package: str) -> list[str]:
    """Where ``source`` (a module of ``package``) imports app.runtime.launcher or something from it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([base] if base else [])])
            modules = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        if any(m == LAUNCHER or m.startswith(LAUNCHER + ".") for m in modules):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_only_the_launcher_reads_the_environment() -> None:
    offenders = {
        _module(path): reads
        for path in sorted(APP.rglob("*.py"))
        if _module(path) != LAUNCHER and (reads := env_reads(path.read_text()))
    }
    assert offenders == {}, "read the value in app/runtime/launcher.py (ProcessInfo) and pass it on"


def test_the_launcher_reads_it_and_the_check_sees_that() -> None:
    # Positive control on real code: the one module allowed to read the environment does so.
    assert env_reads((APP / "runtime" / "launcher.py").read_text())


def test_the_workload_never_imports_the_launcher() -> None:
    train = sorted((APP / "train").rglob("*.py"))
    assert len(train) > 5
    offenders = {
        _module(path): found for path in train if (found := launcher_imports(path.read_text(), _package(path)))
    }
    assert offenders == {}, "use ctx.proc (app.runtime.distributed.DistContext) instead"


@pytest.mark.parametrize(
    "source",
    [
        "import os\nos.environ['RANK']",
        "import os\nx = os.getenv('RANK', '0')",
        "import os as system\nsystem.environ.get('RANK')",
        "from os import environ",
        "from os import getenv as get",
        "def f():\n    import os\n    return dict(os.environ)",
    ],
)
def test_an_environment_read_is_caught(source: str) -> None:
    assert env_reads(source)


@pytest.mark.parametrize(
    "source",
    ["import os\nos.path.join('a', 'b')", "environ = {}\nenviron.get('RANK')", "from os import path", "x.environ"],
)
def test_other_code_is_not_an_environment_read(source: str) -> None:
    assert env_reads(source) == []


@pytest.mark.parametrize(
    "source",
    [
        "from app.runtime import launcher",
        "from app.runtime.launcher import ProcessInfo",
        "import app.runtime.launcher",
        "import app.runtime.launcher as where",
        "from ..runtime import launcher",
        "from ..runtime.launcher import detect",
        "def f():\n    from app.runtime import distributed, launcher",
    ],
)
def test_a_launcher_import_is_caught(source: str) -> None:
    assert launcher_imports(source, "app.train")


@pytest.mark.parametrize(
    "source",
    [
        "from app.runtime.distributed import process_group",
        "from app.runtime import distributed",
        "from . import data",
    ],
)
def test_other_imports_are_not_launcher_imports(source: str) -> None:
    assert launcher_imports(source, "app.train") == []


FLOORS = ("runtime", "topology", "diagnostics", "train", "node", "orchestrate")
"""app's packages from the lowest floor up: a module imports only from its own floor or those below
(the modules directly in app/, errors, logs, flags and the like, serve every floor)."""


def app_imports(source: str) -> list[tuple[int, str]]:
    """(line, module) for each absolute import of an app module in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.startswith("app.")]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("app."):
            found.append((node.lineno, node.module))
    return found


def upward_imports(path: Path) -> list[str]:
    """The imports of a module of app/<floor>/ that reach a higher floor."""
    parts = path.relative_to(APP).parts
    if len(parts) < 2 or parts[0] not in FLOORS:
        return []
    own = FLOORS.index(parts[0])
    return [
        f"line {line}: {module}"
        for line, module in app_imports(path.read_text())
        if (floor := module.split(".")[1]) in FLOORS and FLOORS.index(floor) > own
    ]


def test_every_package_of_app_is_a_floor() -> None:
    packages = {path.parent.relative_to(APP).parts[0] for path in APP.glob("*/__init__.py")}
    assert packages == set(FLOORS)


def test_no_module_imports_from_a_higher_floor() -> None:
    offenders = {_module(path): found for path in sorted(APP.rglob("*.py")) if (found := upward_imports(path))}
    assert offenders == {}


def test_an_upward_import_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module = tmp_path / "runtime" / "x.py"
    module.parent.mkdir()
    module.write_text("from app.train import trainer\nfrom app.errors import UsageError\nimport app.topology.spec\n")
    monkeypatch.setattr(sys.modules[__name__], "APP", tmp_path)
    assert upward_imports(module) == ["line 1: app.train", "line 3: app.topology.spec"]


def test_nothing_a_node_runs_imports_the_host_side() -> None:
    """app/orchestrate (the runner, status, deploy) runs on the host: no other module imports it (app/cli.py names
    its commands by their modules' names). The node's metrics once imported the host's status to fold the events;
    they fold them with app/job_state.py, as the runner and the status do."""
    offenders = {
        _module(path): [f"line {line}: {module}" for line, module in found]
        for path in sorted(APP.rglob("*.py"))
        if "orchestrate" not in path.relative_to(APP).parts
        and (found := [(line, m) for line, m in app_imports(path.read_text()) if m.startswith("app.orchestrate")])
    }
    assert offenders == {}


HOST_SIDE = ("cluster", "topology", "deploy")
"""The commands of pip's light install (no [node] extra: no torch, no numpy)."""
_IMPORTED = """
import sys
before = set(sys.modules)
from app import cli
for name in {names}:
    cli.build_parser(name)
print(" ".join(sorted({{m.partition(".")[0] for m in set(sys.modules) - before}})))
"""


def _imported_by(names: tuple[str, ...]) -> set[str]:
    """The top-level modules that building these commands' parsers imports (their modules, in a fresh process)."""
    code = _IMPORTED.format(names=names)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=APP.parent, check=True)
    return set(done.stdout.split())


def test_the_host_side_commands_import_only_the_stdlib_and_the_app() -> None:
    assert _imported_by(HOST_SIDE) - set(sys.stdlib_module_names) == {"app"}
    assert {"torch", "numpy"} <= _imported_by(("train",))  # the control: a node-side command's imports are seen
