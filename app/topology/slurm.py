"""Slurm batch scripts from the cluster spec. Needs no torch.

    python -m app topology --format sbatch --nodes 2 --nproc-per-node 8 --gpus-per-node 8 --output job.sbatch
    sbatch job.sbatch                                        # on the cluster: rank 0's output in <name>-<id>.out
    python -m app topology --spec cluster.toml --launcher srun --format sbatch | sbatch
    make slurm-job JOB="check"                               # on the Slurm mini-cluster (docker/slurm/)

Two styles, chosen by the spec's ``job.launcher``:

- ``torchrun``: ``srun --ntasks-per-node=1`` starts one node agent per node (``python -m app node``: the
  node's health gate, then torchrun's agent in its process), with the node's CPUs (cpus_per_rank x
  nproc_per_node); the agents meet in a c10d rendezvous on the first node
  of the allocation (``scontrol show hostnames "$SLURM_JOB_NODELIST"``), the job id as the
  rendezvous id, and restart the workers up to ``max_restarts`` times. The srun style starts each
  rank once (``max_restarts`` does not apply; ``--requeue`` restarts the whole job). With
  ``min_nodes`` below ``nodes`` the agents take ``--nnodes MIN:MAX``, the batch job ``--no-kill`` (the allocation
  outlives a node's failure) and srun ``--kill-on-bad-exit=0 --no-kill`` (so does the step: without srun's own
  ``--no-kill`` Slurm kills every step on a failed node, the survivors' agents with it): a node lost leaves the
  others training, and the job completes when they do.
- ``srun``: one Slurm task per rank (``srun --mpi=pmi2``, the spec's ``slurm.mpi``); every process
  describes itself from SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and SLURM_JOB_NODELIST
  (app/runtime/launcher.py), the first node serving the rendezvous.

In the torchrun style every node serves its Prometheus metrics (app/metrics.py) on contract.METRICS_PORT, read
from an events file of its own (``/tmp/<name>-<job id>.events.jsonl``: /tmp is each node's), labelled with the
job id (the rendezvous id); ``--format prometheus`` with the partition's hosts renders a scrape configuration
(docs/engines.md). The srun style starts no agent: nothing serves them.

The rendezvous port is the spec's ``master_port`` when it is not the default; at the default it is
20000 + job id % 10000 (``envvars``' rule, which the launcher applies under srun), so jobs that
share a node do not collide. The job is the spec's app command (``python -m app COMMAND``) or its
``script`` with ``args`` (a path on the nodes). ``--time`` is the time limit in minutes, rounded up;
``--requeue`` appends to the output file so that a requeued job's earlier lines stay.
"""

import math
import shlex
from collections.abc import Iterable
from pathlib import PurePosixPath

from app import contract
from app.errors import UsageError
from app.runtime import envvars
from app.topology import render
from app.topology.spec import ClusterSpec

STYLES = ("torchrun", "srun")
"""The launchers that have a batch style (job.launcher)."""


class Shell(str):
    """A word of the script that its shell expands (``"$head:$port"``): written as is, never quoted."""


def check(spec: ClusterSpec) -> None:
    """Raise UsageError for what a Slurm batch job cannot run."""
    job, r = spec.job, spec.rendezvous
    if job.launcher not in STYLES:
        raise UsageError(
            f"--launcher {job.launcher} has no Slurm batch style: use --launcher torchrun (one agent per node) "
            "or --launcher srun (one task per rank)"
        )
    if spec.nodes.hosts:
        raise UsageError("--hosts: Slurm picks a job's nodes; give --nodes (and --partition), not --hosts/--hostfile")
    if r.master_addr:
        raise UsageError("--master-addr: under Slurm the first node of the allocation serves the rendezvous; drop it")
    if job.launcher == "srun" and job.script:
        raise UsageError(
            "--script is a torchrun script (it reads RANK, WORLD_SIZE ...): use --launcher torchrun; "
            "srun gives each rank only SLURM_* variables"
        )


def _words(argv: Iterable[str]) -> str:
    return " ".join(word if isinstance(word, Shell) else shlex.quote(word) for word in argv)


def _lines(*groups: Iterable[str]) -> str:
    """One command, a group of words per line."""
    return " \\\n    ".join(_words(group) for group in groups)


def directives(spec: ClusterSpec) -> list[str]:
    """The ``#SBATCH`` lines: the job's name, shape, resources, limits, files and queue."""
    n, s, job = spec.nodes, spec.slurm, spec.job
    per_agent = job.launcher == "torchrun"
    options: list[tuple[str, object]] = [
        ("job-name", job.name),
        ("nodes", n.nodes),
        ("ntasks-per-node", 1 if per_agent else n.nproc_per_node),
        ("cpus-per-task", s.cpus_per_rank * (n.nproc_per_node if per_agent else 1)),
    ]
    if n.gpus_per_node:
        options.append(("gpus-per-node", n.gpus_per_node))
    options.append(("time", math.ceil(job.time_limit / 60)))
    options.append(("output", s.output_pattern))
    if s.error_pattern:
        options.append(("error", s.error_pattern))
    if s.partition:
        options.append(("partition", s.partition))
    if s.account:
        options.append(("account", s.account))
    lines = [f"#SBATCH --{key}={value}" for key, value in options]
    if s.exclusive:
        lines.append("#SBATCH --exclusive")
    if n.elastic:
        lines.append("#SBATCH --no-kill")  # a failed node leaves the job on the others (--min-nodes)
    lines += ["#SBATCH --requeue", "#SBATCH --open-mode=append"] if s.requeue else ["#SBATCH --no-requeue"]
    return lines


