"""Eager inference calls that run as one compiled program: what differs per backend.

A notebook's first call, `model.encode_image(x)`, is eager. An eager call
dispatches every operation from Python, one by one, through Keras, which is
many times slower than the same computation compiled (the `host_overhead`
entry of docs/benchmarks.md).
`inference_function(fn, variables)` (`variables`: a function returning the
variables `fn` reads) returns `fn` run as a compiled program, with the same
results up to the compiler's rounding:

- JAX: `jax.jit` of `fn`, with the variables' current values passed in (a
  `keras.StatelessScope`), so a later `assign` or `fit` is seen; compiled
  once per input shape and dtype. Inside a JAX transform (`jax.grad`,
  `jax.jit`, Keras' own steps) it is traced into the caller's program, and
  differentiating through it differentiates `fn`.
- TensorFlow: a `tf.function` of `fn` when executing eagerly (its graph is
  traced once per input signature and set of variables, and reads their
  values at each call); inside a graph `fn` runs as called. A `tf.function`
  is differentiable under a `tf.GradientTape`.
- PyTorch: a `torch.jit.trace` of `fn` per input signature, with the values
  of the variables `fn` reads as inputs. Keras' per-operation dispatch on
  PyTorch costs 10 to 15 us an operation; the traced program runs the same
  kernels without it, one by one: TorchScript's graph optimisations (kernel
  fusion, its own derivative formulas) are off while it runs, so its
  outputs, and the gradients autograd computes through it, are the eager
  call's bit for bit wherever the kernels are deterministic.
  `torch.compile` of Keras' layers costs more to compile than it saves
  (docs/benchmarks.md).

`forward_function(fn, variables)` is the same for a forward pass inside Keras'
training and evaluation steps: on PyTorch, whose steps run eagerly, the traced
program (its gradients reach the variables as the eager call's do); on JAX
and TensorFlow `fn` itself, since their steps are compiled programs already.

Example:

>>> encode = inference_function(lambda x: model.vision(x)["pooled"], lambda: model.vision.variables)
>>> encode(np.zeros((2, 224, 224, 3), "float32")).shape
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
