"""CLIP (Radford et al., 2021): softmax contrastive learning of image and text towers."""

import math

import keras

from vlzoo.families import Family, register_family
from vlzoo.losses import clip_logits, clip_loss
from vlzoo.models.base import ContrastiveModel



@keras.saving.register_keras_serializable(package="vlzoo")
class CLIP(ContrastiveModel):
    """CLIP: ViT with CLS pooling, causal text transformer with end-token pooling.

    Score: `logit_scale * cos(image, text)`; loss: symmetric InfoNCE
    (`vlzoo.losses.clip_loss`). Defaults follow open_clip's ViT models
    (LayerNorm epsilon 1e-5, `ln_pre`, patch and projections without bias);
    OpenAI's weights use QuickGELU (`activation="quick_gelu"` in both towers).

    Args:
        vision: `VisionTransformer` arguments.
        text: `TextTransformer` arguments.
        embed_dim: shared embedding width.
        init_logit_scale: initial log-scale, `ln(1 / 0.07)`.

    Example:
    >>> model = vlzoo.from_preset("clip_tiny")
    >>> model.similarity(images, model.tokenizer(["a red circle"])).shape
    (B, 1)
    """

    family = "clip"
    accepts_patch_batches = True  # the pooled vector is the embedding
    vision_defaults = dict(
        num_prefix_tokens=1, pooling="cls", use_pre_norm=True, patch_bias=False,
        projection_bias=False, layer_norm_epsilon=1e-5,
    )
    text_defaults = dict(
        causal=True, pooling="eot", projection_bias=False, layer_norm_epsilon=1e-5,
    )

    def __init__(self, vision, text, embed_dim=512, init_logit_scale=math.log(1 / 0.07), **kwargs):
        super().__init__(vision, text, embed_dim, init_logit_scale=init_logit_scale, **kwargs)

    def score(self, image_embeds, text_embeds):
        """`exp(logit_scale) * cos` of the global embeddings, `(N_images, N_texts)` float32."""
        image, text = self.check_embeds(image_embeds, "image"), self.check_embeds(text_embeds, "text")
        return clip_logits(image["embeds"], text["embeds"], self.logit_scale_value())

    def contrastive_loss(self, outputs, rows=None, training=False):
        """Symmetric InfoNCE; with `rows`, those images and texts against every text and image (open_clip's
        `local_loss`)."""
        args = (outputs["image_embeds"], outputs["text_embeds"], outputs["logit_scale"])
        return clip_loss(*args, rows=rows)


register_family(Family("clip", CLIP, score_loss="softmax"))
