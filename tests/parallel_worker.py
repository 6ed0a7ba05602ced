"""One process of a multi-process (or multi-device) training step, as `test_parallel.py` starts it.

    torchrun --nproc_per_node=2 tests/parallel_worker.py torch OUT_DIR               (PyTorch, gloo)
    TF_CONFIG=... python tests/parallel_worker.py tf_multiworker OUT_DIR             (2 TensorFlow workers)
    python tests/parallel_worker.py tf_mirrored OUT_DIR                              (2 logical CPUs, 1 process)
    VLZOO_TEST_PROCESS=i VLZOO_TEST_COORDINATOR=127.0.0.1:PORT \\
        python tests/parallel_worker.py jax OUT_DIR                                  (2 JAX processes)

Every process builds each family's tiny model from a seed of its own (`1000 + process index`: the launch
must make the weights equal, as rank 0's broadcast does; JAX's processes share the seed 1000, since JAX
requires every process to give a replicated weight the same value) and fits one step on a global batch of
`GLOBAL_BATCH` pairs (`margins.margin_batch`): torchrun's ranks and the JAX processes each feed their own
rows (process `r`: rows `r * B .. (r + 1) * B - 1`); TensorFlow's strategies split the global batch themselves
(the multi-worker strategy shards it by worker, in the same order), with AdamW. `test_parallel.py` compares
the step with the same step of one process on the whole batch. Process `r` writes `OUT_DIR/rank{r}.npz`: per
family the loss, the gradients (from AdamW's first moment) and the weights after the step.
"""

import json
import os
import sys

LAUNCH = sys.argv[1] if __name__ == "__main__" else None
if LAUNCH == "tf_mirrored":  # two logical CPUs, set before anything else starts TensorFlow
    import tensorflow as tf
    tf.config.set_logical_device_configuration(tf.config.list_physical_devices("CPU")[0],
                                               [tf.config.LogicalDeviceConfiguration()] * 2)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

from vlzoo import parallel  # noqa: E402

from margins import margin_batch, tiny_family_model  # noqa: E402

FAMILIES = ("clip", "siglip", "filip", "sparc", "sparo", "llip", "stair", "flair")
GLOBAL_BATCH = 8
ADAMW = dict(learning_rate=1e-3, weight_decay=0.1)




def build(family, seed):
    """The family's tiny model from `seed`, compiled with AdamW (made here: in a strategy's scope)."""
    keras.utils.set_random_seed(seed)
    model = tiny_family_model(family)
    if family == "stair":
        model.stage_fractions = None  # one step: no stage schedule over the run
    model.compile(optimizer=keras.optimizers.AdamW(**ADAMW))
    return model


def gradients(model):
    """`{path: gradient}` of the step just taken, from AdamW's first moment: after one step it is
    `(1 - beta_1) * gradient` (Keras keeps one moment per trainable variable, in their order)."""
    optimizer = model.optimizer
    return {v.path: np.asarray(keras.ops.convert_to_numpy(m)) / (1.0 - optimizer.beta_1)
            for v, m in zip(optimizer._trainable_variables, optimizer._momentums)}


def fit_one_step(model, batch):
    rows = len(batch["token_ids"])
    return float(model.fit(batch, batch_size=rows, epochs=1, shuffle=False, verbose=0).history["loss"][0])


class Launch:
    """What differs per launch: this process's index and count, the scope models are built in, its rows."""

    def __init__(self, name):
        self.name, self.scope = name, None
        if name == "torch":
            import torch.distributed as dist
            parallel.initialize()
            self.index, self.count, self.own_rows = dist.get_rank(), dist.get_world_size(), True
        elif name in ("tf_mirrored", "tf_multiworker"):
            import tensorflow as tf
            strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if name == "tf_mirrored"
                        else tf.distribute.MultiWorkerMirroredStrategy())
            self.index = json.loads(os.environ.get("TF_CONFIG", '{"task": {"index": 0}}'))["task"]["index"]
            self.count, self.scope, self.own_rows = 1 if name == "tf_mirrored" else 2, strategy.scope, False
        elif name == "jax":
            self.index, self.count, self.own_rows = int(os.environ["VLZOO_TEST_PROCESS"]), 2, True
            keras.distribution.initialize(os.environ["VLZOO_TEST_COORDINATOR"], num_processes=2,
                                          process_id=self.index)
            distribution = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
            distribution.auto_shard_dataset = False  # each process feeds its own rows
            keras.distribution.set_distribution(distribution)
        else:
            raise ValueError(f"unknown launch {name!r}")

    def build(self, family):
        # JAX places a replicated weight from every process's value and checks they are equal: its processes
        # must build the same weights (a preset's, or the same seed); the other launches broadcast worker 0's.
        seed = 1000 + (0 if self.name == "jax" else self.index)
        if self.scope is None:
            return build(family, seed)
        with self.scope():
            return build(family, seed)

    def rows(self, batch):
        if not self.own_rows:
            return batch
        size = GLOBAL_BATCH // self.count
        return {key: value[self.index * size:(self.index + 1) * size] for key, value in batch.items()}


def main(name, out_dir):
    launch = Launch(name)
    record = {}
    for family in FAMILIES:
        print(f"{name} {launch.index}: {family}", file=sys.stderr, flush=True)
        model = launch.build(family)
        record[f"{family}/loss"] = fit_one_step(model, launch.rows(margin_batch(model, GLOBAL_BATCH)))
        for v in model.weights:
            record[f"{family}/after/{v.path}"] = np.asarray(keras.ops.convert_to_numpy(v))
        for path, gradient in gradients(model).items():
            record[f"{family}/gradient/{path}"] = gradient
    np.savez(os.path.join(out_dir, f"rank{launch.index}.npz"), **record)


if __name__ == "__main__":
    main(LAUNCH, sys.argv[2])
