"""The health gate (app gate): its verdict on given figures (a node against the job's figures at its start),
the rendezvous it reads from torchrun's arguments, its records, and the one line and exit status 3 of a node
kept out (a real measurement against start figures no CPU reaches)."""

import fcntl
import json
import re
import socket
import threading

import pytest

from app import cli, contract
from app.diagnostics import gate
from app.diagnostics.health import DeviceHealth
from app.errors import UsageError

CPU_START = DeviceHealth("cpu", "float32", 512, 180e9, 64 << 20, 3.0, 2.0)


def cpu(flops: float, copy: float = 3.0) -> DeviceHealth:
    return DeviceHealth("cpu", "float32", 512, flops, 64 << 20, copy, 2.0)


def gpus(*tflops: float) -> list[DeviceHealth]:
    return [DeviceHealth(f"cuda:{i}", "bfloat16", 8192, t * 1e12, 256 << 20, 1500.0, 2.0) for i, t in enumerate(tflops)]


def test_a_node_passes_at_half_its_start_figures_and_is_kept_out_below() -> None:
    assert gate.shortfall([cpu(180e9)], [CPU_START], 0.5) is None
    assert gate.shortfall([cpu(90e9, 1.5)], [CPU_START], 0.5) is None  # exactly half still passes
    said = gate.shortfall([cpu(41e9)], [CPU_START], 0.5)
    assert said == "device check 41.0 GFLOP/s against the job's 180.0 (fail below 0.5)"


def test_the_copy_bandwidth_is_judged_too_and_the_fraction_is_the_given_one() -> None:
    assert gate.shortfall([cpu(180e9, 1.2)], [CPU_START], 0.5) == (
        "device check 1.2 GB/s copy against the job's 3.0 (fail below 0.5)"
    )
    assert gate.shortfall([cpu(150e9)], [CPU_START], 0.9) == (
        "device check 150.0 GFLOP/s against the job's 180.0 (fail below 0.9)"
    )


def test_with_several_gpus_the_slow_one_is_named_and_a_missing_one_fails() -> None:
    start = gpus(690, 700, 680)
    assert gate.shortfall(gpus(690, 212, 680), start, 0.5) == (
        "device check cuda:1 212.0 TFLOP/s against the job's 700.0 (fail below 0.5)"
    )
    assert (
        gate.shortfall(gpus(690, 700), start, 0.5)
        == "device check cuda:2 is missing (the job started with 3 device(s))"
    )


def test_the_jobs_figures_are_the_best_of_its_nodes_records_device_by_device() -> None:
    head, worker, third = [cpu(46e9, 3.5)], [cpu(5e9, 0.8)], [cpu(40e9, 3.1)]
    [job] = gate.job_figures(worker, [head, worker, third])
    assert (job.flops, job.copy_gbps) == (46e9, 3.5)  # the worker measured at a busy start does not lower the bar
    [pair] = gate.job_figures(worker, [head, worker])
    assert (pair.flops, pair.copy_gbps) == (46e9, 3.5)  # of two nodes, the better (a median was their mean)
    assert gate.job_figures(head, []) == head  # no other record: its own
    node = gpus(690, 700)
    assert [d.flops for d in gate.job_figures(node, [node, gpus(710, 300), [CPU_START]])] == [710e12, 700e12]


def test_nodes_that_share_the_records_folder_measure_one_at_a_time(tmp_path, monkeypatch) -> None:
    # Another node (here this test) holds the folder's lock: this node's measurement waits until it is released.
    measured = threading.Event()
    monkeypatch.setattr(gate.health, "measure", lambda device, seconds: measured.set() or cpu(80e9))
    folder = tmp_path / "gate"
    folder.mkdir()
    with (folder / gate.MEASURE_LOCK).open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        other = threading.Thread(target=gate.measure, args=(1.0, folder))
        other.start()
        assert not measured.wait(1.0), "measured while another node held the lock"
    other.join(60)
    assert measured.is_set()
    measured.clear()
    assert gate.measure(1.0) == [cpu(80e9)] and measured.is_set()  # no folder: measured without a lock


def test_of_two_measurements_each_figure_keeps_its_better_value() -> None:
    kept = gate.best([cpu(40e9, 3.0)], [cpu(170e9, 1.0)])
    assert (kept[0].flops, kept[0].copy_gbps) == (170e9, 3.0)
    assert gate.shortfall(kept, [CPU_START], 0.5) is None


def test_the_rendezvous_is_read_from_torchruns_arguments_by_torchruns_parser(tmp_path) -> None:
    args = tmp_path / "torchrun.args"
    args.write_text(
        "--nnodes=1:2 --nproc-per-node=2 --max-restarts=3 --rdzv-backend=c10d --rdzv-endpoint=demo-head-1:29500 "
        "--rdzv-id=demo --rdzv-conf=join_timeout=60,last_call_timeout=2\n"
    )
    assert gate.rendezvous(args) == ("demo-head-1", 29500, False)
    args.write_text("--nnodes=2 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint=node0 --rdzv-id=x\n")
    assert gate.rendezvous(args) == ("node0", contract.C10D_PORT, False)
    args.write_text("--nnodes=2 --nproc-per-node=1 --node-rank=0 --master-addr=node0 --master-port=29600\n")
    assert gate.rendezvous(args) == ("node0", 29600, True)  # static: node rank 0 serves it
    with pytest.raises(UsageError, match=r"--torchrun-args .*missing\.args"):
        gate.rendezvous(tmp_path / "missing.args")


