"""``python -m app topology``: one cluster spec, rendered for every engine. Needs no torch.

    python -m app topology --format json                               # the spec with every default
    python -m app topology --hosts node0:2,node1:2 --format hostfile   # node0 slots=2 ...
    python -m app topology --hosts node0:2,node1:2 --ifname eth0 --format env
    python -m app topology --hostfile hosts.txt --format torchrun --node-rank 1
    python -m app topology --format node                                # app node's own flags (node.args)
    python -m app topology --hostfile hosts.txt --launcher mpirun --format mpirun
    python -m app topology --spec cluster.toml --nodes 3 --format compose-files --output-dir build/cluster/x
    python -m app topology --nodes 2 --nproc-per-node 8 --gpus-per-node 8 --format sbatch --output job.sbatch
    python -m app topology --name mycluster --format ssh-keys --output-dir ~/.cache/ddp-cluster/ssh/mycluster
    python -m app topology --nodes 4 --namespace ml --results-claim ddp-results --format k8s --output job.yaml
    python -m app topology --format trainingruntime --output runtime.yaml      # Kubeflow Trainer v2 (trainjob.py)
    python -m app topology --nodes 4 --format trainjob --output trainjob.yaml
    python -m app topology --nodes 4 --format podmonitor --output podmonitor.yaml   # Prometheus Operator
    python -m app topology --hosts node0:2,node1:2 --format prometheus --output prometheus-scrape.yml

The spec comes from its defaults, a TOML file (``--spec``; or ``--spec-json``, what ``--format json``
prints) and the flags below, the flags winning. Hosts by name come from
``--hosts NAME:SLOTS,...`` (like ``mpirun -H``) or an OpenMPI hostfile (``--hostfile``: ``NAME
slots=N`` per line, ``#`` comments; a line without ``slots=`` is one slot, where OpenMPI would count
the node's cores); the first host serves the rendezvous unless ``--master-addr`` says otherwise.
``--format torchrun`` with ``--node-rank`` gives a static rendezvous, else c10d.
A bad value is one line naming the flag (or spec key) and the fix, exit status 2.
"""

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from app import contract, flags
from app.atomic import atomic_write_text
from app.errors import UsageError
from app.topology import compose, kube, prometheus, render, slurm, spec, sshkeys, trainjob
from app.topology.spec import ClusterSpec, Host

__doc__ = f"{__doc__}\n{trainjob.CANNOT_EXPRESS}"  # the --help epilog ends with Trainer v2's limits


@dataclass(frozen=True)
class Request:
    """What one call asks for besides the spec."""

    spec: ClusterSpec
    node_rank: int | None
    mpirun_hostfile: str
    output_dir: Path | None


def _named_hosts(req: Request) -> tuple[Host, ...]:
    if not req.spec.nodes.hosts:
        raise UsageError("this format needs the hosts by name: give --hosts node0:2,node1:2 or --hostfile FILE")
    return req.spec.nodes.hosts


DERIVED = ("world_size", "job_argv", "python_argv", "master", "env", "paths", "metrics")
"""What --format json adds to the spec's sections (--spec-json takes its output back and skips them)."""


def _json(req: Request) -> str:
    s = req.spec
    data: dict[str, Any] = {
        **s.as_dict(),
        "world_size": s.world_size,
        "job_argv": render.job_argv(s),
        "python_argv": render.python_argv(s),
        "paths": contract.PATHS,
        "metrics": {"port": contract.METRICS_PORT, "path": contract.METRICS_PATH, "events_name": contract.EVENTS_NAME},
    }
    if s.nodes.hosts:
        data |= {"master": s.master(s.nodes.hosts), "env": render.env_vars(s, s.nodes.hosts)}
    return json.dumps(data, indent=2) + "\n"


def _doc(_req: Request) -> str:
    """The spec's fields as a Markdown table: docs/engines.md's 'The cluster spec' holds exactly this."""
    lines = ["| key | flag | default | used by | meaning |", "| --- | --- | --- | --- | --- |"]
    for section, cls in spec.SECTIONS.items():
        helps = flags.docstrings(cls)
        for f in fields(cls):
            used = ", ".join(f.metadata.get("engines", ()))
            shown = f.metadata.get(flags.FLAG, {}).get("show") or flags.default_of(f) not in (None, "")
            default = flags.shown(f) if shown else "(none)"
            row = f"`{section}.{f.name}` | `{flags.option(f.name)}` | `{default}` | {used} | {helps[f.name]}"
            lines.append(f"| {row} |")
    return "\n".join(lines) + "\n"


