"""Rendezvous doctor: will the ranks of this job find each other? Bounded checks, one line each.

    python -m app doctor                                    # one process: world of one, interfaces
    torchrun --nproc-per-node 2 -m app doctor               # one node
    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint node0:29500 -m app doctor
    mpirun -np 4 -H a:2,b:2 -x MASTER_ADDR=a -x MASTER_PORT=29500 python -m app doctor --json doctor.json
    srun -N 2 --ntasks-per-node 4 python -m app doctor
    make cluster-up JOB=doctor                              # across the compose mini-cluster

Every rank runs these checks; each is ok, failed or skipped (not applicable), with a one-line detail:

  world           the environment names several nodes (SLURM_STEP_NUM_NODES, SLURM_JOB_NUM_NODES,
                  NNODES) but the launcher started a job on one node: a "world of one", where each
                  node would train alone
  master_address  MASTER_ADDR resolves within 4 s; to no loopback address on a node without rank 0
  interface       the interface named by --ifname, GLOO_SOCKET_IFNAME or NCCL_SOCKET_IFNAME exists
                  (else exit 2, naming those that do); with several nodes and none named, the one
                  that routes to MASTER_ADDR (on rank 0's node: the default route's) is chosen on
                  each node and given to gloo and NCCL
  host_name       with several nodes and no interface, gloo offers the others the address of this
                  host's name: it must not be loopback (Debian's 127.0.1.1)
  port            rank 0 can bind MASTER_PORT, and MASTER_ADDR leads back to it; the others connect
                  to it, retrying until --timeout (under torchrun every rank connects to its agent's store)
  gpus, shm,      the GPU side (app/diagnostics/gpus.py): visible GPUs against local ranks (--backend
  cuda, nccl      nccl with too few: exit 2), /dev/shm size under nccl, the driver's CUDA version
                  against torch's, the NCCL version
  same_master     (app doctor, app check) every rank resolved MASTER_ADDR to the same address

``app check`` and ``app train`` run the same checks before they start their process group
(``preflight``), so a bad rendezvous is one line within --timeout + 5 s rather than a hang or
torch's own retries. ``app doctor`` then gathers every rank's results through the rendezvous store
(not a gloo group: the group is what may be broken) and rank 0 prints a table, or --json. Exit
status: 0 ok, 1 a check failed, 2 bad input.

What cannot be detected from inside one node: several machines each started as a complete job of
their own (``torchrun --standalone`` or ``--nnodes 1`` on each, mpirun per host) with no variable
naming the other nodes; such a job is valid on its own. Under Slurm, or with the cluster's env file
(NNODES), the node count is known and the world of one is caught.
"""

import argparse
import contextlib
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import timedelta

import torch.distributed as dist

from app import flags
from app.atomic import atomic_write_text
from app.diagnostics import gpus
from app.diagnostics.findings import FAILED, OK, SKIPPED, Finding
from app.errors import ClusterError, UsageError, first_line
from app.flags import flag
from app.runtime import devices, launcher, network
from app.runtime.devices import NodeDevices
from app.runtime.distributed import DistConfig, add_command_arguments, job_store, rendezvous_endpoint, this_process
from app.runtime.launcher import ProcessInfo

RESOLVE_TIMEOUT_S = 4.0
"""Longest wait for a name lookup: an unresolvable MASTER_ADDR fails in under 5 s."""
SELF_REACH_TIMEOUT_S = 3.0
"""Longest wait for rank 0's own connection back to itself through MASTER_ADDR."""
CHECKS = ("world", "master_address", "interface", "host_name", "port", *gpus.CHECKS, "same_master")


@dataclass(frozen=True)
class Network:
    """How the doctor sees the host; tests give their own (a host name that resolves to loopback, say)."""

    resolve: Callable[[str, float], list[str]] = network.resolve
    interfaces: Callable[[], dict[str, list[str]]] = network.interfaces
    route_source: Callable[[str, int], str] = network.route_source
    default_route_interface: Callable[[], str | None] = network.default_route_interface


