"""The Slurm mini-cluster (``make slurm-*``): its image, compose file, daemons' scripts and driver.

    PYTHONPATH=docker:. python3 -m slurm.minicluster --help     # what make slurm-* runs

Tooling of the repository, imported with docker/ on the path as the image builder is (``imagebuild``); not part of
the ``app`` package, and not in its wheel. Modules: slurmconf (the spec's slurm.conf, node names, compose's
environment), minicluster (the driver). README.md says how it is built.
"""
