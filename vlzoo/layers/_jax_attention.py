"""JAX: cuDNN's fused (flash) attention at any sequence length, by padding to a multiple of 64.

Keras checks cuDNN's flash attention for inference only, and in training cuDNN refused ViT-B/16's
197 tokens on an H100 (JAX 0.11.2: "Unsupported sequence length Q 197, KV 197"), so vlzoo had XLA's
unfused attention there, which materialises the `(B, heads, N, N)` logits, their softmax and its
gradient in memory: with the elementwise work around it, half the kernel time of CLIP-B/16's
`mixed_bfloat16` step on that card (docs/benchmarks.md). Padded to the next multiple of 64 (the
lengths cuDNN's kernels tile by), with the padding outside the sequence lengths of cuDNN's padding
mask (`query_seq_lengths`, `key_value_seq_lengths` of `jax.nn.dot_product_attention`), the padded
keys get no weight and the padded queries' rows are dropped: the attention of the unpadded inputs,
through the fused kernel forward and backward, with no bias (whose training kernels want even
lengths).
"""

import jax
import jax.numpy as jnp

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
