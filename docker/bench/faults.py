"""``make bench-faults``: how fast the compose cluster heals. A benchmark (figures), not a test (no assertions).

    make bench-faults                                    # IMAGE_NAME=... picks the image, as for cluster-up
    PYTHONPATH=docker:. python -m bench.faults --image ddp-cluster:cpu --epochs 300 --json build/bench-faults.json
    make bench-faults BENCH_FAULTS_ARGS='--min-nodes 1'   # elastic: the head trains on alone meanwhile
    make bench-faults BENCH_FAULTS_ARGS='--pairs 2'       # 2 runs of each, alternately (~18 min)

Runs one training job on the 2 x 2 gloo cluster twice, the same job both times: first undisturbed,
then with one fault a minute, alternately a training process killed (kill -9 inside the worker
container) and the worker container killed (docker kill). The job checkpoints only on the default
time basis (``--checkpoint-every-seconds``, its default; no epoch checkpoints), so the steps lost
show what that default bounds. For each fault: the time from the fault to the first optimizer step
the resumed job completes (the fault job's ``--first-steps`` record; container and host share a
clock), the steps lost (the resume record in metrics.jsonl) and the checkpoint interval in steps;
for each run, the rank ends its node agents saw and the resumptions (the job's events file, app/events.py:
facts, not the runner's lines).
Then the effective training time ratio: the undisturbed run's training time over the disturbed
run's (first start to end in metrics.jsonl), and the same within the disturbed run alone: its
training time less its recoveries, over its training time. Figures depend on the machine's load:
two runs of the same job on a shared 2-core machine differ by up to 15%, as much as the faults
cost; ``--pairs N`` alternates N undisturbed and N disturbed runs and adds the ratio of their medians.
"""

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import docker

from app import contract, events
from app.orchestrate import engine, job
from bench.drive import OUT, FaultRun, explain

FIRST_STEPS = f"{OUT}/first-steps.jsonl"
KILL_A_TRAINING_PROCESS = (
    "import os, signal\n"
    "pids = [int(p) for p in os.listdir('/proc') if p.isdigit()]\n"
    "def title(p):\n"
    "    try:\n"
    "        return open(f'/proc/{p}/cmdline', 'rb').read().replace(b'\\0', b' ')\n"
    "    except OSError:\n"
    "        return b''\n"
    "ranks = [p for p in pids if title(p).startswith(b'python -u /job/fault_job.py ') and b' [rank ' in title(p)]\n"
    "os.kill(max(ranks), signal.SIGKILL)\n"
    "print(max(ranks))\n"
)
"""Run in the worker container: SIGKILL its newest training process, a rank forked by ``app node`` whose title
reads ``python -u /job/fault_job.py ... [rank 3]`` (not the node's agent nor its fork server)."""


def train_args(epochs: int) -> list[str]:
    """The job: digits, 23 steps per epoch on 4 ranks; checkpoints only every --checkpoint-every-seconds."""
    return [
        "--dataset", "digits", "--epochs", str(epochs), "--batch-size", "16", "--checkpoint-every-epochs", "0",
        "--out", OUT, "--resume", "auto", "--timeout", "30", "--quiet",
    ]  # fmt: skip


