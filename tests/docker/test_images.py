"""The workload images: built offline from the local base (``make test-images``), safe defaults, both flavours.

Run: ``make test-images && .venv/bin/python -m pytest tests/docker/test_images.py``.
"""

import json
import shutil

import pytest
from imagebuild import versions

from .conftest import IMAGE_NAME, ROOT, explain, run

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
    torch = in_image(cpu_image, "python", "-c", "import torch; print(torch.__version__)")
    assert torch.split()[0] == f"{versions.read()['TORCH_VERSION']}+cpu", torch
    assert "Open MPI" in in_image(cpu_image, "mpirun", "--version")


def test_cuda_standin_builds_and_passes_cpu_smoke(cuda_image):
    """CI has no registry and no GPU: the cuda target from the local base with CPU torch."""
    config = inspect(cuda_image)
    assert config["Labels"]["org.ddp-cluster.cuda-standin"] == "1"
    assert "NVIDIA_VISIBLE_DEVICES=all" in config["Env"]
    imports = (
        "import torch, numpy, sklearn, app.diagnostics.check, app.train, torch.utils.tensorboard, matplotlib, tqdm"
    )
    in_image(cuda_image, "python", "-c", imports)
    report = json.loads(in_image(cuda_image, "python", "-m", "app", "check", "--backend", "gloo", "--json", "-"))
    assert report["ok"] and report["backend"] == "gloo"
    # Two ranks need a resolvable hostname for gloo: the default bridge network gives one.
    torchrun = ["torchrun", "--standalone", "--nproc-per-node", "2", "-m", "app", "check", "--backend", "gloo"]
    out = in_image(cuda_image, *torchrun, network="bridge")
    assert "result: ok" in out, out


def test_cuda_target_refuses_cpu_torch_unless_standin(cuda_image):
    """The guard: a CPU wheel must not slip into a GPU image unnoticed."""
    base = inspect(cuda_image)["Labels"]["org.opencontainers.image.base.name"]
    python = f"PYTHON_VERSION={versions.read()['PYTHON_VERSION']}"
    args = [f"BASE_IMAGE={base}", f"WHEELS_IMAGE={IMAGE_NAME}-wheels:cpu", python, "CUDA_STANDIN=0"]
    build_args = [item for arg in args for item in ("--build-arg", arg)]
    # --force-rm: the failing step leaves no stopped container behind.
    cmd = ["docker", "build", "--force-rm", "-f", "docker/Dockerfile", "--target", "cuda", *build_args]
    proc = run([*cmd, str(ROOT)], 900)
    assert proc.returncode != 0, explain(proc)
    assert "has no CUDA" in proc.stdout + proc.stderr, explain(proc)


# What the trims must leave working: TensorBoard's writer (and reading its files back), headless
# matplotlib, tqdm, tabulate under torch's flight-recorder analysis, DataLoader workers; and the
# packages left out on purpose (TensorBoard's server, pip, setuptools), absent while all of that works.
REPORTS = """
import importlib.util, torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.tensorboard import SummaryWriter
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
from tqdm import tqdm
from torch.distributed.flight_recorder.components import builder

assert builder.tabulate.__module__ == "tabulate", builder.tabulate  # the flight-recorder analysis's tables
fig, ax = plt.subplots()
ax.plot([3, 2, 1], label=r"loss $\\alpha$")
ax.legend()
fig.savefig("/tmp/loss.png")
with SummaryWriter("/tmp/tb") as writer:
    for step in tqdm(range(3)):
        writer.add_scalar("loss", 1.0 / (step + 1), step)
    writer.add_histogram("weights", torch.randn(100), 0)
    writer.add_text("note", "hello", 0)
    writer.add_image("sample", torch.rand(3, 8, 8), 0)
    writer.add_figure("plot", fig, 0)
    writer.add_hparams({"lr": 0.1}, {"hparam/accuracy": 0.9})
events = EventAccumulator("/tmp/tb")
events.Reload()
assert [round(e.value, 4) for e in events.Scalars("loss")] == [1.0, 0.5, 0.3333], events.Tags()
with open("/tmp/loss.png", "rb") as png:
    assert png.read(8) == b"\\x89PNG\\r\\n\\x1a\\n"
batches = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=2, num_workers=2)
assert sum(batch[0].sum().item() for batch in batches) == 28.0
left_out = ("grpc", "werkzeug", "markdown", "tensorboard_data_server", "setuptools", "pip")
print("installed:", [name for name in left_out if importlib.util.find_spec(name)])
"""
# Modules the workload imports; with their bytecode built in, none is compiled from source.
WORKLOAD_IMPORTS = (
    "import app.diagnostics.check, app.train.main, app.train.data, "
    "torch.distributed.run, torch.nn.parallel, torch.utils.tensorboard, matplotlib.pyplot, tqdm"
)


