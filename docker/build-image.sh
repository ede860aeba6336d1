#!/usr/bin/env bash
# Build the workload image of one flavour, offline when no registry answers.
#
#   docker/build-image.sh --flavour cpu  [--base auto|upstream|local] [--tag ddp-cluster:cpu]
#   docker/build-image.sh --flavour cuda [--base ...] [--torch-cuda 'torch==2.13.0']
#
# Steps, overlapped where they can be: the host wheelhouse fills in the background
# (docker/fill-wheelhouse.sh; a no-op when up to date) while the engine is made ready
# (docker/setup-engine.sh) and the base is picked (--base upstream: python:3.11-slim-bookworm
# or nvidia/cuda, pulled if missing; local: ddp-cluster-base:bookworm, built by
# docker/build-base.sh if missing; auto: upstream when present or pullable, else local);
# then the wheelhouse becomes the image <name>-wheels:<flavour> and docker/Dockerfile's
# target <flavour> is built. The cuda flavour on the local base is CI's stand-in: Debian,
# no CUDA libraries, the CPU torch wheel (labelled org.ddp-cluster.cuda-standin=1).
# Every step prints its duration. Full build log: build/logs/image-<flavour>.log.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
flavour=""
tag=""
base=auto
cpu_upstream=python:3.11-slim-bookworm
cuda_upstream=nvidia/cuda:12.6.3-base-ubuntu22.04
local_base=ddp-cluster-base:bookworm
torch_cpu='torch==2.13.0+cpu'
torch_cpu_index=""
torch_cuda='torch==2.13.0'
wheelhouse=$root/build/wheelhouse
python=python3

while (($#)); do
    case "$1" in
        --flavour) flavour=$2; shift 2 ;;
        --tag) tag=$2; shift 2 ;;
        --base) base=$2; shift 2 ;;
        --cpu-upstream) cpu_upstream=$2; shift 2 ;;
        --cuda-upstream) cuda_upstream=$2; shift 2 ;;
        --local-base) local_base=$2; shift 2 ;;
        --torch-cpu) torch_cpu=$2; shift 2 ;;
        --torch-cpu-index) torch_cpu_index=$2; shift 2 ;;
        --torch-cuda) torch_cuda=$2; shift 2 ;;
        --wheelhouse) wheelhouse=$2; shift 2 ;;
        --python) python=$2; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument '$1'; see $0 --help" >&2; exit 2 ;;
    esac
done

die() { echo "error: $*" >&2; exit 1; }
say() { echo "image: $*"; }
case $flavour in cpu|cuda) ;; *) die "--flavour must be cpu or cuda (got '$flavour')" ;; esac
case $base in auto|upstream|local) ;; *) die "BASE must be auto, upstream or local (got '$base')" ;; esac
tag=${tag:-ddp-cluster:$flavour}
begin=$SECONDS

present_or_pulled() {  # IMAGE SECONDS: a registry that does not answer costs at most SECONDS
    docker image inspect "$1" >/dev/null 2>&1 || timeout "$2" docker pull -q "$1" >/dev/null 2>&1
}
local_base_image() {
    docker image inspect "$local_base" >/dev/null 2>&1 || "$root/docker/build-base.sh" --tag "$local_base" >&2
    echo "$local_base"
}
pick_base() {  # prints the base image to build from
    local upstream=$1
    case $base in
        upstream) present_or_pulled "$upstream" 900 || die "cannot pull $upstream (no registry reachable?); build offline with BASE=local"
                  echo "$upstream" ;;
        local) local_base_image ;;
        auto) if present_or_pulled "$upstream" 300; then echo "$upstream"
              else say "$upstream cannot be pulled: using the local base (BASE=local)" >&2; local_base_image; fi ;;
    esac
}