def run_job(
    job: FaultRun, epochs: int, fault_every: float, min_nodes: int = 2
) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run the job; with ``fault_every`` > 0 strike a fault every that many seconds while it trains."""
    spec = ["--max-restarts", "20", "--min-nodes", str(min_nodes)]
    proc = job.start(["--first-steps", FIRST_STEPS], *spec, train=train_args(epochs))
    faults: list[dict] = []
    if fault_every:
        threading.Thread(target=_strike, args=(job, proc, fault_every, faults), daemon=True).start()
    done = job.finish(proc, timeout=3600)
    return done, faults


def _exec(client: Any, name: str, *command: str) -> tuple[int, str]:
    """A command in the container (``docker exec``): its exit status and standard error, -1 and why when the engine
    refused (no such container, or not running)."""
    try:
        code, (_, err) = client.containers.get(name).exec_run(list(command), demux=True)
        return code, (err or b"").decode(errors="replace")
    except docker.errors.APIError as error:
        return -1, str(error)


def _strike(job: FaultRun, proc: subprocess.Popen, every: float, faults: list[dict]) -> None:
    client = engine.client()  # this thread's own (an SDK client is a requests session)
    head, worker = job.container("head"), job.container("worker")
    while proc.poll() is None and _exec(client, head, "test", "-s", FIRST_STEPS)[0]:
        time.sleep(1)  # not training yet
    kinds = ["training process killed", "worker container killed"]
    while True:
        deadline = time.monotonic() + every
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return
            time.sleep(0.5)
        kind = kinds[len(faults) % 2]
        at = time.time()
        if kind == kinds[0]:
            code, detail = _exec(client, worker, "python", "-c", KILL_A_TRAINING_PROCESS)
        else:
            try:
                client.containers.get(worker).kill()
                code, detail = 0, ""
            except docker.errors.APIError as error:
                code, detail = -1, str(error)
        faults.append({"kind": kind, "time": at, "ok": code == 0, "detail": detail.strip()[-200:]})


def _records(job: FaultRun) -> tuple[list[dict], list[dict]]:
    first = job.results / "f" / "first-steps.jsonl"
    steps = [json.loads(line) for line in first.read_text().splitlines()] if first.exists() else []
    return job.metrics(), steps


def training_seconds(metrics: list[dict]) -> float:
    starts = [m["time"] for m in metrics if m["event"] == "start"]
    ends = [m["time"] for m in metrics if m["event"] == "end"]
    return ends[-1] - starts[0]


def recoveries(faults: list[dict], metrics: list[dict], first_steps: list[dict]) -> list[dict]:
    """Each fault with its recovery time, steps lost and the checkpoint interval before it."""
    resumes = [m for m in metrics if m["event"] == "resume"]
    checkpoints = [m for m in metrics if m["event"] == "checkpoint"]
    out = []
    for fault in faults:
        after = [s["time"] for s in first_steps if s["time"] > fault["time"]]
        resume = next((m for m in resumes if m["time"] > fault["time"]), None)
        before = [c["step"] for c in checkpoints if c["time"] < fault["time"]]
        interval = before[-1] - before[-2] if len(before) > 1 else None
        out.append(
            {
                **fault,
                "recovery_s": round(min(after) - fault["time"], 1) if after else None,
                "steps_lost": resume["lost"] if resume else None,
                "resumed_from": resume["from_step"] if resume else None,
                "checkpoint_interval_steps": interval,
            }
        )
    return out


UNDISTURBED, FAULTED = "undisturbed", "one fault per minute"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.splitlines()[0])
    parser.add_argument("--image", default=contract.image(0), help="workload image (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=600, help="epochs of digits (2-3 minutes undisturbed)")
    parser.add_argument("--fault-every", type=float, default=60.0, metavar="S", help="seconds between faults")
    parser.add_argument("--pairs", type=int, default=1, help="undisturbed and faulted runs, alternately, N of each")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--min-nodes", type=int, default=2, help="1: the head goes on alone while the worker is out")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error(f"--pairs {args.pairs} must be >= 1")
    report: dict = {"load_average_before": os.getloadavg(), "image": args.image, "epochs": args.epochs, "pairs": []}
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        for _ in range(args.pairs):
            pair = {}
            for name, every in ((UNDISTURBED, 0.0), (FAULTED, args.fault_every)):
                pair[name] = measure(name, every, args, Path(tmp))
                if pair[name] is None:
                    return 1
            report["pairs"].append(pair)
    report["load_average_after"] = os.getloadavg()
    print(format_report(report), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def measure(name: str, every: float, args: argparse.Namespace, tmp: Path) -> dict | None:
    """One run of the job on a new compose project, with a fault every ``every`` seconds (0: none): its figures,
    None when it failed (said on stderr)."""
    job = FaultRun(f"ddpb-{uuid.uuid4().hex[:8]}", tmp / uuid.uuid4().hex[:8], args.image)
    print(f"bench-faults: {name}: {job.project} ...", flush=True)
    try:
        done, faults = run_job(job, args.epochs, every, args.min_nodes)
        if done.returncode != 0:
            print(f"error: the {name} run failed\n{explain(done)}", file=sys.stderr)
            return None
        metrics, first_steps = _records(job)
        facts = job.events()
        return {
            "training_s": round(training_seconds(metrics), 1),
            "steps": next(m["step"] for m in reversed(metrics) if m["event"] == "end"),
            "faults": recoveries(faults, metrics, first_steps),
            "failures": [  # each rank's end, as its node's agent saw it (exit status; negative: the signal)
                {k: r.get(k) for k in ("time", "node", "rank", "exitcode", "attempt")}
                for r in facts
                if r["kind"] == events.WORKER_FAILED
            ],
            "resumptions": sum(r["kind"] == events.RESUMED for r in facts),
            "resizes": [(m["from"], m["to"], m["step"]) for m in metrics if m["event"] == "resize"],
        }
    finally:
        subprocess.run(
            [sys.executable, "-m", "app", "cluster", "down", "--name", job.project],
            capture_output=True, timeout=300, check=False,
        )  # fmt: skip


def format_report(r: dict) -> str:
    pairs = r["pairs"]
    lines = [
        f"bench-faults: 2 nodes x 2 ranks (gloo), digits, {r['epochs']} epochs, {pairs[0][UNDISTURBED]['steps']} "
        f"steps; load average before {r['load_average_before'][0]:.1f}, after {r['load_average_after'][0]:.1f}",
    ]
    for pair in pairs:
        calm, hit = pair[UNDISTURBED], pair[FAULTED]
        for f in hit["faults"]:
            lines.append(
                f"  {f['kind']:<26} recovery {f['recovery_s']} s  steps lost {f['steps_lost']} "
                f"(resumed from {f['resumed_from']}; checkpoint interval {f['checkpoint_interval_steps']} steps)"
            )
        if "failures" in hit:
            codes = collections.Counter(job.describe_status(f["exitcode"]) for f in hit["failures"])
            seen = ", ".join(f"{n} x {status}" for status, n in codes.most_common()) or "none"
            lines.append(f"  rank ends its agents saw: {seen}; resumed {hit['resumptions']} time(s)")
        if hit.get("resizes"):
            lines.append(f"  resizes (ranks from, to, at step): {hit['resizes']}")
        lines.append(
            f"  training time: undisturbed {calm['training_s']:.0f} s, {len(hit['faults'])} fault(s) "
            f"{hit['training_s']:.0f} s: effective training time ratio {calm['training_s'] / hit['training_s']:.2f}; "
            f"within the run {within_run(hit):.2f}"
        )
    faults = [f for pair in pairs for f in pair[FAULTED]["faults"]]
    timed = [f["recovery_s"] for f in faults if f["recovery_s"] is not None]
    lost = [f["steps_lost"] for f in faults if f["steps_lost"] is not None]
    if timed:
        lines.append(f"  median recovery {statistics.median(timed):.1f} s (max {max(timed):.1f} s), "
                     f"median steps lost {statistics.median(lost) if lost else '?'}")  # fmt: skip
    if len(pairs) > 1:
        calm = statistics.median(p[UNDISTURBED]["training_s"] for p in pairs)
        hit = statistics.median(p[FAULTED]["training_s"] for p in pairs)
        lines.append(f"  medians: undisturbed {calm:.0f} s, with faults {hit:.0f} s: ratio {calm / hit:.2f}")
    return "\n".join(lines)


def within_run(hit: dict) -> float:
    """The faulted run's training time less its recoveries (fault to the first step after the resume), over its
    training time: what the faults cost in that run alone, free of the machine's pace between runs."""
    lost = sum(f["recovery_s"] or 0.0 for f in hit["faults"])
    return (hit["training_s"] - lost) / hit["training_s"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
