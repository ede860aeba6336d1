"""Drive the compose cluster through faults: start a job of the fault job (fault_job.py), wait for its
marker, act on a container, and read what came back. Used by the container tests (tests/docker/) and by
``make bench-faults`` and ``make bench-straggler`` (faults.py, straggler.py).

    run = FaultRun("ddpt-1234", Path("/tmp/results"), "ddp-cluster-test:cpu")
    proc = run.start(["--fault-at-step", "25", "--fault-rank", "3", "--slow-ms", "500"])
    marker = run.marker(proc)              # the step was reached: act now
    run.engine.containers.get(run.container("worker")).kill()  # the engine's objects, from the Docker SDK
    done = run.finish(proc)                # exit status and output of `python -m app cluster up`

A test's causes, which no load can shrink: ``set_gate_figures`` sets the job's figures that every node's gate
judges against (far above any real figure: kept out; far below: passes), ``touch`` releases the fault job's
``--hold-until`` file, and ``wait_event`` waits for a fact of the job's events, never for a window of time.
"""

import functools
import json
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import torch

from app import events
from app.diagnostics.gate_config import GateConfig
from app.orchestrate import engine as docker_engine
from app.orchestrate import runner
from app.topology import compose
from bench import gate_figures

ROOT = Path(__file__).resolve().parents[2]
JOB = str(Path(__file__).resolve().with_name("fault_job.py").relative_to(ROOT))
"""The fault job as ``--script`` names it, from the checkout's root: the runner mounts its folder (this package's) at
/job in every node."""
OUT = "/results/f"
"""The job's --out in the results volume."""
MARKER = f"{OUT}/fault.json"
CFS_PERIOD_US = 100_000
"""The CFS period that ``docker update --cpus`` sets; the SDK's update takes a quota in it (no --cpus)."""
SICK_QUOTA_US = CFS_PERIOD_US // 20
"""A sick node's quota (``docker update --cpus 0.05``): a ceiling, under any load, of about a tenth of what the
node measured alone at the job's start on this 2-core machine. At --cpus 0.1 it measured more than half the job's
figure on a loaded CI machine (its gate let it in); Python starts twice as slowly at 0.05 as at 0.1 (test_evict,
whose evicted node starts again under its quota, keeps 0.1)."""
COLLECTIVE_TIMEOUT = 20
"""The job's --timeout: a collective that waits longer fails."""
TRAIN = [
    "--dataset", "digits", "--epochs", "2", "--batch-size", "16", "--checkpoint-every", "10",
    "--keep-checkpoints", "10", "--out", OUT, "--resume", "auto", "--timeout", str(COLLECTIVE_TIMEOUT),
]  # fmt: skip
"""app train's flags: 23 steps per epoch on 4 ranks, 46 in all; checkpoints at 10, 20, 23, 30, 40, 46."""
FINAL_STEP = 46
JOIN_TIMEOUT_S = 600
"""The fault jobs' --join-timeout: their first round waits half of it for every node (app/node/agent.py), so a node
that a loaded machine starts late still makes it (a job that starts on fewer nodes has another global batch); it
bounds only a failure (a node that never comes), not a passing run."""
GATE_RECORDS = str(GateConfig().records)
"""Where every node's gate records its figures at the job's start (the results volume, shared by the nodes)."""


