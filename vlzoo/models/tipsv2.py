"""TIPSv2 (Google DeepMind; TIPS: Maninis et al. 2025): image-text pretraining with spatially aware patches."""

import math

import keras
from keras import ops

from vlzoo.families import Family, register_family
from vlzoo.losses import clip_logits, clip_loss
from vlzoo.models.clip import CLIP

# The temperature of each released size (`temperature_init_value` of its config; the checkpoints do not store
# it): the logits are `cos / temperature`.
TEMPERATURES = {"b14": 0.005065968260169029, "l14": 0.004785, "so400m14": 0.004638, "g14": 0.003623}


@keras.saving.register_keras_serializable(package="vlzoo")
class TIPSv2(CLIP):
    """TIPSv2: a DINOv2-style ViT with a register token and a bidirectional text tower, in one space without
    projections.

    The image tower is a ViT/14 with a biased patch projection, a class token with a learned position, one
    register token without one, LayerScale in every block (SwiGLU MLPs in g/14), no `ln_pre`, LayerNorm
    epsilon 1e-6; the image embedding is the class token after the final LayerNorm. The text tower scales
    the token embeddings by `sqrt(D)`, adds fixed sinusoidal positions, attends bidirectionally over the real
    tokens (ReLU MLPs, epsilon 1e-5) and averages them after the final LayerNorm. Both have the same width
    `D`, and the score is CLIP's, `cos / temperature` (`logit_scale = -ln(temperature)`, unbounded: the
    released temperatures put the multiplier at 197 to 276).

    TIPS supervises each image with two caption kinds: the class token with its web (alt-text) caption, the
    register token with a synthetic, spatially descriptive one. Inputs with `token_ids` and `padding_mask` of
    shape `(B, 2, T)` give both, web caption first; the loss is then the mean of the two symmetric InfoNCE
    terms. With `(B, T)` captions it is CLIP's loss on the class token. TIPS's self-distillation and masked
    image modelling terms need a teacher network and are not part of `fit` (docs/families/tipsv2.md).

    Args:
        vision: `VisionTransformer` arguments (the family's defaults fill the rest).
        text: `TextTransformer` arguments; `hidden_dim` must equal the image tower's.
        embed_dim: the towers' shared width (they have no projections); None: `vision["hidden_dim"]`.
        init_logit_scale: `-ln(temperature)`, B/14's by default.

    Example:
    >>> model = vlzoo.from_preset("tipsv2_tiny")
    >>> model.similarity(images, model.tokenizer(["a red circle"])).shape
    (B, 1)
    """

    family = "tipsv2"
    accepts_patch_batches = False
    vision_defaults = dict(
        num_prefix_tokens=1, num_register_tokens=1, pooling="cls", use_pre_norm=False, patch_bias=True,
        projection_bias=False, output_dim=None, layer_norm_epsilon=1e-6, activation="gelu", layer_scale=1.0,
    )
    text_defaults = dict(
        causal=False, pooling="mean", use_padding_mask=True, activation="relu", layer_norm_epsilon=1e-5,
        positions="sinusoidal", scale_embeddings=True, output_dim=None, projection_bias=False,
    )
    image_embedding_keys = ("embeds", "synthetic_embeds")
    normalized_keys = ("embeds", "synthetic_embeds")
    image_tower_keys = ("pooled", "registers")  # what a locked image tower's cache keeps
    has_dense_embeddings = True

    def __init__(self, vision, text, embed_dim=None, init_logit_scale=-math.log(TEMPERATURES["b14"]),
                 logit_scale_max=None, **kwargs):
        width = vision.get("hidden_dim")
        super().__init__(vision, text, width if embed_dim is None else embed_dim, init_logit_scale=init_logit_scale,
                         logit_scale_max=logit_scale_max, **kwargs)
        if not self.vision.hidden_dim == self.text.hidden_dim == self.embed_dim:
            raise ValueError(f"TIPSv2's towers share one space without projections: `text['hidden_dim']` "
                             f"({self.text.hidden_dim}) and `embed_dim` ({self.embed_dim}) must equal "
                             f"`vision['hidden_dim']` ({self.vision.hidden_dim}).")
        if self.vision.num_register_tokens < 1:
            raise ValueError("TIPSv2's image tower needs a register token (`vision['num_register_tokens'] >= 1`): "
                             "it embeds the image for synthetic captions.")

    def get_config(self):
        # The shared width is the towers' own: left to follow them when a preset is loaded with other widths.
        return {**super().get_config(), "embed_dim": None}

    def score(self, image_embeds, text_embeds):
        """`cos / temperature` of the class-token embeddings and the texts, `(N_images, N_texts)` float32."""
        image = self.check_embeds(image_embeds, "image", keys=("embeds",))
        text = self.check_embeds(text_embeds, "text")
        return clip_logits(image["embeds"], text["embeds"], self.logit_scale_value())

    def _image_features(self, images, training=None):
        tower = self._image_tower(images, training=training)
        return {"embeds": tower["pooled"], "synthetic_embeds": tower["registers"][:, 0]}

    def _text_features(self, inputs, training=None):
        ids = inputs["token_ids"]
        if len(ids.shape) != 3:
            return super()._text_features(inputs, training=training)
        kinds, length = ids.shape[1], ids.shape[2]
        flat = {"token_ids": ops.reshape(ids, (-1, length)),
                "padding_mask": ops.reshape(self._padding_mask(inputs), (-1, length))}
        pooled = super()._text_features(flat, training=training)["embeds"]
        return {"embeds": ops.reshape(pooled, (-1, kinds, pooled.shape[-1]))}

    def _check_training_inputs(self, inputs):
        ids = inputs.get("token_ids") if isinstance(inputs, dict) else None
        if ids is None or len(ids.shape) != 3:
            return super()._check_training_inputs(inputs)
        if ids.shape[1] != 2:
            raise ValueError(f"`token_ids` of shape (B, 2, T) hold each image's web and synthetic captions; "
                             f"received shape {tuple(ids.shape)}.")
        flat = {**inputs, "token_ids": ids[:, 0]}
        if "padding_mask" in inputs:
            mask = inputs["padding_mask"]
            if tuple(mask.shape) != tuple(ids.shape):
                raise ValueError(f"`padding_mask` must have the shape of `token_ids` {tuple(ids.shape)}; "
                                 f"received {tuple(mask.shape)}.")
            flat["padding_mask"] = mask[:, 0]
        super()._check_training_inputs(flat)

    def contrastive_loss(self, outputs, rows=None, training=False):
        """CLIP's symmetric InfoNCE of the class token against the web captions, averaged with the register
        token's against the synthetic captions when the batch has both kinds (`(B, 2, D)` text embeddings)."""
        texts, scale = outputs["text_embeds"], outputs["logit_scale"]
        if len(texts.shape) != 3:
            return clip_loss(outputs["image_embeds"], texts, scale, rows=rows)
        web = clip_loss(outputs["image_embeds"], texts[:, 0], scale, rows=rows)
        synthetic = clip_loss(outputs["image_synthetic_embeds"], texts[:, 1], scale, rows=rows)
        return 0.5 * (web + synthetic)

    def _dense_image_features(self, images):
        """The patch tokens `(B, P, D)` after the final LayerNorm, in the text embeddings' space (TIPS's
        zero-shot segmentation compares them with class prompts by cosine), registers and class token left out."""
        return self.vision(images)["tokens"][:, self.vision.num_prefix_tokens:]


register_family(Family("tipsv2", TIPSv2, score_loss="softmax"))
