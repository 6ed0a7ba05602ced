"""PyTorch: data parallelism with `torch.distributed` (`torchrun`, SLURM `srun`, any `init_process_group`).

Each process (rank) holds a replica of the model and its own part of the
global batch. The train step runs the model and the loss through
`torch.nn.parallel.DistributedDataParallel`: building it broadcasts rank 0's
weights, and its reducer averages the gradients across ranks in buckets,
all-reduced while the backward pass still runs. The loss sees the global
batch through torch's differentiable all-gather (`_functional_collectives`,
which torch names as the successor of `torch.distributed.nn.functional`),
whose backward pass sums every rank's gradient of the gathered rows and
returns each rank its own rows'.
"""

import contextlib
import os

import keras
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as functional_collectives
from torch.nn.parallel import DistributedDataParallel

# The variables a launcher sets in each of the processes it starts: torchrun, and SLURM's srun (the tasks of
# the job step; a batch script's own process sees the allocation's SLURM_NTASKS but is one task).
_LAUNCH_VARIABLES = ("WORLD_SIZE", "SLURM_STEP_NUM_TASKS")


def _initialized():
    return dist.is_available() and dist.is_initialized()


def world_size():
    """Ranks in `torch.distributed`'s default group; 1 when it is not initialised."""
    return dist.get_world_size() if _initialized() else 1


def replica_index():
    """This process's rank (0 when torch.distributed is not initialised)."""
    return dist.get_rank() if _initialized() else 0


def data_processes():
    """`(ranks, rank)`: each rank reads its own share of a `vlzoo.data` pipeline."""
    return world_size(), replica_index()


def _launched_processes():
    for name in _LAUNCH_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 1:
            return name, int(value)
    return None, 1


def distribute_pipelines(make, global_batch):
    """None: each process feeds its own pipeline (`data_processes`)."""
    return None


def check_launch():
    """Raises a `RuntimeError` when this process is one of several launched together but
    `torch.distributed` is not initialised: each would silently train a model of its own."""
    name, count = _launched_processes()
    if count > 1 and not _initialized():
        raise RuntimeError(
            f"This process is one of {count} launched together ({name}={count}), but torch.distributed is not "
            "initialised, so each process would train its own model on its own part of the data. Call "
            "`vlzoo.parallel.initialize()` (or `torch.distributed.init_process_group(...)`) before `fit`."
        )


def scope():
    """Nothing to enter: DistributedDataParallel wraps the model in the train step."""
    return contextlib.nullcontext()


def is_writer():
    """True in rank 0 (and when training alone): the process that writes presets and checkpoints."""
    return replica_index() == 0


def saves_together():
    """False: a rank holds its weights whole, so one rank saves alone."""
    return False


def initialize(backend=None):
    """`torch.distributed.init_process_group` from the launcher's variables, if not done already.

    On a GPU machine, each process takes the GPU `LOCAL_RANK` (call this before
    building a model, so that its weights are created there) and NCCL; on the
    CPU, gloo. Under SLURM's `srun`, the rank, world size and local rank come
    from SLURM's variables, and `MASTER_ADDR` / `MASTER_PORT` from the job
    script. Does nothing when the process was started alone.

    Args:
        backend: the process group's backend; None: `"nccl"` with CUDA, `"gloo"` otherwise.
    """
    if _initialized() or _launched_processes()[1] == 1:
        return
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:  # srun: each task its rank from SLURM
        os.environ.update(RANK=os.environ["SLURM_PROCID"], WORLD_SIZE=os.environ["SLURM_STEP_NUM_TASKS"],
                          LOCAL_RANK=os.environ.get("SLURM_LOCALID", "0"))
        missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
        if missing:
            raise RuntimeError(f"Under srun, set {' and '.join(missing)} in the job script (the first node's "
                               "address and a free port): torch.distributed meets there.")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend or ("nccl" if torch.cuda.is_available() else "gloo"))


def _gather(x):
    if not isinstance(x, torch.Tensor) or x.ndim == 0:
        return x  # the logit scale and bias: weights, already equal on every rank
    return _all_gather(x)


def _all_gather(x):
    """Every rank's `x` concatenated on axis 0; differentiable (its backward: a reduce-scatter of the sums)."""
    gathered = functional_collectives.all_gather_single(x.contiguous(), 0, dist.group.WORLD)
    return functional_collectives.wait_tensor(gathered)


def _check_equal_batches(outputs):
    first = next(x for x in keras.tree.flatten(outputs) if isinstance(x, torch.Tensor) and x.ndim)
    sizes = _all_gather(torch.tensor([first.shape[0]], device=first.device)).tolist()
    if len(set(sizes)) > 1:
        raise ValueError(
            f"Every rank must feed a batch of the same size to a step; the ranks' batch sizes are {sizes}. "
            "Give each rank the same number of pairs (drop the last, partial batch: `drop_remainder=True`)."
        )


def step_logs(logs):
    return logs


def one_replica_batch(model, iterator, data_batch):
    return iterator, data_batch


def gather_batch(outputs):
    """`call`'s outputs of every rank, concatenated on the batch axis in rank order (see `vlzoo.parallel`)."""
    if world_size() == 1:
        return outputs
    _check_equal_batches(outputs)
    return keras.tree.map_structure(_gather, outputs)


def scale_loss(loss):
    """The loss itself: DistributedDataParallel averages the ranks' gradients."""
    return loss


class _ForwardAndLoss(torch.nn.Module):
    """The forward pass and the family's loss as one module, so that DistributedDataParallel sees every
    weight the loss uses (some families' losses have weights of their own: FLAIR's pooling, Llip's
    cross-attention)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y, sample_weight):
        y_pred = self.model(x, training=True)
        return y_pred, self.model.compute_loss(x, y, y_pred, sample_weight, training=True)


def _replicated(model):
    """The model's DistributedDataParallel wrapper, rebuilt when its trainable weights change (LiT
    locking, LoRA); building it broadcasts rank 0's weights."""
    trainable = tuple(id(v.value) for v in model.trainable_variables)
    cached = model.__dict__.get("_vlzoo_replicated")
    if cached is None or cached[0] != trainable:
        device = torch.cuda.current_device() if torch.cuda.is_available() else None
        wrapper = DistributedDataParallel(_ForwardAndLoss(model), device_ids=None if device is None else [device])
        cached = (trainable, wrapper)
        # Outside Keras' attribute tracking and torch's submodules: the wrapper is not part of the model.
        object.__setattr__(model, "_vlzoo_replicated", cached)
    return cached[1]


def train_step(model, keras_step, data):
    """Keras' PyTorch train step, its forward pass and loss through DistributedDataParallel when
    `torch.distributed` spans several ranks; Keras' own step otherwise."""
    check_launch()
    if world_size() == 1:
        return keras_step(data)
    if not model.trainable_weights:
        raise ValueError("The model has no trainable weights.")
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    model.zero_grad(set_to_none=True)
    y_pred, loss = _replicated(model)(x, y, sample_weight)
    batch = next(i for i in keras.tree.flatten(x) if i is not None).shape[0]
    # The logged loss is the global batch's: the mean of the ranks' shares (`contrastive_loss` with `rows`). Keras' epoch logs
    # read the tracker's state, so the mean goes into it.
    logged = functional_collectives.all_reduce(loss.detach(), "sum", dist.group.WORLD) / dist.get_world_size()
    model._loss_tracker.update_state(logged, sample_weight=batch)  # as Keras' train step does
    model.optimizer.scale_loss(loss).backward()
    weights = model.trainable_weights
    with torch.no_grad():
        model.optimizer.apply([v.value.grad for v in weights], weights)
    return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
