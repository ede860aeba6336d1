"""``make bench-straggler``: what a straggler's eviction gives a job. A benchmark (figures and a picture), not a test.

    make bench-straggler                            # IMAGE_NAME=... picks the image, as for cluster-up (~11 min)
    PYTHONPATH=docker:. python -m bench.straggler --image ddp-cluster:cpu --cpus 0.25 --png docs/straggler.png

The compose cluster of 3 nodes x 1 rank (--min-nodes 2), digits at global batch 96 (16 x 3 ranks x accum 2; 2 ranks:
accum 3), runs the same job: the 2-node job alone (the healthy rate of the nodes that remain), then for each --cpus (by
default 0.17, a quarter of its share of a 2-core machine, and 0.25) 3 nodes with worker-2 held to that many CPUs
(``docker update --cpus``) from step --at-step for --throttle-s seconds, once without eviction (``--evict-factor
0``) and once with the spec's default policy. From
each run's exchanges of step times (metrics.jsonl's ``ranks`` records: samples/s every 4 steps) and records: the
mean samples/s while throttled, how soon after the throttle the job, resumed without the node, is back at 90 % of
the 2-node rate (its first exchange that is), how soon
after the throttle is lifted the node is back (the resize to 3 ranks), steps lost (the resumes) and evictions
(none may happen in the 2-node run, nor before the throttle). The picture: samples/s over time of both
throttled runs, the throttle, the eviction and the return marked.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.drive import CFS_PERIOD_US, OUT, ROOT, FaultRun, explain

SPEC = ["--nproc-per-node", "1", "--min-nodes", "2", "--max-restarts", "10"]


def train_args(epochs: int, accum: int) -> list[str]:
    return [
        "--dataset", "digits", "--epochs", str(epochs), "--batch-size", "16", "--accum-steps", str(accum),
        "--exchange-every", "4", "--checkpoint-every-epochs", "0", "--out", OUT, "--resume", "auto",
        "--timeout", "30", "--quiet",
    ]  # fmt: skip


def run(image: str, nodes: int, epochs: int, throttle: tuple[int, float, float] | None, *policy: str) -> dict:
    """One job; with ``throttle`` (step, seconds, CPUs) worker-2 is held to that many CPUs from that step on."""
    job = FaultRun(f"ddps-{uuid.uuid4().hex[:8]}", Path(tempfile.mkdtemp(prefix="bench-straggler-")), image)
    hooks = ["--fault-at-step", str(throttle[0]), "--fault-rank", "2"] if throttle else []
    accum = 2 if nodes == 3 else 3
    proc = job.start(hooks, "--nodes", str(nodes), *SPEC, *policy, train=train_args(epochs, accum))
    marks: dict[str, float] = {}
    try:
        if throttle:
            job.marker(proc)
            worker = f"{job.project}-worker-2"
            container = job.engine.containers.get(worker)
            container.update(cpu_period=CFS_PERIOD_US, cpu_quota=round(CFS_PERIOD_US * throttle[2]))
            marks["throttle"], marks["cpus"] = time.time(), throttle[2]
            deadline = time.monotonic() + throttle[1]
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.5)
            container.update(cpu_quota=CFS_PERIOD_US * (os.cpu_count() or 1))
            marks["lift"] = time.time()
        done = job.finish(proc, timeout=3600)
        if done.returncode != 0:
            raise SystemExit(f"error: the job failed:\n{explain(done)}")
        metrics, records = job.metrics(), job.events()
    finally:
        down = [sys.executable, "-m", "app", "cluster", "down", "--name", job.project]
        subprocess.run(down, cwd=ROOT, capture_output=True, timeout=240, check=False)
    evicted = [r["time"] for r in records if r.get("kind") == "evicted"]
    grown = [m["time"] for m in metrics if m.get("event") == "resize" and m["to"] > m["from"]]
    shrunk = [m["time"] for m in metrics if m.get("event") == "resize" and m["to"] < m["from"]]
    return {
        "nodes": nodes, "policy": list(policy), "marks": marks, "evicted_at": evicted, "returned_at": grown,
        "shrunk_at": shrunk,
        "rates": [(m["time"], m["samples_per_s"]) for m in metrics if m.get("event") == "ranks"],
        "steps_lost": sum(m.get("lost", 0) for m in metrics if m.get("event") == "resume"),
    }  # fmt: skip


def figures(healthy: dict, without: dict, evicting: dict) -> dict:
    """The benchmark's figures from its three runs."""
    two_node = statistics.median(rate for _, rate in healthy["rates"][2:])

    def throttled_mean(r: dict) -> float:
        t0, t1 = r["marks"]["throttle"], r["marks"]["lift"]
        return statistics.mean([rate for at, rate in r["rates"] if t0 <= at <= t1] or [0.0])

    t0 = evicting["marks"]["throttle"]
    resumed = evicting["shrunk_at"][:1] or [float("inf")]  # the job going on without the node (its resize)
    back = next((at - t0 for at, rate in evicting["rates"] if at >= resumed[0] and rate >= 0.9 * two_node), None)
    lifted = evicting["marks"]["lift"]
    returned = next((at - lifted for at in evicting["returned_at"] if at >= lifted), None)
    false = len(healthy["evicted_at"]) + sum(e < r["marks"]["throttle"] for r in (evicting,) for e in r["evicted_at"])
    return {
        "cpus": evicting["marks"]["cpus"],
        "two_node_samples_per_s": round(two_node),
        "throttled_mean_without_eviction": round(throttled_mean(without)),
        "throttled_mean_with_eviction": round(throttled_mean(evicting)),
        "back_to_90_percent_s": None if back is None else round(back, 1),
        "returned_after_lift_s": None if returned is None else round(returned, 1),
        "steps_lost": evicting["steps_lost"] + without["steps_lost"],
        "evictions": len(evicting["evicted_at"]),
        "false_evictions": false,
    }


