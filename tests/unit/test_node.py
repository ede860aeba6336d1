"""app node's parts without ranks: torchrun's arguments as its parser reads them, what a rank's exit status is,
and a fork server that never asks CUDA anything (a GPU started before the fork is unusable in the ranks)."""

import json
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from app import contract, events, evict
from app.errors import UsageError
from app.node import agent
from app.node import command as node
from app.runtime import launcher
from tests.rigs import entrypoints

SPY = """
import json
import torch

asked = []


def spy(name, real):
    def called(*args, **kwargs):
        asked.append(name)
        return real(*args, **kwargs)

    return called


for name in ("is_available", "device_count", "init", "_lazy_init", "current_device", "get_device_properties"):
    setattr(torch.cuda, name, spy(name, getattr(torch.cuda, name)))
for name in dir(torch._C):
    if name.startswith(("_cuda_get", "_cuda_init")):
        setattr(torch._C, name, spy(name, getattr(torch._C, name)))
from app.node.command import PRELOAD

for module in PRELOAD:
    __import__(module)
preload = list(asked)
torch.cuda.is_available()  # the control: a real question is seen
print(json.dumps({"preload": preload, "control": asked[len(preload):]}))
"""


def test_the_preload_asks_cuda_nothing() -> None:
    done = subprocess.run([sys.executable, "-c", SPY], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["preload"] == [], seen
    assert "is_available" in seen["control"], seen


def test_torchruns_arguments_are_read_by_torchruns_parser() -> None:
    args = agent.parse(["--nnodes=1:2", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=s:29500",
                        "-m", "app", "train", "--epochs", "3"])  # fmt: skip
    assert (args.nnodes, args.rdzv_endpoint, args.module, args.training_script) == ("1:2", "s:29500", True, "app")
    assert args.training_script_args == ["train", "--epochs", "3"]


def test_standalone_is_c10d_on_a_free_local_port_as_torchrun_makes_it() -> None:
    args = agent.parse(["--standalone", "--nproc-per-node=2", "job.py"])
    assert (args.rdzv_backend, args.rdzv_endpoint, args.master_port) == ("c10d", "localhost:0", 29500)


@pytest.mark.parametrize(
    ("words", "said"),
    [
        (["--nnodes", "x:y", "job.py"], "torchrun's arguments: --nnodes x:y: "),
        (["--max-restarts", "many", "job.py"], "torchrun's arguments: argument --max-restarts"),
        (["--nproc-per-node=2"], "torchrun's arguments: the following arguments are required: training_script"),
    ],
)
def test_bad_torchrun_arguments_are_usage_errors(words: list[str], said: str) -> None:
    with pytest.raises(UsageError) as error:
        agent.prepare(agent.parse(words), node.rank_main, agent.Server({}))
    assert str(error.value).startswith(said) and str(error.value).endswith("(see 'torchrun --help')"), error.value


def test_the_job_of_each_rank_is_torchruns_script_its_arguments_and_what_the_agent_set_since(monkeypatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    server = agent.Server(launcher.environment())  # the fork server starts with this environment
    monkeypatch.setenv("DDP_CLUSTER_SURVIVORS_STORE", "store:29500")  # set by the agent after it started
    words = ["--standalone", "--nproc-per-node=2", "-m", "app", "check", "-v"]
    launch = agent.prepare(agent.parse(words), node.rank_main, server)
    assert launch.entrypoint is node.rank_main and launch.config.start_method == agent.START_METHOD
    [job] = launch.args
    assert (job.target, job.module, job.args) == ("app", True, ("check", "-v"))
    assert job.words() == ["-m", "app", "check", "-v"]
    assert job.environment == (("DDP_CLUSTER_SURVIVORS_STORE", "store:29500"),)  # a fork would miss it otherwise
    assert job.eviction is None
    own = agent.prepare(agent.parse(["--standalone", "--nproc-per-node=2", "job.py", "a"]), node.rank_main, None)
    assert own.entrypoint == sys.executable and own.args == ("-u", "job.py", "a")  # torchrun's own launch


def test_the_eviction_policy_is_handed_to_each_rank_whole_through_its_job_and_never_to_torchruns_own_launch() -> None:
    policy = evict.Policy(3.0, 2, 2)
    words = ["--nnodes=2:3", "--nproc-per-node=1", "--rdzv-backend=c10d", "--rdzv-endpoint=s:29500", "-m", "app"]
    [job] = agent.prepare(agent.parse(words), node.rank_main, agent.Server({}), policy).args
    assert pickle.loads(pickle.dumps(job)).eviction == policy  # as the fork server hands it to the rank
    with pytest.raises(UsageError, match=r"--evict-factor needs app node's forked ranks.*leave out --no-fork"):
        agent.prepare(agent.parse(words), node.rank_main, None, policy)


@pytest.mark.parametrize(
    ("endpoint", "backend", "store"),
    [("ddp-cluster-rendezvous-1:29500", "c10d", "ddp-cluster-rendezvous-1:29500"), ("localhost:0", "c10d", None),
     ("", "static", None), ("node0:29400", "static", None)],
)  # fmt: skip
def test_the_survivors_store_is_a_c10d_rendezvous_store(endpoint: str, backend: str, store: str | None) -> None:
    assert node.survivors_store(SimpleNamespace(rdzv_endpoint=endpoint, rdzv_backend=backend)) == store


@pytest.mark.parametrize(("code", "status"), [(None, 0), (0, 0), (3, 3), ("a message", 1)])
def test_a_ranks_exit_status_is_what_sys_exit_gives_a_process(code: object, status: int, capsys) -> None:
    assert node.exit_status(code) == status
    assert capsys.readouterr().err == ("a message\n" if isinstance(code, str) else "")


def _agent_after(*attempts: list[tuple[int, int, str]], path: Path) -> object:
    """torch's agent with the events of ``attempts`` (each: (rank, exit status, error) of the ranks that failed)
    seen, as its monitor reports them; its restarts left, and what it wrote to the events file ``path``."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    watcher = object.__new__(agent.event_agent())  # its monitoring alone: no rendezvous, no ranks
    watcher.restarts_left = 5
    for attempt, failures in enumerate(attempts):
        found = {}
        for rank, code, message in failures:
            error_file = path.parent / f"error-{attempt}-{rank}.json"
            if message:
                error_file.write_text(json.dumps({"message": {"message": message, "extraInfo": {"timestamp": "1"}}}))
            found[rank] = ProcessFailure(local_rank=rank % 2, pid=1, exitcode=code, error_file=str(error_file))
        watcher._write(found, attempt)  # as _monitor_workers does: written, then judged
        watcher._judge(found, attempt)
    return watcher


@pytest.mark.parametrize(
    ("attempts", "gave_up"),
    [
        ([[(1, 1, "RuntimeError: boom")], [(1, 1, "RuntimeError: boom")]], (1, events.REPEATED, 2)),
        (  # its peers lost it: their errors name other ports each time, the cause is the same
            [
                [(0, 1, "closed by peer [10.0.0.4]:47341"), (1, 1, "boom")],
                [(0, 1, "closed by peer [10.0.0.4]:51234"), (1, 1, "boom")],
            ],
            (1, events.REPEATED, 2),
        ),
        ([[(0, -15, "a"), (1, 1, "boom")], [(0, -15, "b"), (1, 1, "boom")]], (1, events.REPEATED, 2)),  # agent's stop
        ([[(1, 1, "RuntimeError: boom at step 3")], [(1, 1, "RuntimeError: boom at step 7")]], None),  # another
        ([[(1, 1, "RuntimeError: boom")], [(1, 1, "RuntimeError: boom"), (3, -9, "")]], None),  # a rank killed too
        ([[(3, -9, ""), (1, 1, "x")], [(1, 1, "x")]], None),  # after a kill: not the script's doing
        ([[(1, 1, "")], [(1, 1, "")]], None),  # no error file: nothing known to be the same
        ([[(0, 2, "error: rank 0 on h: --dataset 'x' is not one of digits [exit 2]")]], (0, events.BAD_INPUT, 1)),
    ],
)
def test_the_agent_writes_each_failure_and_stops_restarting_what_no_restart_cures(tmp_path, attempts, gave_up):
    path = tmp_path / "events.jsonl"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DDP_CLUSTER_EVENTS_FILE", str(path))
        watcher = _agent_after(*attempts, path=path)
    records, _ = events.read(path)
    failed = [(r["rank"], r["exitcode"], r["message"]) for r in records if r["kind"] == events.WORKER_FAILED]
    assert failed == [tuple(f) for attempt in attempts for f in sorted(attempt)]
    said = [(r["rank"], r["reason"], r["attempts"]) for r in records if r["kind"] == events.GAVE_UP]
    assert said == ([gave_up] if gave_up else [])
    assert watcher.restarts_left == (0 if gave_up else 5)


def test_ddp_node_gives_the_agent_the_rendered_node_flags_before_torchruns_arguments(tmp_path: Path) -> None:
    """docker/bin/ddp-node with a stand-in ``python`` that prints what it was given: the node flags of
    /cluster/node.args (Kubernetes' ConfigMap) go to app node, torchrun's arguments after ``--``; none without."""
    (tmp_path / "bin").mkdir()
    stand_in = tmp_path / "bin" / "python"
    stand_in.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    stand_in.chmod(0o755)
    (tmp_path / "torchrun.args").write_text("--nnodes=2:3 --nproc-per-node=1\n")
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}
    script = entrypoints.relocated("ddp-node", tmp_path)

    def argv() -> list[str]:
        done = subprocess.run(["bash", str(script), "-m", "app", "check"], env=env, capture_output=True, text=True,
                              timeout=30, check=True)  # fmt: skip
        return done.stdout.split()

    plain = ["-m", "app", "node", "--serve-metrics"]
    job = ["--", "--nnodes=2:3", "--nproc-per-node=1", "-m", "app", "check"]
    assert argv() == [*plain, *job]
    (tmp_path / contract.NODE_ARGS).write_text("--evict-factor=3 --evict-after=3\n")
    assert argv() == [*plain, "--evict-factor=3", "--evict-after=3", *job]


def test_an_evicted_nodes_line_says_when_its_gate_judges_it() -> None:
    assert node.evicted(0.0, 10) == (
        "node: out of the job; its health gate judges it in 10 s, then every 10 s, and it joins the job's next "
        "round once it passes"
    )
    assert "judges it in 60 s (evicted again soon after its return), then every 10 s" in node.evicted(60.0, 10)
    assert "judges it now (no --retry-every: kept out, the node exits 3), and it joins" in node.evicted(0.0, 0)


@pytest.mark.parametrize(
    ("nnodes", "backend", "policy"),
    [("2:3", "c10d", evict.Policy(3.0, 2, 2)), ("3", "c10d", None), ("3:3", "c10d", None), ("2:3", "static", None)],
)
def test_the_eviction_policy_acts_only_on_an_elastic_c10d_job(nnodes: str, backend: str, policy) -> None:
    parsed = SimpleNamespace(nnodes=nnodes, rdzv_backend=backend)
    cfg = node.NodeConfig(evict_factor=3.0, evict_after=2)
    if policy is None:
        with pytest.raises(UsageError, match="needs an elastic job"):
            node.eviction(cfg, parsed)
    else:
        assert node.eviction(cfg, parsed) == policy
    assert node.eviction(node.NodeConfig(), parsed) is None  # not given: off (every rendering gives the spec's)
    assert node.eviction(node.NodeConfig(evict_factor=0.0), parsed) is None
    with pytest.raises(UsageError, match=r"--evict-after 0 must be >= 1"):
        node.eviction(node.NodeConfig(evict_factor=3.0, evict_after=0), parsed)


def test_an_evicted_nodes_agent_leaves_and_a_change_of_the_jobs_nodes_is_no_restart_to_count(tmp_path) -> None:
    """The agent's reading of its ranks' exit statuses (``evict.LEFT``, ``evict.PEER_LEFT``) and of a node waiting
    to join (another node's agent stopped its ranks for it, so this node's failed)."""
    from torch.distributed.elastic.agent.server.api import RunResult, WorkerState
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    class Handler:
        def __init__(self, waiting: int | None) -> None:
            self.waiting = waiting

        def num_nodes_waiting(self) -> int:
            if self.waiting is None:
                raise RuntimeError("the store is gone")
            return self.waiting

    def monitored(
        codes: list[int], waiting: int | None = 0, evicting: bool = True, wait_list=None, round_nodes=frozenset()
    ) -> object:
        failures = {r: ProcessFailure(local_rank=r, pid=1, exitcode=c, error_file=str(tmp_path / "none")) for r, c
                    in enumerate(codes)}  # fmt: skip
        cls = agent.event_agent(evicting)
        watcher = cls.__new__(cls)
        watcher._before, watcher._round = None, frozenset(round_nodes)
        watcher.restarts_left = 2
        handler = Handler(waiting)
        if wait_list is not None:  # c10d's handler: its state as num_nodes_waiting last read it
            handler._state_holder = SimpleNamespace(state=SimpleNamespace(participants=set(), wait_list=set(wait_list)))
        result = RunResult(WorkerState.FAILED, {}, failures)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(agent, "SETTLE_S", 0.0)
            patch.setattr(agent, "leave_round", lambda found: left.append(found))
            watcher.monitored(result, lambda: result, SimpleNamespace(max_restarts=2, rdzv_handler=handler))
        return watcher

    left: list = []
    assert monitored([evict.PEER_LEFT, evict.PEER_LEFT]).restarts_left == 3  # torch takes one back: 2
    assert monitored([1, evict.PEER_LEFT]).restarts_left == 2  # a failure among them: counted
    assert monitored([1], waiting=1).restarts_left == 3  # a node waits to join: not counted
    assert monitored([1], waiting=None).restarts_left == 2  # the store is gone: counted
    with pytest.raises(agent.evicted_error()):
        monitored([evict.LEFT, evict.LEFT])
    assert len(left) == 1 and isinstance(left[0], Handler)
    # A node waits to join that was in this agent's round: a peer whose agent restarted after this very failure (the
    # compose test's rank that raised at every attempt got an uncounted third attempt when the peer came back first).
    peer, newcomer = "worker-1 (pid 7)", "worker-2 (pid 9)"
    assert monitored([1], waiting=1, wait_list={peer}, round_nodes={"head (pid 5)", peer}).restarts_left == 2
    assert monitored([1], waiting=1, wait_list={newcomer}, round_nodes={"head (pid 5)", peer}).restarts_left == 3
    # Without a straggler policy no node is evicted: those statuses are the script's own, failures like any other
    # (a script that left with 5 on every rank was restarted for ever, uncounted).
    assert monitored([evict.PEER_LEFT, evict.PEER_LEFT], evicting=False).restarts_left == 2
    assert monitored([evict.LEFT, evict.LEFT], evicting=False).restarts_left == 2 and len(left) == 1


def test_a_rank_names_its_process_where_setproctitle_is_installed_and_goes_on_where_it_is_not(monkeypatch):
    """A GPU machine with only torch (no setproctitle): the rank keeps the server's title instead of failing."""
    titles = []
    monkeypatch.setitem(sys.modules, "setproctitle", SimpleNamespace(setproctitle=titles.append))
    node.name_process("python -u -m app train [rank 3]")
    assert titles == ["python -u -m app train [rank 3]"]
    monkeypatch.setitem(sys.modules, "setproctitle", None)  # import setproctitle raises ImportError
    node.name_process("python -u -m app train [rank 3]")
    assert titles == ["python -u -m app train [rank 3]"]


def test_a_ranks_error_file_is_whole_or_absent_and_torchs_agent_reads_it(tmp_path, monkeypatch) -> None:
    """torch's own writer opens the file, then writes: a rank stopped in between left it empty, and torch's agent
    failed on it and ended the job (``unexpected JSONDecodeError``, a two-busy-loop run of 131df6d)."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from app import logs

    path = tmp_path / "error.json"
    logs.write_error_file(str(path), "RuntimeError: boom on rank 1", "Traceback ...")
    failure = ProcessFailure(local_rank=1, pid=1, exitcode=1, error_file=str(path))
    assert agent.error_of(failure) == "RuntimeError: boom on rank 1"
    unfinished = tmp_path / "unfinished.json"

    def stopped_before_the_rename(*_):
        raise OSError("stopped")

    monkeypatch.setattr("os.replace", stopped_before_the_rename)
    logs.write_error_file(str(unfinished), "RuntimeError: boom", "")
    assert not unfinished.exists() and list(tmp_path.iterdir()) == [path]  # no empty file, no temporary left
