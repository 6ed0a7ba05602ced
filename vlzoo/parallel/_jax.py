"""JAX: `keras.distribution` traces one program over the global batch, so nothing is gathered by hand."""

import jax
import keras


def world_size():
    """1: under `keras.distribution` the step is one program whose outputs already span every device."""
    return 1


def replica_index():
    return 0


def data_processes():
    """`(processes, index)` when the distribution leaves each process to feed its own rows
    (`auto_shard_dataset = False`); `(1, 0)` otherwise (Keras shards a global pipeline itself)."""
    distribution = keras.distribution.distribution()
    if distribution is None or getattr(distribution, "auto_shard_dataset", True) or jax.process_count() == 1:
        return 1, 0
    return jax.process_count(), jax.process_index()


def check_launch():
    """Nothing to check: `keras.distribution.initialize` reads its own launch variables."""


def initialize():
    """`keras.distribution.initialize()`, reading `KERAS_DISTRIBUTION_*` (or a TPU pod's own variables)."""
    keras.distribution.initialize()


def step_logs(logs):
    return logs


def one_replica_batch(iterator, data_batch):
    return data_batch


def gather_batch(outputs):
    return outputs


def scale_loss(loss):
    return loss


def train_step(model, keras_step, *args, **kwargs):
    return keras_step(*args, **kwargs)
