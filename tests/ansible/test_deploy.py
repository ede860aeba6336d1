"""deploy.yml end to end against two node containers standing in for GPU machines (CPU only):
--check runs clean on the bare nodes; then provision (base, Docker engine), ship the workload image
as a tarball, write hostfile and env rendered from the cluster spec, `app check` and a short training
across the nodes with the image's entrypoints, the summary back on the controller; then a second run
changes nothing (with the first dry run, what a --check after the deploy would show), a failing job
fails the play with its error, the spec's values reach the nodes and the job, mpirun runs uneven nodes
from the head node over ssh, and a bad spec value fails the play in one line.

    make images && .venv/bin/python -m pytest tests/ansible/test_deploy.py -m ansible
"""

import io
import json
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path, PurePosixPath

import pytest
import yaml
from bench import gate_figures
from nodes import nodes

from app import contract
from app.orchestrate import engine
from tests.ansible.conftest import ANSIBLE_DIR, ansible_env, record_timing, run_playbook

pytestmark = [pytest.mark.ansible, pytest.mark.docker, pytest.mark.slow]
DEPLOY = ANSIBLE_DIR / "deploy.yml"
PLAYBOOKS = Path(__file__).resolve().parent / "playbooks"
# Stand-in for `nvidia-ctk runtime configure --runtime=docker --dry-run --config=PATH`: prints
# the file's configuration with the nvidia runtime added, as the real tool does (no GPU here).
FAKE_NVIDIA_CTK = """#!/usr/bin/python3
import json, sys
path = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--config="))
try:
    config = json.load(open(path))
except FileNotFoundError:
    config = {}
config.setdefault("runtimes", {})["nvidia"] = {"args": [], "path": "nvidia-container-runtime"}
json.dump(config, sys.stdout, indent=4)
"""


NO_DEVICE_VERDICT = "--device-seconds 0"
"""The checks of these tests judge no device (the verify role's too): on this loaded machine equal nodes read up to 2x
apart (run24: node1's copy speed 2.0x below node0's failed the uneven-nodes job); test_measure.py judges the verdict
on a node slowed by a set factor, and tests/unit/test_health.py on recorded figures."""
DEPLOY_BOUND_S = 700
"""The full deploy's bound: it took 340 s beside two busy loops; pytest's own timeout (900 s) covers the dry run too."""
SCRAPE_FILE = "runs-not-made-yet/prometheus-scrape.yml"
"""Where the deploy writes the scrape configuration, in a folder that does not exist yet (as runs/ansible in a fresh
clone: the play makes it)."""
VERIFY_REPORT = "{{ cluster_spec_given.paths.results }}/{{ verify_app_check_report }}"
"""Where the verify role's check writes its report (its default, ansible/roles/verify/defaults/main.yml)."""


def with_spec(extravars: dict, **sections: dict) -> dict:
    """``extravars`` with these spec sections laid over its cluster_spec (-e replaces the whole mapping)."""
    spec = {name: dict(table) for name, table in extravars["cluster_spec"].items()}
    for name, values in sections.items():
        spec[name] = {**spec.get(name, {}), **values}
    return {**extravars, "cluster_spec": spec}