@dataclass
class Diagnosis:
    """The findings of one rank, and what it learnt on the way."""

    rank: int
    host: str
    findings: list[Finding] = field(default_factory=list)
    master_ip: str | None = None
    """The address MASTER_ADDR resolved to here."""
    ifname: str | None = None
    """The interface gloo and NCCL will use (named, or chosen here); None: their own default."""
    chosen: bool = False
    """True when the doctor chose the interface (nothing named one)."""

    @property
    def ok(self) -> bool:
        return all(f.status != FAILED for f in self.findings)

    def add(self, check: str, status: str, detail: str) -> bool:
        self.findings.append(Finding(check, status, detail))
        return status != FAILED

    def fail(self, check: str, detail: str) -> bool:
        """A failed check: ``detail`` names the problem and the fix."""
        return self.add(check, FAILED, detail)

    def failure(self) -> Finding | None:
        return next((f for f in self.findings if f.status == FAILED), None)


def check_world(diag: Diagnosis, proc: ProcessInfo) -> None:
    """A world of one: the environment names several nodes, the launcher started a job on one. Not a round of an
    elastic job: its rendezvous went on with the nodes it had (the others died, or were dropped)."""
    shape = f"{proc.world_size} rank(s) on {'several nodes' if proc.spans_nodes else '1 node'} ({proc.launcher.value})"
    lone = proc.named_nodes > 1 and not proc.spans_nodes
    if lone and proc.elastic:
        least, most = proc.node_range
        diag.add("world", OK, f"{shape}: a round of an elastic job of {least} to {most} nodes ({proc.named_nodes_by})")
    elif lone:
        size = proc.launcher.variables.size
        started = f"{size}={proc.world_size}" if size else "no launcher"
        diag.fail(
            "world",
            f"world of one: {proc.named_nodes_by} names {proc.named_nodes} nodes but this job is {shape}, "
            f"{started}: each node would train alone; start every node in one job (srun -N {proc.named_nodes} "
            f"--ntasks-per-node <processes>, or torchrun --nnodes {proc.named_nodes} with a shared --rdzv-endpoint)",
        )
    else:
        diag.add("world", OK, shape)


def check_master_address(diag: Diagnosis, proc: ProcessInfo, where: tuple[str, int] | None, net: Network) -> None:
    if where is None:
        diag.add("master_address", SKIPPED, "no network rendezvous (one process or a file:// rendezvous)")
        return
    host, _ = where
    try:
        addresses = net.resolve(host, RESOLVE_TIMEOUT_S)
    except network.Unresolved as error:
        diag.fail(
            "master_address",
            f"MASTER_ADDR={host} does not resolve on {proc.host} ({error}): use the host name or IP address of "
            "rank 0's node, one that every node resolves",
        )
        return
    diag.master_ip = addresses[0]
    if network.is_loopback(diag.master_ip) and proc.spans_nodes and proc.node_rank != 0:
        diag.fail(
            "master_address",
            f"MASTER_ADDR={host} resolves to {diag.master_ip} (loopback) on {proc.host}, which does not hold rank 0: "
            "this node would look for rank 0 on itself; use the host name or IP address of rank 0's node",
        )
        return
    diag.add("master_address", OK, f"{host} -> {diag.master_ip}")


def _describe(found: dict[str, list[str]]) -> str:
    return ", ".join(f"{name} {' '.join(addrs) or '(no address)'}" for name, addrs in found.items())


def _named_exists(name: str, found: dict[str, list[str]]) -> bool:
    """Whether a GLOO/NCCL_SOCKET_IFNAME value names interfaces here (lists, NCCL's =exact, prefixes; ^ excludes)."""
    items = [item.strip().lstrip("=") for item in name.split(",") if item.strip()]
    return all(item.startswith("^") or any(n.startswith(item) for n in found) for item in items) and bool(items)


def _choose(master_ip: str | None, found: dict[str, list[str]], net: Network, port: int) -> tuple[str | None, str]:
    """(interface, why) that the other nodes reach this one through, or (None, why not)."""
    local = {addr for addrs in found.values() for addr in addrs}
    owner = {addr: name for name, addrs in found.items() for addr in addrs}
    if master_ip and not network.is_loopback(master_ip) and master_ip not in local:
        try:
            source = net.route_source(master_ip, port)
        except OSError as error:
            return None, f"no route to MASTER_ADDR ({master_ip}): {error.strerror or error}"
        if source in owner:
            return owner[source], f"the route to MASTER_ADDR ({master_ip})"
        return None, f"the route to MASTER_ADDR leaves from {source}, which no interface holds"
    default = net.default_route_interface()
    if default in found:
        return default, "the default route (rank 0's node)"
    up = [name for name, addrs in found.items() if addrs and not all(network.is_loopback(a) for a in addrs)]
    if len(up) == 1:
        return up[0], "the only interface with an address"
    return None, f"{len(up)} candidate interfaces and no route that decides"


