"""Deploy the cluster with Ansible (ansible/deploy.yml through ansible-runner): provision the
nodes, ship the image, write hostfile and env, run `app check` and the training, bring the
summary back to runs/ansible/<job>/.

    python -m app deploy -i ansible/inventory/gpu-cluster.yml
    python -m app deploy -i ansible/inventory/local-nodes.yml --tags verify
    python -m app deploy -i ansible/inventory/gpu-cluster.yml --check
    python -m app deploy -i inv.yml -e launch_rerun=true -e image_source=pull
    python -m app deploy -i inv.yml -e '{"cluster_spec": {"job": {"command": "check", "launcher": "mpirun"}}}'
    cd ansible && ../.venv/bin/ansible-playbook deploy.yml -i inventory/gpu-cluster.yml   # the same, directly

Needs ansible and ansible-runner on this machine (`make venv` puts them in .venv; or pip install
'ddp-cluster[deploy]'), not torch: run it with the venv's Python (.venv/bin/python -m app deploy) or
with the venv active. Nothing changes on any node before every node answers and every value is
valid (deploy.yml's check plays). The exit status is 0 when the play succeeded; 2 for bad input
(flags, the inventory, the cluster spec, two hosts on one address: the check plays' findings,
nothing changed); 1 when the deploy failed (a node unreachable, a task failed), naming the host and
the task.
"""

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from app import flags, logs
from app.errors import ClusterError, UsageError, clip, install_extra
from app.flags import flag

ANSIBLE_DIR = Path("ansible")
"""The checkout's ansible/ folder (deploy.yml, ansible.cfg, roles/), from the folder the command runs in."""


@dataclass(frozen=True)
class DeployConfig:
    """One run of deploy.yml."""

    inventory: Path = field(metadata=flag(short="-i", metavar="INVENTORY"))
    """Inventory with the group ddp_cluster (see ansible/inventory/gpu-cluster.example.yml)."""
    extravars: dict[str, object] = field(
        default_factory=dict,
        metadata=flag(option="--extra-vars", short="-e", repeat=True, metavar="KEY=VALUE", show="none"),
    )
    """Role variable, repeatable (KEY=VALUE, VALUE as JSON if it parses, or a JSON object); highest precedence."""
    tags: str = field(default="", metadata=flag(short="-t", metavar="TAGS", show="all"))
    """Only these tags (comma separated): base,nvidia,docker,image,config,verify,launch."""
    skip_tags: str = field(default="", metadata=flag(metavar="SKIP_TAGS", show="none"))
    """Skip these tags."""
    limit: str = field(default="", metadata=flag(short="-l", metavar="LIMIT", show="all"))
    """Only these hosts (all hosts of a job must be included)."""
    check: bool = False
    """Dry run (--check --diff): show what would change, run no job."""
    timeout_s: int = field(default=7200, metadata=flag(option="--timeout", metavar="TIMEOUT"))
    """Stop the whole run after this many seconds."""
    ansible_dir: Path = field(default=ANSIBLE_DIR, metadata=flag(metavar="ANSIBLE_DIR"))
    """Folder holding deploy.yml and ansible.cfg."""
    quiet: bool = field(default=False, metadata=flag(short="-q"))
    """No Ansible output, only the result line."""

    def __post_init__(self) -> None:
        if not self.inventory.exists():
            raise UsageError(
                f"inventory {self.inventory} does not exist: copy "
                "ansible/inventory/gpu-cluster.example.yml and list your nodes"
            )
        if not (self.ansible_dir / "deploy.yml").is_file():
            raise UsageError(
                f"{self.ansible_dir}/deploy.yml not found: run from a ddp-cluster checkout or give --ansible-dir"
            )
        if self.timeout_s < 1:
            raise UsageError(f"--timeout {self.timeout_s} must be >= 1 second")


def parse_extravar(text: str) -> dict[str, object]:
    """``KEY=VALUE`` (VALUE parsed as JSON when it is JSON, else a string) or a JSON object."""
    if text.lstrip().startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise UsageError(f"-e {text!r} is not a JSON object: {error.msg}") from None
        if not isinstance(value, dict):
            raise UsageError(f"-e {text!r} must be a JSON object or KEY=VALUE")
        return value
    key, sep, raw = text.partition("=")
    if not sep or not key.isidentifier():
        raise UsageError(f"-e {text!r} must look like KEY=VALUE, e.g. -e launch_rerun=true")
    try:
        return {key: json.loads(raw)}
    except json.JSONDecodeError:
        return {key: raw}


def _result_message(result: dict) -> str:
    """The most telling line of a failed task's result: a failed loop item's, a failed module's
    under fact gathering, a command's stderr, else Ansible's message."""
    for item in result.get("results") or []:
        if isinstance(item, dict) and item.get("failed"):
            return _result_message(item)
    for module in (result.get("failed_modules") or {}).values():
        detail = str(module.get("module_stderr") or module.get("msg") or "").strip()
        if detail:
            return detail
    stderr = str(result.get("stderr") or "").strip()
    if stderr and result.get("rc"):
        return stderr.splitlines()[-1]
    return str(result.get("msg") or stderr or "failed").strip()


