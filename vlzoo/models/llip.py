"""Llip (Lavoie et al., ICML 2024): one image embedding per caption, mixed from K visual tokens."""

import math

import keras
from keras import ops

from vlzoo._backends import switches
from vlzoo.families import CLIPTransfer, Family, TEXT_PROJECTION, register_family
from vlzoo.layers.llip import LlipCrossAttention
from vlzoo.losses import l2_normalize
from vlzoo.losses._chunking import check_positive_int
from vlzoo.losses.llip import llip_contextualize, llip_logits, llip_loss, llip_template_average
from vlzoo.models.base import ContrastiveModel
from vlzoo.models.clip import CLIP
from vlzoo.models.ensembling import ClassTextsMethod
from vlzoo.models.token_level import token_projection

@keras.saving.register_keras_serializable(package="vlzoo")
class Llip(ContrastiveModel):
    """Llip: a ViT with K mixture tokens, a causal text tower, a text-conditioned cross-attention.

    Image side: a CLIP ViT whose K learned prefix tokens (with their own
    position embeddings, tokens first) replace the CLS token
    (`vision["num_prefix_tokens"]` is K; K = 1 is CLIP's layout). Only their
    K outputs, after the final LayerNorm, are used; there is no visual
    projection. Text side: CLIP's causal transformer pooled at the end
    token after `ln_final`, giving `g`, which feeds both the queries
    (`q_proj`) and the text embedding `t = g @ text_projection`.
    `LlipCrossAttention` (M heads, temperature tau) mixes the K tokens into
    one image embedding per caption, `z_ij`.

    Score: `exp(logit_scale) * cos(z_ij, t_j) + logit_bias` for every pair
    (`similarity`); loss: the sigmoid loss over those pairs
    (`vlzoo.losses.llip_loss`), chunked over the texts when `num_chunks`
    is set. Towers as the authors' open_clip fork:
    QuickGELU, LayerNorm epsilon 1e-5, patch convolution without bias.

    Args:
        vision: `VisionTransformer` arguments; `num_prefix_tokens` is the
            number K of mixture tokens (no `output_dim`).
        text: `TextTransformer` arguments (no `output_dim`).
        embed_dim: joint width D.
        num_heads: cross-attention heads M (8 in the paper).
        temperature: cross-attention temperature tau, the default of every
            call (5; 1 for the L/14 preset); not a weight.
        use_qkv_norm: LayerNorms on Q, K, V (the H/14 and G/14 presets).
        init_logit_scale: initial log-scale, `ln(1 / 0.07)`; clamped to
            `[0, ln 100]` after every training step.
        init_logit_bias: initial bias, -10.
        num_chunks: None scores all texts at once; a python int scores and
            computes the loss in at most `num_chunks` blocks of texts
            (memory `N_I * ceil(N_T / num_chunks) * (M * K + D)` per block),
            the batch size possibly unknown while tracing.

    Raises:
        ValueError: a tower with an `output_dim`; `num_chunks` not None or
            a python int >= 1.

    `encode_image` returns `{"embeds": (B, D), "keys": (B, K, M, d_h),
    "values": (B, K, M, D), "mixture_tokens": (B, K, W_v)}` (values folded
    through `W_O`, see `LlipCrossAttention`); `encode_text` returns
    `{"embeds": (B, D), "queries": (B, M, d_h)}`; `normalize=True`
    normalises both `embeds`. Llip scores each pair with its own
    text-conditioned image embedding, so an image's `embeds` is only a
    text-independent summary: the contextualised embedding under uniform
    attention over the mixture tokens (the limit of a large temperature),
    which `score` does not use. Cache the whole dicts for retrieval.

    Weight decay (`compile`): every parameter of rank >= 2 is decayed,
    mixture tokens, position and token embeddings included (the authors'
    rule); LayerNorm parameters, biases and the logit scale/bias are not.

    Example:
    >>> model = vlzoo.from_preset("llip_tiny")
    >>> model.similarity(images, model.tokenizer(["a red circle", "a blue square"])).shape
    (B, 2)
    """

    family = "llip"
    image_embedding_keys = ("embeds", "keys", "values", "mixture_tokens")
    image_tower_keys = ("tokens",)
    text_embedding_keys = ("embeds", "queries")
    extra_layout_rules = (
        ("cross_attention/q_proj", (None, "model")),
        ("cross_attention/(k|v)_proj", (None, None, "model")),
        ("cross_attention/out_proj", ("model", None)),
    )
    vision_defaults = {**CLIP.vision_defaults, "output_dim": None, "activation": "quick_gelu"}
    text_defaults = {**CLIP.text_defaults, "output_dim": None, "activation": "quick_gelu"}

    def __init__(
        self, vision, text, embed_dim=512, num_heads=8, temperature=5.0, use_qkv_norm=False,
        init_logit_scale=math.log(1 / 0.07), init_logit_bias=-10.0, num_chunks=None,
        **kwargs,
    ):
        super().__init__(vision, text, embed_dim, init_logit_scale=init_logit_scale, **kwargs)
        for name, tower in (("vision", self.vision), ("text", self.text)):
            if tower.output_dim is not None:
                raise ValueError(
                    f"Llip's {name} tower has no projection of its own (the cross-attention and "
                    f"`text_projection` read the tower features); received `{name}` with "
                    f"`output_dim={tower.output_dim}`. Remove it."
                )
        check_positive_int(num_chunks, "num_chunks")
        self.num_chunks = num_chunks
        self.init_logit_bias = init_logit_bias
        self.cross_attention = LlipCrossAttention(
            self.vision.num_prefix_tokens, self.vision.hidden_dim, self.text.hidden_dim, embed_dim,
            num_heads=num_heads, temperature=temperature, use_qkv_norm=use_qkv_norm,
            dtype=self.dtype_policy, name="cross_attention",
        )
        self.cross_attention.build()
        self.text_projection = token_projection(
            embed_dim, self.text.hidden_dim, False, self.dtype_policy, "text_projection")
        self.logit_bias = self.add_weight(
            name="logit_bias", shape=(), dtype="float32", autocast=False,
            initializer=keras.initializers.Constant(init_logit_bias),
        )

    @property
    def num_mixture_tokens(self):
        """K, the number of visual mixture tokens."""
        return self.vision.num_prefix_tokens

    @property
    def temperature(self):
        """The default cross-attention temperature tau."""
        return self.cross_attention.temperature

    # ------------------------------------------------------------- features

    def _image_features(self, images, training=None):
        tokens = self._image_tower(images, training=training)["tokens"][:, : self.num_mixture_tokens]
        keys, values = self.cross_attention.image_keys_values(tokens)
        # Uniform attention: the mean over the K tokens, summed over the M heads' folded values.
        embeds = ops.sum(ops.mean(values, axis=1), axis=1)
        return {"embeds": embeds, "keys": keys, "values": values, "mixture_tokens": tokens}

    def _text_features(self, inputs, training=None):
        pooled = super()._text_features(inputs, training=training)["embeds"]  # g: end-token feature after ln_final
        return {"embeds": self.text_projection(pooled), "queries": self.cross_attention.text_queries(pooled)}

    def call(self, inputs, training=False):
        outputs = super().call(inputs, training=training)
        outputs["logit_bias"] = ops.convert_to_tensor(self.logit_bias)
        return outputs

    # --------------------------------------------------------------- scores

    def _tau(self, temperature):
        return self.temperature if temperature is None else temperature

    def score(self, image_embeds, text_embeds, temperature=None):
        """`exp(logit_scale) * cos(z_ij, t_j) + logit_bias`, `(N_images, N_texts)` float32.

        Args:
            image_embeds: `encode_image`'s dict.
            text_embeds: `encode_text`'s (or `encode_class_texts`') dict.
            temperature: tau of the cross-attention; None: the model's.
        """
        image = self.check_embeds(image_embeds, "image", keys=("keys", "values"))
        text = self.check_embeds(text_embeds, "text", keys=("embeds", "queries"))
        return llip_logits(
            text["queries"], image["keys"], image["values"], text["embeds"],
            self.logit_scale_value(), self.logit_bias, self._tau(temperature),
            num_chunks=self.num_chunks,
        )

    replica_local_outputs = ("image_keys", "image_values", "image_mixture_tokens", "image_embeds")

    def similarity(self, images, texts, temperature=None):
        """Scores `(N_images, N_texts)`, each pair with its own contextualised image embedding."""
        return self.score(self.encode_image(images), self.encode_text(texts), temperature=temperature)

    @switches.untracked_inference
    def contextualize(self, images, texts, temperature=None, normalize=False):
        """Image embeddings conditioned on each text, `(N_images, N_texts, D)` float32.

        Not chunked (the result itself is `N_images * N_texts * D`).
        """
        image, text = self.encode_image(images), self.encode_text(texts)
        z = llip_contextualize(text["queries"], image["keys"], image["values"], self._tau(temperature))
        return l2_normalize(z) if normalize else z

    # ------------------------------------------------------------ zero-shot

    @property
    def prompt_ensembling(self):
        """Llip's own template averaging of queries and targets (`encode_class_texts`)."""
        return ClassTextsMethod()

    @switches.untracked_inference
    def encode_class_texts(self, class_texts):
        """Template-averaged text side of zero-shot classification.

        Per class: the mean of the per-prompt queries (after `qkv_norm`;
        not renormalised) and the renormalised mean of the per-prompt
        normalised text embeddings (`vlzoo.losses.llip_template_average`).

        Args:
            class_texts: a list of C lists of P prompts each (strings), or
                a tokenizer dict whose `token_ids` / `padding_mask` have
                shape `(C, P, T)`.

        Returns:
            `{"queries": (C, M, d_h), "embeds": (C, D)}`, for `score`.
        """
        if isinstance(class_texts, (list, tuple)):
            counts = {len(prompts) for prompts in class_texts}
            if len(counts) != 1 or not all(isinstance(p, str) for prompts in class_texts for p in prompts):
                raise ValueError(
                    "`class_texts` must be C lists of the same number P of prompt strings; "
                    f"received lists of lengths {sorted(counts)}."
                )
            flat = self.tokenizer([p for prompts in class_texts for p in prompts])
            c, p = len(class_texts), counts.pop()
            class_texts = {key: ops.reshape(value, (c, p, -1)) for key, value in flat.items()}
        if not isinstance(class_texts, dict) or len(tuple(class_texts["token_ids"].shape)) != 3:
            raise ValueError(
                "`class_texts` must be C lists of P prompts or a tokenizer dict with `token_ids` of "
                f"shape (C, P, T); received {type(class_texts).__name__}"
                + (f" with `token_ids` of shape {tuple(class_texts['token_ids'].shape)}"
                   if isinstance(class_texts, dict) else "") + "."
            )
        c, p, t = class_texts["token_ids"].shape
        mask = self._padding_mask(class_texts)
        text = self.encode_text({"token_ids": ops.reshape(class_texts["token_ids"], (c * p, t)),
                                 "padding_mask": ops.reshape(mask, (c * p, t))})
        queries = ops.reshape(text["queries"], (c, p) + tuple(text["queries"].shape[1:]))
        queries, embeds = llip_template_average(queries, ops.reshape(text["embeds"], (c, p, self.embed_dim)))
        return {"queries": queries, "embeds": embeds}

    @switches.untracked_inference
    def ensemble_scores(self, images, class_texts, temperature=None):
        """Zero-shot class scores `(B, C)` with template-averaged queries and targets.

        `argmax` over classes is the prediction; see `encode_class_texts`.
        """
        return self.score(self.encode_image(images), self.encode_class_texts(class_texts), temperature=temperature)

    # ------------------------------------------------------------- training

    def contrastive_loss(self, outputs, rows=None, training=False):
        """Llip's sigmoid loss on the caption-mixed image embeddings; with `rows`, this replica's images (the
        only ones the image entries then hold), each mixed by every caption of the global batch, chunked over
        the captions."""
        args = (outputs["text_queries"], outputs["image_keys"], outputs["image_values"], outputs["text_embeds"],
                outputs["logit_scale"], outputs["logit_bias"], self.temperature)
        return llip_loss(*args, num_chunks=self.num_chunks, rows=rows)

    def no_weight_decay_variables(self):
        """LayerNorm parameters, biases and the logit scale/bias: the variables of rank < 2."""
        return [v for v in self.trainable_variables if len(v.shape) < 2]

    def get_config(self):
        config = super().get_config()
        head = self.cross_attention
        config.update(
            num_heads=head.num_heads, temperature=head.temperature, use_qkv_norm=head.use_qkv_norm,
            init_logit_bias=self.init_logit_bias, num_chunks=self.num_chunks,
        )
        return config


# Llip's number of mixture tokens when started from CLIP: the authors' released ViT-B/16 (K = 32).
LLIP_MIXTURE_TOKENS = 32


def _configure_from_clip(config, clip):
    """From CLIP: `LLIP_MIXTURE_TOKENS` mixture tokens in place of the CLS token."""
    config["vision"]["num_prefix_tokens"] = LLIP_MIXTURE_TOKENS


register_family(Family(
    "llip", Llip, score_loss="sigmoid",
    from_clip=CLIPTransfer(projections=(TEXT_PROJECTION,), embed_dim=True, configure=_configure_from_clip),
))
