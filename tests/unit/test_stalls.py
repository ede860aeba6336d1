"""app/train/stalls.py: the collective threads' waits for a CPU, read from the kernel's per-thread counts."""

from pathlib import Path

from app.train import stalls


def thread(tasks: Path, tid: int, name: str, run_delay_ns: int) -> None:
    (tasks / str(tid)).mkdir(parents=True, exist_ok=True)
    (tasks / str(tid) / "comm").write_text(f"{name}\n")
    (tasks / str(tid) / "schedstat").write_text(f"123456 {run_delay_ns} 42\n")


def test_the_stall_is_the_longest_wait_of_one_collective_thread_since_the_last_read(tmp_path) -> None:
    thread(tmp_path, 1, "python", 5_000_000_000)  # the main thread: its waits are in its busy time already
    thread(tmp_path, 2, "pt_gloo_runloop", 1_000_000_000)
    thread(tmp_path, 3, "gloo_tcp_loop", 2_000_000_000)
    stall = stalls.CommStall(tmp_path)
    assert stall.since_last() == 0.0  # nothing waited since it began
    thread(tmp_path, 1, "python", 9_000_000_000)
    thread(tmp_path, 2, "pt_gloo_runloop", 1_075_000_000)  # throttled 75 ms while its all-reduce was under way
    thread(tmp_path, 3, "gloo_tcp_loop", 2_070_000_000)  # the same quota's wait, overlapping: not added
    assert stall.since_last() == 0.075
    thread(tmp_path, 4, "pt_gloo_runloop", 3_000_000)  # a thread new since the last read counts from its start
    assert stall.since_last() == 0.003


def test_where_the_kernel_keeps_no_count_the_stall_reads_zero(tmp_path) -> None:
    assert stalls.CommStall(tmp_path / "missing").since_last() == 0.0
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "comm").write_text("pt_gloo_runloop\n")  # no schedstat (sched_info off)
    assert stalls.run_delays(tmp_path) == {}


def test_this_process_threads_are_read_where_the_kernel_counts() -> None:
    # This test's own process: no gloo thread runs in it, so nothing is found, and reading costs nothing.
    assert stalls.run_delays() == {}
    assert stalls.run_delays(names=("pytest", "python", "python3")) or not Path("/proc/self/task").exists()
