#!/bin/bash
# lab: 2 node(s) x 4 rank(s), srun style. Rendered from the
# cluster spec by `python -m app topology --format sbatch`; submit it with `sbatch FILE`.
#SBATCH --job-name=lab
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=1
#SBATCH --time=20
#SBATCH --output=logs/%x-%j.out
#SBATCH --error=logs/%x-%j.err
#SBATCH --no-requeue
set -euo pipefail
export OMP_NUM_THREADS=1
export TORCH_FR_BUFFER_SIZE=2000
export TORCH_NCCL_DUMP_ON_TIMEOUT=1
export GLOO_SOCKET_IFNAME=ib0
export NCCL_SOCKET_IFNAME=ib0
export MASTER_PORT=29400
echo "slurm: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST: one task per rank"
exec srun --kill-on-bad-exit=1 --mpi=pmi2 \
    python3 -m app check --json '/shared/runs/lab check.json'
