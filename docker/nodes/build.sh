#!/usr/bin/env bash
# Build the node-container image: a bare Debian bookworm that stands in for a GPU machine.
#
#   docker/nodes/build.sh [TAG]        (default TAG: ddp-cluster-node:bookworm)
#
# Offline: FROM the project's debootstrap base (LOCAL_BASE_IMAGE of docker/versions.env, or
# NODE_BASE_IMAGE; built here when missing, by the image builder) plus Debian packages over plain
# http; no image registry is needed.
set -euo pipefail

TAG="${1:-ddp-cluster-node:bookworm}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
# shellcheck source=/dev/null  # docker/versions.env: KEY=VALUE lines
. "$REPO/docker/versions.env"
BASE="${NODE_BASE_IMAGE:-$LOCAL_BASE_IMAGE}"

docker info >/dev/null 2>&1 || { echo "error: no Docker engine answers; run 'make engine' first" >&2; exit 2; }
docker image inspect "$BASE" >/dev/null 2>&1 \
    || PYTHONPATH="$REPO/docker" "${PYTHON:-python3}" -m imagebuild base --local-base "$BASE"
timeout 900 docker build --quiet --build-arg "BASE_IMAGE=$BASE" --tag "$TAG" "$HERE" >/dev/null
echo "built $TAG"
