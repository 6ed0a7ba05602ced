"""One process of a multi-process training step, as `test_parallel.py` starts it; writes what it computed.

    torchrun --nproc_per_node=2 tests/parallel_worker.py OUT_DIR            (PyTorch, gloo)

Every process builds each family's tiny model from a seed of its own (`1000 + rank`: the launch must
make the weights equal, as DistributedDataParallel's broadcast from rank 0 does), takes its rows of the
global batch (`margins.margin_batch(model, GLOBAL_BATCH)`, rank `r` rows `r * B .. (r + 1) * B - 1`)
and runs two one-step `train_on_batch` calls from the same start: SGD with learning rate 1 (the update
is minus the gradient) and AdamW. The test compares both with the same steps of one process on the
whole global batch. Process `r` writes `OUT_DIR/rank{r}.npz`: per family the two losses, the weights
before the steps (after the broadcast), the gradients and the weights after the AdamW step.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from vlzoo import parallel  # noqa: E402

from margins import margin_batch, tiny_family_model  # noqa: E402

FAMILIES = ("clip", "siglip", "filip", "sparc", "sparo", "llip", "stair", "flair")
GLOBAL_BATCH = 8
ADAMW = dict(learning_rate=1e-3, weight_decay=0.1)


def rank_and_size():
    if keras.backend.backend() == "torch":
        import torch.distributed as dist
        return dist.get_rank(), dist.get_world_size()
    raise NotImplementedError(keras.backend.backend())


def local_rows(batch, rank, size):
    rows = GLOBAL_BATCH // size
    return {key: value[rank * rows:(rank + 1) * rows] for key, value in batch.items()}


def step(family, optimizer, rank, size):
    keras.utils.set_random_seed(1000 + rank)
    model = tiny_family_model(family)
    batch = local_rows(margin_batch(model, GLOBAL_BATCH), rank, size)
    model.compile(optimizer=optimizer)
    loss = float(model.train_on_batch(batch, return_dict=True)["loss"])
    return model, loss


def main(out_dir):
    parallel.initialize()
    rank, size = rank_and_size()
    record = {}
    for family in FAMILIES:
        print(f"rank {rank}: {family}", file=sys.stderr, flush=True)
        model, loss = step(family, keras.optimizers.SGD(1.0), rank, size)
        # The broadcast happened before the update: weights before = weights after + gradient.
        after = [keras.ops.convert_to_numpy(v) for v in model.trainable_weights]
        model_adamw, loss_adamw = step(family, keras.optimizers.AdamW(**ADAMW), rank, size)
        record[f"{family}/loss_sgd"] = loss
        record[f"{family}/loss_adamw"] = loss_adamw
        for i, (v, a) in enumerate(zip(model.trainable_weights, after)):
            record[f"{family}/sgd_after/{v.path}"] = a
        for v in model_adamw.weights:
            record[f"{family}/adamw_after/{v.path}"] = keras.ops.convert_to_numpy(v)
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **record)


if __name__ == "__main__":
    main(sys.argv[1])
