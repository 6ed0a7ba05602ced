"""SigLIP (Zhai et al., 2023): pairwise sigmoid loss for image-text pre-training."""

import math

import keras
from keras import ops

from vlzoo.losses import siglip_logits, siglip_loss, siglip_loss_chunked
from vlzoo.models.base import ContrastiveModel, shapes_preset
from vlzoo.tokenizers import CLIP_BPE


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
        loss_num_chunks: when set, the loss is computed over this many text
            chunks (same value, memory linear in the batch).
    """

    family = "siglip"
    vision_defaults = dict(
        num_prefix_tokens=0, pooling="map", use_pre_norm=False, patch_bias=True,
        projection_bias=True, layer_norm_epsilon=1e-6, activation="gelu", pos_init_std=0.02,
    )
    text_defaults = dict(
        causal=False, pooling="last", projection_bias=True, layer_norm_epsilon=1e-6, activation="gelu",
    )

    def __init__(
        self, vision, text, embed_dim=768, init_logit_scale=math.log(10.0), init_logit_bias=-10.0,
        loss_num_chunks=None, **kwargs,
    ):
        super().__init__(vision, text, embed_dim, init_logit_scale=init_logit_scale, **kwargs)
        self.init_logit_bias = init_logit_bias
        self.loss_num_chunks = loss_num_chunks
        self.logit_bias = self.add_weight(
            name="logit_bias", shape=(), dtype="float32", autocast=False,
            initializer=keras.initializers.Constant(init_logit_bias),
        )

    def call(self, inputs, training=False):
        outputs = super().call(inputs, training=training)
        outputs["logit_bias"] = ops.convert_to_tensor(self.logit_bias)
        return outputs

    def score(self, image_embeds, text_embeds):
        return siglip_logits(image_embeds, text_embeds, self.logit_scale_value(), self.logit_bias)

    def contrastive_loss(self, outputs, training=False):
        args = (outputs["image_embeds"], outputs["text_embeds"], outputs["logit_scale"], outputs["logit_bias"])
        if self.loss_num_chunks:
            return siglip_loss_chunked(*args, num_chunks=self.loss_num_chunks)
        return siglip_loss(*args)

    def get_config(self):
        config = super().get_config()
        config.update(init_logit_bias=self.init_logit_bias, loss_num_chunks=self.loss_num_chunks)
        return config


def _siglip_config(image_size, patch, width, layers, heads, mlp_dim, vocabulary_size, sequence_length):
    return dict(
        vision=dict(
            image_size=image_size, patch_size=patch, hidden_dim=width, num_layers=layers,
            num_heads=heads, intermediate_dim=mlp_dim, output_dim=None,
        ),
        text=dict(
            vocabulary_size=vocabulary_size, sequence_length=sequence_length, hidden_dim=width,
            num_layers=layers, num_heads=heads, intermediate_dim=mlp_dim,
        ),
        embed_dim=width,
    )


_SIGLIP = dict(
    paper="Zhai et al. 2023, Sigmoid Loss for Language Image Pre-Training",
    preprocessor_stats=dict(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)),
)

def _b16_preset(vocabulary_size, description, tokenizer_note, paper, weights):
    """A ViT-B/16 SigLIP architecture preset (224 px, context 64) whose SentencePiece model is not bundled."""
    return dict(
        config=_siglip_config(224, 16, 768, 12, 12, 3072, vocabulary_size, 64),
        description=description,
        tokenizer=dict(class_name="SentencePieceTokenizer", assets=None, note=tokenizer_note),
        preprocessor=dict(image_size=224, **_SIGLIP["preprocessor_stats"]),
        paper=paper,
        weights_note=f"Architecture only (random initialisation). Real weights: {weights}.",
    )


PRESETS = {
    "siglip_vit_b16": _b16_preset(
        32000,
        description="SigLIP ViT-B/16 (open_clip ViT-B-16-SigLIP geometry: MAP head, 768 embed, "
        "bidirectional text, vocabulary 32000, context 64, LayerNorm eps 1e-6).",
        tokenizer_note="SigLIP's 32k SentencePiece model cannot be bundled offline; place it at "
        "assets/tokenizer/spiece.model of a saved preset or set `model.tokenizer`.",
        paper=_SIGLIP["paper"],
        weights="the pretrained preset `siglip_vit_b16_webli` (downloaded on first use), or convert a local "
        "checkpoint with `vlzoo.convert`",
    ),
    "siglip2_vit_b16": _b16_preset(
        256000,
        description="SigLIP 2 ViT-B/16 at fixed resolution (224 px): SigLIP's B/16 towers with Gemma's "
        "256k-token vocabulary, context 64 (keras-hub siglip2_base_patch16_224: 375,188,230 parameters).",
        tokenizer_note="SigLIP 2's 256k SentencePiece model (Gemma's) cannot be bundled offline; the pretrained "
        "preset `siglip2_vit_b16_webli` brings its own.",
        paper="Tschannen et al. 2025, SigLIP 2: Multilingual Vision-Language Encoders with Improved Semantic "
        "Understanding, Localization, and Dense Features",
        weights="the pretrained preset `siglip2_vit_b16_webli` (keras-hub's, downloaded from Kaggle on first use)",
    ),
    "siglip_tiny": dict(
        config=_siglip_config(32, 8, 32, 2, 4, 64, 49408, 16),
        description="Tiny SigLIP for tests and examples (32 px, 2+2 layers, width 32; CLIP BPE "
        "tokenizer in place of SigLIP's SentencePiece).",
        tokenizer=CLIP_BPE,
        preprocessor=dict(image_size=32, **_SIGLIP["preprocessor_stats"]),
        paper=_SIGLIP["paper"],
        weights_note="Random initialisation; for tests.",
    ),
    "siglip_shapes": shapes_preset(
        "SigLIP", dict(vision=dict(output_dim=None), embed_dim=64), paper=_SIGLIP["paper"], tokenizer=CLIP_BPE,
        details="MAP head, embed 64; CLIP BPE", preprocessor=_SIGLIP["preprocessor_stats"],
    ),
}
