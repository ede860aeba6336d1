"""docker/bin/ddp-mpirun (the mpi profile's and Ansible's launcher) names an empty or unreadable hostfile before
mpirun starts: the app's one line, exit 2 (issue 36, item 7: OpenMPI's own message was cut short).

The real script (relocated to the test's cluster folder), the app's real parser, and an ``mpirun`` on PATH that
only leaves a mark.
Run: ``.venv/bin/python -m pytest tests/integration/test_mpirun_hostfile.py`` (about 2 s).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.rigs import entrypoints

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DIR = "a folder"


def launch(tmp_path: Path, hostfile_text: str | None, mode: int = 0o644) -> subprocess.CompletedProcess:
    """ddp-mpirun with /cluster at ``tmp_path`` and its hostfile holding ``hostfile_text`` (None: no file; DIR: a
    folder, which not even root can read as a file)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    mpirun = bin_dir / "mpirun"
    mpirun.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "mpirun-called"}\n')
    mpirun.chmod(0o755)
    hostfile = tmp_path / "hostfile"
    if hostfile_text == DIR:
        hostfile.mkdir()
    elif hostfile_text is not None:
        hostfile.write_text(hostfile_text)
        hostfile.chmod(mode)
    (tmp_path / "mpirun.args").write_text(f"-np 2 --hostfile {hostfile} -x MASTER_ADDR=a -x MASTER_PORT=29500\n")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT)}
    script = entrypoints.relocated("ddp-mpirun", tmp_path)
    return subprocess.run(["bash", str(script), "python", "-m", "app", "check"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip


@pytest.mark.parametrize(
    ("text", "mode", "said"),
    [
        ("", 0o644, "names no host (empty, or only comments): write one 'NAME slots=N' line per node"),
        ("# nodes go here\n", 0o644, "names no host (empty, or only comments)"),
        ("a slots=1\n", 0o000, "(Permission denied): give a readable file of one 'NAME slots=N' line per node"),
        (None, 0o644, "(No such file or directory): give a readable file"),
        (DIR, 0o644, "(Is a directory): give a readable file"),
    ],
)
def test_a_bad_hostfile_is_named_before_mpirun_starts(tmp_path, text, mode, said):
    if mode == 0o000 and os.geteuid() == 0:
        pytest.skip("root reads a file of mode 000")
    done = launch(tmp_path, text, mode)
    assert done.returncode == 2, done
    assert done.stderr.splitlines() == [done.stderr.strip()] and done.stderr.startswith("error: "), done.stderr
    assert f"--hostfile {tmp_path / 'hostfile'}" in done.stderr and said in done.stderr
    assert not (tmp_path / "mpirun-called").exists(), "mpirun started"


def test_a_good_hostfile_starts_mpirun(tmp_path):
    """The negative control: the same launch with a hostfile that names its nodes runs mpirun with the job."""
    done = launch(tmp_path, "a slots=1\nb slots=1\n")
    assert done.returncode == 0 and done.stderr == "", done
    assert (tmp_path / "mpirun-called").read_text().split()[-4:] == ["python", "-m", "app", "check"]
