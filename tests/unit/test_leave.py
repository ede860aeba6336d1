"""``python -m app`` leaves without the interpreter's teardown (app.cli.leave), yet as a normal exit would:
thread pools ended, other threads joined, exit handlers run, output flushed, the status kept."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from app.cli import leave
pool = ThreadPoolExecutor(2)  # its idle worker threads wait for the pool's word to end (torch.compile keeps one)
pool.submit(time.sleep, 0.1).result()
def late():
    time.sleep(0.5)
    print("thread finished", flush=True)
threading.Thread(target=late).start()  # not a daemon: a normal exit waits for it
atexit.register(lambda: sys.stdout.write("exit handler ran, unflushed"))
leave(3)
"""


def test_leave_exits_as_a_normal_exit_would_but_without_the_teardown() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3, done.stderr
    assert done.stdout == "thread finished\nexit handler ran, unflushed", done.stdout


def test_python_m_app_leaves_with_the_commands_status() -> None:
    done = subprocess.run([sys.executable, "-m", "app", "nope"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("error: unknown command 'nope'"), done.stderr
