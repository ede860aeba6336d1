"""Rendering from the cluster spec: the hostfile, env file and launcher arguments that compose,
Ansible and users' launches use, and the `app topology` command."""

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from app.errors import UsageError
from app.topology import render
from app.topology.spec import ClusterSpec, Host, Job, Nodes, Rendezvous, build, parse_hostfile, parse_hosts

TWO_BY_TWO = build({"nodes": {"hosts": "node0:2,node1:2"}, "rendezvous": {"master_port": 29400, "ifname": "eth0"}})
HOSTS = TWO_BY_TWO.nodes.hosts


def test_hostfile_has_one_line_per_host_with_slots() -> None:
    assert render.render_hostfile(HOSTS) == "node0 slots=2\nnode1 slots=2\n"


def test_env_file_names_master_and_sizes() -> None:
    assert render.render_env(TWO_BY_TWO, HOSTS).splitlines() == [
        "MASTER_ADDR=node0",
        "MASTER_PORT=29400",
        "NNODES=2",
        "WORLD_SIZE=4",
        "NPROC_PER_NODE=2",
        "GLOO_SOCKET_IFNAME=eth0",
        "NCCL_SOCKET_IFNAME=eth0",
        "TORCH_FR_BUFFER_SIZE=2000",  # torch's flight recorder, on for every launcher
        "TORCH_NCCL_DUMP_ON_TIMEOUT=1",
    ]


def test_torchrun_static_and_c10d_rendezvous() -> None:
    assert render.torchrun_args(TWO_BY_TWO, HOSTS, node_rank=1) == [
        "--nnodes=2",
        "--nproc-per-node=2",
        "--max-restarts=3",
        "--node-rank=1",
        "--master-addr=node0",
        "--master-port=29400",
        f"--rdzv-id={TWO_BY_TWO.job.name}",  # the metrics' job label (torchrun's default: none)
    ]
    c10d = render.torchrun_args(TWO_BY_TWO, HOSTS)
    assert "--rdzv-endpoint=node0:29400" in c10d
    assert "--rdzv-conf=join_timeout=120,keep_alive_interval=1,keep_alive_max_attempt=10" in c10d


def test_torchs_c10d_rendezvous_takes_the_rendered_settings() -> None:
    """The rendered --rdzv-conf, read by torch's own handler: a lost node dropped after 3 x 1 s, not 3 x 5 s."""
    from torch.distributed import TCPStore
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler
    from torch.distributed.run import get_args_parser

    spec = build(
        {
            "nodes": {"hosts": "node0:2,node1:2,node2:2", "min_nodes": 2},
            "rendezvous": {"keep_alive": 2},
            "job": {"command": "train --accum-steps 2"},
        }
    )
    args = get_args_parser().parse_args([*render.torchrun_args(spec, spec.nodes.hosts), "job.py"])
    conf = dict(item.split("=") for item in args.rdzv_conf.split(","))
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    params = RendezvousParameters("c10d", f"127.0.0.1:{store.port}", "demo", 2, 3, **conf)
    settings = create_handler(store, C10dRendezvousBackend(store, "demo"), params)._settings
    assert (
        settings.keep_alive_interval.total_seconds() == 2
        and settings.keep_alive_max_attempt == render.KEEP_ALIVE_MISSED
    )
    assert settings.timeout.join.total_seconds() == 120 and settings.timeout.last_call.total_seconds() == 2


def test_min_nodes_defaults_to_nodes_and_renders_as_torchruns_min_max() -> None:
    assert build({"nodes": {"nodes": 3}}).nodes.min_nodes == 3  # all or none: today's --nnodes=3
    assert "--nnodes=3" in render.torchrun_args(build({"nodes": {"nodes": 3}}), (Host("a", 1),) * 3)
    elastic = build(
        {"nodes": {"hosts": "node0:2,node1:2,node2:2", "min_nodes": 2}, "job": {"command": "train --accum-steps 2"}}
    )
    args = render.torchrun_args(elastic, elastic.nodes.hosts)
    assert (
        "--nnodes=2:3" in args
        and "--rdzv-conf=join_timeout=120,keep_alive_interval=1,keep_alive_max_attempt=10,last_call_timeout=2" in args
    )
    with pytest.raises(UsageError, match="static rendezvous"):
        render.torchrun_args(elastic, elastic.nodes.hosts, node_rank=0)
    assert build({"nodes": {"nodes": 4}}).as_dict()["nodes"]["min_nodes"] == 4


