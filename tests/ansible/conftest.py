"""Fixtures of the Ansible tests: node containers, their inventory, and ansible-runner runs."""

import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from nodes import nodes

from app import contract
from app.orchestrate import engine

ANSIBLE_DIR = nodes.REPO / "ansible"
WORKLOAD_IMAGE = contract.image(0)  # the cpu image, which the node containers run


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--ansible-image", default=WORKLOAD_IMAGE,
                     help=f"workload image the Ansible tests ship to the nodes (default {WORKLOAD_IMAGE})")  # fmt: skip


@dataclass
class Run:
    """The outcome of one ansible-playbook run."""

    status: str
    rc: int
    stats: dict
    stdout: str
    seconds: float

    def total(self, key: str) -> int:
        """Sum of one counter (changed, failures, ...) over all hosts."""
        return sum(self.stats.get(key, {}).values())


def ansible_env() -> dict[str, str]:
    """Environment for ansible-playbook: this one plus the repo's ansible.cfg and roles, the venv's binaries first."""
    bindir = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(ANSIBLE_DIR / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(ANSIBLE_DIR / "roles"),
        "ANSIBLE_NOCOLOR": "1",
        "PATH": f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    }


def run_playbook(playbook: Path, inventory: Path | str, extravars: dict | None = None, cmdline: str = "",
                 timeout: int = 1800, tags: str = "") -> Run:  # fmt: skip
    """Run a playbook with ansible-runner from ansible/ and return its status, stats and output."""
    import ansible_runner

    private = tempfile.mkdtemp(prefix="ddp-runner-")
    start = time.monotonic()
    runner = ansible_runner.run(
        private_data_dir=private,
        project_dir=str(ANSIBLE_DIR),
        playbook=str(playbook),
        inventory=str(inventory),
        extravars=extravars or {},
        cmdline=cmdline or None,
        tags=tags or None,
        envvars=ansible_env(),
        timeout=timeout,
        quiet=True,
    )
    seconds = time.monotonic() - start
    result = Run(runner.status, runner.rc, runner.stats or {}, runner.stdout.read(), seconds)
    shutil.rmtree(private, ignore_errors=True)
    return result


@pytest.fixture(scope="session")
def workload_image(request: pytest.FixtureRequest) -> str:
    """The workload image; it must be built (make images) before these tests."""
    image = request.config.getoption("--ansible-image")
    if not engine.has_image(image):
        pytest.fail(f"workload image {image} is missing: build it with `make images` (make test does)")
    return image


@pytest.fixture(scope="module")
def node_cluster(tmp_path_factory: pytest.TempPathFactory, workload_image: str):
    """Two node containers and an inventory for them; removed afterwards, leaving nothing."""
    prefix = f"ddp-test{os.getpid()}"
    names = nodes.up(prefix, 2)
    inventory = tmp_path_factory.mktemp("inventory") / "nodes.yml"
    inventory.write_text(yaml.safe_dump(nodes.inventory(prefix, 2), sort_keys=False))
    try:
        yield {"prefix": prefix, "names": names, "inventory": inventory, "image": workload_image}
    finally:
        nodes.down(prefix)
        assert nodes.leftovers(prefix) == [], f"node containers, volumes or network of {prefix} left behind"


def record_timing(name: str, seconds: float) -> None:
    """Add one measured duration to runs/ansible/timings.json (the closing note quotes them)."""
    path = nodes.REPO / "runs" / "ansible" / "timings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = round(seconds, 1)
    path.write_text(json.dumps(data, indent=2) + "\n")
