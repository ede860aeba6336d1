#!/usr/bin/env bash
# Build the Slurm mini-cluster's image FROM a workload image, once per workload image.
#
#   docker/slurm/build.sh --workload ddp-cluster:cpu --tag ddp-cluster-slurm:bookworm         (make slurm-image)
#
# The image is labelled with the workload image's id and a digest of this folder's build files:
# while both are unchanged the build is skipped (a second `make slurm-image` costs a second);
# after a rebuild of the workload image (new app code) this image follows. Offline: Debian
# packages over plain http.
set -euo pipefail

workload=
tag=
while (($#)); do
    case "$1" in
        --workload) workload=$2; shift 2 ;;
        --tag) tag=$2; shift 2 ;;
        -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument '$1'; see $0 --help" >&2; exit 2 ;;
    esac
done
[[ -n $workload && -n $tag ]] || { echo "error: give --workload IMAGE and --tag IMAGE (make slurm-image does)" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
label=org.ddp-cluster.workload
docker info >/dev/null 2>&1 || { echo "error: no Docker engine answers; run 'make engine' first" >&2; exit 2; }
source_id=$(docker image inspect --format '{{.Id}}' "$workload" 2>/dev/null) \
    || { echo "error: workload image $workload is missing; build it with 'make image-cpu'" >&2; exit 2; }
files=$(cd "$here" && cat Dockerfile slurm-init slurm-daemon | sha256sum | cut -c1-16)
stamp="$source_id+$files"
if [[ $(docker image inspect --format "{{index .Config.Labels \"$label\"}}" "$tag" 2>/dev/null) == "$stamp" ]]; then
    echo "slurm: $tag is up to date with $workload"
    exit 0
fi
previous=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
start=$SECONDS
mkdir -p "$here/../../build/logs"
log=$(cd "$here/../.." && pwd)/build/logs/slurm-image.log
echo "slurm: building $tag from $workload; log: build/logs/slurm-image.log"
if ! timeout 1200 docker build --force-rm --build-arg "WORKLOAD_IMAGE=$workload" --label "$label=$stamp" \
        --tag "$tag" "$here" >"$log" 2>&1; then
    tail -n 15 "$log" >&2
    echo "error: docker build of $tag failed (full log: $log)" >&2
    exit 1
fi
# The image this tag named before, now untagged, would only take space: remove it unless in use.
if [[ -n $previous && $previous != "$(docker image inspect --format '{{.Id}}' "$tag")" ]]; then
    docker rmi "$previous" >/dev/null 2>&1 || true
fi
echo "slurm: built $tag in $((SECONDS - start)) s"
