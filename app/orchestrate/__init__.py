"""Runs jobs on clusters: from the host, the compose mini-cluster's runner (``app cluster``) and
Ansible deployment (``app deploy``). Each node's own start (``app node``) is app/node/."""
