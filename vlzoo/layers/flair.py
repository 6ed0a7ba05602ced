"""FLAIR's text-conditioned attention pooling of the image's patch tokens."""

import keras
from keras import ops

from vlzoo.layers.contraction import float32_einsum


def _check_last_axis(x, name, layout, width, rank):
    shape = tuple(x.shape)
    if len(shape) != rank or (shape[-1] is not None and shape[-1] != width):
        raise ValueError(f"`{name}` must have shape {layout} with D = {width}; received {shape}.")


@keras.saving.register_keras_serializable(package="vlzoo")
class TextConditionedPooling(keras.layers.Layer):
    """FLAIR's head: a caption's embedding attends over one image's patch tokens.

    Follows the authors' `PureAttentionPoolingBlock` (ExplainableML/flair,
    `src/flair/transformer.py`): separate LayerNorms on the query, key and
    value inputs, then multi-head attention with biased projections and a
    zero key/value slot (torch's `add_zero_attn=True`):

        q = LN_q(t) @ W_q + b_q       t: the caption's projected embedding (D,)
        k = LN_k(x) @ W_k + b_k       x: the image's projected patch tokens (P, D)
        v = LN_v(x) @ W_v + b_v
        a_m = softmax([q_m . k_m,p / sqrt(d_h) for p in 1..P] + [0])   (P + 1 weights)
        z = concat_m(sum_p a_m,p v_m,p) @ W_o + b_o

    The extra logit 0 belongs to a key and value of zeros: it takes its share
    of the softmax and adds nothing, so an image can give a caption that
    matches none of its patches a small `z`. Heads are contiguous blocks of
    `d_h = D / M` channels.

    Weights: `q_norm`, `k_norm`, `v_norm` (LayerNorm over D, epsilon 1e-5);
    `query`, `key`, `value`, `output_dense` (`Dense(D)` with bias).

    Args:
        embed_dim: D, the width of the captions' and the tokens' embeddings.
        num_heads: M (8 in the released model); must divide D.
        layer_norm_epsilon: epsilon of the three LayerNorms (torch's 1e-5).

    Call arguments:
        texts: `(N, S, D)`: for each of N images, the S caption embeddings
            that query it.
        tokens: `(N, P, D)` patch tokens of the N images.

    Returns:
        `(N, S, D)`: the image's embedding conditioned on each caption,
        unnormalised.

    Raises:
        ValueError: `embed_dim` not a positive int, `num_heads` not a positive int dividing it, or
            call inputs not of the shapes above.

    Example:
    >>> pool = TextConditionedPooling(16, num_heads=4)
    >>> pool(keras.ops.ones((2, 5, 16)), keras.ops.ones((2, 9, 16))).shape
    (2, 5, 16)
    """

    def __init__(self, embed_dim, num_heads=8, layer_norm_epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        if isinstance(embed_dim, bool) or not isinstance(embed_dim, int) or embed_dim < 1:
            raise ValueError(f"`embed_dim` must be a positive integer; received {embed_dim!r}.")
        if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1 or embed_dim % num_heads:
            raise ValueError(f"`num_heads` must be a positive integer dividing `embed_dim` ({embed_dim}); "
                             f"received {num_heads!r}.")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.layer_norm_epsilon = layer_norm_epsilon
        self.q_norm, self.k_norm, self.v_norm = (
            keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name=f"{key}_norm")
            for key in ("q", "k", "v")
        )
        self.query, self.key, self.value = (
            keras.layers.Dense(embed_dim, kernel_initializer="glorot_uniform", dtype=self.dtype_policy, name=name)
            for name in ("query", "key", "value")
        )
        self.output_dense = keras.layers.Dense(embed_dim, dtype=self.dtype_policy, name="output_dense")

    def build(self, input_shape=None):
        for layer in (self.q_norm, self.k_norm, self.v_norm, self.query, self.key, self.value, self.output_dense):
            layer.build((None, self.embed_dim))
        self.built = True

    def _split_heads(self, x):
        return ops.reshape(x, tuple(ops.shape(x)[:-1]) + (self.num_heads, self.head_dim))

    def text_queries(self, texts):
        """`(..., D)` caption embeddings -> `(..., M, d_h)` queries, scaled by `d_h ** -0.5`."""
        _check_last_axis(texts, "texts", "(..., D)", self.embed_dim, len(texts.shape) or 1)
        queries = self._split_heads(self.query(self.q_norm(texts)))
        return queries * ops.cast(self.head_dim**-0.5, queries.dtype)

    def image_keys_values(self, tokens):
        """`(N, P, D)` patch tokens -> keys and values, each `(N, P, M, d_h)`."""
        _check_last_axis(tokens, "tokens", "(N, P, D)", self.embed_dim, 3)
        return self._split_heads(self.key(self.k_norm(tokens))), self._split_heads(self.value(self.v_norm(tokens)))

    def attention_weights(self, queries, keys):
        """Each query head's weights over the patches, float32 `(N, S, M, P)`.

        Args:
            queries: `(N, S, M, d_h)` from `text_queries` (S captions per image).
            keys: `(N, P, M, d_h)` from `image_keys_values`.

        Returns:
            The softmax over the P patches and the zero slot, the slot's share
            left out: a row sums to less than 1 by what the slot took.
        """
        logits = float32_einsum("nsmd,npmd->nsmp", queries, keys)
        zero_slot = ops.zeros(tuple(ops.shape(logits)[:-1]) + (1,), dtype=logits.dtype)
        return ops.softmax(ops.concatenate([logits, zero_slot], axis=-1), axis=-1)[..., :-1]

    def attend(self, queries, keys, values):
        """Pools each image's values for each of its queries.

        Args:
            queries: `(N, S, M, d_h)` from `text_queries` (S captions per image).
            keys, values: `(N, P, M, d_h)` from `image_keys_values`.

        Returns:
            `(N, S, D)`, unnormalised.
        """
        weights = self.attention_weights(queries, keys)
        mixed = ops.cast(float32_einsum("nsmp,npmd->nsmd", weights, values), values.dtype)
        return self.output_dense(ops.reshape(mixed, tuple(ops.shape(mixed)[:2]) + (self.embed_dim,)))

    def call(self, texts, tokens):
        _check_last_axis(texts, "texts", "(N, S, D)", self.embed_dim, 3)
        keys, values = self.image_keys_values(tokens)
        return self.attend(self.text_queries(texts), keys, values)

    def get_config(self):
        config = super().get_config()
        config.update(embed_dim=self.embed_dim, num_heads=self.num_heads,
                      layer_norm_epsilon=self.layer_norm_epsilon)
        return config
