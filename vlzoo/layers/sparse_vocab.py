"""STAIR's token projection head: per-position vocabulary logits pooled into a sparse vector."""

import keras
from keras import ops

from vlzoo.losses.stair import stair_head_pool


@keras.saving.register_keras_serializable(package="vlzoo")
class SparseVocabHead(keras.layers.Layer):
    """BERT's MLM prediction head with a tied decoder, max-pooled over positions (STAIR eq. 4-5).

    Per position `j`: `u_j = LayerNorm(GELU(W h_j + c))` (exact erf GELU),
    then `u_j <- u_j P` when the token width differs from the embedding
    width (the image-side bridge, bias-free), then
    `p(h_j) = u_j E^T + b` with `E` the text token-embedding table, passed
    at call time so that the decoder *is* the text tower's variable (no
    parameters of its own for it). The output is
    `ENC = log1p(relu(max_{j real} p(h_j)))` (`vlzoo.losses.stair_pool`),
    computed by `vlzoo.losses.stair.stair_head_pool` in `num_chunks`
    vocabulary blocks without materialising the `(B, S, V)` logits.

    Args:
        input_dim: token width `d_h` of the tower (768 for ViT-B, 512 for the text).
        embedding_dim: width `d_e` of the token-embedding table; a bias-free
            `d_h -> d_e` bridge is added when it differs from `input_dim`.
        vocabulary_size: `V`, the number of rows of the table and of the bias.
        layer_norm_epsilon: epsilon of the head's LayerNorm (1e-5, our choice).
        num_chunks: static number of vocabulary blocks (None: one block).
        remat: rematerialise each block in the backward pass.

    Call arguments:
        tokens: `(B, S, input_dim)` tower outputs.
        embeddings: `(V, embedding_dim)` decoder table.
        mask: optional `(B, S)` bool, True = real position.

    Returns:
        `(B, V)` float32 sparse embeddings (`>= 0`).

    Example:
    >>> head = SparseVocabHead(32, 16, 100)
    >>> table = keras.ops.ones((100, 16))
    >>> head(keras.ops.ones((2, 5, 32)), table).shape
    (2, 100)
    """

    def __init__(self, input_dim, embedding_dim, vocabulary_size, layer_norm_epsilon=1e-5, num_chunks=None,
                 remat=True, **kwargs):
        super().__init__(**kwargs)
        self.input_dim = input_dim
        self.embedding_dim = embedding_dim
        self.vocabulary_size = vocabulary_size
        self.layer_norm_epsilon = layer_norm_epsilon
        self.num_chunks = num_chunks
        self.remat = remat
        dtype = self.dtype_policy
        # BERT's initialisation of the transform (normal, std 0.02).
        self.transform = keras.layers.Dense(
            input_dim, dtype=dtype, name="transform",
            kernel_initializer=keras.initializers.RandomNormal(stddev=0.02),
        )
        self.norm = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=dtype, name="norm")
        self.bridge = (
            keras.layers.Dense(
                embedding_dim, use_bias=False, dtype=dtype, name="bridge",
                kernel_initializer=keras.initializers.RandomNormal(stddev=input_dim**-0.5),
            )
            if input_dim != embedding_dim else None
        )

    def build(self, input_shape=None):
        shape = (None, None, self.input_dim)
        self.transform.build(shape)
        self.norm.build(shape)
        if self.bridge is not None:
            self.bridge.build(shape)
        self.bias = self.add_weight(name="bias", shape=(self.vocabulary_size,), initializer="zeros")
        self.built = True

    def features(self, tokens):
        """`LayerNorm(GELU(W h + c))` (then the bridge): `(B, S, input_dim)` -> `(B, S, embedding_dim)`."""
        x = self.norm(ops.gelu(self.transform(tokens), approximate=False))
        return self.bridge(x) if self.bridge is not None else x

    def logits(self, tokens, embeddings):
        """The per-position vocabulary logits `p(h_j)`, `(B, S, V)` float32 (materialised)."""
        x = self.features(tokens)
        return ops.cast(ops.matmul(x, ops.transpose(ops.cast(embeddings, x.dtype))), "float32") + self.bias

    def call(self, tokens, embeddings, mask=None):
        return stair_head_pool(self.features(tokens), embeddings, self.bias, mask=mask,
                               num_chunks=self.num_chunks, remat=self.remat)

    def get_config(self):
        config = super().get_config()
        config.update(
            input_dim=self.input_dim, embedding_dim=self.embedding_dim, vocabulary_size=self.vocabulary_size,
            layer_norm_epsilon=self.layer_norm_epsilon, num_chunks=self.num_chunks, remat=self.remat,
        )
        return config
