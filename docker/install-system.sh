#!/usr/bin/env bash
# Install the image's system packages (run once inside the Dockerfile's `system` stage).
#
#   install-system.sh PYTHON_VERSION
#
# Works on the three bases of docker/versions.env: CPU_BASE_IMAGE (python:X-slim, Debian),
# LOCAL_BASE_IMAGE (Debian from docker/build-base.sh) and CUDA_BASE_IMAGE (nvidia/cuda, Ubuntu). It
# installs OpenMPI and OpenSSH (mpirun over SSH), and Python PYTHON_VERSION with
# venv when the base lacks it (Ubuntu). Versions are those of the base's release:
# Debian/Ubuntu stable archives keep only the latest security build of each
# package, so an exact apt pin would break the build on the next update.
set -euo pipefail

py=python${1:?usage: install-system.sh PYTHON_VERSION}
packages=(openmpi-bin openssh-client openssh-server)
# ensurepip is what venv needs to put pip into /opt/venv.
if ! "$py" -c 'import venv, ensurepip' 2>/dev/null; then
    packages+=("$py" "$py-venv")
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
apt-get clean
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log \
    /usr/share/doc/* /usr/share/man/* /usr/share/locale/*
# The image's sshd runs as the app user on its own config; the distribution's
# host keys and units are not used.
rm -f /etc/ssh/ssh_host_*

"$py" -c 'import venv, ensurepip' || { echo "error: $py has no venv/ensurepip after install" >&2; exit 1; }
