#!/bin/bash
# lab: 4 node(s) x 8 rank(s), torchrun style. Rendered from the
# cluster spec by `python -m app topology --format sbatch`; submit it with `sbatch FILE`.
#SBATCH --job-name=lab
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=48
#SBATCH --gpus-per-node=8
#SBATCH --time=91
#SBATCH --output=%x-%j.out
#SBATCH --partition=gpu
#SBATCH --account=ml
#SBATCH --exclusive
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail
export OMP_NUM_THREADS=6
export TORCH_FR_BUFFER_SIZE=2000
export TORCH_NCCL_DUMP_ON_TIMEOUT=1
export DDP_CLUSTER_EVENTS_FILE="/tmp/lab-$SLURM_JOB_ID.events.jsonl"
mapfile -t nodes < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
head="${nodes[0]}"
port=$((20000 + SLURM_JOB_ID % 10000))
echo "slurm: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST: node agents, rendezvous $head:$port"
exec srun --ntasks-per-node=1 --kill-on-bad-exit=1 \
    /shared/venv/bin/python -m app node --serve-metrics --records="/tmp/lab-$SLURM_JOB_ID.gate" --retry-every=10 -- \
    --nnodes=4 --nproc-per-node=8 --max-restarts=2 \
    --rdzv-backend=c10d --rdzv-endpoint="$head:$port" --rdzv-id="$SLURM_JOB_ID" --rdzv-conf=join_timeout=120,keep_alive_interval=1,keep_alive_max_attempt=10 \
    -m app train --dataset mnist --out /shared/runs/lab --resume auto
