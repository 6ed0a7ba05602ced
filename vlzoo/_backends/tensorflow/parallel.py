"""TensorFlow: `tf.distribute` strategies (`MirroredStrategy`, `MultiWorkerMirroredStrategy`, TPUs).

Keras' train step runs once per replica inside the strategy's replica context,
and Keras' optimizer sums the replicas' gradients. Each replica's loss is
therefore divided by the number of replicas, as Keras' own losses are, and the
outputs of the global batch come from the replica context's `all_gather`,
whose gradient sums the replicas' gradients of the gathered rows.
"""

import contextlib
import os

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


def replica_index():
    """This replica's index in the strategy (a scalar tensor in a replica context), 0 elsewhere."""
    context = _replica_context()
    return 0 if context is None else context.replica_id_in_sync_group


def data_processes():
    """`(1, 0)`: a `tf.distribute` strategy shards a pipeline by worker itself."""
    return 1, 0


def distribute_pipelines(make, global_batch):
    """Under a strategy with several replicas, `(distributed dataset, this worker's pipeline)`: `make` builds
    each worker's pipeline of per-replica batches (`distribute_datasets_from_function`), repeated without end,
    so that the batch size stays static in the traced step (gradient caching needs it; Keras' own
    distribution of a dataset, and a distributed dataset that can run out, leave it unknown). None
    otherwise."""
    strategy = _STRATEGY[0] if _STRATEGY else tf.distribute.get_strategy()
    if strategy.num_replicas_in_sync == 1:
        return None
    made = []

    def worker_pipeline(context):
        made.append(make(context.get_per_replica_batch_size(global_batch), context.num_input_pipelines,
                         context.input_pipeline_id))
        return made[-1].repeat()

    return strategy.distribute_datasets_from_function(worker_pipeline), made[0]


def check_launch():
    """Nothing to check: a strategy reads `TF_CONFIG` itself."""


_STRATEGY = []  # the strategy `initialize` made, entered by `scope`


def initialize():
    """The strategy of the launch, for a training script or `vlzoo train`: `MultiWorkerMirroredStrategy`
    when `TF_CONFIG` names a cluster, `MirroredStrategy` over several GPUs, none otherwise. Build and
    compile the model in `scope()`."""
    if _STRATEGY:
        return
    if os.environ.get("TF_CONFIG"):
        _STRATEGY.append(tf.distribute.MultiWorkerMirroredStrategy())
    elif len(tf.config.list_logical_devices("GPU")) > 1:
        _STRATEGY.append(tf.distribute.MirroredStrategy())


def scope():
    """The scope of `initialize`'s strategy (or of none)."""
    return _STRATEGY[0].scope() if _STRATEGY else contextlib.nullcontext()


def is_writer():
    """True in the chief (worker 0 of a `TF_CONFIG` cluster) or when there is one worker: the process
    that writes presets and checkpoints."""
    resolver = _cluster_resolver()
    return resolver is None or not resolver.task_type or resolver.task_id == 0


def saves_together():
    """True for a worker of a `TF_CONFIG` cluster: TensorFlow's multi-worker saving is collective (every
    worker saves; the chief's files are the ones kept)."""
    resolver = _cluster_resolver()
    return resolver is not None and bool(resolver.task_type)


def _cluster_resolver():
    """The cluster resolver of `initialize`'s (or the current) strategy; None without one."""
    return getattr(_STRATEGY[0] if _STRATEGY else tf.distribute.get_strategy(), "cluster_resolver", None)


def gather_batch(outputs):
    """`call`'s outputs of every replica, concatenated on the batch axis in replica order."""
    context = _replica_context()
    if context is None:
        return outputs
    return keras.tree.map_structure(lambda x: _all_gather(context, x) if len(x.shape) else x, outputs)


def _all_gather(context, x):
    """Every replica's `x` on axis 0, with `x`'s static shape (booleans as 0/1: the collective has no boolean
    kernel); differentiable, the gradient of each replica's rows summed over the replicas."""
    gathered = context.all_gather(tf.cast(x, tf.int32) if x.dtype == tf.bool else x, axis=0)
    rows = None if x.shape[0] is None else x.shape[0] * context.num_replicas_in_sync
    gathered = tf.ensure_shape(gathered, [rows] + list(x.shape[1:]))
    return tf.cast(gathered, tf.bool) if x.dtype == tf.bool else gathered


def scale_loss(loss):
    """The loss divided by the number of replicas, since the optimizer sums their gradients."""
    replicas = world_size()
    return loss if replicas == 1 else loss / replicas


def one_replica_batch(model, iterator, data_batch):
    """`(iterator, data_batch)` for Keras' symbolic build of `model`: under a strategy with several replicas,
    `(None, the first replica's part of the iterator's next batch)`, which Keras reads the same way (one
    batch off the iterator); the arguments unchanged otherwise."""
    if iterator is None or model.distribute_strategy.num_replicas_in_sync == 1:
        return iterator, data_batch
    for _, _, batches in iterator:
        return None, keras.tree.map_structure(
            lambda x: x.values[0] if isinstance(x, tf.distribute.DistributedValues) else x, next(batches))
    return iterator, data_batch


def step_logs(logs):
    """A step's logs as Keras' TensorFlow trainer can reduce them: with several workers (MultiWorkerMirrored-
    Strategy), Keras 3.15 averages each log over its axis 0 and the replicas, so scalars become `(1,)`."""
    strategy = tf.distribute.get_strategy()
    if not tf.distribute.has_strategy() or strategy.num_replicas_in_sync == len(strategy.extended.worker_devices):
        return logs  # one worker: Keras stacks the local replicas' scalars
    return keras.tree.map_structure(lambda x: tf.reshape(x, (1,)) if len(x.shape) == 0 else x, logs)


def train_step(model, keras_step, data):
    return step_logs(keras_step(data))
