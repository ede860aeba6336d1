"""The rendezvous doctor's checks, each with a failing case: real sockets on loopback, injected name resolution."""

import socket
import time

import pytest

from app.diagnostics import doctor
from app.errors import ClusterError, UsageError
from app.runtime import network
from app.runtime.devices import NodeDevices
from app.runtime.distributed import DistConfig
from app.runtime.launcher import detect

TWO_NODES = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}
"""Rank 2 of 2 nodes x 2 ranks: this node does not hold rank 0."""


def _net(hosts: dict[str, list[str]] | None = None, **given) -> doctor.Network:
    """The real network, but host names resolve from ``hosts`` (no /etc/hosts edits) and parts may be replaced."""

    def resolve(host: str, timeout: float) -> list[str]:
        if hosts is not None and host in hosts:
            return hosts[host]
        return network.resolve(host, timeout)

    return doctor.Network(resolve=resolve, **given)


def _diagnosis(env: dict, cfg: DistConfig | None = None, net: doctor.Network | None = None) -> doctor.Diagnosis:
    return doctor.diagnose(detect(env), cfg or DistConfig(timeout_s=1), net or _net())


def _status(diag: doctor.Diagnosis) -> dict[str, str]:
    return {f.check: f.status for f in diag.findings}


def _detail(diag: doctor.Diagnosis, check: str) -> str:
    return next(f.detail for f in diag.findings if f.check == check)


# --- name resolution -------------------------------------------------------------------------------


def test_an_unresolvable_name_fails_with_the_resolvers_reason() -> None:
    with pytest.raises(network.Unresolved):
        network.resolve("nonexistent.invalid", doctor.RESOLVE_TIMEOUT_S)
    assert network.resolve("localhost", 2)[0] in ("127.0.0.1", "::1")


def test_a_resolver_that_hangs_is_abandoned_after_the_timeout(monkeypatch) -> None:
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: time.sleep(30) or [])
    with pytest.raises(network.Unresolved, match=r"no answer from the resolver within 0\.2s"):
        network.resolve("slow.example", 0.2)


def test_master_address_that_does_not_resolve_fails_naming_it() -> None:
    diag = _diagnosis({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "nonexistent.invalid"})
    assert _status(diag)["master_address"] == "failed" and _status(diag)["port"] == "skipped"
    assert "MASTER_ADDR=nonexistent.invalid does not resolve on" in _detail(diag, "master_address")
    with pytest.raises(ClusterError, match=r"MASTER_ADDR=nonexistent\.invalid does not resolve"):
        doctor.preflight(detect({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "nonexistent.invalid"}), DistConfig())


def test_master_address_on_loopback_fails_only_on_a_node_without_rank_0() -> None:
    hosts = {"node0": ["127.0.1.1"]}
    net = _net(hosts, route_source=lambda ip, port: "10.0.0.2", interfaces=lambda: {"lo": ["127.0.0.1"]})
    other = _diagnosis(TWO_NODES | {"MASTER_ADDR": "node0"}, net=net)
    assert _status(other)["master_address"] == "failed"
    assert "resolves to 127.0.1.1 (loopback)" in _detail(other, "master_address")
    rank0_node = TWO_NODES | {"RANK": "0", "GROUP_RANK": "0", "MASTER_ADDR": "node0"}
    mine = doctor.Diagnosis(0, "node0")
    doctor.check_master_address(mine, detect(rank0_node), ("node0", 29500), net)
    assert _status(mine)["master_address"] == "ok"  # rank 0's own name may resolve to loopback on its node


# --- world of one ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env",
    [
        {"NNODES": "2"},  # the cluster's env file names 2 nodes; plain python started one process
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NUM_NODES": "2"},  # sbatch without srun
        {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "SLURM_STEP_NUM_NODES": "2", "MASTER_ADDR": "a"},
    ],
)
def test_a_world_of_one_is_caught_when_the_environment_names_other_nodes(env: dict) -> None:
    diag = _diagnosis(env)
    assert _status(diag)["world"] == "failed"
    assert "world of one" in _detail(diag, "world") and "=2 names 2 nodes" in _detail(diag, "world")


