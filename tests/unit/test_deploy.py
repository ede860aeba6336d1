"""`python -m app deploy`: flag parsing, input checks and the one-line failure summary (no Ansible run).

.venv/bin/python -m pytest tests/unit/test_deploy.py
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from app.errors import ClusterError, UsageError
from app.orchestrate.deploy import ANSIBLE_DIR, CHECK_PLAY, DeployConfig, Failure, first_failure, parse_extravar
from tests.deps import need


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
    failure = first_failure(events)
    assert failure is not None and (failure.host, failure.task, failure.unreachable) == ("n1", "Gathering Facts", True)
    assert failure.message == "Error response from daemon: No such container: n1"
    assert first_failure([]) is None


def test_first_failure_digs_into_loop_items_and_command_errors() -> None:
    item = {
        "failed": True,
        "rc": 2,
        "msg": "non-zero return code",
        "stderr": "Traceback ...\nerror: torchrun needs the same slots on every host, got [2, 3]",
    }
    events = [{"event": "runner_on_failed", "event_data": {"host": "localhost", "task": "Render", "res": {
        "msg": "One or more items failed", "results": [{"failed": False}, item]}}}]  # fmt: skip
    failure = first_failure(events)
    assert failure is not None and failure.task == "Render"
    assert failure.message == "torchrun needs the same slots on every host, got [2, 3]"


def failed_in(play: str, message: str, event: str = "runner_on_failed", task: str = "Check it.") -> Failure | None:
    data = {"host": "n0", "task": task, "play": play, "res": {"msg": message}}
    return first_failure([{"event": event, "event_data": data}])


def test_a_check_play_failure_is_bad_input_with_one_exit_status_in_its_line() -> None:
    app_line = "error: --spec-json [job]: unknown key 'comand': the keys are name, command [exit 2]"
    failure = failed_in(f"{CHECK_PLAY}every node.", app_line)
    assert failure is not None
    error = failure.error()
    assert isinstance(error, UsageError), "bad input found before any change exits 2, as --help says"
    cause = "--spec-json [job]: unknown key 'comand': the keys are name, command"
    assert str(error) == f"deploy stopped before any change: n0: {cause}"
    assert "exit" not in str(error) and "rc=" not in str(error)


def test_a_failure_after_the_checks_and_a_node_that_does_not_answer_are_a_failed_deploy() -> None:
    failure = failed_in("Provision the nodes.", "No package matching 'nope'")
    assert failure is not None
    error = failure.error()
    assert isinstance(error, ClusterError) and error.status == 1
    assert str(error) == "deploy failed on n0: task 'Check it.': No package matching 'nope'"
    lost = failed_in(f"{CHECK_PLAY}every node.", "container n0 is not running", event="runner_on_unreachable")
    assert lost is not None
    error = lost.error()
    assert isinstance(error, ClusterError) and error.status == 1
    assert str(error) == (
        "deploy stopped: n0 does not answer (container n0 is not running): start it, or leave it out of the "
        "inventory; nothing was changed"
    )
    # The docker connection reports a stopped node container as a failed fact gathering, not unreachable.
    stopped = failed_in(f"{CHECK_PLAY}every node.", "Container 1f is not running", task="Gathering Facts")
    assert stopped is not None and isinstance(stopped.error(), ClusterError)
    assert str(stopped.error()).startswith("deploy stopped: n0 does not answer (Container 1f is not running)")


def test_deploy_yml_changes_nothing_before_its_check_plays_end() -> None:
    plays = need("yaml").safe_load((ANSIBLE_DIR / "deploy.yml").read_text())
    checks = [play for play in plays if play["name"].startswith(CHECK_PLAY)]
    assert plays[: len(checks)] == checks, "the check plays come first"
    nodes = [play for play in checks if play["hosts"] == "ddp_cluster"]
    assert nodes and all(play["any_errors_fatal"] and play["max_fail_percentage"] == 0 for play in nodes)
    assert all(play.get("tags") == ["always"] for play in checks), "every --tags run checks first"


def test_deploy_imports_no_torch() -> None:
    code = "import sys, app.orchestrate.deploy; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--check"], "deploy: ok (check mode: a real run would make 8 change(s); none was made)\n"),
        ([], "deploy: ok (8 change(s); results in runs/ansible/)\n"),
    ],
)
def test_the_result_line_counts_the_changes_never_says_nothing_changed_beside_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, flags: list[str], said: str
) -> None:
    from app import cli
    from app.orchestrate import deploy

    inventory = tmp_path / "inv.yml"
    inventory.write_text("all: {}\n")
    monkeypatch.setattr(deploy, "deploy", lambda cfg: 8)  # what a --check on bare nodes reported: changed=8
    assert cli.main(["deploy", "-i", str(inventory), "--log-dir", str(tmp_path), *flags]) == 0
    assert capsys.readouterr().out == said
