"""CLIP (Radford et al., 2021): softmax contrastive learning of image and text towers."""

import math

import keras

from vlzoo.losses import clip_logits, clip_loss
from vlzoo.models.base import ContrastiveModel, shapes_preset
from vlzoo.tokenizers import CLIP_BPE



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
        return clip_logits(image_embeds, text_embeds, self.logit_scale_value())

    def contrastive_loss(self, outputs, training=False):
        return clip_loss(outputs["image_embeds"], outputs["text_embeds"], outputs["logit_scale"])


def clip_config(patch, vision_width, vision_layers, vision_heads, text_width, text_heads, embed_dim, image_size=224):
    """Constructor arguments of an OpenAI-geometry CLIP (QuickGELU, vocabulary 49408, context 77, MLP 4x)."""
    return dict(
        vision=dict(
            image_size=image_size, patch_size=patch, hidden_dim=vision_width,
            num_layers=vision_layers, num_heads=vision_heads,
            intermediate_dim=4 * vision_width, activation="quick_gelu",
        ),
        text=dict(
            vocabulary_size=49408, sequence_length=77, hidden_dim=text_width, num_layers=12,
            num_heads=text_heads, intermediate_dim=4 * text_width, activation="quick_gelu",
        ),
        embed_dim=embed_dim,
    )


_OPENAI = dict(
    paper="Radford et al. 2021, Learning Transferable Visual Models From Natural Language Supervision",
    weights_note="Architecture only (random initialisation). Real weights of this geometry load by name: "
    "`vlzoo list --pretrained` (OpenAI, LAION-2B and DataComp checkpoints, e.g. `clip_vit_b16_openai`), "
    "or convert a local checkpoint with `vlzoo.convert`.",
)

PRESETS = {
    "clip_vit_b32": dict(
        config=clip_config(32, 768, 12, 12, 512, 8, 512),
        description="CLIP ViT-B/32 (OpenAI geometry, QuickGELU), 224 px, context 77.",
        tokenizer=CLIP_BPE, preprocessor=dict(image_size=224), **_OPENAI,
    ),
    "clip_vit_b16": dict(
        config=clip_config(16, 768, 12, 12, 512, 8, 512),
        description="CLIP ViT-B/16 (OpenAI geometry, QuickGELU), 224 px, context 77.",
        tokenizer=CLIP_BPE, preprocessor=dict(image_size=224), **_OPENAI,
    ),
    "clip_vit_l14": dict(
        config=clip_config(14, 1024, 24, 16, 768, 12, 768),
        description="CLIP ViT-L/14 (OpenAI geometry, QuickGELU), 224 px, context 77.",
        tokenizer=CLIP_BPE, preprocessor=dict(image_size=224), **_OPENAI,
    ),
    "clip_tiny": dict(
        config=dict(
            vision=dict(
                image_size=32, patch_size=8, hidden_dim=32, num_layers=2, num_heads=4,
                intermediate_dim=64, activation="quick_gelu",
            ),
            text=dict(
                vocabulary_size=49408, sequence_length=16, hidden_dim=32, num_layers=2,
                num_heads=4, intermediate_dim=64, activation="quick_gelu",
            ),
            embed_dim=24,
        ),
        description="Tiny CLIP for tests and examples (32 px, 2+2 layers, width 32).",
        tokenizer=CLIP_BPE, preprocessor=dict(image_size=32),
        paper=_OPENAI["paper"], weights_note="Random initialisation; for tests.",
    ),
    "clip_shapes": shapes_preset(
        "CLIP", dict(vision=dict(activation="quick_gelu"), text=dict(activation="quick_gelu"), embed_dim=64),
        paper=_OPENAI["paper"], tokenizer=CLIP_BPE, details="QuickGELU, embed 64; CLIP BPE",
    ),
}