def compose_folder(req: Request) -> Path:
    """Where the compose cluster's files are (or go): --output-dir, else build/cluster/NAME."""
    return req.output_dir or Path("build/cluster") / req.spec.job.name


def _ssh_keys(req: Request) -> dict[str, str]:
    if req.output_dir is None:
        raise UsageError("--format ssh-keys writes files: give --output-dir DIR")
    made = sshkeys.make_keys(req.output_dir, req.spec.job.name)
    print(f"ssh-keys: {req.output_dir}: {', '.join(made) if made else 'present, unchanged'}")
    return {}


Renderer = Callable[[Request], "str | dict[str, str]"]
FORMATS: dict[str, tuple[Renderer, str]] = {
    "json": (
        _json,
        "the spec as JSON, with every default, the job's argv, the metrics' port (and MASTER_ADDR and the env with "
        "--hosts)",
    ),
    "hostfile": (lambda r: render.render_hostfile(_named_hosts(r)), "OpenMPI hostfile: 'NAME slots=N' per host"),
    "env": (lambda r: render.render_env(r.spec, _named_hosts(r)), "KEY=VALUE lines every rank needs"),
    "torchrun": (
        lambda r: " ".join(render.torchrun_args(r.spec, _named_hosts(r), r.node_rank)) + "\n",
        "torchrun's arguments (static rendezvous with --node-rank, else c10d)",
    ),
    "node": (
        lambda r: " ".join(render.node_args(r.spec)) + "\n",
        "python -m app node's own flags (the image's ddp-node reads them from node.args): the gate's, the straggler's",
    ),
    "mpirun": (
        lambda r: " ".join(render.mpirun_args(r.spec, _named_hosts(r), r.mpirun_hostfile)) + "\n",
        "mpirun's arguments: -np, --hostfile, -x MASTER_ADDR ...",
    ),
    "compose": (
        lambda r: compose.env_file(r.spec, compose_folder(r)),
        "the env file of compose.yaml (docker compose --env-file) for the files of --output-dir",
    ),
    "compose-files": (
        lambda r: compose.cluster_files(r.spec, compose_folder(r)),
        "the compose cluster's files: env file, nodes.yaml, every node's launch files (--output-dir)",
    ),
    "compose-path": (lambda _: f"{compose.COMPOSE_FILE}\n", "where compose.yaml is (package data)"),
    "sbatch": (lambda r: slurm.render_script(r.spec), "a Slurm batch script (sbatch FILE): torchrun or srun style"),
    "ssh-keys": (_ssh_keys, "this cluster's SSH user and host keys, made once (--output-dir)"),
    "k8s": (lambda r: kube.render_k8s(r.spec), "Kubernetes: Indexed Job, headless Service, ConfigMap, NetworkPolicy"),
    "pytorchjob": (lambda r: kube.render_pytorchjob(r.spec), "Kubernetes: a Kubeflow PyTorchJob and a NetworkPolicy"),
    "trainjob": (
        lambda r: trainjob.render_trainjob(r.spec),
        "Kubeflow Trainer v2: a TrainJob on --training-runtime and a NetworkPolicy (see app/topology/trainjob.py)",
    ),
    "trainingruntime": (
        lambda r: trainjob.render_trainingruntime(r.spec),
        "Kubeflow Trainer v2: our ClusterTrainingRuntime (torch policy, hardened JobSet, --max-restarts)",
    ),
    "podmonitor": (
        lambda r: kube.render_podmonitor(r.spec),
        "Prometheus Operator: a PodMonitor of the job's pods (k8s, pytorchjob, trainjob) and their metrics port",
    ),
    "prometheus": (
        lambda r: prometheus.render_scrape_config(r.spec, _named_hosts(r)),
        f"Prometheus: the scrape configuration of every host's metrics (port {contract.METRICS_PORT}): prometheus.yml",
    ),
    "nproc-per-node": (lambda r: f"{r.spec.nodes.nproc_per_node}\n", "processes per node (make's local targets)"),
    "flavour": (
        lambda r: f"{contract.flavour(r.spec.nodes.gpus_per_node)}\n",
        "the image flavour the nodes need: cuda with --gpus-per-node > 0, else cpu (make's image targets)",
    ),
    "image": (lambda r: f"{r.spec.job.image}\n", "the workload image: --image, else IMAGE_NAME:<flavour>"),
    "doc": (_doc, "the spec's keys as a Markdown table (docs/engines.md)"),
}
"""Every format: its renderer (text, or files by name for --output-dir) and one line of help."""


