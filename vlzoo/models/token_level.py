"""`TokenContrastiveModel`: the shared base of the token-level families (FILIP, SPARC)."""

import keras
from keras import ops

from vlzoo.models.base import ContrastiveModel


def masked_mean(tokens, mask):
    """Mean of `tokens` `(B, T, D)` over the positions where `mask` `(B, T)` is True."""
    weights = ops.cast(mask, tokens.dtype)[..., None]
    return ops.sum(tokens * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1.0)


def token_projection(units, input_dim, use_bias, dtype, name):
    """A built `Dense(units)` applied to every token (CLIP-style init, std `input_dim**-0.5`)."""
    layer = keras.layers.Dense(
        units, use_bias=use_bias, dtype=dtype, name=name,
        kernel_initializer=keras.initializers.RandomNormal(stddev=input_dim**-0.5),
    )
    layer.build((None, None, input_dim))
    return layer


class TokenContrastiveModel(ContrastiveModel):
    """Towers without their own projection; every token projected to `embed_dim`.

    Subclasses add their global image embedding (`_image_features` returning
    `{"embeds", "tokens"}`), may change the text pooling (`_pool_text`), and
    implement `score` and `contrastive_loss` as any family.

    `encode_image` returns `{"embeds": (B, D), "tokens": (B, P, D)}` and
    `encode_text` `{"embeds": (B, D), "tokens": (B, T, D), "mask": (B, T)}`;
    `normalize=True` normalises the global embeddings and every token.

    Args:
        vision, text, embed_dim, init_logit_scale: as `ContrastiveModel`.
        projection_bias: bias in the token projections (CLIP-style: none).
    """

    image_embedding_keys = ("embeds", "tokens")
    text_embedding_keys = ("embeds", "tokens", "mask")
    image_tower_keys = ("tokens",)
    text_tower_keys = ("tokens",)
    normalized_keys = ("embeds", "tokens")

    def __init__(self, vision, text, embed_dim, projection_bias=False, **kwargs):
        super().__init__(vision, text, embed_dim, **kwargs)
        self.projection_bias = projection_bias

    def _build_token_projections(self):
        """Creates `image_projection` and `text_projection` (after any family head)."""
        self.image_projection = token_projection(
            self.embed_dim, self.vision.hidden_dim, self.projection_bias, self.dtype_policy, "image_projection")
        self.text_projection = token_projection(
            self.embed_dim, self.text.hidden_dim, self.projection_bias, self.dtype_policy, "text_projection")

    def _pool_text(self, tokens, mask):
        return masked_mean(tokens, mask)

    def _text_features(self, inputs, training=None):
        mask = ops.cast(self._padding_mask(inputs), "bool")
        tokens = self.text_projection(self._text_tower(inputs, training=training, mask=mask)["tokens"])
        return {"embeds": self._pool_text(tokens, mask), "tokens": tokens, "mask": mask}

    def get_config(self):
        config = super().get_config()
        config.update(projection_bias=self.projection_bias)
        return config