def test_a_job_that_spans_the_named_nodes_is_not_a_world_of_one() -> None:
    env = TWO_NODES | {"RANK": "0", "GROUP_RANK": "0", "SLURM_STEP_NUM_NODES": "2"}
    assert not _world_failed(env)
    assert not _world_failed({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_NUM_NODES": "1"})
    assert not _world_failed({})


def test_a_round_of_an_elastic_job_on_fewer_nodes_than_slurm_names_is_not_a_world_of_one() -> None:
    # Slurm's step still names 3 nodes after two died; the survivor's agent (app node, --nnodes 1:3) formed a round of
    # its node alone, as its rendezvous may (issue 36: the doctor failed the survivor's rank 0 at every restart)
    lone = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "7"}
    lone |= {"SLURM_STEP_NUM_NODES": "3", "SLURM_JOB_NUM_NODES": "1"}
    assert _world_failed(lone)  # no range known: the world of one it looks like
    assert _world_failed(lone | {"DDP_CLUSTER_NODE_RANGE": "3:3"})  # a job of a fixed size: still one
    for elastic in ("1:3", "2:3"):  # 2:3: a round that torch's rendezvous shrank below its least (a node dropped)
        diag = doctor.Diagnosis(0, "h")
        doctor.check_world(diag, detect(lone | {"DDP_CLUSTER_NODE_RANGE": elastic, "MASTER_ADDR": "a"}))
        detail = _detail(diag, "world")
        assert _status(diag)["world"] == "ok", detail
        assert "a round of an elastic job of" in detail and "(SLURM_STEP_NUM_NODES=3)" in detail, detail


def _world_failed(env: dict) -> bool:
    diag = doctor.Diagnosis(0, "h")
    doctor.check_world(diag, detect(env | {"MASTER_ADDR": "a"}))
    return _status(diag)["world"] == "failed"


# --- interfaces ------------------------------------------------------------------------------------


def test_a_named_interface_that_does_not_exist_is_bad_input_naming_the_ones_that_do() -> None:
    with pytest.raises(UsageError, match=r"interface nosuch0 \(--ifname\) does not exist on .*: it has .*lo"):
        _diagnosis({}, DistConfig(ifname="nosuch0"))
    with pytest.raises(UsageError, match="GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME"):
        _diagnosis({"GLOO_SOCKET_IFNAME": "nosuch0"})
    assert _status(_diagnosis({}, DistConfig(ifname="lo")))["interface"] == "ok"
    assert _status(_diagnosis({"NCCL_SOCKET_IFNAME": "^docker,lo"}))["interface"] == "ok"  # NCCL's exclusions


def test_real_interfaces_include_loopback_and_the_route_to_it() -> None:
    found = network.interfaces()
    assert "127.0.0.1" in found["lo"]
    assert network.route_source("127.0.0.1", 29500) == "127.0.0.1"


FAKE_HOST = {"lo": ["127.0.0.1"], "eth0": ["10.0.0.2"], "ib0": ["192.168.7.2"]}


def test_with_several_nodes_the_interface_that_routes_to_the_master_is_chosen() -> None:
    proc = detect(TWO_NODES | {"MASTER_ADDR": "node0"})
    diag = doctor.Diagnosis(proc.rank, proc.host, master_ip="192.168.7.1")
    routes = {"192.168.7.1": "192.168.7.2"}
    net = doctor.Network(interfaces=lambda: FAKE_HOST, route_source=lambda ip, port: routes[ip])
    doctor.check_interface(diag, proc, DistConfig(), net)
    assert (diag.ifname, diag.chosen) == ("ib0", True)
    assert "the route to MASTER_ADDR (192.168.7.1)" in _detail(diag, "interface")


def test_preflight_exports_the_chosen_interface(monkeypatch) -> None:
    exported = []
    monkeypatch.setattr("app.runtime.launcher.export_socket_ifname", exported.append)
    proc = detect(TWO_NODES, need_master=False)
    net = doctor.Network(
        resolve=lambda host, timeout: ["10.0.0.2"], interfaces=lambda: FAKE_HOST, default_route_interface=lambda: "eth0"
    )
    cpu = NodeDevices(cuda=False, count=0)  # the GPU checks have their own tests (test_gpus.py)
    diag = doctor.preflight(proc, DistConfig(init_method="file:///shared/rdzv"), announce=False, net=net, found=cpu)
    assert (diag.ifname, exported) == ("eth0", ["eth0"])
    assert _status(diag) == {
        "world": "ok",
        "master_address": "skipped",
        "interface": "ok",
        "host_name": "ok",
        "port": "skipped",
        "gpus": "skipped",
        "shm": "skipped",
        "cuda": "skipped",
        "nccl": "skipped",
    }


def test_on_rank_0s_node_the_default_route_decides_else_the_only_candidate() -> None:
    proc = detect(TWO_NODES | {"RANK": "0", "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1"})
    for default, interfaces, expected in [
        ("eth0", FAKE_HOST, "eth0"),
        (None, {"lo": ["127.0.0.1"], "eth1": ["10.1.0.5"]}, "eth1"),
    ]:
        diag = doctor.Diagnosis(0, proc.host, master_ip="127.0.0.1")
        net = doctor.Network(interfaces=lambda i=interfaces: i, default_route_interface=lambda d=default: d)
        doctor.check_interface(diag, proc, DistConfig(), net)
        assert diag.ifname == expected
    diag = doctor.Diagnosis(0, proc.host, master_ip="127.0.0.1")
    undecided = doctor.Network(interfaces=lambda: FAKE_HOST, default_route_interface=lambda: None)
    doctor.check_interface(diag, proc, DistConfig(), undecided)
    assert _status(diag)["interface"] == "failed" and "pass --ifname" in _detail(diag, "interface")
    assert "eth0 10.0.0.2" in _detail(diag, "interface")


def test_one_node_needs_no_interface() -> None:
    diag = _diagnosis({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"})
    assert _status(diag)["interface"] == "skipped" and diag.ifname is None


# --- host names ------------------------------------------------------------------------------------


def test_a_host_name_on_loopback_fails_with_several_nodes_and_no_interface() -> None:
    proc = detect(TWO_NODES | {"MASTER_ADDR": "node0"})
    loopback = _net({proc.host: ["127.0.1.1"]})
    diag = doctor.Diagnosis(proc.rank, proc.host)
    doctor.check_host_name(diag, proc, loopback)
    assert _status(diag)["host_name"] == "failed"
    assert f"{proc.host} -> 127.0.1.1 (loopback) and no interface is set" in _detail(diag, "host_name")
    # Controls: with an interface gloo ignores the name; a network address is fine; one node never asks.
    diag = doctor.Diagnosis(proc.rank, proc.host, ifname="eth0")
    doctor.check_host_name(diag, proc, loopback)
    assert _status(diag)["host_name"] == "ok" and "harmless" in _detail(diag, "host_name")
    diag = doctor.Diagnosis(proc.rank, proc.host)
    doctor.check_host_name(diag, proc, _net({proc.host: ["10.0.0.2"]}))
    assert _status(diag)["host_name"] == "ok"
    diag = doctor.Diagnosis(0, proc.host)
    doctor.check_host_name(diag, detect({}), loopback)
    assert _status(diag)["host_name"] == "skipped"


# --- ports -----------------------------------------------------------------------------------------


def test_a_closed_port_is_not_reached_and_the_attempts_stop_at_the_timeout() -> None:
    with socket.socket() as held:  # bound, never listening: connections are refused
        held.bind(("127.0.0.1", 0))
        reached = network.reach("127.0.0.1", held.getsockname()[1], 0.6)
    assert not reached.ok and "refused" in reached.why.lower()
    with socket.create_server(("127.0.0.1", 0)) as server:
        assert network.reach("127.0.0.1", server.getsockname()[1], 0.6).ok


def test_a_worker_that_cannot_reach_the_master_fails_naming_the_rendezvous() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        diag = _diagnosis({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    assert _status(diag)["port"] == "failed"
    assert f"could not reach the rendezvous at 127.0.0.1:{port} (127.0.0.1) within 1s" in _detail(diag, "port")


def test_rank_0_finds_its_port_taken() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(OSError):
            network.bind(port).close()
        diag = _diagnosis({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    assert _status(diag)["port"] == "failed"
    assert f"port {port} (MASTER_PORT) is not free on" in _detail(diag, "port")


def test_rank_0_knows_whether_master_addr_leads_back_to_it() -> None:
    with socket.create_server(("127.0.0.1", 0)) as mine, socket.create_server(("127.0.0.1", 0)) as other:
        assert network.reaches_self(mine, "127.0.0.1", mine.getsockname()[1], 2).ok
        elsewhere = network.reaches_self(mine, "127.0.0.1", other.getsockname()[1], 0.5)
    assert not elsewhere.ok and "another host's listener" in elsewhere.why


# --- merging ranks ---------------------------------------------------------------------------------


def _view(rank: int, host: str, ip: str, status: str = "ok") -> dict:
    return {
        "rank": rank,
        "node_rank": rank,
        "host": host,
        "interface": None,
        "master_ip": ip,
        "findings": [{"check": "port", "status": status, "detail": f"detail {rank}"}],
    }


def test_merged_findings_name_the_first_failing_rank_and_compare_master_addresses() -> None:
    merged = {f.check: f for f in doctor.merge([_view(0, "a", "10.0.0.1"), _view(1, "b", "10.0.0.9", "failed")])}
    assert merged["port"].status == "failed" and merged["port"].detail == "rank 1 (b): detail 1"
    assert merged["same_master"].status == "failed"
    assert "10.0.0.1 on rank 0 (a); 10.0.0.9 on rank 1 (b)" in merged["same_master"].detail
    same = {f.check: f for f in doctor.merge([_view(0, "a", "10.0.0.1"), _view(1, "b", "10.0.0.1")])}
    assert same["same_master"].status == "ok" and same["port"].status == "ok"
