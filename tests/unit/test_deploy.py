"""`python -m app deploy`: flag parsing, input checks and the one-line failure summary (no Ansible run).

.venv/bin/python -m pytest tests/unit/test_deploy.py
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.errors import UsageError
from app.orchestrate.deploy import ANSIBLE_DIR, DeployConfig, first_failure, parse_extravar


def test_extra_vars_accept_key_value_json_values_and_json_objects() -> None:
    assert parse_extravar("launch_rerun=true") == {"launch_rerun": True}
    assert parse_extravar("image_build_timeout=600") == {"image_build_timeout": 600}
    assert parse_extravar("image_source=pull") == {"image_source": "pull"}
    assert parse_extravar('launch_devices=["/dev/infiniband"]') == {"launch_devices": ["/dev/infiniband"]}
    assert parse_extravar('cluster_spec={"job": {"name": "run2"}}') == {"cluster_spec": {"job": {"name": "run2"}}}
    assert parse_extravar('{"a": 1, "b": [2]}') == {"a": 1, "b": [2]}


@pytest.mark.parametrize("text", ["novalue", "bad key=1", "=1", "{not json", "[1, 2]"])
def test_malformed_extra_vars_are_refused_in_one_line(text: str) -> None:
    with pytest.raises(UsageError) as error:
        parse_extravar(text)
    assert "\n" not in str(error.value)


def test_a_missing_inventory_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=re.escape("does not exist: copy ansible/inventory/gpu-cluster.example.yml")):
        DeployConfig(tmp_path / "nope.yml")


def test_a_folder_without_deploy_yml_is_refused(tmp_path: Path) -> None:
    inventory = tmp_path / "inv.yml"
    inventory.write_text("all: {}\n")
    with pytest.raises(UsageError, match=re.escape("deploy.yml not found")):
        DeployConfig(inventory, ansible_dir=tmp_path)
    assert DeployConfig(inventory).ansible_dir == ANSIBLE_DIR


def test_first_failure_names_host_task_and_the_telling_message() -> None:
    events = [
        {"event": "runner_on_ok", "event_data": {"host": "n0", "task": "ok"}},
        {"event": "runner_on_failed", "event_data": {"host": "n1", "task": "ignored", "ignore_errors": True,
                                                     "res": {"msg": "x"}}},
        {"event": "runner_on_failed", "event_data": {"host": "n1", "task": "Gathering Facts", "res": {
            "msg": "The following modules failed to execute: setup.",
            "failed_modules": {"setup": {"module_stderr": "Error response from daemon: No such container: n1\n"}}}}},
    ]  # fmt: skip
    assert first_failure(events) == "n1: task 'Gathering Facts': Error response from daemon: No such container: n1"
    assert first_failure([]) == ""


def test_first_failure_digs_into_loop_items_and_command_errors() -> None:
    item = {
        "failed": True,
        "rc": 2,
        "msg": "non-zero return code",
        "stderr": "Traceback ...\nerror: torchrun needs the same slots on every host, got [2, 3]",
    }
    events = [{"event": "runner_on_failed", "event_data": {"host": "localhost", "task": "Render", "res": {
        "msg": "One or more items failed", "results": [{"failed": False}, item]}}}]  # fmt: skip
    assert first_failure(events).endswith("'Render': error: torchrun needs the same slots on every host, got [2, 3]")


def test_deploy_imports_no_torch() -> None:
    code = "import sys, app.orchestrate.deploy; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
