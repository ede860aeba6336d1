"""The node containers that stand in for machines in a local Ansible run (``make deploy-local``, the Ansible tests).

    python docker/nodes/nodes.py up --prefix ddp --nodes 2         # what make ansible-nodes-up runs

Tooling of the repository, imported with docker/ on the path (``from nodes import nodes``) as the image builder is
(``imagebuild``); not part of the ``app`` package, and not in its wheel.
"""
