#!/usr/bin/env bash
# Build the node-container image: a bare Debian bookworm that stands in for a GPU machine.
#
#   tests/ansible/node/build.sh [TAG]        (default TAG: ddp-cluster-node:bookworm)
#
# Made offline from Debian's own packages (debootstrap + docker import), because no image
# registry is reachable. It holds only what a fresh cloud machine has: python3 (+ apt bindings)
# for Ansible, iproute2 and procps. The Ansible roles install everything else, Docker included.
set -euo pipefail

TAG="${1:-ddp-cluster-node:bookworm}"
SUITE="${NODE_SUITE:-bookworm}"
MIRROR="${NODE_MIRROR:-http://deb.debian.org/debian}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

command -v debootstrap >/dev/null || { echo "error: debootstrap not found; install it with: apt-get install -y debootstrap" >&2; exit 2; }
command -v docker >/dev/null || { echo "error: docker CLI not found; start the engine first (make engine)" >&2; exit 2; }

ROOT="$(mktemp -d /tmp/ddp-node-root.XXXXXX)"
trap 'rm -rf "$ROOT"' EXIT

timeout 900 debootstrap --variant=minbase \
    --include=python3,python3-apt,iproute2,procps,ca-certificates \
    "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 || { tail -20 "$ROOT.log" >&2; rm -f "$ROOT.log"; exit 1; }
rm -f "$ROOT.log"

# A machine, not a container image: keep docs and apt lists out, let apt clean itself.
chroot "$ROOT" apt-get clean
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* "$ROOT"/usr/share/man/*
# No package lists: make them look stale so the first apt run refreshes them.
touch -d 2000-01-01 "$ROOT"/var/lib/apt/lists
install -m 0755 "$HERE/node-init" "$ROOT/usr/local/sbin/node-init"

tar -C "$ROOT" --numeric-owner -c . | docker import \
    --change 'CMD ["/usr/local/sbin/node-init"]' \
    --change 'LABEL org.opencontainers.image.title=ddp-cluster-node org.opencontainers.image.description="Debian bookworm stand-in for a GPU machine (Ansible tests)"' \
    - "$TAG" >/dev/null
echo "built $TAG"
