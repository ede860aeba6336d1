"""Train a model with DDP: the seed's MNIST workload, resumable, on any launcher.

    python -m app train                                        # one process, digits, MLP
    torchrun --standalone --nproc-per-node 2 -m app train --epochs 20 --out runs/digits
    torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint node0:29500 \\
        --max-restarts 3 -m app train --dataset digits --model mlp --epochs 20 --out runs/ --resume auto
    mpirun -np 4 -H a:2,b:2 -x MASTER_ADDR=a -x MASTER_PORT=29500 python -m app train --out runs/
    srun -N 2 --ntasks-per-node 4 python -m app train --out runs/ --resume auto

Datasets: digits (scikit-learn's 8x8 handwritten digits, shipped with the package: no network),
mnist and cifar10 (torchvision, files in --data-dir; --download fetches them), synthetic (any
--input-shape). Models: mlp (the seed's Linear 784-256-10), cnn (BatchNorm), resnet18 and resnet50 (torchvision).

Rank 0 writes OUT/checkpoints/step-N.pt (atomically; every epoch, every --checkpoint-every steps,
every --checkpoint-every-seconds and at the end), OUT/progress (the last step reached: a resumed
run says how many steps the failure lost), OUT/metrics.jsonl (one record per epoch and event, the
slowest rank every --exchange-every steps), OUT/summary.json and, when
the tensorboard package is installed, TensorBoard scalars in OUT/tensorboard/ (``tensorboard
--logdir OUT --host 127.0.0.1``; ``make tensorboard RUN=OUT``). With
--resume auto a restarted job (torchrun --max-restarts) continues from the latest checkpoint;
without it, a folder that already holds checkpoints is refused rather than overwritten. The exit
status is 0 when training finished with identical parameters on every rank, 2 for bad input.
"""

from app.train.main import add_arguments, run

__all__ = ["add_arguments", "run"]
