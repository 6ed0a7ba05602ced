"""`Trainer`: the training side of a vlzoo model, on one device or several (`ContrastiveModel` inherits it).

What it adds to `keras.Model`:

- `compile(optimizer="adamw", ...)`: the family's own loss (a `loss` argument is refused) and the
  optimizer's weight-decay exclusions (`no_weight_decay_variables`).
- `fit` / `evaluate`: the inputs' pair counts and the launch checked before Keras' loop.
- `train_step` / `test_step`: Keras' steps through `vlzoo.parallel` (DistributedDataParallel under
  `torch.distributed`, the logs a `tf.distribute` strategy reduces), gradients released after each
  update on PyTorch (`vlzoo._backends.workarounds`).

The subclass provides `call` and `compute_loss`.

Example:
>>> model = vlzoo.from_preset("clip_tiny")
>>> model.compile(optimizer="adamw")
>>> model.fit(dataset, epochs=1)
"""

import keras

from vlzoo import optimizers, parallel
from vlzoo._backends import workarounds

# Variable names that never receive weight decay besides rank < 2 tensors
# (biases, norms, logit scale and bias): embedding tables and learned tokens.
_NO_DECAY_NAMES = ("embeddings", "prefix_tokens", "latent")


def check_paired_arrays(x, method):
    """`fit` / `evaluate` inputs given as a dict of arrays (a cached tower's outputs nested inside): every
    entry holds the same number of pairs.

    Args:
        x: `fit`'s or `evaluate`'s `x`; anything but a dict of arrays passes unchecked.
        method: `"fit"` or `"evaluate"`, named in the error.

    Raises:
        ValueError: naming each entry's size when they differ.
    """
    if not isinstance(x, dict):
        return
    flat = {key: value for key, value in x.items() if not isinstance(value, dict)}
    flat.update({f"{key}/{inner}": value for key, group in x.items() if isinstance(group, dict)
                 for inner, value in group.items()})
    if not all(hasattr(v, "shape") and len(v.shape) for v in flat.values()):
        return
    sizes = {key: value.shape[0] for key, value in flat.items()}
    if len(set(sizes.values())) > 1:
        raise ValueError(
            f"`x` of `{method}`: every entry must hold the same number of image-caption pairs; received "
            + ", ".join(f"`{key}` {size}" for key, size in sizes.items()) + "."
        )


class Trainer(workarounds.OneReplicaSymbolicBuild):
    """A `keras.Model` trained with its own loss, on one device or over several (`vlzoo.parallel`)."""

    def compile(self, optimizer="adamw", **kwargs):
        """Configures training with the family's own loss (no `loss` argument).

        `optimizer="adamw"` is `vlzoo.optimizers.AdamW()` (Keras' AdamW, its
        update one fused kernel on PyTorch). Biases, norms, embedding tables,
        learned tokens and the logit scale/bias are excluded from the
        optimizer's weight decay.
        `vlzoo.training.configure(model, ...)` compiles with the papers'
        AdamW, warm-up + cosine schedule and optional remat in one call.

        Raises:
            ValueError: if `loss` is given.
            NotImplementedError: under a `keras.distribution` off JAX.
        """
        if kwargs.get("loss") is not None:
            raise ValueError(
                f"{type(self).__name__} trains with its family's own loss; do not pass `loss` "
                "to `compile` (override `contrastive_loss` to change it)."
            )
        kwargs.pop("loss", None)
        if keras.distribution.distribution() is not None:
            workarounds.check_distribution_backend(f"Training {type(self).__name__} under a keras.distribution")
        if isinstance(optimizer, str) and optimizer.lower() == "adamw":
            optimizer = optimizers.AdamW()
        optimizer = keras.optimizers.get(optimizer)
        if getattr(optimizer, "weight_decay", None):
            optimizer.exclude_from_weight_decay(var_list=self.no_weight_decay_variables())
        super().compile(optimizer=optimizer, **kwargs)

    def no_weight_decay_variables(self):
        """Trainable variables that must not be decayed: rank < 2 tensors, embedding tables, learned tokens."""
        return [
            v for v in self.trainable_variables
            if len(v.shape) < 2 or v.name in _NO_DECAY_NAMES
        ]

    def fit(self, x=None, y=None, *args, **kwargs):
        check_paired_arrays(x, "fit")
        parallel.check_launch()
        workarounds.build_optimizer_before_tracing(self)
        return super().fit(x, y, *args, **kwargs)

    def train_on_batch(self, x=None, y=None, *args, **kwargs):
        workarounds.build_optimizer_before_tracing(self)
        return super().train_on_batch(x, y, *args, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        check_paired_arrays(x, "evaluate")
        parallel.check_launch()
        return super().evaluate(x, y, *args, **kwargs)

    def train_step(self, *args, **kwargs):
        """Keras' train step (on PyTorch under `torch.distributed`, through DistributedDataParallel:
        `vlzoo.parallel`); the gradients are then released (`vlzoo._backends.workarounds.release_gradients`)."""
        logs = parallel.train_step(self, super().train_step, *args, **kwargs)
        workarounds.release_gradients(self)
        return logs

    def test_step(self, *args, **kwargs):
        return parallel.step_logs(super().test_step(*args, **kwargs))
