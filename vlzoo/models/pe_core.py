"""PE-Core (Bolya et al., 2025, Perception Encoder): CLIP with a rotary vision tower pooled by attention."""

import math

import keras

from vlzoo.families import Family, register_family
from vlzoo.models.clip import CLIP


@keras.saving.register_keras_serializable(package="vlzoo")
class PECore(CLIP):
    """PE-Core: CLIP's loss and text tower; a ViT with a 2D rotary embedding and an attention-pooling head.

    The vision tower adds a 2D RoPE of the patch tokens (theta 10000, the class token unrotated) to every
    attention on top of the learned position embedding, keeps `ln_pre`, normalises every token at the
    end and pools them (class token included) with an 8-head MAP head, then projects with a bias. The
    text tower is CLIP's (causal, end-token pooling, context 32 or 72). Exact GELU and LayerNorm
    epsilon 1e-5 in both; score and loss are CLIP's (`logit_scale * cos`, symmetric InfoNCE).
    Defaults follow open_clip's `PE-Core-*` models (timm's `vit_pe_core_*` image towers).

    Args:
        vision: `VisionTransformer` arguments (`rotary_theta`, `map_num_heads` and the MAP pooling are
            the family's defaults).
        text: `TextTransformer` arguments.
        embed_dim: shared embedding width.
        init_logit_scale: initial log-scale, `ln(1 / 0.07)`.

    Example:
    >>> model = vlzoo.from_preset("pe_core_tiny")
    >>> model.similarity(images, model.tokenizer(["a red circle"])).shape
    (B, 1)
    """

    family = "pe_core"
    accepts_patch_batches = True  # the pooled vector is the embedding (the rotary tower itself refuses NaFlex)
    vision_defaults = dict(
        num_prefix_tokens=1, pooling="map", use_pre_norm=True, patch_bias=False, projection_bias=True,
        layer_norm_epsilon=1e-5, activation="gelu", rotary_theta=10000.0, map_num_heads=8,
    )
    text_defaults = dict(
        causal=True, pooling="eot", projection_bias=False, layer_norm_epsilon=1e-5, activation="gelu",
    )

    def __init__(self, vision, text, embed_dim=1024, init_logit_scale=math.log(1 / 0.07), **kwargs):
        super().__init__(vision, text, embed_dim, init_logit_scale=init_logit_scale, **kwargs)

    has_dense_embeddings = True

    def _dense_image_features(self, images):
        """The patch tokens `(B, P, embed_dim)` after the tower's final LayerNorm, class token left out, through
        the projection (weights and bias) that maps the attention pool's output to the global embedding: the
        patch features zero-shot segmentation and grounding compare with texts by cosine.

        >>> model = vlzoo.from_preset("pe_core_tiny")
        >>> model.dense_image_embeddings(images).shape  # doctest: +SKIP
        (B, (H / p) * (W / p), embed_dim)
        """
        vision = self.vision
        return vision.projection(vision(images)["tokens"][:, vision.num_prefix_tokens:])


register_family(Family("pe_core", PECore, score_loss="softmax"))
