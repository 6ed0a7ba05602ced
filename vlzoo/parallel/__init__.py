"""One training step over several processes or devices: the global batch's loss on every backend.

The contrastive losses compare every image with every caption of the batch, so
a step that spans several devices must see the *global* batch: each device
encodes its own pairs, then the outputs of every device are gathered (with
their gradients) before the family's loss. This package is the same on every
backend; what differs is the running backend's `parallel` module
(`vlzoo._backends.{jax,tensorflow,torch}.parallel`), whose functions it exports.

What `ContrastiveModel`'s step calls (its training side, `Trainer`, is `vlzoo.parallel.trainer`):

- `world_size()`: how many replicas one step spans (1 when training alone);
  `replica_index()`: this replica's place among them.
- `gather_batch(outputs)`: `call`'s outputs of every replica, concatenated on
  the batch axis in replica order (the local rows of replica `r` are rows
  `r * B .. (r + 1) * B - 1`); scalars (the logit scale and bias) are left as
  they are. Differentiable: the gradient of each replica's rows comes back to it.
- `scale_loss(loss)`: the loss as the backend's gradient aggregation expects it.
- `train_step(model, keras_step, *args)`: the step itself; `step_logs(logs)`:
  a step's logs as Keras' TensorFlow trainer reduces them; `one_replica_batch`:
  the batch that trainer builds a distributed model from.
- `check_launch()`: a clear error for processes launched together that did not
  join each other.

What a training script (and `vlzoo train`) calls:

- `initialize()`: join the launch's other processes (torchrun's process group,
  `KERAS_DISTRIBUTION_*`, `TF_CONFIG`) and set the backend's data parallelism;
  `scope()`: where to build and compile the model; `is_writer()`: whether this
  process writes presets and checkpoints (one process does); `write_once(save,
  path)`: a save that one process writes, joined by the others where saving is
  collective (`saves_together()`: JAX processes, TensorFlow workers).
- `data_processes()`: how many processes split a `vlzoo.data` pipeline, and
  which one this is; `feed(make, global_batch)`: the training data of this
  process, from a function that builds one pipeline.

Per backend:

- JAX: `keras.distribution` compiles one program over the global batch, so
  the outputs already are the global batch's (`DataParallel`, `ModelParallel`,
  several processes after `keras.distribution.initialize`); nothing to do.
- PyTorch: under `torch.distributed` (e.g. `torchrun`), the step runs the model
  through `torch.nn.parallel.DistributedDataParallel` (weights broadcast from
  rank 0, gradients averaged by its bucketed all-reduce during the backward
  pass), and `gather_batch` is torch's differentiable all-gather.
- TensorFlow: inside a `tf.distribute` strategy's replica context,
  `gather_batch` is the replica context's `all_gather`, and Keras' optimizer
  sums the replicas' gradients.

Why every replica may compute the global loss `L` (or its share of the rows,
`ContrastiveModel.contrastive_loss` with `rows`): with the gather's gradient summed over the
replicas and the gradients averaged (PyTorch) or each replica's loss divided by
the replica count and summed (TensorFlow), the update is the one of a single
device holding the whole batch; see docs/distributed.md.
"""

import os
import tempfile

from vlzoo._backends.running import parallel as _impl

check_launch = _impl.check_launch
data_processes = _impl.data_processes
gather_batch = _impl.gather_batch
one_replica_batch = _impl.one_replica_batch
replica_index = _impl.replica_index
saves_together = _impl.saves_together
initialize = _impl.initialize
is_writer = _impl.is_writer
scale_loss = _impl.scale_loss
scope = _impl.scope
step_logs = _impl.step_logs
train_step = _impl.train_step
world_size = _impl.world_size


def feed(make, global_batch):
    """This process's training data for steps of `global_batch` pairs: `(data, pipeline)`, `data` for `fit`
    and `pipeline` the one this process built (its `stats`, for instance).

    `make(batch_size, num_processes, process_index)` builds a pipeline of `batch_size` pairs per batch that
    reads only share `process_index` of `num_processes` (`vlzoo.data.image_text_dataset` takes these
    arguments). On PyTorch and JAX each process builds its part of the global batch (`data_processes`);
    under a TensorFlow strategy with several replicas, each worker builds its replicas' batches through
    `distribute_datasets_from_function`, and `data` (then not `pipeline`) repeats without end: give `fit`
    its `steps_per_epoch`.
    """
    distributed = _impl.distribute_pipelines(make, global_batch)
    if distributed is not None:
        return distributed
    count, index = data_processes()
    pipeline = make(global_batch // count, count, index)
    return pipeline, pipeline


def write_once(save, path):
    """`save(path)` in the writing process (`is_writer`). Where saving is collective (`saves_together`:
    JAX's arrays span the processes, TensorFlow's workers save together), the other processes run `save`
    too, into a scratch directory that is removed, so that they join its collectives.

    Args:
        save: a function of a path, e.g. `model.save_weights` or `model.save_to_preset`.
        path: where the writing process saves.
    """
    if is_writer():
        save(path)
    elif saves_together():
        with tempfile.TemporaryDirectory() as scratch:
            save(os.path.join(scratch, os.path.basename(os.path.normpath(path))))


__all__ = ["check_launch", "data_processes", "feed", "gather_batch", "initialize", "is_writer", "one_replica_batch",
           "replica_index", "saves_together", "scale_loss", "scope", "step_logs", "train_step", "world_size",
           "write_once"]