def check_interface(diag: Diagnosis, proc: ProcessInfo, cfg: DistConfig, net: Network) -> None:
    """The named interface exists (else UsageError); with several nodes and none named, choose one."""
    named, source = (cfg.ifname, "--ifname") if cfg.ifname else (proc.ifname, "GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME")
    found = net.interfaces()
    if named:
        if not _named_exists(named, found):
            raise UsageError(
                f"interface {named} ({source}) does not exist on {proc.host}: it has {', '.join(found) or 'none'}"
            )
        diag.ifname = named
        addrs = " ".join(found.get(named, [])) or "prefix or list"
        diag.add("interface", OK, f"{named} ({addrs}) from {source}")
        return
    if not proc.spans_nodes:
        diag.add("interface", SKIPPED, "one node: gloo and NCCL pick their own")
        return
    name, why = _choose(diag.master_ip, found, net, proc.master_port)
    if name is None:
        diag.fail(
            "interface",
            f"cannot choose the interface on {proc.host}: {why}; pass --ifname, one of: {_describe(found)}",
        )
        return
    diag.ifname, diag.chosen = name, True
    diag.add("interface", OK, f"{name} ({' '.join(found[name])}) on {proc.host}: {why} (chosen; --ifname overrides)")


def check_host_name(diag: Diagnosis, proc: ProcessInfo, net: Network) -> None:
    """With several nodes and no interface, gloo offers the address of this host's name: it must not be loopback."""
    if not proc.spans_nodes:
        diag.add("host_name", SKIPPED, "one node")
        return
    try:
        address = net.resolve(proc.host, RESOLVE_TIMEOUT_S)[0]
    except network.Unresolved as error:
        address, why = None, f"{proc.host} does not resolve ({error})"
    else:
        why = f"{proc.host} -> {address}"
    if address is not None and not network.is_loopback(address):
        diag.add("host_name", OK, why)
    elif diag.ifname:
        diag.add("host_name", OK, f"{why}, harmless: gloo uses interface {diag.ifname}")
    else:
        diag.fail(
            "host_name",
            f"{why}{' (loopback)' if address else ''} and no interface is set: gloo would offer the other nodes "
            "a loopback address; pass --ifname, or map the host name to its network address in /etc/hosts",
        )


def check_port(diag: Diagnosis, proc: ProcessInfo, where: tuple[str, int] | None, timeout: float) -> None:
    if where is None or diag.master_ip is None:
        diag.add("port", SKIPPED, "no network rendezvous" if where is None else "MASTER_ADDR did not resolve")
        return
    host, port = where
    if proc.is_main and not proc.agent_store:
        _serve(diag, proc, host, port)
        return
    reached = network.reach(diag.master_ip, port, timeout)
    if reached.ok:
        server = "torchrun's agent" if proc.agent_store else "rank 0"
        diag.add("port", OK, f"{host}:{port} ({server}) reached in {reached.seconds:.2f}s")
    else:
        diag.fail(
            "port",
            f"could not reach the rendezvous at {host}:{port} ({diag.master_ip}) within {timeout:g}s ({reached.why}): "
            f"is rank 0 running there, and does the network let port {port} through?",
        )


def _serve(diag: Diagnosis, proc: ProcessInfo, host: str, port: int) -> None:
    """Rank 0: the port must be free here, and MASTER_ADDR must lead back to this host."""
    try:
        server = network.bind(port)
    except OSError as error:
        diag.fail(
            "port",
            f"port {port} (MASTER_PORT) is not free on {proc.host}, where rank 0 must serve it "
            f"({error.strerror or error}): stop what holds it, or pick another MASTER_PORT",
        )
        return
    with server:
        reached = network.reaches_self(server, diag.master_ip, port, SELF_REACH_TIMEOUT_S)
    if reached.ok:
        diag.add("port", OK, f"{port} free on {proc.host}, and MASTER_ADDR={host} leads back to it")
    else:
        diag.fail(
            "port",
            f"MASTER_ADDR={host} ({diag.master_ip}) does not lead to {proc.host}, where rank 0 runs "
            f"({reached.why}): start rank 0 on the host that MASTER_ADDR names, or set MASTER_ADDR to this host",
        )


