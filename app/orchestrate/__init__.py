"""Runs jobs on clusters: from the host, the compose mini-cluster's runner (``app cluster``) and
Ansible deployment (``app deploy``); on each node, its start (``app node``: the gate, then the agent)."""
