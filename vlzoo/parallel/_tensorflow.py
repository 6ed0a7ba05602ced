"""TensorFlow: `tf.distribute` strategies (`MirroredStrategy`, `MultiWorkerMirroredStrategy`, TPUs).

Keras' train step runs once per replica inside the strategy's replica context,
and Keras' optimizer sums the replicas' gradients. Each replica's loss is
therefore divided by the number of replicas, as Keras' own losses are, and the
outputs of the global batch come from the replica context's `all_gather`,
whose gradient sums the replicas' gradients of the gathered rows.
"""

import keras
import tensorflow as tf


def _replica_context():
    """The replica context of a strategy with several replicas, or None."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return None
    return context


def world_size():
    return tf.distribute.get_strategy().num_replicas_in_sync


def check_launch():
    """Nothing to check: a strategy reads `TF_CONFIG` itself."""


def initialize():
    """Nothing to do: build and compile the model inside a `tf.distribute` strategy's `scope()`."""


def gather_batch(outputs):
    """`call`'s outputs of every replica, concatenated on the batch axis in replica order."""
    context = _replica_context()
    if context is None:
        return outputs
    return keras.tree.map_structure(
        lambda x: context.all_gather(x, axis=0) if len(x.shape) else x, outputs)


def scale_loss(loss):
    """The loss divided by the number of replicas, since the optimizer sums their gradients."""
    replicas = world_size()
    return loss if replicas == 1 else loss / replicas


def train_step(model, data, keras_step):
    return keras_step(data)