# The wheelhouse (and torch) of the image: the cuda flavour on the local base is the
# stand-in with CPU torch. Unknown before the base only for cuda with BASE=auto.
house_of() {  # BASE_IMAGE: prints the wheelhouse flavour
    if [[ $flavour == cuda && $1 != "$local_base" ]]; then echo cuda; else echo cpu; fi
}
fill_pid=""
fill_wheelhouse() {  # HOUSE: start filling it in the background (own process group)
    local torch=$torch_cpu index=$torch_cpu_index
    [[ $1 == cuda ]] && torch=$torch_cuda index=""
    setsid "$root/docker/fill-wheelhouse.sh" --out "$wheelhouse/$1" --torch "$torch" --python "$python" \
        ${index:+--torch-index "$index"} &
    fill_pid=$!
}
stop_fill() { [[ -z $fill_pid ]] || kill -- "-$fill_pid" 2>/dev/null || true; }
trap stop_fill EXIT

house=""
if [[ $flavour == cpu ]]; then house=cpu
elif [[ $base == local ]]; then house=cpu
elif [[ $base == upstream ]]; then house=cuda
fi
[[ -z $house ]] || fill_wheelhouse "$house"

"$root/docker/setup-engine.sh" --python "$python"
step=$SECONDS
if [[ $flavour == cpu ]]; then base_image=$(pick_base "$cpu_upstream"); else base_image=$(pick_base "$cuda_upstream"); fi
say "base $base_image ready in $((SECONDS - step)) s"
[[ -n $house ]] || { house=$(house_of "$base_image"); fill_wheelhouse "$house"; }
standin=0
if [[ $flavour == cuda && $house == cpu ]]; then
    standin=1
    say "cuda flavour from the local stand-in base with CPU torch: for CI only; build with BASE=upstream for GPU nodes"
fi
step=$SECONDS
wait "$fill_pid" || { fill_pid=""; die "the wheelhouse $wheelhouse/$house could not be filled (see above)"; }
fill_pid=""
((SECONDS - step < 2)) || say "waited $((SECONDS - step)) s for the wheelhouse"

# One wheels image per image name, so that checkouts with other pins do not share it.
dir=$wheelhouse/$house
wheels=${tag%:*}-wheels:$house
digest=$( (cat "$dir/requirements.txt"; cd "$dir" && ls -lR) | sha256sum | cut -c1-16)
if [[ $(docker image inspect --format '{{index .Config.Labels "org.ddp-cluster.wheelhouse"}}' "$wheels" 2>/dev/null) != "$digest" ]]; then
    step=$SECONDS
    docker build -q --label "org.ddp-cluster.wheelhouse=$digest" -f "$root/docker/wheelhouse.Dockerfile" -t "$wheels" "$dir" >/dev/null 2>&1 \
        || die "could not build $wheels from $dir"
    say "wrapped $dir into $wheels in $((SECONDS - step)) s"
fi

mkdir -p "$root/build/logs"
log=$root/build/logs/image-$flavour.log
version=$(git -C "$root" describe --tags --always --dirty 2>/dev/null || echo dev)
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
say "building $tag (target $flavour) from $base_image; log: ${log#"$root"/}"
start=$SECONDS
previous=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
# --force-rm: a failed step leaves no stopped container behind.
if ! docker build --force-rm -f "$root/docker/Dockerfile" --target "$flavour" -t "$tag" \
        --build-arg BASE_IMAGE="$base_image" --build-arg WHEELS_IMAGE="$wheels" \
        --build-arg CUDA_STANDIN="$standin" \
        --build-arg VERSION="$version" --build-arg REVISION="$revision" \
        "$root" >"$log" 2>&1; then
    tail -n 15 "$log" >&2
    die "docker build of $tag failed (full log: $log)"
fi
# The image this tag named before, now untagged, would only take space: remove it unless in use.
if [[ -n $previous && $previous != "$(docker image inspect --format '{{.Id}}' "$tag")" ]]; then
    docker rmi "$previous" >/dev/null 2>&1 || true
fi
size=$(docker image inspect --format '{{.Size}}' "$tag" | awk '{printf "%.2f GB", $1/1e9}')
say "built $tag: $size in $((SECONDS - start)) s ($((SECONDS - begin)) s with the steps before)"
