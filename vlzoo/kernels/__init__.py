"""Faster kernels for the towers' dense layers and attention, where a backend has them.

The layers stay in `keras.ops`; `dense` and `attention` return the same result by a faster route
where this backend, device and dtype have one, and None where Keras' own op is the one to run. Only
JAX has such routes (`vlzoo._backends.jax.kernels`):

- on the CPU in bfloat16: products accumulated and returned in float32, then rounded once to
  bfloat16 as Keras' are;
- on an Ampere or newer GPU in half precision without a mask: cuDNN's fused attention on inputs
  padded to a multiple of 64 tokens; Keras' attention where JAX finds no cuDNN or cuDNN refuses.

The speed-ups and when each route can go: docs/workarounds.md.

Example:
>>> out = attention(q, k, v, scale=0.125)  # doctest: +SKIP
>>> out = keras.ops.dot_product_attention(q, k, v, scale=0.125) if out is None else out  # doctest: +SKIP
"""

from vlzoo._backends.keras_internals import calls_directly
from vlzoo._backends.running import kernels as _impl


def dense(layer, x):
    """`layer(x)` for a `keras.layers.Dense` inside a parent layer's call, by this backend's faster kernel,
    or None where Keras' call is the one to run (another backend, device or dtype; LoRA; quantized; a call
    that `Layer.__call__` would change: `vlzoo._backends.keras_internals.calls_directly`).

    Args:
        layer: a built `keras.layers.Dense`.
        x: `(..., D)`.

    Returns:
        `(..., units)`, or None.
    """
    if _impl is None or not _impl.accumulates_in_float32(layer, x) or not calls_directly(layer, (x,)):
        return None
    return _impl.dense(layer, x)


def attention(query, key, value, scale, mask=None, is_causal=False):
    """Softmax attention by this backend's faster kernel, or None where `keras.ops.dot_product_attention`
    is the one to run.

    Takes `query` `(B, T, heads, head_dim)`, `key` and `value` `(B, S, heads, head_dim)` and the logits'
    `scale`, `mask` (bool, True = may attend) and `is_causal` of `keras.ops.dot_product_attention`.

    Returns:
        `(B, T, heads, head_dim)`, or None.
    """
    if _impl is None:
        return None
    if _impl.padding_helps(query, key, mask):
        return _impl.cudnn_padded_attention(query, key, value, scale, is_causal=is_causal)
    if _impl.float32_attention_helps(query):
        return _impl.float32_attention(query, key, value, scale, mask=mask, is_causal=is_causal)
    return None
