"""Eager inference calls run as one compiled program, per backend.

`inference_function(fn, variables)` returns `fn` run as a compiled program
(`variables`: a function returning the variables `fn` reads), with `fn`'s
results up to the compiler's rounding:

- JAX: `jax.jit` of `fn` with the variables' current values passed in (a
  `keras.StatelessScope`), so a later `assign` or `fit` is seen; compiled once
  per input shape and dtype. Inside a JAX transform it is traced into the
  caller's program and differentiates as `fn`.
- TensorFlow: a `tf.function` of `fn` when executing eagerly (traced once per
  input signature and set of variables); inside a graph, `fn` as called.
  Differentiable under a `tf.GradientTape`.
- PyTorch: a `torch.jit.trace` of `fn` per input signature, the variables'
  values passed as inputs, run with TorchScript's graph optimisations off: its
  outputs and autograd gradients are the eager call's bit for bit wherever the
  kernels are deterministic.

`forward_function(fn, variables)` is the same for a forward pass inside Keras'
training and evaluation steps: the traced program on PyTorch (whose steps run
eagerly), `fn` itself on JAX and TensorFlow (whose steps are compiled already).

Why eager calls are compiled, the measured cost of Keras' eager dispatch and
the captures that were tried instead: docs/benchmarks.md (*Host overhead*) and
docs/workarounds.md.

Example:

>>> encode = inference_function(lambda x: model.vision(x)["pooled"],
...                             lambda: model.vision.variables)  # doctest: +SKIP
>>> encode(np.zeros((2, 224, 224, 3), "float32")).shape  # doctest: +SKIP
(2, 512)
"""

import keras

if keras.backend.backend() == "jax":
    from vlzoo.compiled import _jax as _impl
elif keras.backend.backend() == "tensorflow":
    from vlzoo.compiled import _tensorflow as _impl
else:
    from vlzoo.compiled import _torch as _impl


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

    Args:
        fn: a function of tensors (or dicts of them) that reads Keras variables.
        variables: a function returning the variables `fn` reads.

    Returns:
        A function with `fn`'s arguments and outputs.
    """
    if keras.backend.backend() != "torch":
        return fn
    return inference_function(fn, variables)


__all__ = ["forward_function", "inference_function"]
