"""The layout tree (docs/layout.md, linked from the README) matches the tree: every module of app/ is
named under its package, and every top-level folder of the repository is there (and nothing that is not)."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_LINE = re.compile(r"^(?P<indent> *)(?P<name>[\w.]+)/\s")


def layout_block(readme: str) -> str:
    """The first ```text block of docs/layout.md."""
    section = readme[readme.index("# Layout\n") :]
    start = section.index("```text\n") + len("```text\n")
    return section[start : section.index("```\n", start)]


def named_modules(block: str) -> set[str]:
    """'app/train/main.py' for each *.py word of the block, placed under the package lines above it."""
    named, packages = set(), []
    for line in block.splitlines():
        heading = PACKAGE_LINE.match(line)
        if heading:
            depth = len(heading["indent"]) // 2
            packages = [*packages[:depth], heading["name"]]
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        for word in re.findall(r"\b[\w]+\.py\b", line):
            named.add("/".join([*packages[:depth], word]))
    return named


def tracked() -> list[str]:
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return files.split()


@pytest.fixture(scope="module")
def block() -> str:
    return layout_block((ROOT / "docs" / "layout.md").read_text())


def test_every_app_module_is_in_the_layout_tree(block: str) -> None:
    modules = {path for path in tracked() if path.startswith("app/") and path.endswith(".py")}
    modules -= {path for path in modules if path.endswith("/__init__.py")}
    named = named_modules(block)
    assert sorted(modules - named) == [], "add these modules to docs/layout.md's layout tree"
    assert sorted(named - modules) == [], "the layout tree names modules that do not exist"


def test_every_top_level_folder_is_in_the_layout_tree(block: str) -> None:
    folders = {path.split("/")[0] for path in tracked() if "/" in path}
    listed = {match["name"] for match in map(PACKAGE_LINE.match, block.splitlines()) if match and not match["indent"]}
    listed |= {line.split()[0].split("/")[0] for line in block.splitlines() if line.startswith(".")}
    assert sorted(folders - listed) == [], "add these folders to docs/layout.md's layout tree"
    assert sorted(listed - folders) == [], "the layout tree names folders that do not exist"


def test_the_parser_places_a_module_under_its_package() -> None:
    block = "app/  x\n  a.py  one; b.py: two\n  sub/  y\n    c.py  three\n  d.py  four\nother/  z\n"
    assert named_modules(block) == {"app/a.py", "app/b.py", "app/sub/c.py", "app/d.py"}
