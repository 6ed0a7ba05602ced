"""Eager inference calls run as one compiled program, per backend.

`inference_function(fn, variables)` returns `fn` (a function of tensors reading the Keras
variables that `variables()` returns) run as a compiled program, with `fn`'s results up to the
compiler's rounding and its gradients; a later `assign` or `fit` is seen:

- JAX (`vlzoo._backends.jax.compiled`): `jax.jit` of `fn` with the variables' values passed in;
  once per input shape and dtype; traced into the caller's program inside a JAX transform.
- TensorFlow (`vlzoo._backends.tensorflow.compiled`): a `tf.function` of `fn` when executing
  eagerly; `fn` inside a graph.
- PyTorch (`vlzoo._backends.torch.compiled`): a `torch.jit.trace` per input signature, the
  variables' values as inputs; outputs and gradients bit for bit the eager call's wherever the
  kernels are deterministic.

`forward_function(fn, variables)` is the same for the forward pass of Keras' training and
evaluation steps: the traced program on PyTorch (whose steps run eagerly), `fn` on JAX and
TensorFlow (whose steps are compiled already). Why, and the figures: docs/workarounds.md.

Example:
>>> encode = inference_function(lambda x: model.vision(x)["pooled"],
...                             lambda: model.vision.variables)  # doctest: +SKIP
>>> encode(np.zeros((2, 224, 224, 3), "float32")).shape  # doctest: +SKIP
(2, 512)
"""

import keras

from vlzoo._backends import switches
from vlzoo._backends.running import compiled as _impl


def inference_function(fn, variables):
    """`fn` as one compiled program (a traced one on PyTorch); `fn` itself for symbolic inputs.

    Args:
        fn: a function of tensors (or dicts of them) that reads Keras variables.
        variables: a function returning the variables `fn` reads.

    Returns:
        A function with `fn`'s arguments and outputs.
    """
    program = _impl.inference_function(fn, variables)

    def call(*args):
        if any(keras.backend.is_keras_tensor(x) for x in keras.tree.flatten(args)):
            return fn(*args)  # building a functional model or counting shapes: nothing runs
        return program(*args)

    return call


def forward_function(fn, variables):
    """`fn` as a traced program on PyTorch (`inference_function`); `fn` itself on JAX and TensorFlow.

    For a model's forward pass in Keras' training and evaluation steps: those
    steps run eagerly on PyTorch only. Differentiable: on PyTorch, `backward`
    through the program gives each variable the gradient the eager call gives.
    Arguments and result as `inference_function`.

    >>> forward = forward_function(lambda x: model.vision(x)["pooled"],
    ...                            lambda: model.vision.variables)  # doctest: +SKIP
    """
    if not switches.steps_run_eagerly():
        return fn
    return inference_function(fn, variables)


__all__ = ["forward_function", "inference_function"]
