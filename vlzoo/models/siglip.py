"""SigLIP (Zhai et al., 2023): pairwise sigmoid loss for image-text pre-training."""

import math

import keras
from keras import ops

from vlzoo.families import Family, register_family
from vlzoo.losses import siglip_logits, siglip_loss
from vlzoo.losses._chunking import check_positive_int
from vlzoo.models.base import ContrastiveModel


@keras.saving.register_keras_serializable(package="vlzoo")
class SigLIP(ContrastiveModel):
    """SigLIP: ViT with a MAP head (no CLS token), bidirectional text tower pooled at the last position.

    Score: `logit_scale * cos(image, text) + logit_bias`; loss: sigmoid over
    all pairs (`vlzoo.losses.siglip_loss`). Defaults follow open_clip's
    `ViT-B-16-SigLIP` (timm tower: patch bias, no `ln_pre`, LayerNorm epsilon
    1e-6, exact GELU; text projection with bias).

    Args:
        vision: `VisionTransformer` arguments.
        text: `TextTransformer` arguments.
        embed_dim: shared embedding width.
        init_logit_scale: initial log-scale, `ln(10)`.
        init_logit_bias: initial bias, -10.
        num_chunks: None computes the loss's `(B, B)` logits at once; a
            python int computes the loss in at most `num_chunks` blocks of
            texts (the same value; `B * ceil(B / num_chunks)` logits per
            block), the batch size possibly unknown while tracing.

    Raises:
        ValueError: `num_chunks` not None or a python int >= 1.
    """

    family = "siglip"
    accepts_patch_batches = True  # the pooled vector is the embedding (SigLIP 2 NaFlex)
    vision_defaults = dict(
        num_prefix_tokens=0, pooling="map", use_pre_norm=False, patch_bias=True,
        projection_bias=True, layer_norm_epsilon=1e-6, activation="gelu", pos_init_std=0.02,
    )
    text_defaults = dict(
        causal=False, pooling="last", projection_bias=True, layer_norm_epsilon=1e-6, activation="gelu",
    )

    def __init__(
        self, vision, text, embed_dim=768, init_logit_scale=math.log(10.0), init_logit_bias=-10.0,
        num_chunks=None, **kwargs,
    ):
        super().__init__(vision, text, embed_dim, init_logit_scale=init_logit_scale, **kwargs)
        check_positive_int(num_chunks, "num_chunks")
        self.init_logit_bias = init_logit_bias
        self.num_chunks = num_chunks
        self.logit_bias = self.add_weight(
            name="logit_bias", shape=(), dtype="float32", autocast=False,
            initializer=keras.initializers.Constant(init_logit_bias),
        )

    def call(self, inputs, training=False):
        outputs = super().call(inputs, training=training)
        outputs["logit_bias"] = ops.convert_to_tensor(self.logit_bias)
        return outputs

    def score(self, image_embeds, text_embeds):
        """`exp(logit_scale) * cos + logit_bias` of the global embeddings, `(N_images, N_texts)` float32."""
        image, text = self.check_embeds(image_embeds, "image"), self.check_embeds(text_embeds, "text")
        return siglip_logits(image["embeds"], text["embeds"], self.logit_scale_value(), self.logit_bias)

    replica_local_outputs = ("image_embeds",)

    def contrastive_loss(self, outputs, rows=None, training=False):
        """The sigmoid loss over all pairs, in `num_chunks` blocks of texts if set; with `rows`, this replica's
        images (the only ones `image_embeds` then holds) against every text."""
        args = (outputs["image_embeds"], outputs["text_embeds"], outputs["logit_scale"], outputs["logit_bias"])
        return siglip_loss(*args, rows=rows, num_chunks=self.num_chunks)

    def get_config(self):
        config = super().get_config()
        config.update(init_logit_bias=self.init_logit_bias, num_chunks=self.num_chunks)
        return config


register_family(Family("siglip", SigLIP, score_loss="sigmoid"))
