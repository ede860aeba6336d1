"""Launcher detection from each launcher's environment, good and bad."""

import pytest

from app.errors import UsageError
from app.runtime.launcher import Launcher, ProcessInfo, detect, identity


def test_no_launcher_is_a_single_process() -> None:
    info = detect({})
    assert (info.rank, info.world_size, info.local_rank, info.launcher) == (0, 1, 0, Launcher.SINGLE)
    assert info.is_main and info.master_addr is None


def test_torchrun_environment() -> None:
    env = {
        "RANK": "5",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "node0",
        "MASTER_PORT": "29400",
        "TORCHELASTIC_RUN_ID": "x",
    }
    info = detect(env)
    assert info == ProcessInfo(5, 1, 8, 4, 1, "node0", 29400, Launcher.TORCHRUN)
    assert info.num_nodes == 2 and not info.is_main
    assert info.eviction is None  # app node gave no policy: the ranks evict nothing


def test_app_nodes_eviction_policy_reaches_its_ranks_whole_and_no_environment_variable_sets_it() -> None:
    from app import evict
    from app.runtime import launcher

    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "node0", "TORCHELASTIC_RUN_ID": "x"}
    policy = evict.Policy(3.0, 2, 2)
    launcher.hand_eviction(policy)  # what rank_main does with its Job's policy
    try:
        assert detect(env).eviction is policy
    finally:
        launcher.hand_eviction(None)
    assert detect(env | {"DDP_CLUSTER_EVICTION": "3:2:2"}).eviction is None  # no text of it travels


def test_app_nodes_range_of_nodes_reaches_its_ranks_and_a_bad_one_is_one_line() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "node0", "TORCHELASTIC_RUN_ID": "x"}
    assert detect(env).node_range is None and not detect(env).elastic
    assert detect(env | {"DDP_CLUSTER_NODE_RANGE": "2:3"}).node_range == (2, 3)
    assert detect(env | {"DDP_CLUSTER_NODE_RANGE": "2:3"}).elastic
    assert not detect(env | {"DDP_CLUSTER_NODE_RANGE": "3:3"}).elastic
    for bad in ("3", "0:2", "3:2", "x:y"):
        with pytest.raises(UsageError, match=f"DDP_CLUSTER_NODE_RANGE='{bad}' must be MIN:MAX"):
            detect(env | {"DDP_CLUSTER_NODE_RANGE": bad})


def test_hand_written_rank_environment_means_one_node() -> None:
    info = detect({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"})
    assert (info.local_rank, info.local_world_size, info.node_rank, info.master_port) == (1, 2, 0, 29500)


def test_openmpi_environment_with_master_from_x_flags() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "MASTER_ADDR": "a",
        "MASTER_PORT": "1234",
    }
    assert detect(env) == ProcessInfo(3, 1, 4, 2, 1, "a", 1234, Launcher.OPENMPI)


def test_mpich_and_intel_mpi_environment() -> None:
    env = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2", "MASTER_ADDR": "h"}
    assert detect(env) == ProcessInfo(2, 0, 4, 2, 1, "h", 29500, Launcher.MPICH)


def test_slurm_master_is_first_host_of_expanded_nodelist() -> None:
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_TASKS_PER_NODE": "4(x2)",
        "SLURM_JOB_NODELIST": "gpu[07-08,10]",
        "SLURM_JOB_ID": "123456",
    }
    info = detect(env)
    assert info == ProcessInfo(5, 1, 8, 4, 1, "gpu07", 20000 + 123456 % 10000, Launcher.SLURM)