def diagnose(
    proc: ProcessInfo, cfg: DistConfig, net: Network | None = None, found: NodeDevices | None = None
) -> Diagnosis:
    """Run every check of this rank, in bounded time (a missing named interface raises UsageError).

    found: this node's GPU facts (probed here when not given; tests give their own).
    """
    net = net or Network()
    diag = Diagnosis(proc.rank, proc.host)
    where = rendezvous_endpoint(proc, cfg)
    check_world(diag, proc)
    check_master_address(diag, proc, where, net)
    check_interface(diag, proc, cfg, net)
    check_host_name(diag, proc, net)
    check_port(diag, proc, where, cfg.timeout_s)
    diag.findings += gpus.diagnose(proc, cfg.backend, found or devices.probe())
    return diag


def preflight(
    proc: ProcessInfo,
    cfg: DistConfig,
    *,
    announce: bool = True,
    net: Network | None = None,
    found: NodeDevices | None = None,
) -> Diagnosis:
    """Diagnose before the process group starts; export a chosen interface; a failed check raises ClusterError.

    announce: rank 0 prints the interface it chose (one line), when it chose one.
    """
    diag = diagnose(proc, cfg, net, found)
    failed = diag.failure()
    if failed is not None:
        raise ClusterError(failed.detail)
    if diag.chosen:
        launcher.export_socket_ifname(diag.ifname)
        if announce and proc.is_main:
            print(f"doctor: gloo/NCCL use {_finding(diag, 'interface').detail}", flush=True)
    return diag


def _finding(diag: Diagnosis, check: str) -> Finding:
    return next(f for f in diag.findings if f.check == check)


def view(diag: Diagnosis, proc: ProcessInfo) -> dict:
    """What one rank reports to rank 0 (JSON-ready)."""
    return {
        "rank": proc.rank,
        "node_rank": proc.node_rank,
        "host": proc.host,
        "interface": diag.ifname,
        "master_ip": diag.master_ip,
        "findings": [asdict(f) for f in diag.findings],
    }


def same_master(views: list[dict]) -> Finding:
    """Whether every rank resolved MASTER_ADDR to the same address."""
    seen: dict[str, list[str]] = {}
    for v in views:
        if v.get("master_ip"):
            seen.setdefault(v["master_ip"], []).append(f"{v['rank']} ({v['host']})")
    if not seen:
        return Finding("same_master", SKIPPED, "no rank resolved a MASTER_ADDR")
    if len(seen) == 1:
        return Finding("same_master", OK, f"all {len(views)} rank(s) resolve MASTER_ADDR to {next(iter(seen))}")
    where = "; ".join(f"{ip} on rank {', '.join(ranks)}" for ip, ranks in seen.items())
    return Finding("same_master", FAILED, f"MASTER_ADDR resolves differently: {where}: fix DNS or /etc/hosts")


def merge(views: list[dict]) -> list[Finding]:
    """One finding per check over every rank: failed if it failed anywhere, naming the first rank."""
    merged = []
    for check in CHECKS[:-1]:
        found = [(v, f) for v in views for f in v["findings"] if f["check"] == check]
        failed = [(v, f) for v, f in found if f["status"] == FAILED]
        if failed:
            v, f = failed[0]
            more = f" (and {len(failed) - 1} other rank(s))" if len(failed) > 1 else ""
            merged.append(Finding(check, FAILED, f"rank {v['rank']} ({v['host']}): {f['detail']}{more}"))
        elif found:
            status = OK if any(f["status"] == OK for _, f in found) else SKIPPED
            detail = next(f["detail"] for _, f in found if f["status"] == status)
            merged.append(Finding(check, status, detail))
    return [*merged, same_master(views)]


def gather(proc: ProcessInfo, cfg: DistConfig, mine: dict) -> list[dict] | None:
    """Every rank's view on rank 0 (None elsewhere), through the rendezvous store; missing ranks are left out."""
    timeout = timedelta(seconds=cfg.timeout_s)
    base = job_store(proc, cfg)
    store = dist.PrefixStore("doctor", base)
    store.set(f"rank{proc.rank}", json.dumps(mine))
    if not proc.is_main:
        return None
    keys = [f"rank{r}" for r in range(proc.world_size)]
    with contextlib.suppress(RuntimeError):  # timed out: report who is there
        store.wait(keys, timeout)
    return [json.loads(store.get(key)) for key in keys if store.check([key])]