def picture(cases: list[tuple[dict, dict]], path: Path) -> None:
    """Samples/s over time of each throttle's two runs (without and with eviction), a panel each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(cases), 1, figsize=(9, 4 * len(cases)), squeeze=False)
    for ax, (without, evicting) in zip(axes[:, 0], cases, strict=True):
        for r, label in ((without, "no eviction (--evict-factor 0)"), (evicting, "eviction (the default policy)")):
            t0 = r["marks"]["throttle"]
            ax.plot([at - t0 for at, _ in r["rates"]], [rate for _, rate in r["rates"]], label=label, lw=1.2)
        lift = evicting["marks"]["lift"] - evicting["marks"]["throttle"]
        ax.axvspan(0, lift, color="grey", alpha=0.15, label=f"worker-2 at --cpus {evicting['marks']['cpus']:g}")
        for at in evicting["evicted_at"]:
            ax.axvline(at - evicting["marks"]["throttle"], color="red", ls="--", lw=1, label="evicted")
        for at in evicting["returned_at"]:
            ax.axvline(at - evicting["marks"]["throttle"], color="green", ls="--", lw=1, label="back (3 ranks)")
        ax.set_xlabel("seconds from the throttle")
        ax.set_ylabel("samples/s (every 4 steps)")
        ax.set_title(f"3 nodes x 1 rank, digits, global batch 96: worker-2 at --cpus {evicting['marks']['cpus']:g}")
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def _cpus(text: str) -> float:
    """A --cpus value: a positive number of CPUs, as docker update --cpus takes it."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of CPUs, e.g. 0.25")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.straggler", description=__doc__.split("\n")[0])
    parser.add_argument("--image", required=True, help="the workload image (make's IMAGE_NAME:cpu)")
    parser.add_argument("--epochs", type=int, default=600, help="digits epochs of each run (default 600)")
    parser.add_argument("--at-step", type=int, default=200, help="the step the throttle starts at (default 200)")
    parser.add_argument("--throttle-s", type=float, default=40, help="seconds the throttle lasts (default 40)")
    parser.add_argument("--cpus", type=_cpus, nargs="+", default=[0.17, 0.25],
                        help="CPUs worker-2 is held to, one pair of runs each (default 0.17 0.25)")  # fmt: skip
    parser.add_argument("--png", type=Path, default=Path("build/bench-straggler.png"))
    parser.add_argument("--json", type=Path, default=Path("build/bench-straggler.json"))
    args = parser.parse_args()
    healthy = run(args.image, 2, args.epochs, None)
    print(f"2 nodes: {statistics.median(r for _, r in healthy['rates'][2:]):.0f} samples/s", flush=True)
    cases, found = [], []
    for cpus in args.cpus:
        throttle = (args.at_step, args.throttle_s, cpus)
        without = run(args.image, 3, args.epochs, throttle, "--evict-factor", "0")
        evicting = run(args.image, 3, args.epochs, throttle)
        cases.append((without, evicting))
        found.append(figures(healthy, without, evicting))
        for key, value in found[-1].items():
            print(f"--cpus {cpus:g}: {key}: {value}", flush=True)
    picture(cases, args.png)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    runs = [healthy, *(r for case in cases for r in case)]
    args.json.write_text(json.dumps({"figures": found, "runs": runs}, indent=1) + "\n")
    print(f"picture: {args.png}; runs: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
