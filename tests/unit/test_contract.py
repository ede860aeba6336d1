"""The contract every engine shares (app/contract.py): each fact written once and used from there.

Every ``app topology --format`` of a GPU spec names the cuda image, ``app cluster up --gpus-per-node N`` picks
it, ``--image`` overrides it, and the renderers take the port and the in-image paths from the contract (a
contract changed here changes their output). No containers run.

    .venv/bin/python -m pytest tests/unit/test_contract.py -q
"""

import argparse
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from app import cli, contract
from app.diagnostics import gate
from app.errors import ClusterError, UsageError
from app.node import agent
from app.orchestrate import runner
from app.runtime import launcher
from app.topology import command, compose, kube, trainjob
from app.topology.spec import build
from tests.deps import need

ROOT = Path(__file__).resolve().parents[2]
GPU_SHAPE = ("--nodes", "2", "--gpus-per-node", "8", "--nproc-per-node", "8")
CARRY_THE_IMAGE = ("json", "compose", "compose-files", "k8s", "pytorchjob", "trainjob", "image")
"""The formats that name the workload image (the others name none)."""


def _render(fmt: str, out: Path, *flags: str) -> str:
    """What ``app topology --format FMT FLAGS`` renders, its files' text included."""
    parser, _ = cli.build_parser("topology")
    args = parser.parse_args([*flags, "--format", fmt, "--output", str(out / "out"), "--output-dir", str(out / "d")])
    assert command.run(args) == 0
    files = [out / "out", *sorted((out / "d").rglob("*"))]
    return "".join(p.read_text(errors="ignore") for p in files if p.is_file())


def _render_any_shape(fmt: str, out: Path, *flags: str) -> str:
    """As _render; a format that needs the hosts by name gets them (two of 8 slots)."""
    try:
        return _render(fmt, out, *flags)
    except UsageError as error:
        if "needs the hosts by name" not in str(error):
            raise
    return _render(fmt, out, *flags, "--hosts", "node0:8,node1:8")


def test_every_format_of_a_gpu_spec_names_the_cuda_image_and_none_names_the_cpu_one(tmp_path) -> None:
    cuda, cpu = contract.image(8), contract.image(0)
    assert cuda.endswith(":cuda") and cpu.endswith(":cpu")
    rendered = {}
    for fmt in command.FORMATS:
        rendered[fmt] = _render_any_shape(fmt, tmp_path / fmt, *GPU_SHAPE)
    assert {fmt for fmt, text in rendered.items() if cpu in text} == set()
    # doc documents the image's default (IMAGE_NAME:cuda ..., else IMAGE_NAME:cpu), whatever the spec
    assert {fmt for fmt, text in rendered.items() if ":cpu" in text} == {"doc"}
    assert {fmt for fmt in CARRY_THE_IMAGE if cuda not in rendered[fmt]} == set()
    # the control: the same formats of a CPU spec name the cpu image
    for fmt in ("k8s", "trainjob", "compose"):
        assert cpu in _render(fmt, tmp_path / f"cpu-{fmt}", "--nodes", "2"), fmt


def test_image_overrides_the_flavour(tmp_path) -> None:
    reference = "registry.example.org:5000/ml/mine:v1"
    for fmt in ("k8s", "trainjob", "compose", "image"):
        text = _render(fmt, tmp_path / fmt, *GPU_SHAPE, "--image", reference)
        assert reference in text and contract.image(8) not in text, fmt


@pytest.mark.parametrize("bad", ["", "ddp cluster:cpu", "x'y"])
def test_a_bad_image_is_a_one_line_error(bad: str) -> None:
    with pytest.raises(UsageError, match=r"^--image .* must be an image reference without spaces or quotes") as caught:
        build({"job": {"image": bad}})
    assert "\n" not in str(caught.value)


def test_the_flavour_follows_the_gpus() -> None:
    assert [contract.flavour(n) for n in (0, 1, 8)] == [contract.CPU, contract.CUDA, contract.CUDA]
    assert build({}).job.image == contract.image(0)
    assert build({"nodes": {"gpus_per_node": 4, "nproc_per_node": 4}}).job.image == contract.image(4)