def test_mpirun_args_carry_master_and_interface() -> None:
    args = render.mpirun_args(TWO_BY_TWO, HOSTS, hostfile="/etc/ddp/hostfile")
    assert args[:4] == ["-np", "4", "--hostfile", "/etc/ddp/hostfile"]
    assert "MASTER_ADDR=node0" in args and "MASTER_PORT=29400" in args
    assert not any(a.startswith("WORLD_SIZE=") for a in args), "WORLD_SIZE without RANK breaks launcher detection"
    assert args[args.index("btl_tcp_if_include") + 1] == "eth0"


def test_master_addr_override_and_uneven_hosts() -> None:
    uneven = (Host("a", 4), Host("b", 2))
    spec = build({"nodes": {"hosts": uneven}, "rendezvous": {"master_addr": "10.1.1.1"}, "job": {"launcher": "mpirun"}})
    env = render.render_env(spec, uneven)
    assert "MASTER_ADDR=10.1.1.1" in env and "WORLD_SIZE=6" in env and "NPROC_PER_NODE" not in env
    assert spec.world_size == 6
    with pytest.raises(UsageError, match="same slots"):
        render.torchrun_args(spec, uneven)
    with pytest.raises(UsageError, match="same slots"):
        build({"nodes": {"hosts": uneven}})


def test_hostfile_round_trip_with_comments() -> None:
    text = "# cluster\nnode0 slots=8\nnode1 slots=8 max_slots=8  # second\n\nnode2\n"
    notes: list[str] = []
    assert parse_hostfile(text, "hosts.txt", note=notes.append) == (
        Host("node0", 8),
        Host("node1", 8),
        Host("node2", 1),
    )
    assert notes == ["hosts.txt line 5: node2 has no slots=N: 1 slot (OpenMPI would count its cores)"]
    assert parse_hostfile(render.render_hostfile(HOSTS)) == HOSTS


def test_named_hosts_set_the_shape() -> None:
    spec = build({"nodes": {"hosts": "a:3,b:3,c:3"}})
    assert (spec.nodes.nodes, spec.nodes.nproc_per_node, spec.world_size) == (3, 3, 9)
    assert build({}).world_size == Nodes().nodes * Nodes().nproc_per_node


def test_job_argv_runs_the_app_or_the_users_script_unchanged() -> None:
    assert render.job_argv(build({"job": {"command": "check --json /r/c.json"}})) == [
        "-m",
        "app",
        "check",
        "--json",
        "/r/c.json",
    ]
    script = build({"job": {"script": "jobs/train.py", "args": "--lr 0.1 --name 'a b'"}})
    assert render.job_argv(script) == ["/job/train.py", "--lr", "0.1", "--name", "a b"]
    assert render.python_argv(script)[:2] == ["python", "/job/train.py"]


