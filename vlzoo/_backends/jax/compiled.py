"""JAX: eager calls as `jax.jit` of the function of the variables' values."""

import jax
import keras


def inference_function(fn, variables):
    """`fn` jitted, with the current values of `variables()` as arguments (`vlzoo.compiled`).

    A jitted function composes with JAX's transforms: called with traced arguments (under `jax.grad`,
    `jax.jit`, or Keras' own steps, whose variable values are traced) it is traced into the caller's
    program, and differentiating through it gives the gradient of `fn`.

    Args:
        fn: a function of arrays that reads Keras variables.
        variables: a function returning the variables `fn` reads; called at each call, since
            `enable_lora` and `quantize` change them.

    Returns:
        A function with `fn`'s arguments and outputs.
    """
    current, keys = [], []

    def stateless(values, args):
        with keras.StatelessScope(state_mapping=list(zip(current, values))):
            outputs = fn(*args)
        keys[:] = list(outputs) if isinstance(outputs, dict) else []
        return outputs

    compiled = jax.jit(stateless)

    def call(*args):
        current[:] = variables()
        outputs = compiled([v.value for v in current], args)
        return {key: outputs[key] for key in keys} if keys else outputs  # a jitted dict comes back sorted

    return call
