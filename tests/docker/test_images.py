"""The workload images: built offline from the local base, safe defaults, both flavours.

Run: ``.venv/bin/python -m pytest tests/docker/test_images.py``.
"""

import json

import pytest

from .conftest import ROOT, explain, run

pytestmark = pytest.mark.docker


def inspect(image: str) -> dict:
    proc = run(["docker", "image", "inspect", image], 60)
    assert proc.returncode == 0, explain(proc)
    return json.loads(proc.stdout)[0]["Config"]


def in_image(image: str, *cmd: str, user: str = "", network: str = "none", timeout: int = 180) -> str:
    """Run CMD in a throwaway container; returns stdout, asserts success.

    The limit is enforced inside the container too (coreutils timeout), so a hung command
    cannot outlive the test in a container of its own.
    """
    as_user = ["--user", user] if user else []
    options = ["--rm", "--network", network, *as_user, "--entrypoint", "timeout"]
    proc = run(["docker", "run", *options, image, str(timeout), *cmd], timeout + 30)
    assert proc.returncode == 0, explain(proc)
    return proc.stdout


def test_cpu_image_is_non_root_labelled_and_holds_no_keys(cpu_image):
    config = inspect(cpu_image)
    assert config["User"] == "1000:1000"
    assert config["Healthcheck"]["Test"][:2] == ["CMD", "ddp-ready"]
    labels = config["Labels"]
    for key in ("title", "version", "revision", "base.name"):
        assert labels.get(f"org.opencontainers.image.{key}"), f"label {key} missing: {labels}"
    assert in_image(cpu_image, "id", "-u").strip() != "0"
    find = ["find", "/", "-xdev", "(", "-name", "id_*", "-o", "-name", "ssh_host_*", ")", "-type", "f"]
    keys = in_image(cpu_image, *find, user="root")
    assert keys.strip() == "", f"key files baked into the image:\n{keys}"
    versions = in_image(cpu_image, "python", "-c", "import torch; print(torch.__version__)")
    assert versions.split()[0].startswith("2.13.0"), versions
    assert "Open MPI" in in_image(cpu_image, "mpirun", "--version")


def test_cuda_standin_builds_and_passes_cpu_smoke(cuda_image):
    """CI has no registry and no GPU: the cuda target from the local base with CPU torch."""
    config = inspect(cuda_image)
    assert config["Labels"]["org.ddp-cluster.cuda-standin"] == "1"
    assert "NVIDIA_VISIBLE_DEVICES=all" in config["Env"]
    in_image(cuda_image, "python", "-c", "import torch, numpy, sklearn, app.platform.check, app.train")
    report = json.loads(in_image(cuda_image, "python", "-m", "app", "check", "--backend", "gloo", "--json", "-"))
    assert report["ok"] and report["backend"] == "gloo"
    # Two ranks need a resolvable hostname for gloo: the default bridge network gives one.
    torchrun = ["torchrun", "--standalone", "--nproc-per-node", "2", "-m", "app", "check", "--backend", "gloo"]
    out = in_image(cuda_image, *torchrun, network="bridge")
    assert "result: ok" in out, out


def test_cuda_target_refuses_cpu_torch_unless_standin(cuda_image):
    """The guard: a CPU wheel must not slip into a GPU image unnoticed."""
    args = ["BASE_IMAGE=ddp-cluster-base:bookworm", "WHEELS_IMAGE=ddp-cluster-wheels:cpu", "CUDA_STANDIN=0"]
    build_args = [item for arg in args for item in ("--build-arg", arg)]
    # --force-rm: the failing step leaves no stopped container behind.
    cmd = ["docker", "build", "--force-rm", "-f", "docker/Dockerfile", "--target", "cuda", *build_args]
    proc = run([*cmd, str(ROOT)], 900)
    assert proc.returncode != 0, explain(proc)
    assert "has no CUDA" in proc.stdout + proc.stderr, explain(proc)


@pytest.mark.parametrize(
    ("cmd", "message"),
    [
        (["docker/build-image.sh", "--flavour", "gpu"], "--flavour must be cpu or cuda"),
        (["docker/build-image.sh", "--flavour", "cpu", "--base", "cloud"], "BASE must be auto, upstream or local"),
        (["docker/fill-wheelhouse.sh", "--out", "/tmp/x", "--torch", "numpy"], "--torch must be a torch requirement"),
        (["docker/setup-engine.sh", "--nope"], "unknown argument"),
    ],
)
def test_bad_build_input_is_one_line_error(cmd, message):
    proc = run(cmd, 60)
    assert proc.returncode != 0
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert message in proc.stderr
