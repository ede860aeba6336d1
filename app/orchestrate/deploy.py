"""Deploy the cluster with Ansible (ansible/deploy.yml through ansible-runner): provision the
nodes, ship the image, write hostfile and env, run `app check` and the training, bring the
summary back to runs/ansible/<job>/.

    python -m app deploy -i ansible/inventory/gpu-cluster.yml
    python -m app deploy -i ansible/inventory/local-nodes.yml --tags verify
    python -m app deploy -i ansible/inventory/gpu-cluster.yml --check
    python -m app deploy -i inv.yml -e launch_rerun=true -e image_source=pull
    python -m app deploy -i inv.yml -e '{"cluster_spec": {"job": {"command": "check", "launcher": "mpirun"}}}'
    cd ansible && ansible-playbook deploy.yml -i inventory/gpu-cluster.yml   # the same, directly

Needs ansible and ansible-runner on this machine (pip install 'ddp-cluster[deploy]'), not torch.
The exit status is 0 when the play succeeded, 1 naming the failed host and task, 2 for bad input.
"""

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from app import flags
from app.errors import ClusterError, UsageError, clip
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


def first_failure(events: list[dict]) -> str:
    """'host: task: message' of the first failed or unreachable task, or '' when none."""
    for event in events:
        if event.get("event") in ("runner_on_failed", "runner_on_unreachable"):
            data = event.get("event_data", {})
            if data.get("ignore_errors"):
                continue
            message = " ".join(_result_message(data.get("res", {})).split())
            return f"{data.get('host', '?')}: task '{data.get('task', '?')}': {clip(message, 500)}"
    return ""


def ansible_playbook() -> str:
    """Path of ansible-playbook: beside this Python (a venv) first, else on PATH."""
    beside = Path(sys.executable).parent / "ansible-playbook"
    found = str(beside) if beside.is_file() else shutil.which("ansible-playbook")
    if not found:
        raise UsageError("ansible-playbook not found: pip install 'ddp-cluster[deploy]' into this Python's environment")
    return found


def deploy(cfg: DeployConfig) -> int:
    """Run deploy.yml with ansible-runner and return 0; raise ClusterError when the play fails."""
    try:
        import ansible_runner
    except ImportError:
        raise UsageError("ansible-runner is not installed: pip install 'ddp-cluster[deploy]'") from None
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
            return 0
        if runner.status == "timeout":
            raise ClusterError(f"deploy ran past --timeout {cfg.timeout_s}s and was stopped")
        failure = first_failure(list(runner.events))
        raise ClusterError(
            f"deploy failed ({runner.status}, rc={runner.rc})"
            + (f" on {failure}" if failure else ": see the output above")
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m app deploy``: one per field of DeployConfig."""
    flags.add_arguments(parser, DeployConfig)


def run(args: argparse.Namespace) -> int:
    """Parse the flags into a DeployConfig and run it."""
    extravars: dict[str, object] = {}
    for item in flags.given(DeployConfig, args).get("extravars", ()):
        extravars |= parse_extravar(item)
    cfg = flags.from_args(DeployConfig, args, extravars=extravars)
    status = deploy(cfg)
    print(f"deploy: ok ({'check mode, nothing changed' if cfg.check else 'results in runs/ansible/'})")
    return status