@pytest.mark.parametrize(
    ("build_it", "message"),
    [
        (lambda: parse_hostfile("node0 slots=two\n", "hosts.txt"), "hosts.txt line 1"),
        (lambda: parse_hostfile("node0 cpus=2\n"), "node0 slots=2"),
        (lambda: parse_hostfile("", "hosts.txt"), "hosts.txt names no host (empty, or only comments): write one"),
        (lambda: parse_hostfile("# node0 slots=2\n\n"), "hostfile names no host"),
        (lambda: parse_hosts("node0:x"), "NAME:SLOTS"),
        (lambda: parse_hosts("node0:0"), "at least 1 slot"),
        (lambda: parse_hosts("bad host:1"), "not a valid host name"),
        (lambda: build({"nodes": {"hosts": "a:1,a:1"}}), "listed twice"),
        (lambda: Rendezvous(master_port=0), "1024-65535"),
        (lambda: Rendezvous(ifname="eth0; rm -rf /"), "interface name"),
        (lambda: render.torchrun_args(TWO_BY_TWO, HOSTS, node_rank=2), "--node-rank 2"),
        (lambda: Nodes(nodes=0), "--nodes 0 must be >= 1"),
        (lambda: Nodes(nproc_per_node=4, gpus_per_node=2), "exceeds --gpus-per-node 2"),
        (lambda: build({"nodes": {"hosts": "a:1,b:1", "nodes": 3}}), "--nodes 3 but 2 host(s)"),
        (lambda: build({"nodes": {"hosts": "a:2,b:2", "nproc_per_node": 4}}), "--nproc-per-node 4 but"),
        (lambda: Job(name="Bad_Name"), "--name 'Bad_Name'"),
        (lambda: Job(launcher="pbs"), "--launcher 'pbs'"),
        (lambda: Job(args="--lr 1"), "give --script too"),
        (lambda: Job(time_limit=0), "--time-limit 0"),
        (lambda: Rendezvous(max_restarts=-1), "--max-restarts -1"),
        (lambda: build({"nodes": {"nodes": "two"}}), "--nodes"),
        (lambda: Nodes(nodes=2, min_nodes=0), "--min-nodes 0 must be between 1 and --nodes 2"),
        (lambda: Nodes(nodes=2, min_nodes=3), "--min-nodes 3 must be between 1 and --nodes 2"),
        (lambda: Nodes(gate_seconds=0), "--gate-seconds 0 must be a positive number of seconds"),
        (lambda: build({"nodes": {"gate_seconds": -1}}), "--gate-seconds -1 must be a positive"),
        (lambda: build({"nodes": {"gate_seconds": "2"}}), "nodes.gate_seconds = '2' must be a number"),
        (lambda: Nodes(gate_fail_below=0), "--gate-fail-below 0 must be a fraction of the job's figures in (0, 1]"),
        (lambda: build({"nodes": {"gate_fail_below": 1.5}}), "--gate-fail-below 1.5 must be a fraction"),
        (lambda: build({"nodes": {"min_nodes": 1}, "job": {"launcher": "mpirun"}}), "needs --launcher torchrun"),
    ],
)
def test_bad_specs_are_one_line_errors(build_it, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        build_it()
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_whole_number_is_a_number_where_the_spec_takes_one() -> None:
    spec = build({"nodes": {"gate_seconds": 2, "evict_factor": 4}})  # a spec file's `gate_seconds = 2`
    assert (spec.nodes.gate_seconds, spec.nodes.evict_factor) == (2.0, 4.0)
    with pytest.raises(UsageError, match="must be a number"):
        build({"nodes": {"evict_factor": True}})


def _topology_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app", "topology", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_cli_writes_atomically_and_never_imports_torch(tmp_path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("node0 slots=2\nnode1 slots=2\n")
    out = tmp_path / "cluster.json"
    done = _topology_cli("--hostfile", str(hostfile), "--format", "json", "--output", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["world_size"] == 4
    probe = (
        "import sys, app.cli as c; c.main(['topology','--hosts','a:1','--format','env']); print('torch' in sys.modules)"
    )
    assert (
        subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
        .stdout.strip()
        .endswith("False")
    )


def test_cli_bad_hostfile_exits_2_with_one_line(tmp_path) -> None:
    done = _topology_cli("--hostfile", str(tmp_path / "missing"), "--format", "hostfile")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "cannot read --hostfile" in done.stderr


def test_cli_names_the_empty_hostfile_it_was_given_and_says_what_a_line_without_slots_means(tmp_path) -> None:
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# node0 slots=2\n")
    done = _topology_cli("--hostfile", str(hostfile), "--format", "hostfile")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"--hostfile {hostfile} names no host" in done.stderr and "give --hosts" not in done.stderr
    hostfile.write_text("node0 slots=2\nnode1\n")
    done = _topology_cli("--hostfile", str(hostfile), "--launcher", "mpirun", "--format", "hostfile")
    assert done.returncode == 0 and done.stdout == "node0 slots=2\nnode1 slots=1\n", done.stderr
    assert (
        done.stderr
        == f"note: --hostfile {hostfile} line 2: node1 has no slots=N: 1 slot (OpenMPI would count its cores)\n"
    )


def test_spec_file_is_overridden_by_flags_and_checked_for_unknown_keys(tmp_path) -> None:
    path = tmp_path / "cluster.toml"
    path.write_text('[nodes]\nnodes = 3\nnproc_per_node = 1\n\n[job]\nname = "lab"\n')
    done = _topology_cli("--spec", str(path), "--nproc-per-node", "4", "--format", "json")
    data = json.loads(done.stdout)
    assert (data["nodes"]["nodes"], data["nodes"]["nproc_per_node"], data["job"]["name"]) == (3, 4, "lab")
    assert data["world_size"] == 12
    path.write_text("[nodes]\nnode = 3\n")
    done = _topology_cli("--spec", str(path))
    assert done.returncode == 2 and "unknown key 'node'" in done.stderr and "nproc_per_node" in done.stderr
    path.write_text("[nodes\n")
    done = _topology_cli("--spec", str(path))
    assert done.returncode == 2 and "is not valid TOML" in done.stderr and done.stderr.count("\n") == 1


def test_the_json_spec_round_trips() -> None:
    spec = build({"nodes": {"hosts": "a:2,b:2"}, "job": {"command": "check", "launcher": "mpirun"}})
    done = _topology_cli("--spec-json", json.dumps(spec.as_dict()), "--format", "json")
    assert build(json.loads(done.stdout)) == spec
    assert isinstance(build({}), ClusterSpec)


def test_the_json_spec_gives_the_job_argv_and_takes_its_own_output_back() -> None:
    done = _topology_cli("--hosts", "a:2,b:2", "--command", "check --json '/results/a b.json'", "--format", "json")
    data = json.loads(done.stdout)
    assert data["job_argv"] == ["-m", "app", "check", "--json", "/results/a b.json"]
    assert data["python_argv"] == ["python", *data["job_argv"]]
    again = _topology_cli("--spec-json", done.stdout, "--format", "json")
    assert again.returncode == 0 and json.loads(again.stdout) == data, again.stderr


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ('{"job": {"comand": "check"}}', "--spec-json [job]: unknown key 'comand': the keys are name, command,"),
        ('{"jobs": {}}', "--spec-json: unknown key 'jobs': the keys are nodes, rendezvous, job,"),
        ('{"job": "check"}', "--spec-json: [job] must be a table of keys, got 'check'"),
        ('["check"]', "--spec-json must be tables of keys"),
        ('{"rendezvous": {"master_port": "29600"}}', "spec key rendezvous.master_port = '29600' must be a whole"),
    ],
)
def test_a_bad_json_spec_is_one_line_naming_the_key(given: str, message: str) -> None:
    done = _topology_cli("--spec-json", given, "--format", "json")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_mpirun_format_quotes_nothing_it_cannot_split() -> None:
    done = _topology_cli("--hosts", "a:1,b:1", "--ifname", "eth1", "--format", "mpirun")
    assert shlex.split(done.stdout)[:2] == ["-np", "2"]