def test_records_round_trip_and_an_unwritable_folder_is_one_line(tmp_path) -> None:
    path = tmp_path / "gate" / "node1.json"
    assert gate.read_record(path) is None
    said = gate.record(path, "node1", [CPU_START])
    assert said == f"gate: node1 at the job's start: cpu 180.0 GFLOP/s, 3.0 GB/s copy; recorded in {path}"
    assert gate.read_record(path) == [CPU_START]
    path.write_text("{torn")
    assert gate.read_record(path) is None  # recorded again at the next start
    (tmp_path / "a-file").write_text("")  # a folder that cannot be made (read-only for root too)
    said = gate.record(tmp_path / "a-file" / "node1.json", "node1", [CPU_START])
    assert said.startswith("gate: cannot record node1's figures in ") and said.endswith("not judged on a restart")


def test_bad_values_are_one_line() -> None:
    with pytest.raises(UsageError, match=r"--fail-below 1.5 must be a fraction of the job.s figures"):
        gate.GateConfig(fail_below=1.5)
    with pytest.raises(UsageError, match=r"--retry-every -1 must be >= 0"):
        gate.GateConfig(retry_every=-1)
    with pytest.raises(UsageError, match=r"--timeout 0 must be a positive number of seconds"):
        gate.GateConfig(timeout_s=0)


def test_missing_torchrun_arguments_are_bad_input_at_any_start(tmp_path, capsys) -> None:
    missing = tmp_path / "torchrun.args"
    flags = ["gate", "--records", str(tmp_path / "gate"), "--torchrun-args", str(missing), "--log-dir", str(tmp_path)]
    assert cli.main(flags) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line == f"error: --torchrun-args {missing}: No such file or directory [exit 2]"
    assert not (tmp_path / "gate").exists()  # nothing recorded


def test_a_node_below_its_start_figures_is_kept_out_with_one_line_and_exit_3(tmp_path, capsys) -> None:
    records, logs = tmp_path / "gate", tmp_path / "logs"
    flags = ["gate", "--records", str(records), "--device-seconds", "0.2", "--log-dir", str(logs)]
    assert cli.main(flags) == 0  # first start: recorded
    [path] = records.glob("*.json")
    assert capsys.readouterr().out.startswith(f"gate: {path.stem} at the job's start: cpu ")
    body = json.loads(path.read_text())
    body["devices"][0]["flops"] *= 1000  # a start no CPU reaches: this node is now far below it
    path.write_text(json.dumps(body))
    assert cli.main(flags) == gate.KEPT_OUT
    out, err = capsys.readouterr()
    assert out == ""
    [line] = err.splitlines()
    assert line.startswith(f"error: {path.stem} kept out: device check ") and " GFLOP/s against the job's " in line
    assert line.endswith(f"(fail below 0.5) [exit 3; log {logs / 'gate.log'}]")


def test_a_nodes_environment_with_the_jobs_world_size_but_no_rank_is_no_error(tmp_path, monkeypatch, capsys) -> None:
    """Ansible's env file gives a node WORLD_SIZE (and MASTER_ADDR) before torchrun sets any RANK: the gate
    reads only the node (the defect: `WORLD_SIZE is set but RANK is not` failed every Ansible job)."""
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_ADDR", "node0")
    monkeypatch.delenv("RANK", raising=False)
    flags = ["gate", "--records", str(tmp_path / "gate"), "--device-seconds", "0.2", "--log-dir", str(tmp_path)]
    assert cli.main(flags) == 0, capsys.readouterr().err
    assert len(list((tmp_path / "gate").glob("*.json"))) == 1


def test_a_short_transfer_to_the_rendezvous_store_and_back_passes_and_says_what_it_took() -> None:
    from torch.distributed import TCPStore

    server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # a rendezvous store, as c10d's
    why, took = gate.transfer("node1", "127.0.0.1", server.port, 5.0)
    assert why is None and re.fullmatch(r"1 MiB to 127\.0\.0\.1 and back in \d+ ms", took), took
    assert not server.check(["ddp-cluster/gate/node1"])  # it leaves nothing behind


def test_a_rendezvous_port_that_answers_but_moves_nothing_keeps_the_node_out_within_the_timeout() -> None:
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        why, took = gate.transfer("node1", "127.0.0.1", port, 1.0)
    left = [t for t in threading.enumerate() if t.name == f"store-client-127.0.0.1:{port}"]
    for thread in left:  # its connection reset, the client left behind ends: its C++ warning is this test's output
        thread.join(30)
    assert (why, took) == (f"transfer check: 1 MiB to 127.0.0.1:{port} and back: no answer within 1 s", "")
    assert left and not any(thread.is_alive() for thread in left)