@pytest.mark.parametrize("gpus", [1, 8])
def test_cluster_up_with_gpus_picks_the_cuda_image(tmp_path, gpus: int) -> None:
    """``app cluster up --gpus-per-node N`` run directly, not through make: its spec and compose env file."""
    parser, _ = cli.build_parser("cluster")
    shape = ("--gpus-per-node", str(gpus), "--nproc-per-node", str(gpus), "--state-dir", str(tmp_path))
    run = runner._prepare(parser.parse_args(["up", *shape]))
    assert run.spec.job.image == f"{contract.versions()['IMAGE_NAME']}:cuda"
    assert f"IMAGE='{run.spec.job.image}'" in (run.folder / "compose.env").read_text()
    plain = runner._prepare(parser.parse_args(["up", "--state-dir", str(tmp_path)]))
    assert plain.spec.job.image.endswith(":cpu")  # the control


def _containers(manifests: str) -> list[dict]:
    """The containers of every pod template in rendered manifests."""
    found = []
    for doc in need("yaml").safe_load_all(manifests):
        found += [c for node in _walk(doc) if isinstance(node, dict) for c in node.get("containers", [])]
    return found


def _walk(node):
    yield node
    for child in node.values() if isinstance(node, dict) else node if isinstance(node, list) else ():
        yield from _walk(child)


def test_the_renderings_take_the_port_and_paths_from_the_contract(monkeypatch) -> None:
    """With the contract's facts changed, the renderers follow: none holds a copy of its own."""
    monkeypatch.setattr(contract, "JOB_DIR", "/elsewhere/job")
    monkeypatch.setattr(contract, "CLUSTER_DIR", "/elsewhere/cluster")
    monkeypatch.setattr(contract, "RESULTS_DIR", "/elsewhere/results")
    script = build({"job": {"script": "train.py"}})
    mounts = [m["mountPath"] for m in _containers(kube.render_k8s(build({})))[0]["volumeMounts"]]
    assert {"/elsewhere/results", "/elsewhere/cluster"} <= set(mounts)
    assert "/elsewhere/job/train.py" in compose.nodes_file(script)
    assert "--hostfile /elsewhere/cluster/hostfile" in compose.node_files(build({}))["mpirun.args"]
    assert "/elsewhere/job/train.py" in trainjob.command(script)[1:]


def test_the_renderings_carry_the_rendezvous_port() -> None:
    spec = build({})
    port = contract.RENDEZVOUS_PORT
    assert spec.rendezvous.master_port == port
    assert _containers(kube.render_k8s(spec))[0]["ports"][0]["containerPort"] == port
    assert f'"{port}"' in compose.nodes_file(spec)  # the rendezvous store's command
    assert f"MASTER_PORT={port}" in compose.node_files(spec)["cluster.env"]
    with pytest.raises(UsageError, match=f"fixes the rendezvous port at {port} "):
        trainjob.render_trainjob(build({"rendezvous": {"master_port": port + 1}}))


def test_the_launchers_default_to_the_contracts_port(monkeypatch) -> None:
    monkeypatch.setattr(contract, "RENDEZVOUS_PORT", 31234)
    monkeypatch.setattr(contract, "C10D_PORT", 31235)
    assert agent.parse(["--nnodes=2", "--node-rank=0", "--master-addr=a", "x.py"]).master_port == 31234
    static = agent.parse(["--nnodes=2", "--node-rank=0", "--master-addr=a", "x.py"])
    static.master_port = None
    assert gate.rendezvous_of(static) == ("a", 31234, True)
    c10d = agent.parse(["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=b", "x.py"])
    assert gate.rendezvous_of(c10d) == ("b", 31235, False)
    mpi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1", "MASTER_ADDR": "a"}
    assert launcher.detect(mpi).master_port == 31234


def test_the_app_reads_versions_env_from_the_checkout() -> None:
    assert contract.shipped(contract.VERSIONS_FILE) == ROOT / "docker" / "versions.env"
    assert contract.image(0) == f"{contract.versions()['IMAGE_NAME']}:cpu"


FACT = re.compile(r"(?<![\w.-])/(job|cluster|results)(?![\w-])|ddp-cluster:|:cpu\b|:cuda\b")
"""An in-image path, or an image reference, in a string."""


def _facts(path: Path) -> list[tuple[int, object]]:
    """The port numbers, in-image paths and image references that ``path``'s code (not its prose) writes."""
    tree = ast.parse(path.read_text())
    prose = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and id(n) not in prose
        and (
            n.value in (contract.RENDEZVOUS_PORT, contract.C10D_PORT)
            or (isinstance(n.value, str) and FACT.search(n.value))
        )
    ]


def test_each_shared_fact_is_written_only_in_the_contract() -> None:
    found = {str(p.relative_to(ROOT)): _facts(p) for p in sorted((ROOT / "app").rglob("*.py"))}
    assert len(found.pop("app/contract.py")) == 5  # the control: the scan sees the contract's own
    assert {path: hits for path, hits in found.items() if hits} == {}


