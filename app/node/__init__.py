"""The node's own code, in every container of every engine: ``python -m app node`` (``command``: the entry
the image's ``ddp-node`` execs, the health gate first) and torchrun's agent that forks each rank from one
interpreter (``agent``)."""
