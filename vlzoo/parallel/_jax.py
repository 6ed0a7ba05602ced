"""JAX: `keras.distribution` traces one program over the global batch, so nothing is gathered by hand."""

import keras


def world_size():
    """1: under `keras.distribution` the step is one program whose outputs already span every device."""
    return 1


def replica_index():
    return 0


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
