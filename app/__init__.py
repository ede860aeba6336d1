"""ddp-cluster: one DDP workload and its tools, run as ``python -m app <command>``."""

__version__ = "0.1.0"
