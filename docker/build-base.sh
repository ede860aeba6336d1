#!/usr/bin/env bash
# Build the offline base image from Debian's own packages: debootstrap + docker import.
#
#   docker/build-base.sh [--tag ddp-cluster-base:bookworm] [--suite bookworm] [--mirror URL]
#
# The result stands in for python:3.11-slim-bookworm: Debian bookworm (minbase)
# with python3 (3.11) and venv, apt reading the mirror over plain http. Where no
# registry is reachable it is also the stand-in base of the CUDA flavour (no CUDA
# libraries: CI builds that flavour from it with a CPU torch). Needs root
# (debootstrap); 1-3 minutes. Installs debootstrap on Debian-family systems.
set -euo pipefail

tag=ddp-cluster-base:bookworm
suite=bookworm
mirror=""           # empty: debootstrap's default Debian mirror (plain http)

while (($#)); do
    case "$1" in
        --tag) tag=$2; shift 2 ;;
        --suite) suite=$2; shift 2 ;;
        --mirror) mirror=$2; shift 2 ;;
        -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument '$1'; see $0 --help" >&2; exit 2 ;;
    esac
done

die() { echo "error: $*" >&2; exit 1; }

start=$SECONDS
[[ $(id -u) -eq 0 ]] || die "debootstrap needs root; rerun as root (sudo $0 ...) or build with BASE=upstream"
docker info >/dev/null 2>&1 || die "no Docker engine answers; run 'make engine' first"
if ! command -v debootstrap >/dev/null; then
    grep -Eqs '^(ID|ID_LIKE)=.*(debian|ubuntu)' /etc/os-release \
        || die "debootstrap is missing and this is not a Debian-family system; build with BASE=upstream"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi

rootfs=$(mktemp -d /tmp/ddp-base.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT

echo "base: debootstrap $suite into $rootfs"
# minbase: essential packages + apt only; python3-venv brings ensurepip (pip in venvs).
timeout 900 debootstrap --variant=minbase --include=python3,python3-venv \
    "$suite" "$rootfs" ${mirror:+"$mirror"} >"$rootfs.log" 2>&1 \
    || { tail -n 20 "$rootfs.log" >&2; die "debootstrap failed (full log: $rootfs.log)"; }
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
echo "base: imported $tag ($(docker image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}')) in $((SECONDS - start)) s"
