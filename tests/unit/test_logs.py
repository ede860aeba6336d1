"""RunLog in-process: where the log goes, what the one line says, what is left behind."""

import os
from pathlib import Path

from app import logs


def test_a_run_that_logged_nothing_leaves_no_file_or_folder(tmp_path) -> None:
    with logs.RunLog("check", tmp_path / "a" / "logs") as log:
        assert log.path == tmp_path / "a" / "logs" / "check.log" and log.path.exists()
    assert not (tmp_path / "a").exists()


def test_native_writes_to_descriptor_2_land_in_the_log_and_it_is_kept(tmp_path, capsys) -> None:
    with logs.RunLog("check", tmp_path) as log:
        os.write(2, b"[W socket.cpp:764] [c10d] from C++\n")
        assert log.fail("the rendezvous timed out", 1) == 1
    line = capsys.readouterr().err
    assert line == f"error: the rendezvous timed out [exit 1; log {tmp_path / 'check.log'}]\n"
    assert "[c10d] from C++" in (tmp_path / "check.log").read_text()
    os.write(2, b"")  # descriptor 2 is back where it was (this would raise if it were closed)


def test_the_line_names_rank_and_host_under_a_launcher(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "3")
    with logs.RunLog("train", tmp_path) as log:
        assert log.path.name == "train-rank3.log"
        assert log.line("bad", 2, details=False) == f"error: rank 3 on {log.who.host}: bad [exit 2]"


def test_an_unwritable_log_folder_falls_back_to_a_temp_folder(tmp_path) -> None:
    (tmp_path / "file").write_text("not a folder")
    with logs.RunLog("doctor", tmp_path / "file" / "logs") as log:
        fallback = log.path
        assert fallback.name == "doctor.log" and fallback.parent.name.startswith("ddp-cluster-logs-")
    assert not fallback.parent.exists()  # nothing logged: the temp folder went too


def test_a_childs_error_line_in_the_log_is_found(tmp_path) -> None:
    with logs.RunLog("bench", tmp_path) as log:
        os.write(2, b"torchrun's banner\nerror: rank 1 on h: --backend nccl needs a GPU [exit 2]\n")
        assert log.child_error() == "error: rank 1 on h: --backend nccl needs a GPU [exit 2]"


def test_a_childs_error_line_is_found_after_another_run_removed_the_shared_file(tmp_path) -> None:
    """Two runs of one command in one folder share logs/bench.log; the one that logged nothing removes it on
    exit. The other still reads its children's line from its own descriptor (seen under pytest-xdist)."""
    with logs.RunLog("bench", tmp_path) as log:
        with logs.RunLog("bench", tmp_path):
            pass
        assert not log.path.exists()
        os.write(2, b"error: rank 0 on h: interface nosuchif0 not found [exit 1]\n")
        assert log.child_error() == "error: rank 0 on h: interface nosuchif0 not found [exit 1]"


def test_default_folder_is_the_runs_output_else_logs() -> None:
    class Args:
        log_dir = None
        out = Path("runs/x")

    assert logs.log_dir(Args()) == Path("runs/x/logs")
    Args.out = None
    assert logs.log_dir(Args()) == logs.DEFAULT_LOG_DIR
    Args.log_dir = Path("/shared")
    assert logs.log_dir(Args()) == Path("/shared")


def test_a_full_disk_under_the_log_still_gets_the_line_out(tmp_path, capsys) -> None:
    with logs.RunLog("train", tmp_path, verbose=True) as log:
        log._file.close()
        log._file = open("/dev/full", "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (every write: ENOSPC)
        try:
            raise RuntimeError("boom")
        except RuntimeError as error:
            assert log.fail("could not write checkpoint x (No space left on device)", 1, error) == 1
    assert capsys.readouterr().err.splitlines()[-1].startswith("error: could not write checkpoint x")


def test_a_quiet_run_keeps_the_earlier_runs_lines(tmp_path) -> None:
    """A clean run after a failure must not erase the failure's traceback (the error line pointed to it)."""
    with logs.RunLog("train", tmp_path) as log:
        log.fail("the collective failed", 1, RuntimeError("the earlier failure"))
    before = (tmp_path / "train.log").read_text()
    assert "RuntimeError: the earlier failure" in before
    with logs.RunLog("train", tmp_path):
        pass  # a clean run: writes nothing
    assert (tmp_path / "train.log").read_text() == before


def test_lines_another_process_appends_count_as_written(tmp_path, capsys) -> None:
    """app cluster's runner writes the nodes' output into the command's log through its own handle."""
    with logs.RunLog("cluster", tmp_path) as log:
        with open(log.path, "a", encoding="utf-8") as other:
            other.write("head: a node's line\n")
        log.fail("the job failed", 1)
    assert f"[exit 1; log {tmp_path / 'cluster.log'}]" in capsys.readouterr().err
    assert "head: a node's line" in (tmp_path / "cluster.log").read_text()


def test_plain_drops_escape_codes_redrawn_parts_and_empty_lines() -> None:
    assert logs.plain("a\x1b[Kb \x1b[1;31mred\x1b[0m \x1b]0;title\x07end") == "ab red end"
    assert logs.plain("\r 10%|#   \r 50%|### \r") == " 50%|###"  # a redrawn bar: its last drawing
    assert logs.plain("one\n\n\x1b[K\n two  \n") == "one\n two"
    assert logs.node_line("n", "\x1b[K") is None and logs.node_line("n", "") is None
    assert logs.node_line("n", "x\x1b[K") == "n: x"