@pytest.fixture(scope="module")
def deployed(node_cluster: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A --check run on the bare nodes, then one full deploy through `python -m app deploy` (ansible-runner)."""
    work = tmp_path_factory.mktemp("deploy")
    job = {"name": "train", "image": node_cluster["image"], "command": "train --epochs 3 --out /results"}
    extravars = {"launch_fetch_dir": str(work / "runs"), "image_cache_dir": str(work / "images"),
                 "launch_ssh_key_dir": str(work / "ssh"), "image_build_command": "",
                 "cluster_config_scrape_file": str(work / SCRAPE_FILE),
                 "verify_app_check_command": f"check {NO_DEVICE_VERDICT} --json {VERIFY_REPORT}",
                 "cluster_spec": {"job": job, "nodes": gate_figures.QUICK_SPEC}}  # fmt: skip
    dry = run_playbook(DEPLOY, node_cluster["inventory"], extravars, cmdline="--check")
    assert dry.status == "successful" and dry.total("failures") == 0, dry.stdout[-4000:]
    assert "would be shipped to" in dry.stdout and dry.total("changed") > 0, "a dry run on bare nodes saw nothing to do"
    command = [sys.executable, "-m", "app", "deploy", "-i", str(node_cluster["inventory"]), "-e", json.dumps(extravars)]
    start = time.monotonic()
    try:  # bounded below pytest's timeout, so that a deploy that hangs fails with what it printed
        result = subprocess.run(command, cwd=nodes.REPO, capture_output=True, text=True, timeout=DEPLOY_BOUND_S,
                                env=ansible_env())  # fmt: skip
    except subprocess.TimeoutExpired as hung:
        out, err = (
            text.decode(errors="replace") if isinstance(text, bytes) else text or ""
            for text in (hung.stdout, hung.stderr)
        )
        raise AssertionError(f"the deploy still ran after {DEPLOY_BOUND_S} s:\n{out[-4000:]}{err[-2000:]}") from None
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    record_timing("full_deploy_s", time.monotonic() - start)
    return {**node_cluster, "runs": work / "runs", "work": work, "extravars": extravars, "output": result.stdout}


def node_exec(name: str, *command: str) -> str:
    return nodes.exec_in(name, *command).stdout


def node_write(name: str, path: str, text: str, mode: int = 0o644) -> None:
    """Write a root-owned file into the node (its folder made first) through the engine's archive upload."""
    folder, data = PurePosixPath(path).parent, text.encode()
    member = tarfile.TarInfo(PurePosixPath(path).name)
    member.size, member.mode, member.mtime = len(data), mode, time.time()
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        tar.addfile(member, io.BytesIO(data))
    nodes.exec_in(name, "mkdir", "-p", str(folder))
    engine.client().containers.get(name).put_archive(str(folder), archive.getvalue())


def test_deploy_runs_check_and_training_across_nodes_and_brings_the_summary_back(deployed: dict) -> None:
    summary = json.loads((deployed["runs"] / "train" / "summary.json").read_text())
    assert (summary["world_size"], summary["nodes"], summary["backend"]) == (4, 2, "gloo")
    assert summary["params_identical"] is True
    assert summary["test_accuracy"] > 0.8
    check = json.loads((deployed["runs"] / "check" / "check.json").read_text())
    assert check["world_size"] == 4
    assert {r["host"] for r in check["ranks"]} == {"node0", "node1"}
    logs = {name: (deployed["runs"] / "train" / f"{name}.log").read_text() for name in deployed["names"]}
    assert "done:" in logs[deployed["names"][0]], logs
    assert "deploy: ok" in deployed["output"]


def test_nodes_hold_the_topology_files_and_the_same_image(deployed: dict) -> None:
    first, second = deployed["names"]
    hostfile = node_exec(first, "cat", "/etc/ddp-cluster/hostfile").split("\n")
    addresses = [line.split()[0] for line in hostfile if line]
    assert [line.split()[1] for line in hostfile if line] == ["slots=2", "slots=2"]
    env = dict(line.split("=", 1) for line in node_exec(second, "cat", "/etc/ddp-cluster/cluster.env").split())
    assert env["MASTER_ADDR"] == addresses[0] and env["WORLD_SIZE"] == "4" and env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert env["MASTER_PORT"] == "29500", "the spec's default rendezvous port"
    torchrun = node_exec(second, "cat", "/etc/ddp-cluster/torchrun.args").split()
    listing = ("ls", "-la", "--time-style=full-iso", "/etc/ddp-cluster")  # what the folder held, should it fail again
    assert "--node-rank=1" in torchrun and "--master-port=29500" in torchrun, (torchrun, node_exec(second, *listing))
    assert node_exec(first, "cat", "/etc/ddp-cluster/hostfile") == node_exec(second, "cat", "/etc/ddp-cluster/hostfile")
    inspect = ("docker", "image", "inspect", "--format", "{{.Id}}", deployed["image"])
    controller = engine.client().images.get(deployed["image"]).id
    for name in deployed["names"]:
        assert node_exec(name, *inspect).strip() == controller
        assert node_exec(name, "docker", "ps", "-aq") == "", "a job container was left running"


def test_every_node_serves_its_metrics_from_its_own_events_and_the_scrape_configuration_names_them(
    deployed: dict,
) -> None:
    hostfile = node_exec(deployed["names"][0], "cat", "/etc/ddp-cluster/hostfile")
    addresses = [line.split()[0] for line in hostfile.splitlines()]
    for name in deployed["names"]:
        host = node_exec(name, "hostname").strip()
        log = (deployed["runs"] / "train" / f"{name}.log").read_text()
        assert f"metrics: http://{host}:{contract.METRICS_PORT}/metrics" in log, log[-2000:]  # served, not "not served"
        # its own events file in the job's results: its gate's record, not the other node's
        events = node_exec(name, "cat", "/var/lib/ddp-cluster/runs/train/events.jsonl")
        records = [json.loads(line) for line in events.splitlines()]
        assert {r["node"] for r in records if r["kind"] == "gate"} == {host}, records
    scrape = yaml.safe_load((deployed["work"] / SCRAPE_FILE).read_text())
    assert scrape["scrape_configs"] == [
        {
            "job_name": "train",
            "honor_labels": True,
            "metrics_path": contract.METRICS_PATH,
            "static_configs": [{"targets": [f"{a}:{contract.METRICS_PORT}" for a in addresses]}],
        }
    ]


def test_second_run_changes_nothing(deployed: dict) -> None:
    run = run_playbook(DEPLOY, deployed["inventory"], deployed["extravars"])
    assert run.status == "successful", run.stdout[-4000:]
    record_timing("idempotent_rerun_s", run.seconds)
    assert run.total("changed") == 0, run.stats
    assert "Job 'train' completed before" in " ".join(run.stdout.split())


def test_a_job_started_afresh_says_what_it_deletes_and_one_run_again_resumes_from_its_checkpoints(
    deployed: dict,
) -> None:
    """Running the play again never deletes a job's checkpoints unasked (it used to empty the job's results first:
    a job whose head had died, deployed again, began at epoch 1). ``launch_fresh`` starts a job afresh and the play
    names the newest step it deletes (here an earlier run's checkpoint); run again, the job resumes."""
    head, folder = deployed["names"][0], deployed["runs"] / "resume"
    earlier = "/var/lib/ddp-cluster/runs/resume/checkpoints/step-00000007.pt"
    node_write(head, earlier, "an earlier run's checkpoint")

    def launch(epochs: int, **flags: bool) -> tuple[str, dict, str]:
        job = {"name": "resume", "command": f"train --epochs {epochs} --out /results --resume auto"}
        extravars = with_spec(deployed["extravars"], job=job) | flags
        run = run_playbook(DEPLOY, deployed["inventory"], extravars, tags="launch", timeout=600)
        assert run.status == "successful", run.stdout[-4000:]
        log = (folder / f"{head}.log").read_text()
        said = " ".join(run.stdout.replace("''", "'").split())  # the YAML callback doubles a quoted message's quotes
        return said, json.loads((folder / "summary.json").read_text()), log

    text, first, log = launch(1, launch_fresh=True)
    said = f"Job 'resume' starts afresh (launch_fresh=true): 1 checkpoint file(s) deleted on {head}, up to step 7."
    assert said in text, text[-3000:]
    kept = node_exec(head, "ls", str(PurePosixPath(earlier).parent))
    assert "resumed from" not in log and "step-00000007.pt" not in kept, (kept, log[-3000:])
    _, second, log = launch(2, launch_rerun=True)  # a completed job, run again with one more epoch
    assert f"train: resumed from step {first['step']} " in log, log[-3000:]
    assert second["step"] == 2 * first["step"], (first, second)


def test_a_failing_job_fails_the_play_with_its_error(deployed: dict) -> None:
    extravars = with_spec(deployed["extravars"], job={"name": "bad", "command": "train --dataset nope"})
    run = run_playbook(DEPLOY, deployed["inventory"], extravars, tags="launch", timeout=600)
    assert run.status == "failed"
    text = " ".join(run.stdout.split())
    failure = text[text.find("Job 'bad'") :][:600]
    # The one line the app printed: which rank on which node (either of node0's two ranks may be
    # the first in its log), the problem, the exit status.
    line = rf"Job 'bad' on {re.escape(deployed['names'][0])} exited with 1: error: rank [01] on node0: --dataset"
    assert re.search(line, text), failure
    assert "--dataset 'nope' is not one of digits" in text
    assert not (deployed["runs"] / "bad" / "summary.json").exists()


def test_the_spec_values_reach_the_nodes_and_the_job(deployed: dict) -> None:
    job = {"name": "spec-values", "command": f"check --timeout 60 {NO_DEVICE_VERDICT} --json /results/spec/check.json"}
    extravars = with_spec(deployed["extravars"], rendezvous={"master_port": 29612}, job=job)
    # torchrun's agent logs its rendezvous endpoint at INFO: the port the job really used.
    extravars |= {"launch_summary_file": "check.json", "launch_env": {"LOGLEVEL": "INFO"}}
    # (No restore afterwards: every later test that launches renders its own configuration first, or
    # needs none of these values.)
    run = run_playbook(DEPLOY, deployed["inventory"], extravars, tags="config,launch", timeout=600)
    assert run.status == "successful", run.stdout[-4000:]
    for node in deployed["names"]:
        env = node_exec(node, "cat", "/etc/ddp-cluster/cluster.env").split()
        assert "MASTER_PORT=29612" in env, env
        assert "--master-port=29612" in node_exec(node, "cat", "/etc/ddp-cluster/torchrun.args").split()
        log = (deployed["runs"] / "spec-values" / f"{node}.log").read_text()
        assert re.search(r"rdzv_endpoint\s*: [0-9.]+:29612", log), log[-2000:]
    check = json.loads((deployed["runs"] / "spec-values" / "spec" / "check.json").read_text())
    assert check["ok"] and check["world_size"] == 4


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"job": {"comand": "check"}}, ": --spec-json [job]: unknown key 'comand': the keys are name, command,"),
        ({"rendezvous": {"master_port": 80}}, ": --master-port=80 must be in 1024-65535"),
    ],
    ids=["misspelt-key", "port-out-of-range"],
)
def test_a_bad_spec_value_fails_the_play_in_one_line_naming_the_key(deployed: dict, spec: dict, message: str) -> None:
    extravars = {**deployed["extravars"], "cluster_spec": spec}
    before = node_exec(deployed["names"][0], "cat", "/etc/ddp-cluster/cluster.env")
    command = [sys.executable, "-m", "app", "deploy", "-q", "-i", str(deployed["inventory"]), "--tags", "config",
               "-e", json.dumps(extravars)]  # fmt: skip
    result = subprocess.run(command, cwd=nodes.REPO, capture_output=True, text=True, timeout=600, env=ansible_env())
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr
    line = result.stderr.strip()
    assert "\n" not in line and line.startswith("error: deploy stopped before any change") and message in line, line
    assert line.endswith("[exit 2]") and line.count("exit") == 1, "one exit status, the documented one"
    after = node_exec(deployed["names"][0], "cat", "/etc/ddp-cluster/cluster.env")
    assert before.strip() and after == before, "a bad spec changed the nodes' configuration"


