"""Pooling heads and projections."""

import keras
from keras import ops

from vlzoo.layers.transformer import MLP, MultiHeadAttention


@keras.saving.register_keras_serializable(package="vlzoo")
class MAPHead(keras.layers.Layer):
    """Multihead attention pooling (SigLIP's MAP head, timm's `AttentionPoolLatent`).

    A learned latent query attends over all tokens; the result passes
    through an output projection and a residual pre-LN MLP.

    Args:
        hidden_dim: token width D.
        num_heads: attention heads.
        intermediate_dim: MLP inner width.
        activation: MLP activation.
        layer_norm_epsilon: epsilon of the MLP's LayerNorm.

    Call: tokens `(B, N, D)` -> pooled `(B, D)`; with `token_mask` (bool
    `(B, N)`, True = a real token) the latent attends only to the real tokens.
    """

    def __init__(self, hidden_dim, num_heads, intermediate_dim, activation="gelu", layer_norm_epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.activation = activation
        self.layer_norm_epsilon = layer_norm_epsilon
        self.attention = MultiHeadAttention(hidden_dim, num_heads, dtype=self.dtype_policy, name="attention")
        self.norm = keras.layers.LayerNormalization(epsilon=layer_norm_epsilon, dtype=self.dtype_policy, name="norm")
        self.mlp = MLP(hidden_dim, intermediate_dim, activation, dtype=self.dtype_policy, name="mlp")

    def build(self, input_shape):
        self.latent = self.add_weight(
            name="latent", shape=(1, 1, self.hidden_dim),
            initializer=keras.initializers.TruncatedNormal(stddev=self.hidden_dim**-0.5),
        )
        self.attention.build((input_shape[0], 1, self.hidden_dim), input_shape)
        self.norm.build((input_shape[0], 1, self.hidden_dim))
        self.mlp.build((input_shape[0], 1, self.hidden_dim))
        self.built = True

    def call(self, tokens, token_mask=None):
        batch = ops.shape(tokens)[0]
        query = ops.broadcast_to(ops.cast(self.latent, tokens.dtype), (batch, 1, self.hidden_dim))
        x = self.attention(query, context=tokens, attention_mask=None if token_mask is None else token_mask[:, None, :])
        x = x + self.mlp(self.norm(x))
        return x[:, 0]

    def get_config(self):
        config = super().get_config()
        config.update(
            hidden_dim=self.hidden_dim, num_heads=self.num_heads,
            intermediate_dim=self.intermediate_dim, activation=self.activation,
            layer_norm_epsilon=self.layer_norm_epsilon,
        )
        return config
