"""A bad knob fails in about a second with one line, before the engine or an image is touched.

Real ``make`` calls with a PATH whose ``docker`` only records that it was called (it must not be).
Run: ``.venv/bin/python -m pytest tests/unit/test_make_spec.py`` (about 3 s).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deps import need

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bin_dir(tmp_path) -> Path:
    """make, bash and env as they are, python3 this interpreter, and a docker that leaves a mark."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in ("make", "bash", "env", "sh"):
        (folder / tool).symlink_to(shutil.which(tool))
    (folder / "python3").symlink_to(sys.executable)
    docker = folder / "docker"
    docker.write_text(f"#!/bin/sh\necho called >> {tmp_path / 'docker-called'}\nexit 1\n")
    docker.chmod(0o755)
    return folder


def make(bin_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": str(bin_dir), "HOME": os.environ.get("HOME", "/tmp")}
    cmd = ["make", "--no-print-directory", "IMAGE_NAME=ddp-cluster-spec-test", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize(
    ("target", "knobs", "line"),
    [
        ("cluster-up", ["NODES=0"], "error: --nodes 0 must be >= 1"),
        ("cluster-check", ["NODES=17"], "error: --nodes 17: the mini-cluster is for one machine; use at most 16"),
        ("cluster-mpi", ["NPROC_PER_NODE=-1"], "error: --nproc-per-node -1 must be >= 1"),
        ("cluster-links", ["CLUSTER=Bad_Name"], "error: --name 'Bad_Name' must be lowercase"),
    ],
)
def test_a_bad_knob_fails_first_with_one_line_and_no_docker(bin_dir, target, knobs, line):
    done = make(bin_dir, target, *knobs)
    assert done.returncode == 2, done
    errors = [text for text in done.stderr.splitlines() if not text.startswith("make: ***")]
    assert len(errors) == 1 and errors[0].startswith(line), done.stderr
    assert done.stdout == ""
    assert not (bin_dir.parent / "docker-called").exists(), "docker was called before the spec was checked"


def test_good_knobs_pass_the_check(bin_dir):
    """The negative control: the same check passes good knobs (and still calls no docker)."""
    done = make(bin_dir, "cluster-spec", "NODES=3", "NPROC_PER_NODE=1", "JOB=check")
    assert done.returncode == 0 and done.stderr == "", done
    assert not (bin_dir.parent / "docker-called").exists()


def test_cluster_check_logs_where_the_results_are_copied(bin_dir):
    """Its ranks' logs go to the results volume (copied to RESULTS), not to a container's home that is not copied."""
    from app import contract

    done = make(bin_dir, "-n", "cluster-check")
    assert done.returncode == 0, done
    assert f"--log-dir {contract.RESULTS_DIR}/logs" in done.stdout
    assert not (bin_dir.parent / "docker-called").exists()


def test_make_tells_the_cluster_command_that_make_started_it(bin_dir):
    """--make: the runner's hints then name make's targets (make cluster-down CLUSTER=x), not python -m app's."""
    done = make(bin_dir, "-n", "cluster-down", "CLUSTER=x")
    assert done.returncode == 0, done
    assert " -m app cluster down --make " in done.stdout and "--name 'x'" in done.stdout


def test_deploy_local_deploys_to_the_node_containers_it_started(bin_dir, tmp_path):
    """Issue 35: ``make deploy-local ANSIBLE_NODES_PREFIX=hb`` started hb-node* and deployed to the ddp-node* that
    local-nodes.yml names; now it deploys with the inventory of the nodes it started."""
    done = make(bin_dir, "-n", "deploy-local", "ANSIBLE_NODES_PREFIX=hb", "ANSIBLE_NODES=3")
    assert done.returncode == 0, done
    assert "nodes.py up --prefix hb --nodes 3" in done.stdout, done.stdout
    assert "nodes.py inventory --prefix hb --nodes 3 > build/ansible/hb-nodes.yml" in done.stdout, done.stdout
    assert " -m app deploy -i build/ansible/hb-nodes.yml" in done.stdout, done.stdout
    listed = subprocess.run([sys.executable, "docker/nodes/nodes.py", "inventory", "--prefix", "hb", "--nodes",
                             "3"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    hosts = need("yaml").safe_load(listed.stdout)["all"]["children"]["ddp_cluster"]["hosts"]
    assert list(hosts) == ["hb-node0", "hb-node1", "hb-node2"], listed.stdout
