"""The commands and files that the pages quote exist: every ``make TARGET`` is a target that ``make help`` lists, every
``python -m MODULE`` is a module found from the repository's root (one under docker/, such as ``bench.faults``, with
``PYTHONPATH=docker`` in the same command, as make runs it), every ``python -m app COMMAND`` is an app command, and
every file of the repository that a page names (in code or as a link) is there. What a command then does is the
business of its own tests (test_compose.py: the files that the compose command quoted in compose.yaml and
docs/engines.md names are the ones app topology writes).

    .venv/bin/python -m pytest tests/unit/test_doc_commands.py      # a few seconds (it runs make help once)
"""

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from app import cli

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    ROOT / "README.md",
    *sorted(ROOT.glob("*/README.md")),
    *sorted(ROOT.glob("docker/*/README.md")),
    *sorted((ROOT / "docs").glob("*.md")),
]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
MAKE = re.compile(r"(?<![\w/.-])make(?: +[A-Z_]+=\S*| +-\S+)* +([a-z][\w.-]*)(\*?)")
"""``make [VAR=value | -flag]... TARGET``; ``make slurm-*`` (a trailing star) names the targets that start so."""
PYTHON_M = re.compile(r"(?:\S*/)?python3? -m ([\w.]+)(?: +([a-z][\w-]*))?")
"""``python -m MODULE [WORD]``; WORD: the command of ``python -m app``."""


def code(text: str) -> list[str]:
    """The page's code: each line of its fenced blocks, and each inline span (lines joined: a span may wrap)."""
    lines = [line for block in FENCE.findall(text) for line in block.splitlines()]
    return lines + SPAN.findall(" ".join(FENCE.sub("", text).split()))


def repo_paths(chunk: str, tops: set[str]) -> list[str]:
    """The words of ``chunk`` that name a file or folder of the repository: under one of its top-level folders
    (``docker/bench/faults.py``), or relative to the page (``../docker/bench/``); a word with a star is a pattern
    (``docker/bin/ddp-*``); another placeholder ends a word (``tests/unit/golden/<name>``)."""
    found = re.findall(r"(?<![\w/.$~-])((?:\.\./)*[\w.-]+/[\w./*-]*)", chunk)
    return [word.rstrip(".") for word in found if word.lstrip("./").split("/")[0] in tops]


def missing_paths(page: Path, tops: set[str]) -> list[str]:
    text = page.read_text()
    named = {word for chunk in code(text) for word in repo_paths(chunk, tops)}
    named -= set(re.findall(r"\bcp \S+ ([^\s`]+)", text))  # what the page has the reader write (an example copied)
    named |= {link for link in LINK.findall(text) if "://" not in link and not link.startswith("mailto:")}
    return sorted(word for word in named if not any(_exists(base, word) for base in (ROOT, page.parent)))


def _exists(base: Path, word: str) -> bool:
    return any(base.glob(word)) if "*" in word else (base / word).exists()


def missing_targets(chunks: list[str], targets: set[str]) -> list[str]:
    said = [(m[1], m[2]) for chunk in chunks for m in MAKE.finditer(chunk)]
    return sorted({f"make {name}{star}" for name, star in said if not _is_target(name, star, targets)})


def _is_target(name: str, star: str, targets: set[str]) -> bool:
    return any(t.startswith(name) for t in targets) if star else name in targets


def missing_modules(chunks: list[str]) -> list[str]:
    """``python -m X`` that would not run as written from the repository's root."""
    wrong = []
    for chunk in chunks:
        for m in PYTHON_M.finditer(chunk):
            module, word = m[1], m[2]
            if module == "app" and word and word not in cli.COMMANDS:
                wrong.append(f"python -m app {word}: no such command")
            elif _under_docker(module) and "PYTHONPATH=docker" not in chunk[: m.start()]:
                wrong.append(f"python -m {module}: found only with PYTHONPATH=docker (docker/{module.split('.')[0]})")
            elif not _under_docker(module) and not _found(module):
                wrong.append(f"python -m {module}: no such module")
    return sorted(set(wrong))


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its package is not there either
        return False


def _under_docker(module: str) -> bool:
    top = module.split(".")[0]
    return (ROOT / "docker" / top / "__init__.py").is_file() or (ROOT / "docker" / f"{top}.py").is_file()


@pytest.fixture(scope="module")
def targets() -> set[str]:
    """The targets that ``make help`` lists."""
    done = subprocess.run(
        ["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    plain = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout)
    return set(re.findall(r"^  ([\w.-]+)", plain, re.MULTILINE))


@pytest.fixture(scope="module")
def tops() -> set[str]:
    """The repository's top-level folders."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    return {path.split("/")[0] for path in files if "/" in path}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_make_target_a_page_quotes_is_one_make_help_lists(page: Path, targets: set[str]) -> None:
    assert missing_targets(code(page.read_text()), targets) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_module_a_page_quotes_runs_as_written(page: Path) -> None:
    assert missing_modules(code(page.read_text())) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_of_the_repository_a_page_names_is_there(page: Path, tops: set[str]) -> None:
    assert missing_paths(page, tops) == []


def test_the_checks_find_what_a_page_gets_wrong(tmp_path: Path, targets: set[str], tops: set[str]) -> None:
    """The negative controls: the commands this issue found moved or never written so (issue 37)."""
    assert len(targets) > 30 and {"help", "bench-faults", "slurm-up"} <= targets
    said = ["make bench-faults", "make slurm-*", "make bench-fault", "make nosuch-*", "make NODES=3 cluster-upp"]
    assert missing_targets(said, targets) == ["make bench-fault", "make cluster-upp", "make nosuch-*"]
    said = ["python -m app cluster up", "python -m app clusters", "python -m tests.rigs.faults.bench",
            "python -m bench.faults", "PYTHONPATH=docker:. python -m bench.faults --help"]  # fmt: skip
    assert missing_modules(said) == [
        "python -m app clusters: no such command",
        "python -m bench.faults: found only with PYTHONPATH=docker (docker/bench)",
        "python -m tests.rigs.faults.bench: no such module",
    ]
    page = tmp_path / "page.md"
    page.write_text(
        "`tests/rigs/faults/bench.py`, `docker/bench/faults.py`, `build/x`, [y](docs/nosuch.md), "
        "`docker/bin/ddp-*`, `docker/bin/nosuch-*`, `cp a docs/mine.md`\n"
    )
    assert missing_paths(page, tops) == ["docker/bin/nosuch-*", "docs/nosuch.md", "tests/rigs/faults/bench.py"]