def test_the_readme_documents_every_spec_key_as_the_code_defines_it() -> None:
    readme = (Path(__file__).resolve().parents[2] / "docs" / "engines.md").read_text()
    table = _topology_cli("--format", "doc").stdout
    assert table.count("\n") > 15
    assert table in readme, "docs/engines.md's spec table is stale: run make readme-spec"


def test_every_rendered_launcher_turns_the_flight_recorder_on() -> None:
    """compose and Ansible (the env file), mpirun (-x), Slurm (export) and Kubernetes (env) all carry it."""
    from app.runtime import envvars
    from app.topology import kube, slurm

    wanted = [f"{k}={v}" for k, v in envvars.FLIGHT_RECORDER.items()]
    env = render.render_env(TWO_BY_TWO, HOSTS).splitlines()
    mpirun = render.mpirun_args(TWO_BY_TWO, HOSTS)
    sbatch = slurm.render_script(build({"nodes": {"nodes": 2}}))
    manifests = kube.render_k8s(build({})) + kube.render_pytorchjob(build({}))
    for key, value in envvars.FLIGHT_RECORDER.items():
        assert f"{key}={value}" in env and f"{key}={value}" in mpirun and f"export {key}={value}" in sbatch
        assert manifests.count(f'"{key}"') >= 3  # the indexed job's pod, the PyTorchJob's master and worker
    assert wanted
