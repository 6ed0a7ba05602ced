"""Patch, position and token embeddings."""

import math

import keras
import numpy as np
from keras import ops

from vlzoo._backends import switches
from vlzoo.layers.contraction import float32_einsum


def _cubic_kernel(t, a=-0.75):
    """Keys' cubic convolution kernel (a = -0.75, as torch's bicubic)."""
    t = np.abs(t)
    return np.where(
        t <= 1, ((a + 2) * t - (a + 3)) * t * t + 1,
        np.where(t < 2, (((t - 5) * t + 8) * t - 4) * a, 0.0),
    )


def sinusoidal_positions(length, width):
    """`(length, width)` float32 table of fixed sinusoidal positions (Vaswani et al. 2017, as fairseq lays
    them out): row `t` is `sin(t f)` then `cos(t f)` over the `width // 2` frequencies
    `f_i = 10000^(-i / (width // 2 - 1))`, a zero column last when `width` is odd (TIPSv2's text tower).
    Computed in float32 numpy, as transformers computes its table.

    >>> sinusoidal_positions(4, 6).shape
    (4, 6)
    """
    half = width // 2
    if half < 2:
        raise ValueError(f"sinusoidal positions need a width of at least 4; received {width}.")
    frequencies = np.exp(np.arange(half, dtype=np.float32) * np.float32(-math.log(10000) / (half - 1)))
    angles = np.arange(length, dtype=np.float32)[:, None] * frequencies[None, :]
    table = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    if width % 2:
        table = np.concatenate([table, np.zeros((length, 1), np.float32)], axis=1)
    return table.astype("float32")


def bicubic_resize_matrix(in_size, out_size):
    """`(out_size, in_size)` matrix of bicubic interpolation weights.

    Matches `torch.nn.functional.interpolate(mode="bicubic",
    align_corners=False)` without antialiasing (edges clamped), which is
    how open_clip and timm resize position embeddings. Computed in numpy so
    that every backend applies exactly the same weights.
    """
    scale = in_size / out_size
    matrix = np.zeros((out_size, in_size), dtype=np.float64)
    for i in range(out_size):
        src = (i + 0.5) * scale - 0.5
        base = math.floor(src)
        for tap in range(-1, 3):
            j = base + tap
            weight = _cubic_kernel(src - j)
            matrix[i, min(max(j, 0), in_size - 1)] += weight
    return matrix.astype("float32")


def antialiased_bilinear_weights(positions, sizes, grid):
    """Interpolation weights of output positions over a `grid`-long input axis, `(B, N, grid)` float32.

    Bilinear resizing of `grid` samples to `sizes` samples with half-pixel
    centres and, when shrinking, a triangle filter widened by the scale, so
    that every input sample contributes (torch's `F.interpolate(mode=
    "bilinear", align_corners=False, antialias=True)`, JAX's
    `jax.image.scale_and_translate(method="linear", antialias=True)`): output
    `i` of `size` sits at `scale (i + 0.5)` on the input axis, with `scale =
    grid / size`, and weighs input `j` by `max(0, 1 - |j + 0.5 - centre| /
    max(scale, 1))`, normalised to sum to 1.

    Args:
        positions: int `(B, N)` output index of each token along the axis.
        sizes: int `(B, 1)` output length of each row's axis.
        grid: the input length (a Python int).
    """
    scale = grid / ops.cast(sizes, "float32")
    support = ops.maximum(scale, 1.0)
    centre = scale * (ops.cast(positions, "float32") + 0.5)
    taps = ops.arange(grid, dtype="float32") + 0.5
    weights = ops.relu(1.0 - ops.abs(taps[None, None, :] - centre[..., None]) / support[..., None])
    return weights / ops.maximum(ops.sum(weights, axis=-1, keepdims=True), 1e-12)


