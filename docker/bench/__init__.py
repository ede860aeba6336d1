"""The benchmarks that make runs (``make bench-faults``, ``bench-straggler``, ``bench-metrics``), the fault job they
train with and its driver.

    PYTHONPATH=docker:. .venv/bin/python -m bench.faults --help       # what make bench-faults runs
    PYTHONPATH=docker:. .venv/bin/python -m bench.straggler --help    # make bench-straggler
    PYTHONPATH=docker:. .venv/bin/python -m bench.metrics --help      # make bench-metrics

from the repository's root: docker/ holds this package, ``bench``; the root holds the app; .venv (make venv) has
torch and the Docker SDK. Tooling of the repository, imported with docker/ on the path as the image builder
(``imagebuild``) and the Slurm mini-cluster (``slurm``) are; not part of the ``app`` package, and not in its wheel.
Modules: faults, straggler, metrics (the benchmarks), fault_job (app train plus fault hooks, run as a ``--script``:
its folder is mounted at /job), drive (starts the fault job on the compose cluster and acts on its containers),
gate_figures (the gate flags its jobs run with, the figures a test sets). The tests use the fault job, its driver
and the gate figures too.
"""