CHECK_PLAY = "Check "
"""How deploy.yml's plays that change nothing begin their names: a failure there is bad input (the
inventory, the spec, a host's address) and left every node as it was."""


GATHER_FACTS = "Gathering Facts"
"""Ansible's name of a play's first task: a host that fails it answers no task (its container stopped, say)."""


@dataclass(frozen=True)
class Failure:
    """The first failed or unreachable task of a run."""

    host: str
    task: str
    message: str
    play: str
    unreachable: bool
    """Ansible could not reach the host, or run Python there to gather its facts (a stopped node container)."""

    def error(self) -> UsageError | ClusterError:
        """The one error of this failure: bad input found by a check play (exit 2), else the deploy failed (1)."""
        checked = self.play.startswith(CHECK_PLAY)
        if self.unreachable:
            before = "; nothing was changed" if checked else ""
            return ClusterError(
                f"deploy stopped: {self.host} does not answer ({self.message}): start it, or leave it out of "
                f"the inventory{before}"
            )
        if checked:
            where = "" if self.host == "localhost" else f"{self.host}: "  # the inventory's own check
            return UsageError(f"deploy stopped before any change: {where}{self.message}")
        return ClusterError(f"deploy failed on {self.host}: task '{self.task}': {self.message}")


def first_failure(events: list[dict]) -> Failure | None:
    """The first failed or unreachable task whose error was not ignored, or None."""
    for event in events:
        if event.get("event") in ("runner_on_failed", "runner_on_unreachable"):
            data = event.get("event_data", {})
            if data.get("ignore_errors"):
                continue
            message = " ".join(_result_message(data.get("res", {})).split())
            return Failure(
                host=str(data.get("host", "?")),
                task=str(data.get("task", "?")),
                message=clip(logs.cause_of(message), 500),
                play=str(data.get("play", "")),
                unreachable=event["event"] == "runner_on_unreachable" or data.get("task") == GATHER_FACTS,
            )
    return None


def ansible_playbook() -> str:
    """Path of ansible-playbook: beside this Python (a venv) first, else on PATH."""
    beside = Path(sys.executable).parent / "ansible-playbook"
    found = str(beside) if beside.is_file() else shutil.which("ansible-playbook")
    if not found:
        raise UsageError(f"ansible-playbook not found (the [deploy] extra): {install_extra('deploy')}")
    return found


def deploy(cfg: DeployConfig) -> int:
    """Run deploy.yml with ansible-runner; return the number of changes (--check: those a real run would
    make). Raise UsageError when a check play found bad input, ClusterError when the deploy failed."""
    try:
        import ansible_runner
    except ImportError:
        raise UsageError(f"ansible-runner is not installed (the [deploy] extra): {install_extra('deploy')}") from None
    # With `binary` set, ansible-runner passes no playbook itself: it leads the command line.
    cmdline = "deploy.yml" + (" --check --diff" if cfg.check else "")
    with tempfile.TemporaryDirectory(prefix="ddp-deploy-") as private:
        runner = ansible_runner.run(
            private_data_dir=private,
            project_dir=str(cfg.ansible_dir.resolve()),
            playbook="deploy.yml",
            binary=ansible_playbook(),
            inventory=str(cfg.inventory.resolve()),
            extravars=cfg.extravars,
            tags=cfg.tags or None,
            skip_tags=cfg.skip_tags or None,
            limit=cfg.limit or None,
            cmdline=cmdline,
            envvars={"ANSIBLE_CONFIG": str(cfg.ansible_dir.resolve() / "ansible.cfg")},
            timeout=cfg.timeout_s,
            quiet=cfg.quiet,
        )
        if runner.status == "successful":
            return sum((runner.stats or {}).get("changed", {}).values())
        if runner.status == "timeout":
            raise ClusterError(f"deploy ran past --timeout {cfg.timeout_s}s and was stopped")
        failure = first_failure(list(runner.events))
        if failure is None:
            raise ClusterError(f"deploy failed (ansible-playbook: {runner.status}): see the output above")
        raise failure.error()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m app deploy``: one per field of DeployConfig."""
    flags.add_arguments(parser, DeployConfig)


def run(args: argparse.Namespace) -> int:
    """Parse the flags into a DeployConfig and run it."""
    extravars: dict[str, object] = {}
    for item in flags.given(DeployConfig, args).get("extravars", ()):
        extravars |= parse_extravar(item)
    cfg = flags.from_args(DeployConfig, args, extravars=extravars)
    changes = deploy(cfg)
    if cfg.check:
        print(f"deploy: ok (check mode: a real run would make {changes} change(s); none was made)")
    else:
        print(f"deploy: ok ({changes} change(s); results in runs/ansible/)")
    return 0
