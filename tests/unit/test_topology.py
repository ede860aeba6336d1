"""Topology rendering: the hostfile, env file and launcher arguments that compose and Ansible use."""

import json
import shlex
import subprocess
import sys

import pytest

from app.errors import UsageError
from app.platform.topology import Host, Topology, parse_hostfile, parse_hosts, render, torchrun_args

TWO_BY_TWO = Topology(parse_hosts("node0:2,node1:2"), master_port=29400, ifname="eth0")


def test_hostfile_has_one_line_per_host_with_slots() -> None:
    assert render(TWO_BY_TWO, "hostfile") == "node0 slots=2\nnode1 slots=2\n"


def test_env_file_names_master_and_sizes() -> None:
    assert render(TWO_BY_TWO, "env").splitlines() == [
        "MASTER_ADDR=node0",
        "MASTER_PORT=29400",
        "NNODES=2",
        "WORLD_SIZE=4",
        "NPROC_PER_NODE=2",
        "GLOO_SOCKET_IFNAME=eth0",
        "NCCL_SOCKET_IFNAME=eth0",
    ]


def test_torchrun_static_and_c10d_rendezvous() -> None:
    assert torchrun_args(TWO_BY_TWO, node_rank=1) == [
        "--nnodes=2",
        "--nproc-per-node=2",
        "--node-rank=1",
        "--master-addr=node0",
        "--master-port=29400",
    ]
    assert "--rdzv-endpoint=node0:29400" in torchrun_args(TWO_BY_TWO)


def test_mpirun_args_carry_master_and_interface() -> None:
    args = shlex.split(render(TWO_BY_TWO, "mpirun", hostfile="/etc/ddp/hostfile"))
    assert args[:4] == ["-np", "4", "--hostfile", "/etc/ddp/hostfile"]
    assert "MASTER_ADDR=node0" in args and "MASTER_PORT=29400" in args
    assert not any(a.startswith("WORLD_SIZE=") for a in args), "WORLD_SIZE without RANK breaks launcher detection"
    assert args[args.index("btl_tcp_if_include") + 1] == "eth0"


def test_master_addr_override_and_uneven_hosts() -> None:
    topo = Topology((Host("a", 4), Host("b", 2)), master_addr="10.1.1.1")
    env = render(topo, "env")
    assert "MASTER_ADDR=10.1.1.1" in env and "WORLD_SIZE=6" in env and "NPROC_PER_NODE" not in env
    with pytest.raises(UsageError, match="same slots"):
        torchrun_args(topo)


def test_hostfile_round_trip_with_comments() -> None:
    text = "# cluster\nnode0 slots=8\nnode1 slots=8 max_slots=8  # second\n\nnode2\n"
    assert parse_hostfile(text) == (Host("node0", 8), Host("node1", 8), Host("node2", 1))
    assert parse_hostfile(render(TWO_BY_TWO, "hostfile")) == TWO_BY_TWO.hosts


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: parse_hostfile("node0 slots=two\n", "hosts.txt"), "hosts.txt line 1"),
        (lambda: parse_hostfile("node0 cpus=2\n"), "node0 slots=2"),
        (lambda: parse_hosts("node0:x"), "NAME:SLOTS"),
        (lambda: parse_hosts("node0:0"), "at least 1 slot"),
        (lambda: parse_hosts("bad host:1"), "not a valid host name"),
        (lambda: Topology(()), "no hosts"),
        (lambda: Topology(parse_hosts("a:1,a:1")), "listed twice"),
        (lambda: Topology(parse_hosts("a:1"), master_port=0), "1024-65535"),
        (lambda: Topology(parse_hosts("a:1"), ifname="eth0; rm -rf /"), "interface name"),
        (lambda: torchrun_args(TWO_BY_TWO, node_rank=2), "--node-rank 2"),
    ],
)
def test_bad_topologies_are_one_line_errors(build, message: str) -> None:
    with pytest.raises(UsageError, match=None) as caught:
        build()
    assert message in str(caught.value) and "\n" not in str(caught.value)


def _topology_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", "topology", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_cli_writes_atomically_and_never_imports_torch(tmp_path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node0 slots=2\nnode1 slots=2\n")
    out = tmp_path / "cluster.json"
    done = _topology_cli("--hostfile", str(hostfile), "--format", "json", "--output", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["world_size"] == 4
    probe = (
        "import sys, app.cli as c; c.main(['topology','--hosts','a:1','--format','env']); print('torch' in sys.modules)"
    )
    assert (
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
        .stdout.strip()
        .endswith("False")
    )


def test_cli_bad_hostfile_exits_2_with_one_line(tmp_path) -> None:
    done = _topology_cli("--hostfile", str(tmp_path / "missing"), "--format", "hostfile")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "cannot read --hostfile" in done.stderr