def compiled_from_source(image: str, *env: str, imports: str = WORKLOAD_IMPORTS) -> list[str]:
    """The venv's modules that ``imports`` (the workload's) compiles from source (python -v), with ENV (K=V)."""
    script = f"python -v -c '{imports}' 2>&1 | grep -E '^# code object from /opt/venv/.*[.]py$' || true"
    return in_image(image, "env", *env, "bash", "-c", script).splitlines()


def test_trimmed_image_still_trains_reports_and_loads_bytecode(cpu_image):
    """The trims (stripped objects, no tests, no pip, TensorBoard without its server, bytecode only
    for what the workload imports) leave the workload whole: an over-eager trim fails here."""
    out = in_image(cpu_image, "python", "-c", REPORTS)
    assert "installed: []" in out, out
    torchrun = ["torchrun", "--standalone", "--nproc-per-node", "2", "-m", "app", "train", "--dataset", "digits"]
    out = in_image(cpu_image, *torchrun, "--epochs", "1", "--out", "/tmp/digits", network="bridge")
    assert "done: " in out and "params identical on all ranks" in out, out

    assert compiled_from_source(cpu_image) == []
    # Negative control: the same check, bytecode hidden, sees a venv module compiled from source (tqdm's: all of
    # torch compiled from source took a minute of this test's CPU).
    hidden = compiled_from_source(cpu_image, "PYTHONPYCACHEPREFIX=/tmp/empty", imports="import tqdm")
    assert any("/tqdm/" in line for line in hidden), hidden


@pytest.mark.parametrize("left_out", [False, True])
def test_venv_check_names_a_required_package_that_is_missing(cpu_image, tmp_path, left_out):
    """docker/check-venv.sh on a venv holding python-dateutil without its requirement tzdata:
    an error naming tzdata and the fix, unless the list leaves tzdata out on purpose (the control)."""
    house = ROOT / "build" / "wheelhouse" / "cpu"
    for wheel in (*house.glob("python_dateutil-*.whl"), *house.glob("tools/pip-*.whl")):
        shutil.copy(wheel, tmp_path)
    lines = ["python-dateutil", *(["# left-out: tzdata   python-dateutil's time zones"] if left_out else [])]
    (tmp_path / "requirements.txt").write_text("\n".join(lines) + "\n")
    script = (
        "pip=$(echo /w/pip-*.whl) && python3 -m venv --without-pip /tmp/v"
        " && /tmp/v/bin/python $pip/pip install -q --no-index --no-deps /w/python_dateutil-*.whl"
        " && bash /docker/check-venv.sh /tmp/v /w/requirements.txt $pip"
    )
    mounts = ["-v", f"{tmp_path}:/w:ro", "-v", f"{ROOT / 'docker'}:/docker:ro"]
    cmd = ["docker", "run", "--rm", "--network", "none", "--user", "root", *mounts, "--entrypoint", "bash"]
    proc = run([*cmd, cpu_image, "-c", script], 120)
    if left_out:
        assert proc.returncode == 0 and "left out on purpose (tzdata)" in proc.stdout, explain(proc)
    else:
        assert proc.returncode == 1, explain(proc)
        assert proc.stderr.startswith("error: pip check: required but not installed: tzdata;"), explain(proc)
        assert proc.stderr.count("\n") == 1 and "docker/requirements.txt" in proc.stderr, explain(proc)