@dataclass
class FaultRun:
    """One compose project running the fault job."""

    project: str
    results: Path
    image: str

    def command(self, hooks: list[str], *spec: str, train: list[str] = TRAIN) -> list[str]:
        args = " ".join([*hooks, "--", *train])
        return [
            sys.executable, "-m", "app", "cluster", "up", "--name", self.project, "--image", self.image,
            "--results", str(self.results), "--script", JOB, "--args", args,
            *gate_figures.QUICK, "--join-timeout", str(JOIN_TIMEOUT_S), *spec,  # a test's own flags come last: they win
        ]  # fmt: skip

    def start(self, hooks: list[str], *spec: str, train: list[str] = TRAIN) -> subprocess.Popen:
        """``python -m app cluster up`` with the fault job, in the background."""
        cmd = self.command(["--marker", MARKER, *hooks], *spec, train=train)
        return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def container(self, service: str) -> str:
        return f"{self.project}-{service}-1"

    @functools.cached_property
    def engine(self) -> Any:
        """The Docker engine (a ``docker.DockerClient``: containers, volumes... as Engine API objects) of the
        thread that first asks; another thread takes its own, ``app.orchestrate.engine.client()``."""
        return docker_engine.client()

    def marker(self, proc: subprocess.Popen, timeout: float = 400) -> dict:
        """The fault job's marker (its step was reached), read from the head container as soon as it is there."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                found = self.engine.containers.get(self.container("head")).exec_run(["cat", MARKER])
            except docker.errors.APIError:  # no head yet, or not running
                found = None
            if found and found.exit_code == 0 and found.output.strip():
                return json.loads(found.output)
            assert proc.poll() is None, f"the job ended before its fault step:\n{self.finish(proc)}"
            time.sleep(0.5)
        raise AssertionError(f"no marker {MARKER} within {timeout}s; {self.digest()}\n{self.evidence()}")

    def in_head(self, *cmd: str) -> str:
        """Run ``cmd`` in the head container (as its user); its output; an error unless it exits 0."""
        done = self.engine.containers.get(self.container("head")).exec_run(list(cmd))
        assert done.exit_code == 0, f"{cmd} in the head: exit {done.exit_code}: {done.output.decode(errors='replace')}"
        return done.output.decode(errors="replace")

    def set_gate_figures(self, value: float) -> None:
        """Every node's record of its figures at the job's start set to ``value`` (gate_figures.KEEP_OUT, LET_IN):
        the job's figures that each gate judges against from its next judgment on."""
        self.in_head("python", "-c", gate_figures.SET_FIGURES, GATE_RECORDS, repr(value))

    def touch(self, path: str) -> None:
        """Create ``path`` in the results volume (what a fault job's --hold-until or --sleep-while waits on)."""
        self.in_head("touch", path)

    def wait_event(self, proc: subprocess.Popen, what: str, match, timeout: float = 600) -> dict:
        """The first of the job's events for which ``match(record)`` is true, once written; the job must run on
        until then (``timeout`` bounds a test whose job hangs: the verdict is the event, not the time)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [record for record in self.events() if match(record)]
            if found:
                return found[0]
            assert proc.poll() is None, f"the job ended before {what}:\n{explain(self.finish(proc))}"
            time.sleep(0.5)
        raise AssertionError(f"no event within {timeout:g} s: {what}; {self.digest()}\n{self.evidence()}")

    def finish(self, proc: subprocess.Popen, timeout: float = 600) -> subprocess.CompletedProcess:
        """The job's exit status and output; a job still running after ``timeout`` is killed and the test fails
        with what it printed, its last events and each container's last lines (``cluster down`` removes them)."""
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            digest, seen = self.digest(), self.evidence()
            proc.kill()
            out, err = proc.communicate()
            hung = explain(subprocess.CompletedProcess(proc.args, None, out, err))
            raise AssertionError(f"the job still ran after {timeout:g} s; {digest}\n{hung}\n{seen}") from None
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def digest(self) -> str:
        """One line for pytest's short summary (all that a CI log's tail may keep): the job's last event and each of
        its containers' state."""
        last = self.events()[-1:]
        states = ", ".join(f"{c.name.removeprefix(self.project + '-')} {c.status}" for c in self._containers())
        return f"last event {json.dumps(last[0])[:300] if last else None}; containers: {states or 'none'}"

    def _containers(self) -> list:
        """The project's containers, running or not (Engine API objects)."""
        return self.engine.containers.list(all=True, filters={"label": f"com.docker.compose.project={self.project}"})

    def evidence(self) -> str:
        """The job's last events and each of its containers' last log lines, for a failure's message."""
        told = ["--- last events", *(json.dumps(record) for record in self.events()[-30:])]
        for found in self._containers():
            told += [f"--- {found.name} ({found.status})", found.logs(tail=40).decode(errors="replace")]
        return "\n".join(told)

    def final_state(self, step: int = FINAL_STEP) -> dict:
        """The checkpoint of ``step`` that came back to --results, read as the app reads it."""
        path = self.results / "f" / "checkpoints" / f"step-{step:08d}.pt"
        return torch.load(path, map_location="cpu", weights_only=True)

    def summary(self) -> dict:
        return json.loads((self.results / "f" / "summary.json").read_text())

    def metrics(self) -> list[dict]:
        return [json.loads(line) for line in (self.results / "f" / "metrics.jsonl").read_text().splitlines()]

    def events(self) -> list[dict]:
        """The job's events (app/events.py: what its agents, ranks and gates wrote), until ``cluster down``."""
        return events.read(compose.events_file(ROOT / runner.STATE_DIR / self.project))[0]


def explain(done: subprocess.CompletedProcess) -> str:
    """The tail of a command's output, for assertion messages; for a cluster's run, its nodes' last lines too (the
    command streams rank 0's node alone; every node's lines are in logs/cluster.log, under the node's name)."""
    said = f"exit {done.returncode}\n--- stdout\n{done.stdout[-5000:]}\n--- stderr\n{done.stderr[-3000:]}"
    named = re.search(r"^cluster: ([\w.-]+): ", done.stdout or "", re.MULTILINE)  # the runner's first line
    log = ROOT / "logs" / "cluster.log"
    if not named or not log.exists():
        return said
    mine = [line for line in log.read_text(errors="replace").splitlines() if line.startswith(f"{named[1]}-")]
    return f"{said}\n--- the nodes' last lines (logs/cluster.log)\n" + "\n".join(mine[-40:])
