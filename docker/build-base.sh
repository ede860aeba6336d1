#!/usr/bin/env bash
# The local base's root file system: debootstrap, the trims of Debian's slim images, docker import.
#
#   docker/build-base.sh TAG SUITE [MIRROR]
#
# Run by the image builder (docker/imagebuild/base.py: make base, or BASE=local), which checks
# first what this needs: root, a Docker engine and debootstrap. MIRROR: debootstrap's default
# Debian mirror (plain http) when absent.
set -euo pipefail

tag=${1:?usage: build-base.sh TAG SUITE [MIRROR]}
suite=${2:?usage: build-base.sh TAG SUITE [MIRROR]}
mirror=${3:-}

rootfs=$(mktemp -d /tmp/ddp-base.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT

# minbase: essential packages + apt only; python3-venv brings ensurepip (pip in venvs).
timeout 900 debootstrap --variant=minbase --include=python3,python3-venv \
    "$suite" "$rootfs" ${mirror:+"$mirror"} >"$rootfs.log" 2>&1 \
    || { tail -n 20 "$rootfs.log" >&2; echo "error: debootstrap failed (full log: $rootfs.log)" >&2; exit 1; }
rm -f "$rootfs.log"

# debootstrap lists only '<mirror> <suite> main'; add the updates and security
# suites from the same mirror so apt-get upgrade in images gets fixes.
main_line=$(grep -m1 '^deb ' "$rootfs/etc/apt/sources.list")
{
    echo "$main_line"
    echo "${main_line/ $suite main/ $suite-updates main}"
    echo "${main_line/\/debian $suite main/\/debian-security $suite-security main}"
} >"$rootfs/etc/apt/sources.list"

# Same trimming as Debian's official slim images: no caches, host identity, docs or
# translations (/usr/share/locale: 32 MB), and dpkg keeps later packages from adding them.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
       "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/share/locale/* \
       "$rootfs"/var/log/*.log "$rootfs"/etc/hostname "$rootfs"/tmp/*
: >"$rootfs/etc/resolv.conf"
# Let apt clean up after itself in image layers, as the Debian images do.
echo 'APT::Keep-Downloaded-Packages "false";' >"$rootfs/etc/apt/apt.conf.d/docker-clean"
printf 'path-exclude %s\n' '/usr/share/doc/*' '/usr/share/man/*' '/usr/share/info/*' '/usr/share/locale/*' \
    >"$rootfs/etc/dpkg/dpkg.cfg.d/docker-slim"

created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
tar -C "$rootfs" --numeric-owner -c . | docker import \
    --change 'CMD ["/bin/bash"]' \
    --change 'ENV LANG=C.UTF-8' \
    --change "LABEL org.opencontainers.image.title=ddp-cluster-base org.opencontainers.image.created=$created org.opencontainers.image.description=Debian-$suite-minbase+python3-(debootstrap)" \
    - "$tag" >/dev/null
