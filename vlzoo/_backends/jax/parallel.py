"""JAX: `keras.distribution` traces one program over the global batch, so nothing is gathered by hand."""

import contextlib
import os

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


def distribute_pipelines(make, global_batch):
    """None: each process feeds its own pipeline (`data_processes`)."""
    return None


def check_launch():
    """Nothing to check: `keras.distribution.initialize` reads its own launch variables."""


# The variables `keras.distribution.initialize()` reads to join several processes.
_LAUNCH_VARIABLES = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES")


def initialize():
    """Data parallelism over every device of the launch, for a training script or `vlzoo train`.

    Joins the other processes first when the `KERAS_DISTRIBUTION_*` variables name them
    (`keras.distribution.initialize()`), then, with several devices in all and no distribution
    set yet, sets `keras.distribution.DataParallel` with `auto_shard_dataset = False`: each
    process feeds its own rows (`vlzoo.data` pipelines split themselves by process).
    """
    if any(os.environ.get(name) for name in _LAUNCH_VARIABLES) and not jax.distributed.is_initialized():
        keras.distribution.initialize()
    if keras.distribution.distribution() is None and jax.device_count() > 1:
        distribution = keras.distribution.DataParallel(devices=keras.distribution.list_devices())
        distribution.auto_shard_dataset = False
        keras.distribution.set_distribution(distribution)


def scope():
    """Nothing to enter: the distribution is global."""
    return contextlib.nullcontext()


def is_writer():
    """True in process 0: the process that writes presets and checkpoints."""
    return jax.process_index() == 0


def saves_together():
    """True with several processes: the weights are arrays spanning them, and reading one for a file is a
    collective that every process joins."""
    return jax.process_count() > 1


def step_logs(logs):
    return logs


def one_replica_batch(model, iterator, data_batch):
    return iterator, data_batch


def gather_batch(outputs):
    return outputs


def scale_loss(loss):
    return loss


def train_step(model, keras_step, *args, **kwargs):
    return keras_step(*args, **kwargs)