def test_uneven_nodes_run_under_mpirun_and_are_refused_by_torchrun(deployed: dict, tmp_path: Path) -> None:
    """mpirun runs the job from the head node over ssh (one slot on the second node: 3 ranks), torchrun refuses."""
    uneven = yaml.safe_load(deployed["inventory"].read_text())
    uneven["all"]["children"]["ddp_cluster"]["hosts"][deployed["names"][1]] = {"cluster_slots": 1}
    inventory = tmp_path / "uneven.yml"
    inventory.write_text(yaml.safe_dump(uneven))
    check = {"command": f"check {NO_DEVICE_VERDICT} --json /results/check.json"}
    mpi_job = with_spec(deployed["extravars"], job={**check, "name": "uneven-mpi", "launcher": "mpirun"})
    mpi_job |= {"launch_summary_file": "check.json"}
    mpi = run_playbook(DEPLOY, inventory, mpi_job, tags="config,launch", timeout=600)
    assert mpi.status == "successful", mpi.stdout[-4000:]
    report = json.loads((deployed["runs"] / "uneven-mpi" / "check.json").read_text())
    assert report["launcher"] == "openmpi" and report["world_size"] == 3  # mpirun from the head node over ssh
    assert {r["host"] for r in report["ranks"]} == {"node0", "node1"}
    for name in deployed["names"]:
        assert node_exec(name, "docker", "ps", "-aq") == "", "an sshd or job container was left running"
    torchrun_job = with_spec(deployed["extravars"], job={**check, "name": "uneven-torchrun"})
    torchrun = run_playbook(DEPLOY, inventory, torchrun_job, tags="launch", timeout=600)
    assert torchrun.status == "failed"
    text = " ".join(torchrun.stdout.split())
    refusal = "error: torchrun needs the same slots on every host, got [1, 2]: use --launcher mpirun"
    assert refusal in text, text[-3000:]
    assert not (deployed["runs"] / "uneven-torchrun").exists(), "torchrun started on uneven hosts"


