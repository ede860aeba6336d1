"""The image build's decisions, in Python (stdlib only: it runs on the host's python3 before any venv).

    PYTHONPATH=docker python3 -m imagebuild image --flavour cpu --base local   # make image-cpu BASE=local
    PYTHONPATH=docker python3 -m imagebuild --help                             # every step and flag

Modules: versions (docker/versions.env, the flags' defaults), host (errors, commands, apt, the
docker CLI), tools (build/tools-venv), engine (dockerd + compose v2), base (upstream or the local
debootstrap base), wheelhouse (the host-filled wheels, in the background), image (the wheels
image, cached by digest, and docker build); __main__ holds the one argument parser.
"""