def test_srun_pmi2_is_slurm_not_mpich() -> None:
    """srun --mpi=pmi2 adds PMI_RANK/PMI_SIZE (as the mini-cluster showed); hydra would add MPI_LOCALRANKID."""
    slurm = {
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_JOB_NODELIST": "c-node-[1-2]",
        "SLURM_JOB_ID": "7",
    }
    pmi2 = {"PMI_RANK": "3", "PMI_SIZE": "4", "PMI_FD": "12", "PMI_JOBID": "7.0"}
    info = detect(slurm | pmi2)
    assert info == ProcessInfo(3, 1, 4, 2, 1, "c-node-1", 20007, Launcher.SLURM)
    hydra = detect(slurm | pmi2 | {"MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "MASTER_ADDR": "h"})
    assert hydra.launcher is Launcher.MPICH, "mpirun (hydra) inside a Slurm job is still the innermost launcher"


def test_slurm_master_addr_wins_over_nodelist() -> None:
    env = {
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_NODELIST": "n[1-2]",
        "MASTER_ADDR": "10.0.0.9",
        "MASTER_PORT": "4000",
    }
    info = detect(env)
    assert (info.master_addr, info.master_port, info.local_world_size) == ("10.0.0.9", 4000, 2)


def test_precedence_torchrun_inside_slurm_inside_nothing() -> None:
    env = {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "SLURM_PROCID": "3",
        "SLURM_NTASKS": "4",
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
    }
    assert detect(env).launcher is Launcher.TORCHRUN
    del env["RANK"], env["WORLD_SIZE"]
    env["MASTER_ADDR"] = "x"
    assert detect(env).launcher is Launcher.OPENMPI


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"RANK": "4", "WORLD_SIZE": "4", "MASTER_ADDR": "a"}, ["rank 4", "world size 4"]),
        ({"RANK": "0"}, ["RANK", "WORLD_SIZE"]),
        ({"WORLD_SIZE": "2"}, ["WORLD_SIZE", "RANK"]),
        ({"OMPI_COMM_WORLD_RANK": "1"}, ["OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"]),
        ({"PMI_SIZE": "2"}, ["PMI_SIZE", "PMI_RANK"]),
        ({"RANK": "1", "WORLD_SIZE": "2"}, ["(WORLD_SIZE=2)", "export MASTER_ADDR"]),
        ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "4"}, ["openmpi", "-x MASTER_ADDR"]),
        ({"PMI_RANK": "0", "PMI_SIZE": "2"}, ["(PMI_SIZE=2)", "-genv MASTER_ADDR"]),
        ({"RANK": "one", "WORLD_SIZE": "2"}, ["RANK='one'", "not an integer"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "http"}, ["MASTER_PORT='http'"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "70000"}, ["MASTER_PORT=70000"]),
        ({"RANK": "0", "WORLD_SIZE": "0"}, ["world size"]),
        (
            {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "a"},
            ["local rank 2"],
        ),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_TASKS_PER_NODE": "many"}, ["SLURM_TASKS_PER_NODE"]),
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[3-1]"}, ["n[3-1]"]),
        ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, ["slurm", "MASTER_ADDR nor SLURM_JOB_NODELIST"]),
        ({"RANK": "0", "WORLD_SIZE": "2", "GROUP_RANK": "2", "MASTER_ADDR": "a"}, ["GROUP_RANK=2", "WORLD_SIZE=2"]),
    ],
)
def test_bad_environments_give_one_line_naming_the_variables(env: dict, names: list[str]) -> None:
    with pytest.raises(UsageError) as caught:
        detect(env)
    message = str(caught.value)
    assert "\n" not in message
    for name in names:
        assert name in message


def test_file_rendezvous_needs_no_master() -> None:
    info = detect({"RANK": "1", "WORLD_SIZE": "2"}, need_master=False)
    assert info.master_addr is None and info.world_size == 2


def test_other_environment_facts_are_captured_once() -> None:
    assert detect({"NCCL_SOCKET_IFNAME": "ib0"}).ifname == "ib0"
    assert detect({}).ifname is None
    torchrun = {"RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_RUN_ID": "j"}
    info = detect(torchrun | {"TORCHELASTIC_USE_AGENT_STORE": "True"})
    assert (info.restart_count, info.torchelastic, info.agent_store) == (2, True, True)
    assert detect({}).restart_count == 0 and not detect({}).torchelastic
    # Only torchrun's own agent serves a store to join; a hand-written RANK environment does not.
    assert not detect({"RANK": "0", "WORLD_SIZE": "1"}).torchelastic
    assert detect({}).host


def test_bad_rank_names_the_launchers_variables() -> None:
    with pytest.raises(UsageError, match=r"rank 3 \(RANK=3\) must be in \[0, world size 2 \(WORLD_SIZE=2\)\)"):
        detect({"RANK": "3", "WORLD_SIZE": "2", "MASTER_ADDR": "a"})
    slurm = {"SLURM_PROCID": "5", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NODELIST": "n1"}
    with pytest.raises(UsageError, match=r"SLURM_PROCID=5.*SLURM_NTASKS=4"):
        detect(slurm)


def test_privileged_ports_are_refused_with_the_fix() -> None:
    with pytest.raises(UsageError, match="MASTER_PORT=80 must be in 1024-65535"):
        detect({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "80"})


def test_detect_reads_the_real_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "1")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "c[1-2]")
    info = detect()
    assert (info.launcher, info.rank, info.master_addr) == (Launcher.SLURM, 1, "c1")


def test_node_counts_named_apart_from_the_ranks() -> None:
    slurm = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_NUM_NODES": "3"}
    info = detect(slurm)
    assert (info.named_nodes, info.named_nodes_by) == (3, "SLURM_STEP_NUM_NODES=3")  # the step before the job
    assert detect({"NNODES": "2"}).named_nodes_by == "NNODES=2"
    assert detect({"NNODES": "two"}).named_nodes == 0 and detect({}).named_nodes_by == ""


def test_spans_nodes_is_exact_with_uneven_nodes() -> None:
    # 3 ranks, 2 on this node: world // local = 1 node, yet another node holds rank 2.
    mpi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    info = detect(mpi | {"MASTER_ADDR": "a"})
    assert info.num_nodes == 1 and info.spans_nodes
    assert not detect({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a"}).spans_nodes


def test_identity_names_a_rank_even_when_the_environment_is_bad() -> None:
    assert identity({"RANK": "3", "WORLD_SIZE": "2"}).rank == "3"
    assert identity({"SLURM_PROCID": "7"}).rank == "7"
    assert identity({}).rank is None and identity({}).host
