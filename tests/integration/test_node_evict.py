"""``python -m app node --evict-factor``: a node's agent evicts its own node when its ranks find it a straggler,
where no cluster runner watches the job (torchrun alone, Slurm, Kubernetes). Three node agents on this machine,
each in a UTS namespace of its own (its own host name, as on three machines; the network is this machine's), one
rank each, an elastic c10d job (--nnodes 2:3) with its store in a process of its own."""

import contextlib
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from bench.gate_figures import KEEP_OUT, LET_IN, set_figures

from app import events, evict
from tests.integration.launchers import _clean_env, in_namespace
from tests.integration.test_node import FAULT_JOB, node_command, store_server, this_machines_address
from tests.integration.train_runs import TIMEOUT, synthetic

pytestmark = pytest.mark.integration

NODES = ("evict-a", "evict-b", "evict-c")
SLOW = NODES[2]
POLICY = ["--evict-factor", "3", "--evict-after", "2"]
TRAIN = ["--train-samples", "7680", "--test-samples", "48", "--epochs", "1", "--batch-size", "8"]
TRAIN += ["--accum-steps", "2", "--exchange-every", "2", "--checkpoint-every", "40", "--resume", "auto"]
"""Global batch 48 (3 ranks x 8 x 2; on 2 ranks: accumulation 3): 160 steps (time for the evicted node's wait)."""
FINAL_STEP = 160
RETRY_S = 2
"""The evicted node's wait before its gate, then between its gate's judgments. Nothing races it: the gate keeps the
node out until the test has seen the others' round without it (the job's figures set beyond any device), and the
others hold their step until it is back (the world whole again)."""


