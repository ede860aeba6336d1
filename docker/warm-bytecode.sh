#!/usr/bin/env bash
# Write the bytecode of what the workload imports (the Dockerfile's `bytecode` stage).
#
#   warm-bytecode.sh STAGING
#
# The venv is installed without bytecode (.pyc files for every module would be a sixth
# of the image), and the image sets PYTHONDONTWRITEBYTECODE, so without this every
# process would compile torch anew (seconds per rank). Running the workload once here
# with writing allowed leaves .pyc files for exactly the modules it imports; they are
# gathered under STAGING with their paths, which the runtime stage copies onto its
# identical files. One process first (a training on digits: it compiles nearly all),
# then what only runs in DDP (torchrun, 2 ranks), the health check, and the report
# libraries (TensorBoard's SummaryWriter, matplotlib's Agg, tqdm).
set -euo pipefail

staging=${1:?usage: warm-bytecode.sh STAGING}
marker=$(mktemp)
work=$(mktemp -d)
unset PYTHONDONTWRITEBYTECODE
cd "$work"
python -m app train --dataset digits --epochs 1 --out "$work/one"
torchrun --standalone --nproc-per-node 2 -m app train --dataset digits --epochs 1 --out "$work/ddp"
python -m app check --backend gloo
python -c 'import matplotlib; matplotlib.use("Agg"); import matplotlib.pyplot, torch.utils.tensorboard, tqdm'
cd / && rm -rf "$work"

mkdir -p "$staging"
find / -xdev -path "$staging" -prune -o -name '*.pyc' -newer "$marker" -print0 \
    | tar --null --files-from - -cf - | tar -C "$staging" -xf -
rm -f "$marker"
echo "bytecode: $(find "$staging" -name '*.pyc' | wc -l) modules, $(du -sm "$staging" | cut -f1) MB"
