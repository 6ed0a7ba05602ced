"""SPARC (Bica et al., ICML 2024): global contrastive loss plus sparse token-to-patch alignment."""

import math

import keras
from keras import ops

from vlzoo._backends import switches
from vlzoo.families import CLIPTransfer, Family, IMAGE_PROJECTION, TEXT_PROJECTION, register_family
from vlzoo.losses import clip_logits, sparc_alignment_weights, sparc_loss
from vlzoo.models.token_level import TokenContrastiveModel

TEXT_POOLS = ("masked_mean", "mean")


@keras.saving.register_keras_serializable(package="vlzoo")
class SPARC(TokenContrastiveModel):
    """SPARC: ViT without CLS and a bidirectional text transformer, both mean pooled.

    Per token: `v_p = g_v(F_v[p])` (`image_projection`) for every patch and
    `t_l = g_t(F_t[l])` (`text_projection`) for every text token.
    Global: `g_v(h_v(mean_p F_v))` (`h_v`: Dense(W_v) + GELU, the paper's
    "single non-linear layer", `global_vision_head=True`; without it,
    `mean_p v_p`) and `g_t(masked mean of F_t)` = the masked mean of `t_l`
    (`text_pool="mean"` mimics Listing 1's unmasked mean).
    Score (`similarity`): `exp(logit_scale) * cos(global image, global text)`.
    Loss: `vlzoo.losses.sparc_loss` = `lambda_global * L_g +
    lambda_fine * L_f` with one learned temperature shared by both terms.

    Args:
        vision, text: tower arguments (no CLS, `pooling="mean"`, no tower
            projection; the text tower attends with a key-padding mask). A
            ViT with prefix tokens (a CLIP ViT's CLS, as in a SPARC started
            from CLIP weights by `vlzoo.transfer`) keeps them in its
            attention but out of the patch set, the mean pool and `1/P`.
        embed_dim: shared embedding width, 512 in the paper.
        init_logit_scale: initial log-scale, `ln(1 / 0.07)` (the paper's
            init is unstated; CLIP's convention).
        lambda_global, lambda_fine: loss weights (0.5 and 1.0: the paper's
            λ_g and the middle of its unreported λ_f sweep).
        threshold: sparsity threshold σ; None uses `1/P` of the actual
            number of patches at run time.
        reduction: "tokens" (Listing 1) or "samples" (eq. 6), see
            `sparc_fine_grained_loss`.
        alignment: "threshold" (the paper) or "softmax" (Table 6 ablation).
        global_vision_head: use `h_v` on the pooled vision features.
        text_pool: "masked_mean" (default) or "mean" (Listing 1).
        projection_bias: bias in `g_v` / `g_t` (unstated in the paper; off).

    `encode_image` returns `{"embeds", "tokens"}`, `encode_text`
    `{"embeds", "tokens", "mask"}`; `dense_image_embeddings` gives
    `g_v(h_v(F_v[p]))` per patch, as the paper's zero-shot segmentation uses.
    """

    family = "sparc"
    extra_layout_rules = (("vision_head/kernel", (None, "model")), ("vision_head/bias", ("model",)))
    vision_defaults = dict(
        num_prefix_tokens=0, pooling="mean", use_pre_norm=True, patch_bias=False,
        projection_bias=False, layer_norm_epsilon=1e-5, activation="gelu", output_dim=None,
    )
    text_defaults = dict(
        causal=False, pooling="mean", use_padding_mask=True, projection_bias=False,
        layer_norm_epsilon=1e-5, activation="gelu", output_dim=None,
    )

    def __init__(
        self, vision, text, embed_dim=512, init_logit_scale=math.log(1 / 0.07),
        lambda_global=0.5, lambda_fine=1.0, threshold=None, reduction="tokens",
        alignment="threshold", global_vision_head=True, text_pool="masked_mean",
        projection_bias=False, **kwargs,
    ):
        super().__init__(
            vision, text, embed_dim, init_logit_scale=init_logit_scale, projection_bias=projection_bias, **kwargs
        )
        if text_pool not in TEXT_POOLS:
            raise ValueError(f"`text_pool` must be one of {TEXT_POOLS}; received {text_pool!r}.")
        if reduction not in ("tokens", "samples"):
            raise ValueError(f"`reduction` must be one of ('tokens', 'samples'); received {reduction!r}.")
        self.lambda_global = lambda_global
        self.lambda_fine = lambda_fine
        self.threshold = threshold
        self.reduction = reduction
        self.alignment = alignment
        self.global_vision_head = global_vision_head
        self.text_pool = text_pool
        width = self.vision.hidden_dim
        self.vision_head = None
        if global_vision_head:
            self.vision_head = keras.layers.Dense(width, activation="gelu", dtype=self.dtype_policy, name="vision_head")
            self.vision_head.build((None, width))
        self._build_token_projections()

    # ------------------------------------------------------------- features

    def _patch_features(self, images, training=None):
        """The tower's patch outputs `(B, P, W)`: prefix tokens, if any, are left out."""
        return self._image_tower(images, training=training)["tokens"][:, self.vision.num_prefix_tokens:]

    def _image_features(self, images, training=None):
        features = self._patch_features(images, training=training)
        tokens = self.image_projection(features)
        if self.vision_head is None:
            return {"embeds": ops.mean(tokens, axis=1), "tokens": tokens}
        pooled = self.image_projection(self.vision_head(ops.mean(features, axis=1)))
        return {"embeds": pooled, "tokens": tokens}

    has_dense_embeddings = True

    def _dense_image_features(self, images):
        """`g_v(h_v(F_v[p]))` per patch `(B, P, D)`: the paper's zero-shot segmentation embeddings."""
        features = self._patch_features(images)
        if self.vision_head is not None:
            features = self.vision_head(features)
        return self.image_projection(features)

    def _pool_text(self, tokens, mask):
        return super()._pool_text(tokens, mask) if self.text_pool == "masked_mean" else ops.mean(tokens, axis=1)

    # --------------------------------------------------------------- scores

    def score(self, image_embeds, text_embeds):
        """`exp(logit_scale) * cos` of the global embeddings, `(N_images, N_texts)`."""
        image = self.check_embeds(image_embeds, "image", keys=("embeds",))
        text = self.check_embeds(text_embeds, "text", keys=("embeds",))
        return clip_logits(image["embeds"], text["embeds"], self.logit_scale_value())

    has_token_alignment = True

    def token_patch_alignment(self, images, texts):
        """SPARC's sparse weights `(B, T, P)` (`alignment_weights`)."""
        return self.alignment_weights(images, texts)

    @switches.untracked_inference
    def alignment_weights(self, images, texts):
        """Sparse token-to-patch weights `(B, T, P)` of each (image, caption) pair."""
        text = self.encode_text(texts)
        return sparc_alignment_weights(self.encode_image(images)["tokens"], text["tokens"],
                                       threshold=self.threshold)

    replica_local_outputs = ("image_tokens", "text_tokens")

    def contrastive_loss(self, outputs, rows=None, training=False):
        """The global InfoNCE plus the fine-grained loss; with `rows`, CLIP's share of this replica's rows and
        the fine-grained loss of its own pairs (whose tokens are the only ones the token entries then hold)."""
        return sparc_loss(*self._loss_inputs(outputs), **self._loss_options(), rows=rows)

    @staticmethod
    def _loss_inputs(outputs):
        keys = ("image_embeds", "text_embeds", "image_tokens", "text_tokens", "text_mask", "logit_scale")
        return tuple(outputs[key] for key in keys)

    def _loss_options(self):
        return dict(lambda_global=self.lambda_global, lambda_fine=self.lambda_fine, threshold=self.threshold,
                    reduction=self.reduction, alignment=self.alignment)

    def get_config(self):
        config = super().get_config()
        config.update(
            lambda_global=self.lambda_global, lambda_fine=self.lambda_fine, threshold=self.threshold,
            reduction=self.reduction, alignment=self.alignment,
            global_vision_head=self.global_vision_head, text_pool=self.text_pool,
        )
        return config


register_family(Family(
    "sparc", SPARC,
    from_clip=CLIPTransfer(projections=(IMAGE_PROJECTION, TEXT_PROJECTION), logit_scale=True, embed_dim=True),
))
