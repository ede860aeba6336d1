"""``make bench-metrics``: what serving a node's Prometheus metrics costs its ranks. A benchmark (figures), not a
test (no assertions).

    make bench-metrics                                       # 3 pairs, ~4 min on 2 cores
    PYTHONPATH=docker:. python -m bench.metrics --pairs 5 --scrape-every 0.5 --json build/bench-metrics.json

One node agent (``python -m app node``, as the image's ddp-node runs it) trains digits on 2 local ranks (gloo), the
same job each time, alternately without ``--serve-metrics`` and with it while a scraper reads ``/metrics`` every
``--scrape-every`` seconds (0.5 s: 4 times the mini-cluster's Prometheus, 30 times Prometheus's default). Each run's
figure is the job's steady samples/s (summary.json: every epoch after the first); the result is each side's median
and their ratio. Figures depend on the machine's load: on a shared 2-core machine runs of the same job differ by
several percent, so read the ratio against the spread of each side's runs, which it prints.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape_until(port: int, every: float, stop: threading.Event, counts: list[int]) -> None:
    """Read the node's metrics every ``every`` seconds until ``stop``; counts the answers."""
    while not stop.wait(every):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
                answer.read()
            counts[0] += 1
        except OSError:  # not serving yet
            pass


def one_run(folder: Path, serve: bool, epochs: int, scrape_every: float) -> dict:
    """One job; its steady samples/s and the scrapes it answered."""
    port = free_port()
    metrics = ["--serve-metrics", "--metrics-port", str(port)] if serve else []
    train = ["-m", "app", "train", "--dataset", "digits", "--epochs", str(epochs), "--out", str(folder / "out")]
    cmd = [sys.executable, "-m", "app", "node", "--records", str(folder / "gate"), "--device-seconds", "0.2",
           *metrics, "--log-dir", str(folder / "logs"), "--", "--standalone", "--nproc-per-node", "2",
           "--local-addr", "127.0.0.1", *train]  # fmt: skip
    env = {**os.environ, "DDP_CLUSTER_EVENTS_FILE": str(folder / "events.jsonl"), "OMP_NUM_THREADS": "1"}
    stop, counts = threading.Event(), [0]
    scraper = threading.Thread(target=scrape_until, args=(port, scrape_every, stop, counts), daemon=True)
    if serve:
        scraper.start()
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False)
    finally:
        stop.set()
    if done.returncode != 0:
        raise SystemExit(f"error: the job failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    summary = json.loads((folder / "out" / "summary.json").read_text())
    return {"serve": serve, "samples_per_s": summary["steady_samples_per_s"], "scrapes": counts[0]}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.metrics", description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="runs of each side, alternately (default 3)")
    parser.add_argument("--epochs", type=int, default=300, help="digits epochs per run (default 300)")
    parser.add_argument("--scrape-every", type=float, default=0.5, help="seconds between scrapes (default 0.5)")
    parser.add_argument("--json", type=Path, help="also write the runs and the result here")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        for i in range(args.pairs):
            for serve in (False, True):
                run = one_run(Path(tmp) / f"{i}-{int(serve)}", serve, args.epochs, args.scrape_every)
                runs.append(run)
                side = f"served, {run['scrapes']} scrapes" if serve else "not served"
                print(f"run {len(runs)}: {side}: {run['samples_per_s']:.0f} samples/s", flush=True)
    without = [r["samples_per_s"] for r in runs if not r["serve"]]
    served = [r["samples_per_s"] for r in runs if r["serve"]]
    result = {"without": statistics.median(without), "with": statistics.median(served)}
    result["ratio"] = result["with"] / result["without"]
    print(f"metrics not served: median {result['without']:.0f} samples/s (runs {min(without):.0f}-{max(without):.0f})")
    print(f"metrics served, scraped every {args.scrape_every:g} s: median {result['with']:.0f} samples/s "
          f"(runs {min(served):.0f}-{max(served):.0f})")  # fmt: skip
    print(f"ratio (with / without): {result['ratio']:.3f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": runs, "result": result, "args": vars(args) | {"json": str(args.json)}},
                                        indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
