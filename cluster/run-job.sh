#!/usr/bin/env bash
# Run one job on the compose mini-cluster, stream rank 0's node, bring the results home; or
# show the cluster's logs, or remove it. Every knob is a cluster-spec flag, checked by the app.
#
#   cluster/run-job.sh up   [--results build/results] [--python python3] [-- SPEC FLAGS]
#   cluster/run-job.sh logs [-- SPEC FLAGS]
#   cluster/run-job.sh down [-- SPEC FLAGS]
#
#   cluster/run-job.sh up -- --nodes 3 --nproc-per-node 1 --command 'check'
#   cluster/run-job.sh up -- --script my/train.py --args '--epochs 1'
#   cluster/run-job.sh up -- --launcher mpirun --command check          (mpirun over SSH)
#
# SPEC FLAGS are `python -m app topology`'s (python -m app topology --help): it validates them
# and renders the env file of compose.yaml into build/cluster/<name>.env. torchrun (default):
# the head + NODES-1 workers run `torchrun ... -m app COMMAND` (or your script, unchanged); the
# head holds rank 0 and its output is streamed. --launcher mpirun: the mpi profile's launcher
# runs `mpirun ... python -m app COMMAND` over SSH on NODES workers. `up` exits with the job's
# status; afterwards /results of the cluster volume is copied to --results and the newest
# summary.json is printed. --gpus-per-node > 0 adds compose.gpu.yaml. Containers, logs and
# volumes stay until `down`.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
results=$root/build/results
python=python3
action=${1:-}
shift || true

while (($#)); do
    case "$1" in
        --results) results=$2; shift 2 ;;
        --python) python=$2; shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument '$1' (spec flags go after --); see $0 --help" >&2; exit 2 ;;
    esac
done
case $action in
    up|logs|down) ;;
    *) echo "error: the action must be up, logs or down (got '$action'); see $0 --help" >&2; exit 2 ;;
esac

# The spec, checked and rendered by the app's own code (stdlib only: no venv needed).
mkdir -p "$root/build/cluster"
rendered=$(mktemp "$root/build/cluster/.env.XXXXXX")
trap 'rm -f "$rendered"' EXIT
PYTHONPATH=$root "$python" -m app topology "$@" --format compose --output "$rendered" || exit $?
env_file=$rendered
value() { sed -n "s/^$1='\(.*\)'\$/\1/p" "$env_file"; }
project=$(value COMPOSE_PROJECT_NAME)
env_file=$root/build/cluster/$project.env
mv "$rendered" "$env_file"
trap - EXIT
compose=(docker compose --project-directory "$root" --env-file "$env_file" -f "$root/compose.yaml" -p "$project")
(($(value GPUS_PER_NODE) > 0)) && compose+=(-f "$root/compose.gpu.yaml")

if [[ $action == logs ]]; then
    exec "${compose[@]}" --profile mpi logs --no-color --timestamps
fi
if [[ $action == down ]]; then
    timeout 180 "${compose[@]}" --progress quiet --profile mpi down --volumes --remove-orphans --timeout 10
    label=label=com.docker.compose.project=$project
    left=$(docker ps -aq --filter "$label"; docker network ls -q --filter "$label"; docker volume ls -q --filter "$label")
    [[ -z $left ]] || { echo "error: left behind by $project: $left" >&2; exit 1; }
    exit 0
fi

image=$(value IMAGE)
docker image inspect "$image" >/dev/null 2>&1 || { echo "error: image $image is missing; build it with 'make images'" >&2; exit 2; }
timeout_s=$(value TIME_LIMIT)
if [[ $(value LAUNCHER) == mpirun ]]; then
    main="launcher"
    up=(--profile mpi up --attach launcher --exit-code-from launcher launcher)
    echo "cluster: $project: mpirun over SSH, $(value NODES) node(s): $(value MPI_COMMAND)"
else
    main="head"
    up=(up --attach head --exit-code-from head)
    echo "cluster: $project: torchrun, $(value NODES) node(s): $(value JOB_COMMAND)"
fi

start=$SECONDS
status=0
# --attach: only the rank-0 node's output; --exit-code-from: its status, and stop the rest.
timeout --signal TERM --kill-after 30 "$timeout_s" "${compose[@]}" "${up[@]}" || status=$?
elapsed=$((SECONDS - start))
if ((status == 124 || status == 137)); then
    echo "error: the job ran past its time limit (--time-limit ${timeout_s}s) and was stopped; see 'make cluster-logs', then 'make cluster-down'" >&2
fi

mkdir -p "$results"
if timeout 300 "${compose[@]}" cp "$main:/results/." "$results/" >/dev/null 2>&1; then
    summary=$(find "$results" -name summary.json -newermt "-${elapsed} seconds" -printf '%T@ %p\n' 2>/dev/null | sort -n | tail -n1 | cut -d' ' -f2-)
    if [[ -n $summary ]]; then
        echo "cluster: summary ($summary):"
        cat "$summary"; echo
    fi
    echo "cluster: results in $results (checkpoints, metrics, summaries; the volume ${project}_results keeps them until cluster-down)"
fi
# The job is over: stop what still runs (the mpi profile's sshd workers); keep logs and volumes.
timeout 120 "${compose[@]}" --profile mpi stop --timeout 10 >/dev/null 2>&1 || true
echo "cluster: job exit status $status after ${elapsed}s; logs: make cluster-logs; remove: make cluster-down"
exit "$status"