def test_a_slow_node_evicts_itself_the_others_go_on_at_the_same_global_batch_and_it_rejoins_once_healed(
    tmp_path: Path,
) -> None:
    """No restart allowed (--max-restarts 0): the others' round without the evicted node is no failure's restart,
    and its return is a new member's round. evict-c is slow from the start, 10x the others; its gate keeps it out
    (the job's figures set beyond any device) until the others went on without it; the test then heals it."""
    out, slow_while, events_file = tmp_path / "out", tmp_path / "slow", tmp_path / "events"
    records, go = tmp_path / "gate", tmp_path / "go"
    slow_while.touch()  # evict-c sleeps 400 ms a step until the test removes this file
    hooks = [str(FAULT_JOB), "--pace-ms", "40", "--sleep-host", SLOW, "--sleep-while", str(slow_while),
             "--sleep-ms", "400", "--hold-at-step", "1", "--hold-until", str(go),
             "--hold-below-world", "3", "--hold-after", "4", "--"]  # fmt: skip
    job = [*hooks, *synthetic(out, *TRAIN)]
    env = _clean_env({"GLOO_SOCKET_IFNAME": "lo",
                      "DDP_CLUSTER_EVENTS_FILE": str(events_file)})  # fmt: skip

    def start(port: int, host: str) -> subprocess.Popen:
        c10d = ["--nnodes=2:3", "--nproc-per-node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint={address}:{port}",
                "--rdzv-id=evict", "--max-restarts=0", "--monitor-interval=0.5", f"--local-addr={address}",
                "--rdzv-conf=join_timeout=60,last_call_timeout=2"]  # fmt: skip
        cmd = node_command(tmp_path / host, [*c10d, *job], *POLICY, "--records", str(records),
                           "--retry-every", str(RETRY_S))  # fmt: skip
        with open(tmp_path / f"{host}.out", "w") as out_file, open(tmp_path / f"{host}.err", "w") as err_file:
            return subprocess.Popen(in_namespace(host, hosts_file, cmd), env=env, stdout=out_file, stderr=err_file,
                                    start_new_session=True)  # fmt: skip

    def said() -> dict[str, tuple[str, str]]:
        return {host: tuple((tmp_path / f"{host}.{end}").read_text() for end in ("out", "err")) for host in NODES}

    address = this_machines_address()  # every node's: the ranks look for rank 0 there (not on loopback)
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text("127.0.0.1 localhost\n" + "".join(f"{address} {host}\n" for host in NODES))
    with store_server() as port:
        nodes = {host: start(port, host) for host in NODES}

        def until(what: str, found):
            """``found(the job's events)`` once it is something (the nodes hold their step meanwhile)."""
            deadline = time.monotonic() + TIMEOUT
            while time.monotonic() < deadline:
                assert all(proc.poll() is None for proc in nodes.values()), said()
                if result := found(events.read(events_file)[0]):
                    return result
                time.sleep(0.1)
            raise AssertionError(f"no event within {TIMEOUT} s: {what}\n{said()}")

        def first(kind: str, **fields):
            return lambda found: next((r for r in found if r["kind"] == kind and fields.items() <= r.items()), None)

        try:
            until("every node's record", lambda found: sum(r.get("verdict") == events.RECORDED for r in found) == 3)
            set_figures(records, KEEP_OUT)  # then the job starts (held at step 1 until now)
            go.touch()
            evicted = until(f"{SLOW}'s eviction", first(events.EVICTED))
            until(f"{SLOW} kept out", first(events.GATE, node=SLOW, verdict=events.KEPT_OUT))
            until("the others' round without it", first(events.RESIZE, to=2))
            slow_while.unlink()  # healed: its gate passes, and it rejoins
            set_figures(records, LET_IN)
            for proc in nodes.values():
                proc.wait(timeout=TIMEOUT)
        finally:
            for proc in nodes.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
    codes = {host: proc.returncode for host, proc in nodes.items()}
    said = said()
    assert codes == dict.fromkeys(NODES, 0), said
    assert evicted is not None and evicted["evicted"] == SLOW, evicted
    records = events.read(events_file)[0]
    assert [r["evicted"] for r in records if r["kind"] == events.EVICTED] == [SLOW], records  # nobody else
    slow_out = said[SLOW][0]
    assert f"train: node {SLOW} evicted: busy " in slow_out, slow_out[-3000:]
    assert "the job goes on with 2 nodes, global batch 48 (accum 3)" in slow_out, slow_out[-3000:]
    out_line = f"node: out of the job; its health gate judges it in {RETRY_S} s, then every {RETRY_S} s, and it joins "
    assert out_line in slow_out, slow_out
    assert "node: rejoins the job at its next rendezvous round" in slow_out, slow_out[-3000:]
    resizes = [(r["from"], r["to"]) for r in records if r["kind"] == events.RESIZE]
    assert resizes[:2] == [(3, 2), (2, 3)], resizes  # out at the same global batch, then back
    resumed = [r for r in records if r["kind"] == events.RESUMED]
    assert resumed and all(r["from_step"] == r["reached"] for r in resumed), resumed  # no step lost
    survivors = [said[host][1] for host in NODES if host != SLOW]
    assert any(f"node {SLOW} left the job (evicted at step " in err for err in survivors), survivors
    failed = [r for r in records if r["kind"] == events.WORKER_FAILED]
    assert evict.PEER_LEFT in {r["exitcode"] for r in failed}, failed  # not counted: --max-restarts 0 and done
    summary = json.loads((out / "summary.json").read_text())
    assert summary["step"] == FINAL_STEP and summary["params_identical"], summary


def test_an_eviction_policy_on_a_job_of_fixed_size_is_one_line_and_exit_2(tmp_path: Path) -> None:
    cmd = node_command(tmp_path, ["--nnodes=3", "--nproc-per-node=1", "--rdzv-backend=c10d",
                                  "--rdzv-endpoint=127.0.0.1:1", "-m", "app", "check"], *POLICY)  # fmt: skip
    done = subprocess.run(cmd, env=_clean_env(), capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert done.returncode == 2, done
    assert done.stderr.strip().splitlines() == [
        "error: --evict-factor 3 needs an elastic job, torchrun's --nnodes MIN:MAX with MIN below MAX and "
        "--rdzv-backend c10d (this one: --nnodes 3, c10d): a job of a fixed number of nodes cannot go on without "
        "one; give --evict-factor 0 [exit 2]"
    ], done.stderr
    bad = subprocess.run([*cmd[: cmd.index("--")], "--evict-factor", "0.5", *cmd[cmd.index("--") :]],
                         env=_clean_env(), capture_output=True, text=True, timeout=TIMEOUT, check=False)  # fmt: skip
    assert bad.returncode == 2 and "--evict-factor 0.5 must be above 1" in bad.stderr, bad