def test_container_toolkit_merges_the_runtime_into_daemon_json(deployed: dict) -> None:
    node = deployed["names"][1]
    node_write(
        node, "/etc/docker/daemon.json", json.dumps({"log-driver": "json-file", "log-opts": {"max-size": "10m"}})
    )
    node_write(node, "/usr/local/bin/nvidia-ctk", FAKE_NVIDIA_CTK, mode=0o755)
    extravars = {"merge_host": node, "nvidia_container_toolkit_daemon_json_extra": {"log-opts": {"max-file": "3"}}}
    first = run_playbook(PLAYBOOKS / "toolkit-merge.yml", deployed["inventory"], extravars, timeout=600)
    assert first.status == "successful", first.stdout[-4000:]
    config = json.loads(node_exec(node, "cat", "/etc/docker/daemon.json"))
    assert config["log-driver"] == "json-file"
    assert config["log-opts"] == {"max-size": "10m", "max-file": "3"}
    assert config["runtimes"]["nvidia"]["path"] == "nvidia-container-runtime"
    assert "nvidia" in json.loads(node_exec(node, "docker", "info", "--format", "{{json .Runtimes}}"))
    assert "RUNNING HANDLER [docker : Restart dockerd without an init system.]" in first.stdout
    second = run_playbook(PLAYBOOKS / "toolkit-merge.yml", deployed["inventory"], extravars, timeout=600)
    assert second.status == "successful" and second.total("changed") == 0, second.stats


