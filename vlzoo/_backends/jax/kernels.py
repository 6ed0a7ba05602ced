"""JAX: faster kernels for the towers' attention and dense layers (`vlzoo.kernels`).

- `padded_attention` / `cudnn_padded_attention`: attention on copies padded to a multiple of 64
  tokens, with cuDNN's padding mask hiding the padding, so that cuDNN's fused attention runs
  forward and backward at any sequence length; `padding_helps` says when.
- `dense`, `float32_attention`: bfloat16 products accumulated and returned in float32, then rounded
  to bfloat16 as Keras' results are (the same numbers); `accumulates_in_float32` and
  `float32_attention_helps` say when (bfloat16 on the CPU).

Why these routes are faster, the figures, and when each can go: docs/workarounds.md.
"""

import jax
import jax.numpy as jnp
import keras

# cuDNN's flash attention: half-precision inputs, a head width it has kernels for.
_FLASH_DTYPES = (jnp.bfloat16, jnp.float16)
_FLASH_HEAD_DIMS = range(8, 257, 8)


def padding_helps(query, key, mask):
    """Whether `padded_attention` should run this attention: on an Ampere or newer NVIDIA GPU, in
    bfloat16 or float16, without an attention mask (causal is fine), at lengths cuDNN cannot train on.

    Args:
        query: `(B, T, heads, head_dim)`.
        key: `(B, S, heads, head_dim)`.
        mask: the attention mask, or None.

    Returns:
        bool.
    """
    device = jax.devices()[0]
    if device.platform != "gpu" or mask is not None:
        return False
    if float(getattr(device, "compute_capability", "0")) < 8.0:
        return False
    lengths = (query.shape[1], key.shape[1])
    return (query.dtype in _FLASH_DTYPES and query.shape[-1] in _FLASH_HEAD_DIMS
            and all(n is not None for n in lengths) and any(n % 64 for n in lengths))


def padded_attention(query, key, value, scale, is_causal=False, implementation="cudnn"):
    """Attention of `query` over `key`/`value`, computed on copies padded to multiples of 64 tokens.

    Args:
        query: `(B, T, heads, head_dim)`.
        key, value: `(B, S, heads, head_dim)`.
        scale: the logits' scale.
        is_causal: whether token `i` attends to tokens `<= i` only (T == S).
        implementation: `jax.nn.dot_product_attention`'s; "xla" computes the same on any device.

    Returns:
        `(B, T, heads, head_dim)`, as `jax.nn.dot_product_attention(query, key, value)`.

    Example:
    >>> q = jnp.ones((2, 197, 12, 64), jnp.bfloat16)
    >>> padded_attention(q, q, q, 0.125, implementation="xla").shape
    (2, 197, 12, 64)
    """
    batch, t, s = query.shape[0], query.shape[1], key.shape[1]

    def pad(x, length):
        return jnp.pad(x, ((0, 0), (0, -length % 64), (0, 0), (0, 0)))

    out = jax.nn.dot_product_attention(
        pad(query, t), pad(key, s), pad(value, s), scale=scale, is_causal=is_causal,
        query_seq_lengths=jnp.full((batch,), t, jnp.int32), key_value_seq_lengths=jnp.full((batch,), s, jnp.int32),
        implementation=implementation,
    )
    return out[:, :t]


def cudnn_padded_attention(query, key, value, scale, is_causal=False):
    """`padded_attention` through cuDNN, or None where JAX's checks refuse these inputs when the call is
    traced (no cuDNN found, a GPU or head width its kernels do not cover: JAX raises `RuntimeError` or
    `NotImplementedError` before anything runs), so that the caller runs Keras' attention instead.

    Takes `padded_attention`'s arguments but `implementation`; returns `(B, T, heads, head_dim)` or
    None.
    """
    try:
        return padded_attention(query, key, value, scale, is_causal=is_causal, implementation="cudnn")
    except (RuntimeError, NotImplementedError):
        return None


def _on_the_cpu():
    return jax.devices()[0].platform == "cpu"


def float32_attention_helps(query):
    """Whether `float32_attention` should run this attention: bfloat16 `query` on the CPU."""
    return query.dtype == jnp.bfloat16 and _on_the_cpu()


def float32_attention(query, key, value, scale, mask=None, is_causal=False):
    """Softmax attention whose two products accumulate in float32 (`jax.nn.dot_product_attention`'s
    arithmetic: logits and softmax in float32, weights rounded to the inputs' dtype for the second product).

    Args:
        query: `(B, T, heads, head_dim)`.
        key, value: `(B, S, heads, head_dim)`.
        scale: the logits' scale.
        mask: optional bool, broadcastable to `(B, heads, T, S)`; True = may attend.
        is_causal: whether token `i` attends to tokens `<= i` only.

    Returns:
        `(B, T, heads, head_dim)` in `query`'s dtype.

    Example:
    >>> q = jnp.ones((2, 197, 12, 64), jnp.bfloat16)
    >>> float32_attention(q, q, q, 0.125).shape
    (2, 197, 12, 64)
    """
    logits = jnp.einsum("btnh,bsnh->bnts", query, key, preferred_element_type=jnp.float32) * scale
    if is_causal:
        causal = jnp.tril(jnp.ones(logits.shape[-2:], bool))
        mask = causal if mask is None else jnp.logical_and(mask, causal)
    if mask is not None:
        logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)  # finite: a fully masked row stays finite
    weights = jax.nn.softmax(logits, axis=-1).astype(value.dtype)
    out = jnp.einsum("bnts,bsnh->btnh", weights, value, preferred_element_type=jnp.float32)
    return out.astype(query.dtype)


def accumulates_in_float32(layer, x):
    """Whether `dense` should run `layer` on `x`: a plain `keras.layers.Dense` (no LoRA, not quantized)
    computing in bfloat16 on bfloat16 inputs, on the CPU."""
    return (type(layer) is keras.layers.Dense and x.dtype == jnp.bfloat16 and layer.compute_dtype == "bfloat16"
            and not layer.lora_enabled and layer.quantization_mode is None and _on_the_cpu())


def dense(layer, x):
    """`layer.call(x)` for a bfloat16 `keras.layers.Dense`, its product accumulated and returned in float32
    then rounded to bfloat16 (`accumulates_in_float32`).

    Args:
        layer: a built `keras.layers.Dense` with a `(D, units)` kernel.
        x: `(..., D)` bfloat16.

    Returns:
        `(..., units)` bfloat16: `activation(x @ kernel + bias)`.

    Example:
    >>> layer = keras.layers.Dense(4, dtype="bfloat16")
    >>> layer.build((None, 8))
    >>> dense(layer, jnp.ones((2, 8), jnp.bfloat16)).dtype
    dtype(bfloat16)
    """
    y = jax.lax.dot_general(x, keras.ops.cast(layer.kernel, x.dtype), (((x.ndim - 1,), (0,)), ((), ())),
                            preferred_element_type=jnp.float32).astype(x.dtype)
    if layer.bias is not None:
        y = y + keras.ops.cast(layer.bias, x.dtype)
    return layer.activation(y)
