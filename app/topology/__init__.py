"""The cluster spec and its renderings (hostfile, env file, torchrun/mpirun arguments, compose,
Kubernetes, Slurm). No torch import anywhere here: ``python -m app topology`` starts without it."""
