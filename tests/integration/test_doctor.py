"""``app doctor`` (and the same checks in app check/train) on real processes and real sockets on loopback."""

import json
import socket

import pytest

from app.diagnostics import gpus
from tests.integration.launchers import closed_port, one_error_line, run_mpirun, run_single, run_torchrun

pytestmark = pytest.mark.integration


@pytest.fixture
def logs(tmp_path) -> list[str]:
    """Failing runs keep their logs in the test's folder, not in the working directory."""
    return ["--log-dir", str(tmp_path / "logs")]


def _statuses(report: dict) -> dict[str, str]:
    return {c["check"]: c["status"] for c in report["checks"]}


def test_torchrun_two_ranks_pass_and_rank_0_prints_the_table(tmp_path) -> None:
    done = run_torchrun(2, ["doctor", "--json", str(tmp_path / "d.json")])
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "d.json").read_text())
    assert report["ok"] and report["complete"] and report["world_size"] == 2
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1]
    assert _statuses(report) == {
        "world": "ok",
        "master_address": "ok",
        "interface": "skipped",
        "host_name": "skipped",
        "port": "ok",
        **dict.fromkeys(gpus.CHECKS, "skipped"),  # no GPU here (their rules: tests/unit/test_gpus.py)
        "same_master": "ok",
    }
    assert "torchrun's agent" in next(c["detail"] for c in report["checks"] if c["check"] == "port")
    assert done.stdout.count("ddp-cluster doctor:") == 1 and "result: ok" in done.stdout


def test_mpirun_two_ranks_gather_through_a_file_rendezvous(tmp_path) -> None:
    done = run_mpirun(2, ["doctor", "--json", str(tmp_path / "d.json")], tmp_path / "rdzv")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "d.json").read_text())
    assert report["ok"] and report["complete"] and report["launcher"] == "openmpi"
    assert _statuses(report)["master_address"] == "skipped"  # a file rendezvous has no address to check


@pytest.mark.parametrize("command", ["doctor", "check", "train"])
def test_unresolvable_master_fails_in_one_line(tmp_path, logs: list[str], command: str) -> None:
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "nonexistent.invalid"}
    args = [command, "--out", str(tmp_path)] if command == "train" else [command]
    done = run_single([*args, *logs], timeout=60, env=env)
    assert done.returncode == 1
    assert "MASTER_ADDR=nonexistent.invalid does not resolve" in one_error_line(done.stderr)["cause"]


def test_a_closed_port_fails_after_the_timeout_in_one_line(logs: list[str]) -> None:
    with closed_port() as port:
        env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        done = run_single(["doctor", "--timeout", "2", *logs], timeout=60, env=env)
    assert done.returncode == 1 and done.stdout == ""
    cause = one_error_line(done.stderr)["cause"]
    assert f"could not reach the rendezvous at 127.0.0.1:{port} (127.0.0.1) within 2s (Connection refused)" in cause


def test_rank_0_reports_a_port_held_by_another_process(logs: list[str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        done = run_single(["doctor", "--timeout", "2", *logs], timeout=60, env=env)
    assert done.returncode == 1
    assert "result: FAILED: port:" in done.stdout  # rank 0 prints its own view as a table
    assert f"port {port} (MASTER_PORT) is not free on" in one_error_line(done.stderr)["cause"]


def test_a_missing_interface_is_bad_input_naming_the_existing_ones() -> None:
    done = run_single(["doctor", "--ifname", "nosuch0"], timeout=60)
    assert done.returncode == 2
    cause = one_error_line(done.stderr)["cause"]
    assert cause.startswith("interface nosuch0 (--ifname) does not exist on ") and "lo" in cause.split(": it has ")[1]


@pytest.mark.parametrize(
    "env",
    [{"NNODES": "2"}, {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_ID": "7"}],
)
def test_a_world_of_one_fails(logs: list[str], env: dict) -> None:
    done = run_single(["doctor", "--json", "-", *logs], timeout=60, env=env)
    assert done.returncode == 1
    report = json.loads(done.stdout)
    assert _statuses(report)["world"] == "failed"
    assert "world of one" in one_error_line(done.stderr)["cause"]