def test_firewall_rules_admit_only_the_cluster_hosts(deployed: dict) -> None:
    monitoring = "10.9.9.9"  # a Prometheus host: admitted to the metrics port, and to nothing else
    extravars = {**deployed["extravars"], "cluster_config_firewall": "ufw", "base_extra_packages": ["ufw"],
                 "cluster_config_metrics_sources": [monitoring]}  # fmt: skip
    run = run_playbook(DEPLOY, deployed["inventory"], extravars, tags="base,config", timeout=600)
    assert run.status == "successful", run.stdout[-4000:]
    addresses = [
        line.split()[0] for line in node_exec(deployed["names"][0], "cat", "/etc/ddp-cluster/hostfile").splitlines()
    ]
    added = node_exec(deployed["names"][1], "ufw", "show", "added")
    for address in addresses:
        for port in ("29500", str(contract.METRICS_PORT), "32768:60999"):
            assert f"allow from {address} to any port {port} proto tcp" in added, added
    assert f"allow from {monitoring} to any port {contract.METRICS_PORT} proto tcp" in added, added
    assert added.count(f"from {monitoring} ") == 1, added
    assert "allow 29500" not in added and "from any" not in added, added
    again = run_playbook(DEPLOY, deployed["inventory"], extravars, tags="config", timeout=600)
    assert again.status == "successful" and again.total("changed") == 0, again.stats


def test_an_inventory_without_cluster_hosts_is_refused_in_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yml"
    broken.write_text("all:\n  hosts: [unclosed\n")
    result = subprocess.run([sys.executable, "-m", "app", "deploy", "-q", "-i", str(broken)], cwd=nodes.REPO,
                            capture_output=True, text=True, timeout=300, env=ansible_env())  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("error: deploy stopped before any change: The inventory")
    assert "no hosts in group 'ddp_cluster'" in result.stderr
