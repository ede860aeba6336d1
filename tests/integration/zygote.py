"""``python -m MODULE ARGS`` as a fork of one interpreter that imported torch and the app once (this pytest
worker's zygote), not a fresh interpreter each time: the suite's hand-started ranks spent most of their CPU
importing torch (about 1.4 s each on this 2-core machine, beside a job's own second or two).

The fork is the same program a fresh ``python -m MODULE ARGS`` is: its argv, environment, working directory,
standard streams and exit status are its own, and it runs the module as ``__main__``. What differs: the modules
were imported before its environment was set. The app reads its environment when it runs, not when imported
(tests/unit/test_boundaries.py); torch reads OMP_NUM_THREADS when imported, so the zygote starts with the
launchers' value (1) and a fork asked for another sets torch's threads itself. The app's own node agent starts
its ranks the same way (app/node/agent.py: forks of one preloaded server).

    proc = spawn("app", ["train", "--dataset", "synthetic"], env)   # a subprocess.Popen look-alike
    out, err = proc.communicate(timeout=240)

Launcher tests (torchrun, mpirun, app node) start real interpreters as users do; only the hand-started ranks and
single processes of tests/integration/launchers.py and train_runs.py come from here.
"""

import atexit
import contextlib
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRELOAD = ("torch", "torch.distributed", "app.cli", "app.train.main", "app.diagnostics.check", "app.diagnostics.comm")
"""What ``python -m app ...`` imports before its command runs (the commands the suite starts most)."""
OMP_THREADS = "1"
"""The zygote's OMP_NUM_THREADS (launchers._clean_env's)."""
_server: tuple[subprocess.Popen, str] | None = None
_lock = threading.Lock()


# --- the client: a Popen look-alike --------------------------------------------------------------------------


class Forked:
    """A process forked by the zygote, driven as ``subprocess.Popen(..., stdout=PIPE, stderr=PIPE, text=True)``."""

    def __init__(self, module: str, argv: list[str], env: dict[str, str], cwd: str | None = None) -> None:
        self.args = [sys.executable, "-m", module, *argv]
        self.returncode: int | None = None
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        stdin = os.open(os.devnull, os.O_RDONLY)
        request = {"module": module, "argv": argv, "env": env, "cwd": cwd or os.getcwd()}
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._sock.connect(_server_path())
            socket.send_fds(self._sock, [json.dumps(request).encode()], [stdin, out_w, err_w])
            self.pid = int(self._sock.recv(64).decode())
        finally:
            for fd in (stdin, out_w, err_w):
                os.close(fd)
        self.stdout = open(out_r, encoding=None)  # noqa: SIM115 (read until the fork's end, as Popen's are)
        self.stderr = open(err_r, encoding=None)  # noqa: SIM115

    def _status(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            self._sock.settimeout(timeout)
            try:
                said = self._sock.recv(64)
            except (TimeoutError, BlockingIOError):
                return None
            self.returncode = int(said.decode())
            self._sock.close()
        return self.returncode

    def poll(self) -> int | None:
        return self._status(0)

    def wait(self, timeout: float | None = None) -> int:
        status = self._status(timeout)
        if status is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return status

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Both streams to their end and the exit status (TimeoutExpired past ``timeout``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        read: dict[str, str] = {}
        readers = [threading.Thread(target=lambda n=n, f=f: read.__setitem__(n, f.read()), daemon=True)
                   for n, f in (("out", self.stdout), ("err", self.stderr))]  # fmt: skip
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(None if deadline is None else max(deadline - time.monotonic(), 0))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(deadline - time.monotonic(), 0.1))
        self.stdout.close()
        self.stderr.close()
        return read["out"], read["err"]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def spawn(module: str, argv: list[str], env: dict[str, str], cwd: str | None = None) -> Forked:
    """``python -m MODULE ARGV`` with exactly ``env``, forked by this worker's zygote."""
    return Forked(module, argv, env, cwd)


def run(module: str, argv: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run([python, -m, MODULE, *ARGV], env=env, capture_output=True, text=True, timeout=...)``."""
    proc = spawn(module, argv, env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _server_path() -> str:
    """This worker's zygote's socket, the zygote started at the first call (and ended with the worker)."""
    global _server
    with _lock:
        if _server is None or _server[0].poll() is not None:
            path = os.path.join(tempfile.mkdtemp(prefix="ddp-zygote-"), "socket")
            env = {**os.environ, "OMP_NUM_THREADS": OMP_THREADS}
            proc = subprocess.Popen([sys.executable, "-m", "tests.integration.zygote", path], cwd=ROOT, env=env,
                                    stdin=subprocess.DEVNULL)  # fmt: skip
            deadline = time.monotonic() + 120
            while not os.path.exists(path):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the zygote did not start (exit {proc.poll()})")
                time.sleep(0.05)
            atexit.register(proc.kill)
            _server = (proc, path)
        return _server[1]


# --- the zygote ----------------------------------------------------------------------------------------------


def serve(path: str) -> None:
    """Import the preload, then fork one process per request until the pytest worker that started it is gone."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".tmp")
    listener.listen(64)
    os.rename(path + ".tmp", path)  # (the client waits for the name: it appears once the zygote listens)
    waiting: dict[int, socket.socket] = {}
    while os.getppid() == parent:
        if select.select([listener], [], [], 0.05)[0]:
            conn, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            pid = os.fork()
            if pid == 0:
                listener.close()
                for other in [conn, *waiting.values()]:
                    other.close()
                _child(json.loads(message), fds)
            for fd in fds:
                os.close(fd)
            conn.send(str(pid).encode())
            waiting[pid] = conn
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid)
            with contextlib.suppress(OSError):  # (the client may be gone)
                conn.send(str(os.waitstatus_to_exitcode(status)).encode())
            conn.close()


def _child(request: dict, fds: list[int]) -> None:
    """Become ``python -m MODULE ARGV`` with the request's streams, environment and working directory; exit."""
    import runpy

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    threads = request["env"].get("OMP_NUM_THREADS")
    if threads and threads != OMP_THREADS:
        import torch

        torch.set_num_threads(int(threads))
    unbuffered = bool(request["env"].get("PYTHONUNBUFFERED"))
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), errors="backslashreplace", line_buffering=True)
    sys.argv = [request["module"], *request["argv"]]
    status = 0
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as leaving:
        if leaving.code is None or isinstance(leaving.code, int):
            status = leaving.code or 0
        else:
            print(leaving.code, file=sys.stderr)
            status = 1
    except BaseException:  # as the interpreter does: the traceback on stderr, exit 1
        import traceback

        traceback.print_exc()
        status = 1
    try:
        threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's own end: non-daemon threads
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


if __name__ == "__main__":
    serve(sys.argv[1])