def _port(spec: ClusterSpec) -> str:
    """The rendezvous port as the script's shell computes it."""
    port = spec.rendezvous.master_port
    if port != contract.RENDEZVOUS_PORT:
        return str(port)
    return f"$(({envvars.SLURM_PORT_BASE} + {envvars.SLURM_JOB_ID} % {envvars.SLURM_PORT_SPAN}))"


def _job(spec: ClusterSpec) -> list[str]:
    """What follows the launcher: ``-m app COMMAND`` or the script (its path on the nodes) and its args."""
    script = spec.job.script
    return render.job_argv(spec, str(PurePosixPath(script).parent) if script else "")


def _environment(spec: ClusterSpec) -> list[str]:
    values = {"OMP_NUM_THREADS": str(spec.slurm.cpus_per_rank), **envvars.FLIGHT_RECORDER}
    if spec.rendezvous.ifname:
        values |= dict.fromkeys(envvars.IFNAME_VARIABLES, spec.rendezvous.ifname)
    lines = [f"export {key}={shlex.quote(value)}" for key, value in values.items()]
    if spec.job.launcher == "torchrun":  # srun passes it on; /tmp is each node's own
        events = f"/tmp/{spec.job.name}-${envvars.SLURM_JOB_ID}.{contract.EVENTS_NAME}"
        lines.append(f'export {envvars.EVENTS_FILE}="{events}"')
    return lines


def _torchrun_body(spec: ClusterSpec) -> list[str]:
    nodelist = envvars.SLURM_JOB_NODELIST[0]
    endpoint, run_id = Shell('"$head:$port"'), Shell(f'"${envvars.SLURM_JOB_ID}"')
    # all or none: one agent that gives up ends the step. Elastic (--min-nodes): the other agents go on, and a node
    # that fails leaves the step running on the rest: sbatch's --no-kill keeps the allocation but not its steps, which
    # Slurm kills at a node's failure unless srun asks --no-kill itself (sbatch(1), --no-kill)
    elastic = ["--kill-on-bad-exit=0", "--no-kill"] if spec.nodes.elastic else ["--kill-on-bad-exit=1"]
    srun = ["srun", "--ntasks-per-node=1", *elastic]
    # the gate (its figures this job's own, on each node: a later job records afresh), then torchrun's agent (which
    # evicts its own node when it is a straggler, where the job is elastic)
    records = Shell(f'--records="/tmp/{spec.job.name}-${envvars.SLURM_JOB_ID}.gate"')
    agent = [spec.slurm.python, "-m", "app", "node", "--serve-metrics", records, *render.node_args(spec), "--"]
    shape = render.agent_args(spec, spec.nodes.nodes, spec.nodes.nproc_per_node)
    rdzv = [Shell(w) if w.endswith((endpoint, run_id)) else w for w in render.c10d_args(spec, endpoint, run_id)]
    return [
        f'mapfile -t nodes < <(scontrol show hostnames "${nodelist}")',
        'head="${nodes[0]}"',
        f"port={_port(spec)}",
        f'echo "slurm: job ${envvars.SLURM_JOB_ID} on ${nodelist}: node agents, rendezvous $head:$port"',
        "exec " + _lines(srun, agent, shape, rdzv, _job(spec)),
    ]


def _srun_body(spec: ClusterSpec) -> list[str]:
    lines = []
    if spec.rendezvous.master_port != contract.RENDEZVOUS_PORT:
        lines.append(f"export {envvars.MASTER_PORT}={spec.rendezvous.master_port}")
    nodelist = envvars.SLURM_JOB_NODELIST[0]
    srun = ["srun", "--kill-on-bad-exit=1", f"--mpi={spec.slurm.mpi}"]
    return [
        *lines,
        f'echo "slurm: job ${envvars.SLURM_JOB_ID} on ${nodelist}: one task per rank"',
        "exec " + _lines(srun, [spec.slurm.python, *_job(spec)]),
    ]


def render_script(spec: ClusterSpec) -> str:
    """The batch script (``sbatch FILE``) that runs the spec's job in its launcher's style."""
    check(spec)
    n, style = spec.nodes, spec.job.launcher
    body = _torchrun_body(spec) if style == "torchrun" else _srun_body(spec)
    header = [
        "#!/bin/bash",
        f"# {spec.job.name}: {n.nodes} node(s) x {n.nproc_per_node} rank(s), {style} style. Rendered from the",
        "# cluster spec by `python -m app topology --format sbatch`; submit it with `sbatch FILE`.",
    ]
    return "\n".join([*header, *directives(spec), "set -euo pipefail", *_environment(spec), *body]) + "\n"
