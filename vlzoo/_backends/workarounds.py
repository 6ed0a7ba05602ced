"""The workarounds of Keras' and the backends' gaps that the model class needs, fenced in one module.

Each entry says what it works around and when it can be deleted (docs/workarounds.md lists them
with the others and what they buy); the model and its trainer call them and hold no backend switch
of their own.

- `check_distribution_backend(what)`: `keras.distribution` runs on JAX only. Delete when Keras'
  distribution API runs on TensorFlow and PyTorch.
- `OneReplicaSymbolicBuild`: the override of Keras' private `Model._maybe_symbolic_build`. Keras'
  TensorFlow trainer builds the optimizer and metrics under a `tf.distribute` strategy from the first
  batch averaged over the replicas, which fails for a boolean padding mask and, under
  MultiWorkerMirroredStrategy, for any dict of inputs. Delete when Keras builds from one replica's
  batch.
- `release_gradients(model)`: PyTorch's `zero_grad(set_to_none=True)` after each train step. Keras'
  PyTorch trainer clears the previous step's gradients only after the next forward pass, so a gradient
  for every weight stays alive through the activations' peak. Delete when Keras releases them after
  the update.
- `SLOW_INT8_BACKENDS`, `warn_if_int8_is_slow(mode)`: Keras' dynamic int8 on PyTorch and TensorFlow is
  slower than float32 on the CPU. Delete when Keras' int8 is faster than float32 there.
- `frozen_gc()`: Keras runs a full garbage collection each time a quantized layer drops its float
  kernel. Delete when `Model.quantize` no longer collects per layer.
- `build_optimizer_before_tracing(model)`: Keras' TensorFlow trainer without a `tf.distribute` strategy
  (its private `_distribute_strategy`) builds the optimizer inside the first traced step of `fit` or
  `train_on_batch`, and `tf.function` then traces the step twice. Delete when that trainer builds the optimizer
  before tracing.

Example:
>>> with frozen_gc():
...     keras.Model.quantize(model, "int8")  # doctest: +SKIP
"""

import contextlib
import gc
import warnings

import keras

from vlzoo._arrays import on_the_cpu
from vlzoo._backends.running import parallel

SLOW_INT8_BACKENDS = ("torch", "tensorflow")


def check_distribution_backend(what="keras.distribution"):
    """Raises `NotImplementedError` naming `what` unless the backend is JAX.

    Args:
        what: the operation refused, as the error's subject (e.g. `"Building CLIP under a
            keras.distribution"`).

    Raises:
        NotImplementedError: on TensorFlow and PyTorch.
    """
    backend = keras.backend.backend()
    if backend != "jax":
        raise NotImplementedError(
            f"{what} needs the JAX backend: keras.distribution (DataParallel, ModelParallel) runs on JAX only "
            f"in Keras {keras.__version__}. On {backend}, train on several devices with its own engine "
            "(torchrun and torch.distributed, or a tf.distribute strategy: docs/distributed.md) and unset the "
            "distribution (keras.distribution.set_distribution(None)), or run with KERAS_BACKEND=jax."
        )


class OneReplicaSymbolicBuild(keras.Model):
    """A `keras.Model` whose symbolic build under a `tf.distribute` strategy reads one replica's batch
    (`vlzoo.parallel.one_replica_batch`); the same as Keras' elsewhere."""

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        super()._maybe_symbolic_build(*parallel.one_replica_batch(self, iterator, data_batch))


def release_gradients(model):
    """Frees `model`'s gradients once a train step has applied them (PyTorch; nothing elsewhere)."""
    if keras.backend.backend() == "torch":
        model.zero_grad(set_to_none=True)  # torch.nn.Module's, as Keras' trainer calls it


def warn_if_int8_is_slow(mode):
    """Warns (stack level of `quantize`'s caller) when `mode` is `"int8"` on a backend of
    `SLOW_INT8_BACKENDS` whose default device is the CPU."""
    backend = keras.backend.backend()
    if mode == "int8" and backend in SLOW_INT8_BACKENDS and on_the_cpu(keras.ops.zeros(())):
        warnings.warn(
            f"Keras' int8 on {backend} runs slower than float32 on the CPU (its int8 products do "
            "not reach the CPU's int8 kernels; docs/serving.md): `quantize('int8')` saves memory, not time "
            "here. For fast int8 inference, export the towers to ONNX and quantize them with ONNX Runtime: "
            "`vlzoo.serving.quantize_onnx(vlzoo.serving.export(model, path, format='onnx')['image'])`.",
            stacklevel=3,
        )


@contextlib.contextmanager
def frozen_gc():
    """The objects that exist are frozen out of garbage collections inside the block; one collection
    afterwards frees what the block dropped (`quantize`'s float kernels)."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.collect()


def build_optimizer_before_tracing(model):
    """Builds `model`'s optimizer for its trainable variables where Keras would build it inside the trace of
    `fit` or `train_on_batch`.

    Keras' TensorFlow trainer without a `tf.distribute` strategy defers the optimizer's variables to the
    first traced training step; `tf.function` then traces the step twice (one trace creates the
    variables, a second uses them). Built beforehand, with the variables `fit` trains, as Keras itself
    does on JAX and PyTorch and under a strategy, the step traces once and starts from the same values.
    Does nothing elsewhere, or when the model has no optimizer or a built one.
    """
    optimizer = model.optimizer
    if (keras.backend.backend() != "tensorflow" or optimizer is None or optimizer.built
            or getattr(model, "_distribute_strategy", None) is not None):
        return
    optimizer.build(model.trainable_variables)