@keras.saving.register_keras_serializable(package="vlzoo")
class PatchEmbedding(keras.layers.Layer):
    """Splits images into non-overlapping patches and projects each one.

    Args:
        hidden_dim: output width D.
        patch_size: side of a square patch, in pixels.
        use_bias: whether the projection has a bias (OpenAI CLIP: no).

    Call: images `(B, H, W, C)` channels last -> `(B, H/p * W/p, D)`,
    patches in row-major order.
    """

    def __init__(self, hidden_dim, patch_size, use_bias=False, **kwargs):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim
        self.patch_size = patch_size
        self.use_bias = use_bias
        self.conv = keras.layers.Conv2D(
            hidden_dim, patch_size, strides=patch_size, padding="valid",
            use_bias=use_bias, data_format="channels_last",
            kernel_initializer=keras.initializers.RandomNormal(stddev=0.02),
            dtype=self.dtype_policy, name="conv",
        )

    def build(self, input_shape):
        self.conv.build(input_shape)
        self.built = True

    def call(self, images):
        x = self.conv(images)
        b, gh, gw = ops.shape(x)[0], ops.shape(x)[1], ops.shape(x)[2]
        return ops.reshape(x, (b, gh * gw, self.hidden_dim))

    def embed_patches(self, patches):
        """Projects patches already cut and flattened: `(B, N, p * p * C)` -> `(B, N, D)`.

        Each patch vector is its `p x p x C` pixels in row, column, channel
        order (NaFlex's layout, `vlzoo.preprocessing.NaFlexPreprocessor`);
        the projection is the convolution's own kernel, so a patch gives the
        embedding `call` gives it inside an image.
        """
        kernel = ops.reshape(ops.cast(self.conv.kernel, self.compute_dtype), (-1, self.hidden_dim))
        x = ops.matmul(ops.cast(patches, self.compute_dtype), kernel)
        if self.use_bias:
            x = x + ops.cast(self.conv.bias, self.compute_dtype)
        return x

    def get_config(self):
        config = super().get_config()
        config.update(hidden_dim=self.hidden_dim, patch_size=self.patch_size, use_bias=self.use_bias)
        return config


