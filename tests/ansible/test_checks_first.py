"""deploy.yml checks every node and every value before it changes anything: a node that does not
answer, two inventory hosts on one machine, or a spec typo stops the run on bare nodes with one
line and the documented exit status (2: bad input, 1: a node unreachable), and the nodes are left
as they were (no Docker installed, no /etc/hosts block written).

    make images && flock /tmp/engine.lock .venv/bin/python -m pytest tests/ansible/test_checks_first.py -m ansible
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from nodes import nodes

from app.orchestrate import engine
from tests.ansible.conftest import ansible_env

pytestmark = [pytest.mark.ansible, pytest.mark.slow]
HOSTS_BLOCK = "ddp-cluster hosts (managed by Ansible)"


def app_deploy(inventory: Path, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "app", "deploy", "-i", str(inventory), *args]
    return subprocess.run(command, cwd=nodes.REPO, capture_output=True, text=True, timeout=900, env=ansible_env())


def one_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def untouched(name: str) -> None:
    """The node is as bare as it started: no managed /etc/hosts block, no Docker engine installed."""
    hosts = nodes.exec_in(name, "cat", "/etc/hosts").stdout
    assert HOSTS_BLOCK not in hosts, hosts
    assert nodes.exec_in(name, "sh", "-c", "command -v dockerd", check=False).returncode != 0


def test_two_local_hosts_on_one_machine_stop_the_run_before_any_play_changes_it(tmp_path: Path) -> None:
    # Real ansible on this machine, no containers: both hosts are this machine (local connection).
    inventory = tmp_path / "twice.yml"
    local = {"ansible_connection": "local", "ansible_python_interpreter": "/usr/bin/python3", "ansible_become": False}
    group = {"hosts": {"a": {}, "b": {}}, "vars": local}
    inventory.write_text(yaml.safe_dump({"all": {"children": {"ddp_cluster": group}}}))
    result = app_deploy(inventory, "--check")
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr
    line = one_line(result)
    assert line.startswith("error: deploy stopped before any change: a: a and b (") and line.endswith("[exit 2]"), line
    assert "have the same address" in line and "list each machine once" in line, line
    assert "PLAY [Provision the nodes.]" not in result.stdout, "a play that changes the nodes ran"


@pytest.fixture(scope="module")
def bare_nodes(node_cluster: dict) -> dict:
    """Two bare node containers (nothing provisioned): every run below must leave them so."""
    return node_cluster


@pytest.mark.docker
def test_a_spec_typo_on_bare_nodes_installs_nothing(bare_nodes: dict) -> None:
    spec = {"cluster_spec": {"job": {"comand": "check"}}}
    result = app_deploy(bare_nodes["inventory"], "-q", "-e", json.dumps(spec))
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr
    line = one_line(result)
    assert line.startswith("error: deploy stopped before any change: ") and line.endswith("[exit 2]"), line
    assert "--spec-json [job]: unknown key 'comand'" in line and line.count("exit") == 1, line
    for name in bare_nodes["names"]:
        untouched(name)


@pytest.mark.docker
def test_two_inventory_hosts_on_one_node_write_no_hosts_file(bare_nodes: dict, tmp_path: Path) -> None:
    data = yaml.safe_load(bare_nodes["inventory"].read_text())
    first = bare_nodes["names"][0]
    data["all"]["children"]["ddp_cluster"]["hosts"] = {"a": {"ansible_host": first}, "b": {"ansible_host": first}}
    inventory = tmp_path / "twice.yml"
    inventory.write_text(yaml.safe_dump(data))
    result = app_deploy(inventory, "-q")
    assert result.returncode == 2, result.stdout[-3000:] + result.stderr
    line = one_line(result)
    assert "a and b (" in line and "have the same address on eth0" in line and "check ansible_host" in line, line
    untouched(first)


@pytest.mark.docker
def test_a_stopped_node_stops_the_run_before_the_others_change(bare_nodes: dict) -> None:
    first, second = bare_nodes["names"]
    engine.client().containers.get(second).stop(timeout=1)
    result = app_deploy(bare_nodes["inventory"], "-q")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr
    line = one_line(result)
    assert line.startswith(f"error: deploy stopped: {second} does not answer ("), line
    assert re.search(r"nothing was changed \[exit 1; log \S+\]$", line), line
    assert "start it, or leave it out of the inventory; nothing was changed" in line, line
    assert "HostVarsVars" not in result.stdout + result.stderr
    untouched(first)