def build_report(proc: ProcessInfo, cfg: DistConfig, views: list[dict], gathered: bool) -> dict:
    """The doctor's report on rank 0: every rank's view (or rank 0's alone) and the merged checks."""
    findings = merge(views)
    missing = sorted(set(range(proc.world_size)) - {v["rank"] for v in views})
    if missing and gathered:
        listed = ", ".join(map(str, missing))
        findings.append(
            Finding("report", FAILED, f"rank(s) {listed} did not report within {cfg.timeout_s:g}s: see their errors")
        )
    elif missing:
        findings.append(Finding("report", SKIPPED, "rank 0's view only: it could not reach the rendezvous store"))
    where = rendezvous_endpoint(proc, cfg)
    return {
        "ok": all(f.status != FAILED for f in findings),
        "world_size": proc.world_size,
        "nodes": len({v["host"] for v in views}),
        "launcher": proc.launcher.value,
        "rendezvous": f"{where[0]}:{where[1]}" if where else (cfg.init_method or "none"),
        "complete": not missing,
        "timeout_s": cfg.timeout_s,
        "ranks": [{k: v for k, v in r.items() if k != "findings"} for r in views],
        "checks": [asdict(f) for f in findings],
    }


def format_rows(checks: list[dict]) -> list[str]:
    """The check/result/detail table, as app doctor and app check print it."""
    lines = [f"{'check':<15}  {'result':<7}  detail"]
    return lines + [f"{c['check']:<15}  {c['status']:<7}  {c['detail']}" for c in checks]


def format_table(report: dict) -> str:
    lines = [
        f"ddp-cluster doctor: {report['world_size']} rank(s) on {report['nodes']} host(s), launcher "
        f"{report['launcher']}, rendezvous {report['rendezvous']}, timeout {report['timeout_s']:g}s",
        "",
        f"{'rank':>4}  {'node':>4}  {'host':<24}  {'interface':<12}  master address",
    ]
    lines += [
        f"{r['rank']:>4}  {r['node_rank']:>4}  {r['host']:<24}  {r['interface'] or '-':<12}  {r['master_ip'] or '-'}"
        for r in report["ranks"]
    ]
    result = "ok" if report["ok"] else f"FAILED: {summary(report)}"
    lines += ["", *format_rows(report["checks"]), "", f"result: {result}"]
    return "\n".join(lines)


def summary(report: dict) -> str:
    """One line naming each failed check."""
    return "; ".join(f"{c['check']}: {c['detail']}" for c in report["checks"] if c["status"] == FAILED)


@dataclass(frozen=True)
class DoctorConfig:
    """Doctor: where it reports."""

    json: str | None = field(default=None, metadata=flag(metavar="PATH"))
    """Also write the report as JSON to PATH ('-' for stdout)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``python -m app doctor``."""
    add_command_arguments(parser, DoctorConfig)


def _print(report: dict, json_path: str | None) -> None:
    if json_path == "-":
        json.dump(report, sys.stdout, indent=2)
        print()
        return
    print(format_table(report), flush=True)
    if json_path:
        atomic_write_text(json_path, json.dumps(report, indent=2) + "\n")


def run(args: argparse.Namespace) -> int:
    """Diagnose this rank; gather every rank's view on rank 0, which prints the table. 0 ok, 1 a check failed."""
    cfg = flags.from_args(DistConfig, args)
    proc = this_process(cfg)
    diag = diagnose(proc, cfg)
    mine = view(diag, proc)
    views = None
    reachable = all(f.status != FAILED for f in diag.findings if f.check in ("master_address", "port"))
    if proc.world_size > 1 and reachable:
        try:
            views = gather(proc, cfg, mine)
        except (RuntimeError, ClusterError) as error:
            raise ClusterError(f"the checks passed here but the store did not answer ({first_line(error)})") from None
    failed = diag.failure()
    if proc.is_main:
        report = build_report(proc, cfg, views or [mine], gathered=views is not None)
        _print(report, flags.from_args(DoctorConfig, args).json)
        if not report["ok"]:  # this rank's own failure first; else the others', each naming its rank
            raise ClusterError(failed.detail if failed else f"doctor: {summary(report)}")
        return 0
    if failed is not None:
        raise ClusterError(failed.detail)
    return 0