@keras.saving.register_keras_serializable(package="vlzoo")
class PositionEmbedding(keras.layers.Layer):
    """Learned position embedding, resizable to another patch grid.

    The table holds `num_prefix_tokens` rows (class or mixture tokens, never
    resized) followed by `grid_size[0] * grid_size[1]` patch rows, or simply
    `sequence_length` rows for text (`grid_size=None`).

    Args:
        hidden_dim: width D.
        sequence_length: number of rows for a 1-D (text) table.
        grid_size: `(gh, gw)` patch grid for a 2-D (image) table.
        num_prefix_tokens: rows before the grid that are not resized.
        init_std: standard deviation of the initial values.

    Call arguments:
        x: `(B, N, D)` token embeddings.
        grid_size: optional `(gh, gw)` of `x`'s patches; when it differs from
            the table's grid the patch rows are resized bicubically. For a
            1-D table, the first `N` rows are used (`N <= sequence_length`).

    Returns:
        `x` plus the position embedding, `(B, N, D)`.

    Raises:
        ValueError: neither or both of `sequence_length` and `grid_size`.
    """

    def __init__(self, hidden_dim, sequence_length=None, grid_size=None, num_prefix_tokens=0, init_std=0.01, **kwargs):
        super().__init__(**kwargs)
        if (sequence_length is None) == (grid_size is None):
            raise ValueError("Pass exactly one of `sequence_length` and `grid_size`.")
        self.hidden_dim = hidden_dim
        self.grid_size = tuple(grid_size) if grid_size is not None else None
        self.num_prefix_tokens = num_prefix_tokens
        self.sequence_length = (
            sequence_length if grid_size is None
            else num_prefix_tokens + self.grid_size[0] * self.grid_size[1]
        )
        self.init_std = init_std

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings", shape=(self.sequence_length, self.hidden_dim),
            initializer=keras.initializers.RandomNormal(stddev=self.init_std),
        )
        self.built = True

    def resized(self, grid_size):
        """Returns the table for a `(gh, gw)` patch grid, `(prefix + gh*gw, D)`."""
        table = ops.convert_to_tensor(self.embeddings)
        grid_size = tuple(grid_size)
        if self.grid_size is None or grid_size == self.grid_size:
            return table
        prefix, patches = table[: self.num_prefix_tokens], table[self.num_prefix_tokens :]
        gh, gw = self.grid_size
        patches = ops.reshape(patches, (gh, gw, self.hidden_dim))
        rows = ops.convert_to_tensor(bicubic_resize_matrix(gh, grid_size[0]), dtype="float32")
        cols = ops.convert_to_tensor(bicubic_resize_matrix(gw, grid_size[1]), dtype="float32")
        patches = ops.cast(float32_einsum("ih,hwd,jw->ijd", rows, patches, cols), table.dtype)
        patches = ops.reshape(patches, (grid_size[0] * grid_size[1], self.hidden_dim))
        return ops.concatenate([prefix, patches], axis=0)

    def for_patch_grids(self, spatial_shapes, num_patches):
        """Patch rows resized to each image's own grid (NaFlex), `(B, num_patches, D)`.

        Image `b`'s grid `spatial_shapes[b] = (h, w)` fills its first `h * w`
        tokens in row-major order, each the table bilinearly resized to `h x
        w` with antialiasing (`antialiased_bilinear_weights`, as SigLIP 2);
        padding tokens get the first token's row.

        Args:
            spatial_shapes: int `(B, 2)` patch rows and columns per image.
            num_patches: tokens per image, padding included (static).
        """
        shapes = ops.cast(spatial_shapes, "int32")
        rows, cols = shapes[:, :1], shapes[:, 1:]
        index = ops.arange(num_patches, dtype="int32")[None]
        valid = index < rows * cols
        safe_cols = ops.maximum(cols, 1)
        row = ops.where(valid, index // safe_cols, 0)
        col = ops.where(valid, index % safe_cols, 0)
        gh, gw = self.grid_size
        weights = (antialiased_bilinear_weights(row, rows, gh)[..., :, None]
                   * antialiased_bilinear_weights(col, cols, gw)[..., None, :])
        table = ops.convert_to_tensor(self.embeddings)[self.num_prefix_tokens :]
        weights = ops.reshape(weights, (-1, num_patches, gh * gw))
        return ops.cast(float32_einsum("bng,gd->bnd", weights, table), table.dtype)

    def call(self, x, grid_size=None):
        if self.grid_size is not None:
            table = self.resized(grid_size or self.grid_size)
        else:
            table = self.embeddings[: x.shape[1]]
        return x + ops.cast(table, x.dtype)[None]

    def get_config(self):
        config = super().get_config()
        config.update(
            hidden_dim=self.hidden_dim,
            sequence_length=None if self.grid_size else self.sequence_length,
            grid_size=self.grid_size, num_prefix_tokens=self.num_prefix_tokens,
            init_std=self.init_std,
        )
        return config


@keras.saving.register_keras_serializable(package="vlzoo")
class TokenEmbedding(keras.layers.Embedding):
    """`keras.layers.Embedding` whose table gets the same gradient, and the same Adam step, on every backend.

    On TensorFlow in training (not quantized) it reads the table through `ops.where`, whose
    gradient is one dense gradient with a repeated token's rows summed: the gradient JAX and
    PyTorch compute, so Keras' Adam and AdamW take the same step on every backend. Elsewhere it is
    `keras.layers.Embedding`. Why (Keras' optimizers square TensorFlow's per-occurrence
    `IndexedSlices` rows before summing them): `vlzoo._backends.switches.needs_dense_lookup_gradient`,
    docs/workarounds.md.

    Input: int token ids `(B, T)`; output `(B, T, output_dim)`.

    Example:
    >>> layer = TokenEmbedding(49408, 512, name="token_embedding")
    >>> layer(np.array([[49406, 320, 49407]])).shape
    (1, 3, 512)
    """

    def call(self, inputs, training=None):
        if not training or not switches.needs_dense_lookup_gradient() or self.quantization_mode is not None:
            return super().call(inputs)
        if inputs.dtype not in ("int32", "int64"):
            inputs = ops.cast(inputs, "int32")
        table = ops.where(True, self.embeddings, ops.zeros((), self.embeddings.dtype))
        return ops.cast(ops.take(table, inputs, axis=0), dtype=self.compute_dtype)