__doc__ += "\nformats (--format):\n" + "\n".join(f"    {name:16} {text}" for name, (_, text) in FORMATS.items()) + "\n"


@dataclass(frozen=True)
class RenderFlags:
    """What to render and where."""

    format: str = field(default="json", metadata=flags.flag(choices=tuple(FORMATS), metavar="FORMAT"))
    """What to render: one of the formats listed at the end."""
    node_rank: int | None = None
    """With --format torchrun: a static rendezvous as this node."""
    mpirun_hostfile: str = field(default="hostfile", metadata=flags.flag(metavar="PATH"))
    """With --format mpirun: the hostfile's path."""
    output: Path | None = None
    """Write here atomically instead of stdout."""
    output_dir: Path | None = field(default=None, metadata=flags.flag(metavar="DIR"))
    """Folder of the formats that write files."""


@dataclass(frozen=True)
class SpecSource:
    """Where the cluster spec starts from (the flags of its sections override it)."""

    spec: Path | None = field(default=None, metadata=flags.flag(exclusive="source", metavar="FILE"))
    """A spec file (TOML); flags override it."""
    spec_json: str | None = field(default=None, metadata=flags.flag(exclusive="source", metavar="JSON"))
    """The spec as JSON (what --format json prints)."""
    hostfile: Path | None = field(default=None, metadata=flags.flag(metavar="FILE"))
    """The hosts from an OpenMPI hostfile (a line without slots=N: 1 slot, not OpenMPI's count of the node's cores)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m app topology``: what to render and where, then the spec's flags."""
    flags.add_arguments(parser, RenderFlags)
    add_spec_arguments(parser)


def add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster spec's flags: a spec file or JSON, named hosts, and one flag per field."""
    flags.add_arguments(parser, SpecSource)
    for cls in spec.SECTIONS.values():
        flags.add_arguments(parser, cls, overrides_only=True)


def _tables(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The spec file's tables with the flags laid over them."""
    if args.spec is not None:
        tables = spec.read_file(args.spec)
    elif args.spec_json is not None:
        try:
            tables = json.loads(args.spec_json)
        except json.JSONDecodeError as error:
            raise UsageError(f"--spec-json is not JSON ({error.msg}): pass what --format json prints") from None
        if isinstance(tables, dict):
            tables = {name: table for name, table in tables.items() if name not in DERIVED}
        tables = spec.check_tables(tables, "--spec-json")
    else:
        tables = {}
    merged = {name: {**tables.get(name, {}), **flags.given(cls, args)} for name, cls in spec.SECTIONS.items()}
    if args.hostfile is not None:
        try:
            text = args.hostfile.read_text()
        except OSError as error:
            raise UsageError(
                f"cannot read --hostfile {args.hostfile} ({error.strerror}): give a readable file of one "
                "'NAME slots=N' line per node"
            ) from None
        merged["nodes"]["hosts"] = spec.parse_hostfile(text, f"--hostfile {args.hostfile}", note=_note)
    return merged


def _note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr)


def spec_from_args(args: argparse.Namespace) -> ClusterSpec:
    """The ClusterSpec that the spec file and the flags describe."""
    return spec.build(_tables(args))


def run(args: argparse.Namespace) -> int:
    """Render the requested format to stdout, --output or --output-dir."""
    req = Request(spec_from_args(args), args.node_rank, args.mpirun_hostfile, args.output_dir)
    renderer, _ = FORMATS[args.format]
    result = renderer(req)
    if isinstance(result, dict):
        if result and args.output_dir is None:
            raise UsageError(f"--format {args.format} writes files: give --output-dir DIR")
        for name, text in result.items():
            atomic_write_text(args.output_dir / name, text)
        return 0
    if args.output is None:
        sys.stdout.write(result)
    else:
        atomic_write_text(args.output, result)
    return 0
