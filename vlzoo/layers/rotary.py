"""Two-dimensional rotary position embedding (RoPE) of a vision tower's patch tokens."""

import numpy as np
from keras import ops


def rotary_angles_2d(grid_size, head_dim, theta=10000.0, offset=0.0):
    """The rotation angles of each patch of a `(rows, cols)` grid, `(rows * cols, head_dim)` float64.

    Each head's width is split in two halves, the first turned by the patch's column, the second by its
    row (`head_dim / 4` frequencies `theta ** (-k / (head_dim / 4))` each); every angle covers one pair of
    adjacent channels (`(x_0, x_1)`, `(x_2, x_3)`, ...). Patches are row-major, as the patch embedding
    flattens them, and sit at `(column + offset, row + offset)`. This is Meta's Perception Encoder RoPE
    (timm's `RotaryEmbeddingCat` at its native grid).

    Args:
        grid_size: `(rows, cols)` of the patch grid.
        head_dim: attention head width, a multiple of 4.
        theta: the frequency base.
        offset: the position of the first row and column (PE counts from 1 where a class token takes 0).

    Returns:
        numpy `(rows * cols, head_dim)`.

    Raises:
        ValueError: `head_dim` not a multiple of 4.

    Example:
    >>> rotary_angles_2d((2, 3), 4, offset=1.0)[:, ::2].tolist()  # (x angle, y angle) per patch
    [[1.0, 1.0], [2.0, 1.0], [3.0, 1.0], [1.0, 2.0], [2.0, 2.0], [3.0, 2.0]]
    """
    if head_dim % 4:
        raise ValueError(f"2D rotary embedding needs `head_dim` divisible by 4; received {head_dim}.")
    quarter = head_dim // 4
    frequencies = 1.0 / theta ** (np.arange(quarter, dtype=np.float64) / quarter)
    rows, cols = (int(n) for n in grid_size)  # Python ints also where traced shapes are tensors (PyTorch's tracer)
    rows, cols = np.meshgrid(np.arange(rows) + offset, np.arange(cols) + offset, indexing="ij")
    angles = np.concatenate([cols.reshape(-1, 1) * frequencies, rows.reshape(-1, 1) * frequencies], axis=1)
    return np.repeat(angles, 2, axis=1)


def rotary_tables_2d(grid_size, head_dim, theta=10000.0, offset=0.0):
    """`(sin, cos)` of `rotary_angles_2d`, each a float32 tensor `(rows * cols, head_dim)`: the `rotary`
    argument of `MultiHeadAttention`."""
    angles = rotary_angles_2d(grid_size, head_dim, theta, offset)
    return ops.convert_to_tensor(np.sin(angles), "float32"), ops.convert_to_tensor(np.cos(angles), "float32")


def apply_rotary(x, sin, cos):
    """Rotates the last `M` tokens of `x` by the angles whose `(sin, cos)` are given; earlier tokens (a class
    or register token before the patches) pass unchanged.

    Each channel pair `(a, b)` becomes `(a cos - b sin, b cos + a sin)`.

    Args:
        x: `(B, N, heads, head_dim)` queries or keys.
        sin, cos: `(M, head_dim)`, `M <= N`, pairs of equal angles (`rotary_tables_2d`).

    Returns:
        `x`'s shape and dtype.
    """
    count = sin.shape[0]
    prefix, tokens = x[:, : x.shape[1] - count], x[:, x.shape[1] - count:]
    shape = ops.shape(tokens)
    pairs = ops.reshape(tokens, (shape[0], shape[1], shape[2], shape[3] // 2, 2))
    turned = ops.reshape(ops.stack([-pairs[..., 1], pairs[..., 0]], axis=-1), shape)
    sin, cos = (ops.cast(t, x.dtype)[None, :, None, :] for t in (sin, cos))
    rotated = tokens * cos + turned * sin
    return ops.concatenate([prefix, rotated], axis=1) if x.shape[1] > count else rotated
