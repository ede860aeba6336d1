"""Every public role variable is prefixed with its role's name and documented in ansible/README.md, with
its default as defaults/main.yml sets it;
every role has the geerlingguy layout (defaults, meta, tasks) and names its tasks in full sentences.

    .venv/bin/python -m pytest tests/ansible/test_role_docs.py
"""

import re
from pathlib import Path

import pytest
import yaml

ROLES = Path(__file__).resolve().parents[2] / "ansible" / "roles"
README = (ROLES.parent / "README.md").read_text()
ROLE_NAMES = sorted(p.name for p in ROLES.iterdir() if p.is_dir())


def test_the_deploy_roles_are_all_there() -> None:
    expected = {"base", "nvidia_driver", "docker", "nvidia_container_toolkit", "image", "cluster", "cluster_config",
                "launch", "verify", "gpu_facts"}  # fmt: skip
    assert expected <= set(ROLE_NAMES)


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_public_variables_are_prefixed_and_documented(role: str) -> None:
    defaults = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()) or {}
    assert defaults, f"{role} has no documented defaults"
    for name in defaults:
        assert name.startswith(f"{role}_"), f"{role}: variable {name} lacks the role prefix"
        assert f"`{name}`" in README, f"{role}: {name} is not in ansible/README.md"


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_tasks_are_named_in_full_sentences_with_qualified_modules(role: str) -> None:
    for path in sorted((ROLES / role).glob("*/*.yml")):
        if path.parent.name not in ("tasks", "handlers"):
            continue
        for task in yaml.safe_load(path.read_text()) or []:
            for item in [task, *task.get("block", []), *task.get("always", [])]:
                name = item.get("name", "")
                assert name[:1].isupper() and name.endswith("."), f"{path}: task name {name!r} is not a sentence"
                modules = [k for k in item if "." in k and k.split(".")[0] in ("ansible", "community")]
                assert modules or "block" in item, f"{path}: {name!r} uses no fully qualified module"


def test_every_documented_variable_is_a_role_default() -> None:
    documented = re.findall(r"^\| `([a-z0-9_]+)` \|", README.split("## Role variables", 1)[1], re.M)
    defaults = {
        name for role in ROLE_NAMES for name in yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text())
    }
    assert documented and set(documented) <= defaults, f"README documents stale variables: {set(documented) - defaults}"


def shown(value: object) -> str:
    """A default as the README's tables show it: YAML flow style, ``|`` escaped, cut at 60 characters."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**9).strip().removesuffix("\n...").strip()
    text = text.replace("|", "\\|")
    return text if len(text) <= 60 else text[:57] + "..."


@pytest.mark.parametrize("role", ROLE_NAMES)
def test_documented_defaults_are_the_role_defaults(role: str) -> None:
    table = dict(re.findall(r"^\| `([a-z0-9_]+)` \| (.*?) \| .*\|$", README.split("## Role variables", 1)[1], re.M))
    defaults = yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()) or {}
    for name, value in defaults.items():
        documented = table.get(name, "(not documented)")
        if isinstance(value, str) and "\n" in value and "{{" in value and not documented.startswith("`"):
            continue  # a multi-line template: its cell says in words what it computes
        assert documented == f"`{shown(value)}`", f"{role}: ansible/README.md gives {name} the default {documented}"
