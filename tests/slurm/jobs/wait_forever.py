"""A user's torchrun script that never ends on its own: each rank says it started, then waits.
The cancel test runs it (make slurm-job SCRIPT=...) and scancels it."""

import os
import time

print(f"waiting: rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}", flush=True)
time.sleep(3600)