def _top(path: str) -> str:
    """A path's top folder: /cluster/ssh is under /cluster."""
    return "/" + path.split("/")[1]


def test_the_files_that_cannot_import_the_contract_carry_its_paths() -> None:
    """The image (docker/Dockerfile makes the folders, docker/bin's defaults) is not Python: each in-image path it
    names is the contract's, so a contract changed alone fails here (compose.yaml names none: its mounts come from
    the rendered env file, tests/unit/test_compose.py)."""
    paths = {contract.JOB_DIR, contract.CLUSTER_DIR, contract.RESULTS_DIR, contract.EVENTS_DIR}
    made = re.search(r"install -d -o app -g app -m 0755 ([^\n]+)", (ROOT / "docker" / "Dockerfile").read_text())
    assert made is not None and {_top(p) for p in made[1].split()} == paths
    scripts = "".join(p.read_text() for p in sorted((ROOT / "docker" / "bin").iterdir()))
    named = set(re.findall(r"^\w+=(/[^/\s]+)(?:/\S*)?$", scripts, re.M))  # out=/cluster, args_file=/cluster/...
    named |= set(re.findall(r'CLUSTER_ENV = Path\("(/[^/"]+)/', scripts))
    assert named == {contract.CLUSTER_DIR}
    assert "CLUSTER_DIR" not in scripts  # no seam that only a test sets: tests run a relocated copy (rigs/entrypoints)


def test_ansible_mounts_the_contracts_paths_as_the_apps_json_gives_them(capsys) -> None:
    """The roles' tasks and variables name no in-image path of their own (their comments may): the mounts come from
    ``app topology --format json``'s paths, which are the contract's."""
    assert cli.main(["topology", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["paths"] == contract.PATHS
    code = {}
    for path in sorted((ROOT / "ansible" / "roles").rglob("*.yml")):
        lines = [line.split(" #")[0] for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
        hits = [line.strip() for line in lines if re.search(r"(?<![\w.{}-])/(job|cluster|results|events)\b", line)]
        code |= {str(path.relative_to(ROOT)): hits} if hits else {}
    assert code == {}
    job = (ROOT / "ansible" / "roles" / "launch" / "tasks" / "job.yml").read_text()
    assert "{{ launch_spec.paths.results }}" in job and "{{ cluster_dir }}:{{ cluster_mount }}:ro" in job


def test_make_leaves_the_flavour_to_the_app_and_builds_through_it() -> None:
    """make cluster-up parses no spec itself: it gives the runner the image's name and the build command, and the
    runner (which checks the spec once) picks the flavour; with IMAGE (the user's own) nothing is built."""
    cmd = ["make", "--no-print-directory", "-n", "cluster-up", "GPUS_PER_NODE=8", "NPROC_PER_NODE=8", "IMAGE_NAME=x"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    [line] = [line for line in done.stdout.splitlines() if "-m app cluster up" in line]
    assert "--image-name x " in line and "--build 'env PYTHONPATH=" in line and "-m imagebuild image " in line
    assert "topology" not in done.stdout and "--flavour" not in line  # the one parse is the runner's
    mine = subprocess.run([*cmd, "IMAGE=mine:1"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert "--image 'mine:1'" in mine.stdout and "--build" not in mine.stdout


@pytest.mark.parametrize(("gpus", "flavour"), [("0", "cpu"), ("8", "cuda")])
def test_the_runner_builds_the_flavour_of_the_spec_it_checked(tmp_path, gpus: str, flavour: str) -> None:
    """``--build COMMAND`` runs COMMAND with the spec's flavour; ``--image-name`` names the image of that flavour."""
    parser = argparse.ArgumentParser()
    runner.add_arguments(parser)
    args = parser.parse_args(["up", "--state-dir", str(tmp_path), "--gpus-per-node", gpus, "--nproc-per-node", "1",
                              "--image-name", "x"])  # fmt: skip
    args.verbose = False  # (app's own flag, added by app/cli.py)
    assert runner._prepare(args).spec.job.image == f"x:{flavour}"
    seen = tmp_path / "argv"
    runner._build(f"{sys.executable} -c 'import sys; open(sys.argv[1], \"w\").write(sys.argv[2] + sys.argv[3])' {seen}",
                  flavour)  # fmt: skip
    assert seen.read_text() == f"--flavour{flavour}"
    with pytest.raises(ClusterError, match="exit status 3"):
        runner._build(f"{sys.executable} -c 'raise SystemExit(3)'", flavour)
