"""A Prometheus scrape configuration of a job's nodes (``--format prometheus``), for a site's own Prometheus: every
node serves its metrics (app/metrics.py) at ``http://<host>:<contract.METRICS_PORT>/metrics``. Needs no torch and
no YAML library: the strings are written as JSON, which YAML reads.

    python -m app topology --hosts node0:2,node1:2 --format prometheus --output prometheus-scrape.yml
    python -m app topology --hostfile hosts.txt --format prometheus      # Ansible writes it for its inventory
    promtool check config prometheus.yml                                # with the entry under its scrape_configs

The entry goes under ``scrape_configs:`` of prometheus.yml (Debian bookworm's Prometheus 2.42 has no
``scrape_config_files``). ``honor_labels: true`` keeps the series' own ``job`` and ``node`` labels, which say
which job and which node a figure is of. Slurm knows a job's hosts only once it runs: render the entry for the
partition's hosts (docs/engines.md, "Metrics on every engine"); Kubernetes: ``--format podmonitor``.
"""

import json

from app import contract
from app.topology.spec import ClusterSpec, Host


def target(host: Host) -> str:
    """``host:port`` of a node's metrics (an IPv6 address in brackets)."""
    name = f"[{host.name}]" if ":" in host.name else host.name
    return f"{name}:{contract.METRICS_PORT}"


def scrape_entry(spec: ClusterSpec, hosts: tuple[Host, ...]) -> dict:
    """The ``scrape_configs`` entry of the job: its name, the series' labels kept, every host's metrics."""
    targets = [target(h) for h in hosts]
    return {"job_name": spec.job.name, "honor_labels": True, "metrics_path": contract.METRICS_PATH,
            "static_configs": [{"targets": targets}]}  # fmt: skip


def render_scrape_config(spec: ClusterSpec, hosts: tuple[Host, ...]) -> str:
    """``--format prometheus``: the job's entry under ``scrape_configs:``, one key a line."""
    entry = scrape_entry(spec, hosts)
    targets = ", ".join(json.dumps(t) for t in entry["static_configs"][0]["targets"])
    return (
        f"# Prometheus: the scrape configuration of job {spec.job.name}'s {len(hosts)} node(s); put the entry under\n"
        "# scrape_configs: in prometheus.yml (python -m app topology --format prometheus).\n"
        "scrape_configs:\n"
        f"  - job_name: {json.dumps(entry['job_name'])}\n"
        "    honor_labels: true\n"
        f"    metrics_path: {json.dumps(entry['metrics_path'])}\n"
        "    static_configs:\n"
        f"      - targets: [{targets}]\n"
    )
