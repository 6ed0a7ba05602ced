"""Llip's text-conditioned cross-attention over the visual mixture tokens."""

import keras
from keras import ops

from vlzoo.layers.contraction import float32_einsum
from vlzoo.losses.llip import llip_contextualize


def _check_features(x, name, layout, width):
    shape = tuple(x.shape)
    if len(shape) != len(width) or any(
            a is not None and b is not None and a != b
            for a, b in zip(shape, width)):
        expected = "(" + ", ".join("?" if d is None else str(d) for d in width) + ")"
        raise ValueError(
            f"`{name}` must have shape {layout} = {expected}; received {shape}."
        )


@keras.saving.register_keras_serializable(package="vlzoo")
class LlipCrossAttention(keras.layers.Layer):
    """Llip's head: text queries attend over the K visual mixture tokens.

    Follows the authors' `CMP`/`xAttnPred` (facebookresearch/Llip): every
    projection is a bare matrix (no bias), and each mixture token `k` has
    its own key and value matrix:

        Q = LN_Q(g @ W_Q)                (N_T, D) -> heads (N_T, M, d_h)
        K[i, k] = LN_K(h_i^k @ W_K[k])   (N_I, K, D) -> (N_I, K, M, d_h)
        V[i, k] = LN_V(h_i^k @ W_V[k])
        z[i, j] = concat_m(sum_k softmax_k(Q[j, m] . K[i, k, m] / tau)
                           V[i, k, m]) @ W_O

    Heads are contiguous blocks of `d_h = D / M` channels. The LayerNorms
    (`use_qkv_norm`, over the full D before the head split) are off for the
    B and L presets and on for H and G. No `1 / sqrt(d_h)` scaling: `tau`
    alone scales the attention logits. `W_O` is folded into the values per
    image (`image_keys_values`), so each (image, text) pair costs
    `K * M * D` multiply-adds for the mixing.

    Weights: `q_proj (text_dim, D)`, `k_proj` and `v_proj
    (num_tokens, vision_dim, D)`, `out_proj (D, D)`, initialised as the
    authors (normal, std `text_dim**-0.5`, `vision_dim**-0.5` and `D**-0.5`).

    Args:
        num_tokens: number K of mixture tokens.
        vision_dim: width `W_v` of the mixture tokens.
        text_dim: width `W_t` of the pooled text feature.
        embed_dim: joint width D.
        num_heads: heads M (8 in every Llip model); must divide D.
        temperature: default `tau` (5 in the paper; the L/14 model uses 1);
            a call-time argument overrides it.
        use_qkv_norm: affine LayerNorms on Q, K and V (the authors'
            `use_norm`), default False.
        layer_norm_epsilon: epsilon of those LayerNorms (torch's 1e-5).

    Call arguments:
        mixture_tokens: `(N_I, K, vision_dim)` mixture-token outputs of the
            ViT (after its final LayerNorm).
        text_features: `(N_T, text_dim)` pooled text features `g`.
        temperature: optional `tau` overriding the default.

    Returns:
        `(N_I, N_T, D)`: the image embedding of every (image, text) pair,
        unnormalised.

    Raises:
        ValueError: `num_heads` not dividing `embed_dim`, `temperature <= 0`, `num_tokens < 1`,
            or call inputs not of the shapes above.

    Example:
    >>> head = LlipCrossAttention(4, 32, 24, 16, num_heads=2)
    >>> head(keras.ops.ones((3, 4, 32)), keras.ops.ones((5, 24))).shape
    (3, 5, 16)
    """

    def __init__(
        self, num_tokens, vision_dim, text_dim, embed_dim, num_heads=8,
        temperature=5.0, use_qkv_norm=False, layer_norm_epsilon=1e-5,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if embed_dim % num_heads:
            raise ValueError(
                f"`num_heads` ({num_heads}) must divide `embed_dim` "
                f"({embed_dim})."
            )
        if not temperature > 0:
            raise ValueError(
                f"`temperature` must be > 0; received {temperature!r}.")
        if num_tokens < 1:
            raise ValueError(
                f"`num_tokens` must be >= 1; received {num_tokens!r}.")
        self.num_tokens = num_tokens
        self.vision_dim = vision_dim
        self.text_dim = text_dim
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.temperature = temperature
        self.use_qkv_norm = use_qkv_norm
        self.layer_norm_epsilon = layer_norm_epsilon
        norm = dict(epsilon=layer_norm_epsilon, dtype=self.dtype_policy)
        self.q_norm, self.k_norm, self.v_norm = (
            keras.layers.LayerNormalization(name=f"{key}_norm", **norm)
            if use_qkv_norm else None
            for key in ("q", "k", "v")
        )

    def build(self, input_shape=None):
        def normal(std):
            return keras.initializers.RandomNormal(stddev=std)

        d, kv = self.embed_dim, (self.num_tokens, self.vision_dim,
                                 self.embed_dim)
        self.q_proj = self.add_weight(
            name="q_proj", shape=(self.text_dim, d),
            initializer=normal(self.text_dim**-0.5))
        self.k_proj = self.add_weight(
            name="k_proj", shape=kv, initializer=normal(self.vision_dim**-0.5))
        self.v_proj = self.add_weight(
            name="v_proj", shape=kv, initializer=normal(self.vision_dim**-0.5))
        self.out_proj = self.add_weight(
            name="out_proj", shape=(d, d), initializer=normal(d**-0.5))
        for norm in (self.q_norm, self.k_norm, self.v_norm):
            if norm is not None:
                norm.build((None, d))
        self.built = True

    @staticmethod
    def _weight(variable, dtype):
        # Cast only when needed: reading an uninitialised variable with
        # symbolic inputs (abstract builds) would allocate it.
        if keras.backend.standardize_dtype(dtype) == variable.dtype:
            return variable
        return ops.cast(variable, dtype)

    @staticmethod
    def _norm(norm, x):
        return x if norm is None else norm(x)

    def _split_heads(self, x):
        return ops.reshape(
            x, tuple(ops.shape(x)[:-1]) + (self.num_heads, self.head_dim))

    def text_queries(self, text_features):
        """`(N_T, text_dim)` pooled text features -> `(N_T, M, d_h)` queries."""
        _check_features(text_features, "text_features", "(N_T, text_dim)",
                        (None, self.text_dim))
        q = ops.matmul(text_features, self._weight(self.q_proj, text_features.dtype))
        return self._split_heads(self._norm(self.q_norm, q))

    def image_keys_values(self, mixture_tokens):
        """Keys and folded values of the mixture tokens.

        Args:
            mixture_tokens: `(N_I, K, vision_dim)`.

        Returns:
            `(keys, values)`: `(N_I, K, M, d_h)` and `(N_I, K, M, D)`, where
            `values[i, k, m] = V[i, k, m] @ W_O[m * d_h:(m + 1) * d_h]`.
        """
        _check_features(mixture_tokens, "mixture_tokens",
                        "(N_I, num_tokens, vision_dim)",
                        (None, self.num_tokens, self.vision_dim))
        dtype = mixture_tokens.dtype

        def contract(subscripts, x, weight):
            return ops.cast(float32_einsum(subscripts, x, weight), dtype)

        keys = contract("ikw,kwd->ikd", mixture_tokens, self._weight(self.k_proj, dtype))
        values = contract("ikw,kwd->ikd", mixture_tokens, self._weight(self.v_proj, dtype))
        keys = self._split_heads(self._norm(self.k_norm, keys))
        values = self._split_heads(self._norm(self.v_norm, values))
        out = ops.reshape(self._weight(self.out_proj, dtype), (self.num_heads, self.head_dim, self.embed_dim))
        return keys, contract("ikmd,mde->ikme", values, out)

    def call(self, mixture_tokens, text_features, temperature=None):
        keys, values = self.image_keys_values(mixture_tokens)
        tau = self.temperature if temperature is None else temperature
        return llip_contextualize(self.text_queries(text_features), keys,
                                  values, tau)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_tokens=self.num_tokens, vision_dim=self.vision_dim,
            text_dim=self.text_dim, embed_dim=self.embed_dim,
            num_heads=self.num_heads, temperature=self.temperature,
            use_qkv_norm=self.use_qkv_norm,
            layer_norm_epsilon=self.layer_norm_epsilon,
        )
        return config
