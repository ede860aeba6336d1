#!/usr/bin/env bash
# Run one job on the compose mini-cluster, stream rank 0's node, bring the results home.
#
#   cluster/run-job.sh [--nodes 2] [--nproc-per-node 2] [--project ddp-cluster]
#                         [--job 'train --dataset digits' | --script path/to/train.py [--args '...']]
#                         [--mpi] [--gpu] [--results build/results] [--timeout 1200] [--image ddp-cluster:cpu]
#
# torchrun (default): compose.yaml's head + NODES-1 workers run `torchrun ... -m app JOB`
# (or your SCRIPT, unchanged); the head container holds rank 0 and its output is
# streamed. --mpi: the mpi profile's launcher runs `mpirun ... python -m app JOB`
# (or python SCRIPT) over SSH on NODES workers. Exits with the job's status;
# afterwards /results of the cluster volume is copied to RESULTS and the newest
# summary.json is printed. --gpu adds compose.gpu.yaml (NVIDIA GPUs in every node; use
# the cuda image). The cluster's containers, logs and volumes stay until `make cluster-down`.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
nodes=2
nproc=2
port=29500
project=ddp-cluster
job=""
script=""
args=""
mpi=0
gpu=0
results=$root/build/results
timeout_s=1200
image=ddp-cluster:cpu

while (($#)); do
    case "$1" in
        --nodes) nodes=$2; shift 2 ;;
        --nproc-per-node) nproc=$2; shift 2 ;;
        --master-port) port=$2; shift 2 ;;
        --project) project=$2; shift 2 ;;
        --job) job=$2; shift 2 ;;
        --script) script=$2; shift 2 ;;
        --args) args=$2; shift 2 ;;
        --mpi) mpi=1; shift ;;
        --gpu) gpu=1; shift ;;
        --results) results=$2; shift 2 ;;
        --timeout) timeout_s=$2; shift 2 ;;
        --image) image=$2; shift 2 ;;
        -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument '$1'; see $0 --help" >&2; exit 2 ;;
    esac
done

die() { echo "error: $*" >&2; exit 2; }
positive() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 must be a whole number >= 1 (got '$2'); e.g. make cluster-up NODES=2 NPROC_PER_NODE=2"; }
positive NODES "$nodes"
positive NPROC_PER_NODE "$nproc"
positive CLUSTER_TIMEOUT "$timeout_s"
if ! [[ $port =~ ^[0-9]+$ ]] || ((port < 1024 || port > 65535)); then die "MASTER_PORT must be 1024-65535 (got '$port')"; fi
((nodes <= 16)) || die "NODES=$nodes: the mini-cluster is for one machine; use at most 16 (each node is a container)"
[[ $project =~ ^[a-z0-9][a-z0-9_-]*$ ]] || die "CLUSTER='$project' is not a compose project name: lowercase letters, digits, - and _"
[[ -z $job || -z $script ]] || die "give JOB or SCRIPT, not both"

# The command after the launcher: a user's script (its folder is mounted at /job) or an app command.
if [[ -n $script ]]; then
    [[ -f $script ]] || die "SCRIPT=$script: no such file"
    [[ -r $script && $(stat -c %A "$script") == ???????r* ]] \
        || die "SCRIPT=$script must be world-readable: the containers run as an unprivileged user (chmod o+r)"
    script_dir=$(cd "$(dirname "$script")" && pwd)
    command="/job/$(basename "$script") $args"
    [[ $mpi == 1 ]] && command="python $command"
else
    script_dir=$root/cluster/jobs
    command="-m app ${job:-train --dataset digits --out /results/digits --resume auto}"
    [[ $mpi == 1 ]] && command="python $command"
fi

docker image inspect "$image" >/dev/null 2>&1 || die "image $image is missing; build it with 'make images'"

export NODES=$nodes WORKERS=$((nodes - 1)) NPROC_PER_NODE=$nproc MASTER_PORT=$port IMAGE=$image SCRIPT_DIR=$script_dir
compose=(docker compose --project-directory "$root" -f "$root/compose.yaml" -p "$project")
[[ $gpu == 1 ]] && compose+=(-f "$root/compose.gpu.yaml")
if [[ $mpi == 1 ]]; then
    export MPI_COMMAND=$command
    main="launcher"
    up=(--profile mpi up --attach launcher --exit-code-from launcher launcher)
    echo "cluster: $project: mpirun over SSH, $nodes node(s) x $nproc process(es): $command"
else
    export JOB_COMMAND=$command
    main="head"
    up=(up --attach head --exit-code-from head)
    echo "cluster: $project: torchrun, $nodes node(s) x $nproc process(es): $command"
fi

start=$SECONDS
status=0
# --attach: only the rank-0 node's output; --exit-code-from: its status, and stop the rest.
timeout --signal TERM --kill-after 30 "$timeout_s" "${compose[@]}" "${up[@]}" || status=$?
elapsed=$((SECONDS - start))
if ((status == 124 || status == 137)); then
    echo "error: the job ran past CLUSTER_TIMEOUT=${timeout_s}s and was stopped; see 'make cluster-logs', then 'make cluster-down'" >&2
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
