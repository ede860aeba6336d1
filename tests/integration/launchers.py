"""Start ``python -m app ...`` under real launchers on localhost, without free-port races.

torchrun runs with ``--standalone`` (it binds its own free port); mpirun and the Slurm-style
launch rendezvous through a file in the test's tmp_path (``--init-method file://...``).
"""

import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

PYTHON = sys.executable
TORCHRUN = str(Path(PYTHON).parent / "torchrun")
DEFAULT_TIMEOUT = 240
MPIRUN_LOCAL = ("--mca", "plm", "isolated")
"""OpenMPI starts the ranks on this machine itself: its default (rsh) wants ssh on PATH even for local ranks,
and a GPU workstation may have OpenMPI without ssh ("plm_rsh_agent ... could not be found")."""
ERROR_LINE = re.compile(  # app/logs.py's one line: error: [rank R on HOST: ]CAUSE [exit S[; log PATH]]
    r"^error: (rank (?P<rank>\d+) on (?P<host>\S+): )?(?P<cause>.+) \[exit (?P<status>\d+)(; log (?P<log>\S+))?\]$"
)


def one_error_line(stderr: str) -> re.Match:
    """The single line on stderr, parsed; fails when anything else is there."""
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr[-3000:]
    found = ERROR_LINE.match(lines[0])
    assert found, lines[0]
    return found


@contextmanager
def closed_port() -> Iterator[int]:
    """A loopback port that refuses connections: bound (so no one else gets it) but never listening."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without any launcher's rank variables, plus ``extra``."""
    prefixes = ("OMPI_", "PMI_", "SLURM_", "TORCHELASTIC_")
    names = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if k not in names and not k.startswith(prefixes)}
    env["OMP_NUM_THREADS"] = "1"
    return env | (extra or {})


def run_single(
    args: list[str], timeout: float = DEFAULT_TIMEOUT, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``python -m app ARGS`` as a plain single process."""
    return subprocess.run(
        [PYTHON, "-m", "app", *args], env=_clean_env(env), capture_output=True, text=True, timeout=timeout, check=False
    )


def run_torchrun(
    nproc: int, args: list[str], timeout: float = DEFAULT_TIMEOUT, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node N -m app ARGS``."""
    cmd = [TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", "-m", "app", *args]
    return subprocess.run(cmd, env=_clean_env(env), capture_output=True, text=True, timeout=timeout, check=False)


def mpirun_or_skip() -> str:
    """The mpirun binary; skips when OpenMPI is missing (`make test` installs it)."""
    found = shutil.which("mpirun")
    if found is None:
        pytest.skip("mpirun not installed: run `make test` (it installs openmpi-bin) or apt-get install openmpi-bin")
    return found


def run_mpirun(
    nproc: int, args: list[str], rdzv: Path, timeout: float = DEFAULT_TIMEOUT, env: dict | None = None
) -> subprocess.CompletedProcess:
    """``mpirun -np N python -m app ARGS --init-method file://RDZV`` (OpenMPI)."""
    cmd = [
        mpirun_or_skip(),
        "--allow-run-as-root",
        "--oversubscribe",
        *MPIRUN_LOCAL,
        "-np",
        str(nproc),
        PYTHON,
        "-m",
        "app",
        *args,
        "--init-method",
        f"file://{rdzv}",
    ]
    return subprocess.run(cmd, env=_clean_env(env), capture_output=True, text=True, timeout=timeout, check=False)


def run_slurm_style(
    ntasks: int, args: list[str], rdzv: Path, timeout: float = DEFAULT_TIMEOUT, nodelist: str = "localhost"
) -> list[subprocess.CompletedProcess]:
    """Start ``ntasks`` processes with the variables srun sets, as srun would on one node."""
    procs = []
    for rank in range(ntasks):
        env = _clean_env(
            {
                "SLURM_PROCID": str(rank),
                "SLURM_NTASKS": str(ntasks),
                "SLURM_LOCALID": str(rank),
                "SLURM_NODEID": "0",
                "SLURM_TASKS_PER_NODE": str(ntasks),
                "SLURM_JOB_ID": "4242",
                "SLURM_JOB_NODELIST": nodelist,
            }
        )
        cmd = [PYTHON, "-m", "app", *args, "--init-method", f"file://{rdzv}"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return results


def in_namespace(host: str, hosts_file: Path, cmd: list[str]) -> list[str]:
    """``cmd`` in user, UTS and mount namespaces of its own: named ``host``, with ``hosts_file`` as its /etc/hosts
    (this machine's network, and its files but that one)."""
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is missing: the nodes need host names of their own")
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--uts", "--mount", "true"], capture_output=True,
                           text=True, timeout=30, check=False)  # fmt: skip
    if probe.returncode:
        pytest.skip(f"this machine refuses user namespaces ({probe.stderr.strip()}): three nodes need three host names")
    script = 'hostname "$0" && mount --bind "$1" /etc/hosts && shift && exec "$@"'
    return ["unshare", "--user", "--map-root-user", "--uts", "--mount", "sh", "-c", script, host, str(hosts_file), *cmd]
