"""Every failure ends in one line on stderr (rank, host, cause, exit status, log); details go to the log file."""

import subprocess
from pathlib import Path

import pytest

from tests.integration.launchers import ERROR_LINE, PYTHON, _clean_env, one_error_line, run_single, run_torchrun

pytestmark = pytest.mark.integration


def _errors(*args: str, tmp_path: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [PYTHON, "-m", "tests.integration.error_commands", *args, "--log-dir", str(tmp_path / "logs")]
    return subprocess.run(cmd, env=_clean_env(env), capture_output=True, text=True, timeout=120, check=False)


def test_unresolvable_master_is_one_line_naming_rank_host_and_cause(tmp_path) -> None:
    # Before: 26 s of retries and ~45 lines of C++ frames; the doctor answers before torch tries.
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "nonexistent.invalid"}
    done = run_single(["check", "--timeout", "10", "--log-dir", str(tmp_path / "logs")], timeout=60, env=env)
    assert done.returncode == 1
    line = one_error_line(done.stderr)
    assert line["rank"] == "1" and line["host"] and line["status"] == "1"
    assert line["cause"].startswith("MASTER_ADDR=nonexistent.invalid does not resolve on ")
    assert Path(line["log"]) == tmp_path / "logs" / "check-rank1.log"
    assert "Traceback" in Path(line["log"]).read_text()


def test_torchs_native_output_goes_to_the_log_unless_verbose(tmp_path) -> None:
    done = _errors("native", tmp_path=tmp_path)
    assert done.returncode == 1
    line = one_error_line(done.stderr)
    assert line["rank"] is None and line["cause"].startswith("unexpected DistNetworkError: The client socket has timed")
    log = Path(line["log"]).read_text()
    assert "[c10d]" in log and "frame #" in log and "Traceback" in log  # C++ log lines, backtraces, Python's
    # Control: --verbose shows what the log took off the terminal.
    loud = _errors("native", "--verbose", tmp_path=tmp_path)
    assert loud.returncode == 1 and "[c10d]" in loud.stderr and "frame #" in loud.stderr
    assert loud.stderr.rstrip().splitlines()[-1].startswith("error: unexpected DistNetworkError")


def test_a_bug_is_one_line_with_its_traceback_in_the_log(tmp_path) -> None:
    done = _errors("bug", tmp_path=tmp_path, env={"OMPI_COMM_WORLD_RANK": "3"})
    assert done.returncode == 1
    line = one_error_line(done.stderr)
    assert line["rank"] == "3" and line["cause"] == "unexpected ZeroDivisionError: integer division or modulo by zero"
    assert "1 // 0" in Path(line["log"]).read_text()


def test_a_quiet_success_leaves_no_log_behind(tmp_path) -> None:
    done = run_single(["doctor", "--log-dir", str(tmp_path / "logs")], timeout=60)
    assert done.returncode == 0 and done.stderr == ""
    assert not (tmp_path / "logs").exists()


def test_bad_input_is_one_line_without_a_log(tmp_path) -> None:
    done = run_single(["check", "--timeout", "-1", "--log-dir", str(tmp_path / "logs")], timeout=60)
    assert done.returncode == 2
    line = one_error_line(done.stderr)
    assert line["cause"] == "--timeout -1.0 must be a positive number of seconds" and line["log"] is None


def test_under_torchrun_the_failing_rank_printsone_error_line(tmp_path) -> None:
    done = run_torchrun(2, ["check", "--inject-fault", "all_reduce_sum@1", "--log-dir", str(tmp_path / "logs")])
    assert done.returncode == 1
    ours = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1 and ERROR_LINE.match(ours[0])["rank"] == "0", done.stderr[-3000:]
    assert "all_reduce_sum on rank 1: wrong value from rank 1" in ours[0]
    # What is left is torchrun's own report (its ChildFailedError banner), never a traceback of ours;
    # the rank's line reached torchrun through its error file and is the banner's root cause.
    assert "app/cli.py" not in done.stderr and "ChildFailedError" in done.stderr
    assert f"traceback : {ours[0]}" in done.stderr


def test_bench_repeats_the_error_line_of_the_ranks_it_started(tmp_path) -> None:
    args = ["bench", "--nproc-per-node", "2", "--backend", "nccl", "--rounds", "1", "--samples", "64"]
    done = run_single([*args, "--log-dir", str(tmp_path / "logs")], timeout=180)
    assert done.returncode != 0
    line = one_error_line(done.stderr)  # torchrun's banner went to bench's log, with the ranks' own lines
    assert "--backend nccl needs a GPU" in line["cause"] and line["rank"] in ("0", "1")
    assert "ChildFailedError" in (tmp_path / "logs" / "bench.log").read_text()
