"""FLAIR (Xiao et al., CVPR 2025): image embeddings pooled by each caption from the patch tokens."""

import math

import keras
from keras import ops

from vlzoo._backends import switches
from vlzoo.families import CLIPTransfer, Family, IMAGE_PROJECTION, TEXT_PROJECTION, register_family
from vlzoo.layers.flair import TextConditionedPooling
from vlzoo.losses import siglip_logits
from vlzoo.losses._chunking import check_positive_int, chunking, pad_rows, put, slice_chunk, static_loop
from vlzoo.losses._chunking import take_rows, unstack_columns
from vlzoo.losses.flair import flair_caption_indices, flair_loss, flair_pair_logits
from vlzoo.models.base import ContrastiveModel
from vlzoo.models.clip import CLIP
from vlzoo.models.token_level import token_projection

SCORE_MODES = ("conditioned", "global")


@keras.saving.register_keras_serializable(package="vlzoo")
class FLAIR(ContrastiveModel):
    """FLAIR: CLIP towers, and a caption-conditioned attention pooling of the image's patches.

    Towers as the authors' (ExplainableML/flair, open_clip's ViT-B/16 layout):
    a ViT with a CLS token and exact GELU whose final LayerNorm covers every
    token, and CLIP's causal text transformer pooled at the end token. A
    projection without bias maps the CLS output to the global image
    embedding `v` and each patch output to a patch token (`image_projection`,
    their `image_post`); another maps the text feature to the caption
    embedding `t` (`text_projection`, their `text_post`).
    `TextConditionedPooling` (their `visual_proj`) lets `t_j` attend over
    image `i`'s patch tokens, giving `z_ij`.

    Score (`score`, `similarity`): `exp(logit_scale) * cos(z_ij, t_j) +
    logit_bias` for every pair, the authors' retrieval scoring (the bias
    does not change rankings); `mode="global"` scores `cos(v_i, t_j)`
    instead (their "direct global matching"). Loss: `vlzoo.losses.flair_loss`,
    the text-conditioned sigmoid loss over each image's own K captions and
    one random caption of each other image, averaged with the multi-positive
    sigmoid loss of the global embeddings (`use_global_loss`).

    Training inputs take several captions per image: `token_ids` and
    `padding_mask` of shape `(B, K, T)` (the released models used K = 8);
    `(B, T)` is K = 1, where the conditioned loss covers all B x B pairs
    and draws nothing at random.

    Args:
        vision: `VisionTransformer` arguments (no `output_dim`).
        text: `TextTransformer` arguments (no `output_dim`).
        embed_dim: joint width D.
        num_heads: heads of the pooling (8).
        init_logit_scale: initial log-scale, `ln(1 / 0.07)` (the authors'
            default; clamped to `[0, ln 100]` after every training step).
        init_logit_bias: initial bias, -10.
        use_global_loss: average the loss with the global multi-positive
            sigmoid loss (True, as every released model).
        seed: seed of the captions the loss draws from the other images.
        num_chunks: None scores all texts at once; a python int scores them
            in at most `num_chunks` blocks (memory
            `N_images * ceil(N_texts / num_chunks) * M * P` per block), the
            number of texts possibly unknown while tracing.

    Raises:
        ValueError: a tower with an `output_dim`, a vision tower without
            one CLS token; `num_chunks` not None or a python int >= 1.

    `encode_image` returns `{"embeds": (B, D), "tokens": (B, P, D)}` (the
    global embedding and the projected patch tokens); `encode_text`
    returns `{"embeds": (B, D)}`. `score` needs the unnormalised caption
    embeddings (the pooling's query LayerNorm sees their scale through its
    epsilon): pass `encode_text(texts)` without `normalize`.

    Example:
    >>> model = vlzoo.from_preset("flair_tiny")
    >>> model.similarity(images, model.tokenizer(["a red circle", "a blue square"])).shape
    (B, 2)
    """

    family = "flair"
    image_embedding_keys = ("embeds", "tokens")
    image_tower_keys = ("tokens",)
    extra_layout_rules = (
        ("image_projection/kernel", (None, "model")),
        ("text_projection/kernel", (None, "model")),
    )
    vision_defaults = {**CLIP.vision_defaults, "output_dim": None, "activation": "gelu"}
    text_defaults = {**CLIP.text_defaults, "output_dim": None, "activation": "gelu"}

    def __init__(
        self, vision, text, embed_dim=512, num_heads=8, init_logit_scale=math.log(1 / 0.07), init_logit_bias=-10.0,
        use_global_loss=True, seed=None, num_chunks=None, **kwargs,
    ):
        super().__init__(vision, text, embed_dim, init_logit_scale=init_logit_scale, **kwargs)
        for name, tower in (("vision", self.vision), ("text", self.text)):
            if tower.output_dim is not None:
                raise ValueError(
                    f"FLAIR's {name} tower has no projection of its own (`{name[:5]}_projection` maps its "
                    f"tokens); received `{name}` with `output_dim={tower.output_dim}`. Remove it.")
            if name == "vision" and tower.num_prefix_tokens != 1:
                raise ValueError("FLAIR's vision tower has one CLS token (the global embedding); received "
                                 f"`num_prefix_tokens={tower.num_prefix_tokens}`.")
        check_positive_int(num_chunks, "num_chunks")
        self.num_chunks = num_chunks
        self.init_logit_bias = init_logit_bias
        self.use_global_loss = bool(use_global_loss)
        self.seed = seed
        self.image_projection = token_projection(
            embed_dim, self.vision.hidden_dim, False, self.dtype_policy, "image_projection")
        self.text_projection = token_projection(
            embed_dim, self.text.hidden_dim, False, self.dtype_policy, "text_projection")
        self.text_pooling = TextConditionedPooling(
            embed_dim, num_heads=num_heads, layer_norm_epsilon=self.vision.layer_norm_epsilon,
            dtype=self.dtype_policy, name="text_pooling")
        self.text_pooling.build()
        self.logit_bias = self.add_weight(
            name="logit_bias", shape=(), dtype="float32", autocast=False,
            initializer=keras.initializers.Constant(init_logit_bias),
        )
        self.seed_generator = keras.random.SeedGenerator(seed, name="caption_sampling")

    # ------------------------------------------------------------- features

    def _image_features(self, images, training=None):
        tokens = self.image_projection(self._image_tower(images, training=training)["tokens"])
        return {"embeds": tokens[:, 0], "tokens": tokens[:, 1:]}

    def _text_features(self, inputs, training=None):
        return {"embeds": self.text_projection(super()._text_features(inputs, training=training)["embeds"])}

    # ------------------------------------------------------------- training

    def _check_training_inputs(self, inputs):
        ids = inputs.get("token_ids") if isinstance(inputs, dict) else None
        if ids is not None and len(ids.shape) == 3:
            mask = inputs.get("padding_mask")
            if mask is not None and tuple(mask.shape) != tuple(ids.shape):
                raise ValueError(f"`padding_mask` must have the shape of `token_ids` {tuple(ids.shape)}; "
                                 f"received {tuple(mask.shape)}.")
            inputs = {**inputs, **{key: inputs[key][:, 0] for key in ("token_ids", "padding_mask") if key in inputs}}
        super()._check_training_inputs(inputs)

    def call(self, inputs, training=False):
        """`call`'s outputs; with `(B, K, T)` captions, `text_embeds` is `(B, K, D)`."""
        self._check_training_inputs(inputs)
        ids = inputs["token_ids"]
        captions = ids.shape[1] if len(ids.shape) == 3 else None
        if captions is not None:
            inputs = {**inputs, **{key: ops.reshape(inputs[key], (-1, ids.shape[-1]))
                                   for key in ("token_ids", "padding_mask") if key in inputs}}
        outputs = self._call_towers(inputs, training)
        if captions is not None:
            outputs["text_embeds"] = ops.reshape(outputs["text_embeds"], (-1, captions, self.embed_dim))
        outputs["logit_bias"] = ops.convert_to_tensor(self.logit_bias)
        return outputs

    replica_local_outputs = ("image_embeds", "image_tokens")

    def contrastive_loss(self, outputs, rows=None, training=False):
        """FLAIR's text-conditioned sigmoid loss (and the global one if set); with `rows`, this replica's
        images, each pooled on its own captions and one drawn from every other image of the global batch
        (the draw of one process on the whole batch), against all captions."""
        if rows is None:
            return flair_loss(*self._loss_logits(outputs))
        start, count = rows
        conditioned, captions, overall = self._loss_logits(outputs, lambda x: take_rows(x, start, count))
        return flair_loss(conditioned, captions, overall, rows=rows)

    def _loss_logits(self, outputs, rows=lambda x: x):
        """`(conditioned, K, global)` for `flair_loss` (global None without `use_global_loss`): the logits
        of the images in `outputs`, which are the batch's rows that `rows` picks."""
        texts = outputs["text_embeds"]
        captions = texts.shape[1] if len(texts.shape) == 3 else 1
        batch = ops.shape(texts)[0]  # the global batch's
        texts = ops.reshape(texts, (-1, self.embed_dim))  # (B * K, D), image i's captions at rows i*K ..
        if captions == 1:
            offsets = ops.zeros((batch, batch - 1), "int32")
        else:
            offsets = keras.random.randint((batch, batch - 1), 0, captions, dtype="int32", seed=self.seed_generator)
        sampled = ops.take(texts, rows(flair_caption_indices(offsets, captions)), axis=0)  # (rows, B + K - 1, D)
        scale, bias = outputs["logit_scale"], outputs["logit_bias"]
        conditioned = flair_pair_logits(self.text_pooling(sampled, outputs["image_tokens"]), sampled, scale, bias)
        overall = None
        if self.use_global_loss:
            overall = siglip_logits(outputs["image_embeds"], texts, scale, bias)
        return conditioned, captions, overall

    # --------------------------------------------------------------- scores

    def score(self, image_embeds, text_embeds, mode="conditioned"):
        """Scores `(N_images, N_texts)` float32 on the loss's scale.

        Args:
            image_embeds: `encode_image`'s dict (`mode="global"` reads only
                `"embeds"`).
            text_embeds: `encode_text`'s dict, unnormalised, or a class
                representation `{"embeds": (C, D)}`.
            mode: `"conditioned"`: `a * cos(z_ij, t_j) + b`, each image
                pooled by each text (the authors' retrieval scoring), in the
                model's `num_chunks` blocks of texts; `"global"`:
                `a * cos(v_i, t_j) + b` of the global embeddings.

        Raises:
            ValueError: an unknown `mode`.
        """
        if mode not in SCORE_MODES:
            raise ValueError(f"`mode` must be one of {SCORE_MODES}; received {mode!r}.")
        image = self.check_embeds(image_embeds, "image", keys=("embeds",) if mode == "global" else None)
        texts = self.check_embeds(text_embeds, "text")["embeds"]
        scale = self.logit_scale_value()
        if mode == "global":
            return siglip_logits(image["embeds"], texts, scale, self.logit_bias)
        keys, values = self.text_pooling.image_keys_values(ops.convert_to_tensor(image["tokens"]))
        texts = ops.convert_to_tensor(texts)
        plan = chunking(texts, self.num_chunks)
        if plan is None:
            return self._conditioned_logits(keys, values, texts, scale)
        count, size, n = plan
        texts = pad_rows(texts, plan.pad)  # zero texts: finite scores, dropped

        def body(k, carry):
            _, block = slice_chunk(k, size, texts)
            return (put(carry[0], k, self._conditioned_logits(keys, values, block, scale)),)

        (stack,) = static_loop(count, body, (ops.zeros((count, ops.shape(keys)[0], size), "float32"),))
        return unstack_columns(stack, count, size, n)

    def _conditioned_logits(self, keys, values, texts, scale):
        """`a * cos(z_ij, t_j) + b` `(N_images, N_texts)` of the images whose pooling keys and values are `keys`,
        `values` against the caption embeddings `texts` `(N_texts, D)`."""
        pairs = ops.broadcast_to(texts[None], (ops.shape(keys)[0],) + tuple(ops.shape(texts)))
        conditioned = self.text_pooling.attend(self.text_pooling.text_queries(pairs), keys, values)
        return flair_pair_logits(conditioned, pairs, scale, self.logit_bias)

    def _image_text_pairs(self, images, texts):
        """`(patch tokens (N_images, P, D), every text's embedding for every image (N_images, N_texts, D))`."""
        tokens, texts = self.encode_image(images)["tokens"], self.encode_text(texts)["embeds"]
        return tokens, ops.broadcast_to(texts[None], (ops.shape(tokens)[0],) + tuple(texts.shape))

    @switches.untracked_inference
    def contextualize(self, images, texts, normalize=False):
        """Image embeddings conditioned on each text, `(N_images, N_texts, D)` float32 (not chunked)."""
        tokens, pairs = self._image_text_pairs(images, texts)
        z = ops.cast(self.text_pooling(pairs, tokens), "float32")
        return self.normalize_vectors(z) if normalize else z

    @switches.untracked_inference
    def text_attention_maps(self, images, texts):
        """Where each text looks in each image: the pooling's attention over the patches, mean over heads.

        FLAIR's own word-to-patch map (`vlzoo.evaluation.grounding`): the
        weights with which the text's query pools the patch tokens into
        `z_ij` (`TextConditionedPooling.attention_weights`), the zero slot's
        share left out.

        Args:
            images: `(N_images, H, W, 3)` preprocessed pixels.
            texts: tokenizer output for `N_texts` texts.

        Returns:
            float32 `(N_images, N_texts, P)`, each row summing to at most 1,
            patches in the tower's row-major order.

        Example:
        >>> model.text_attention_maps(pixels, model.tokenizer(["a red circle"])).shape
        (B, 1, P)
        """
        tokens, pairs = self._image_text_pairs(images, texts)
        pooling = self.text_pooling
        keys, _ = pooling.image_keys_values(tokens)
        return ops.mean(pooling.attention_weights(pooling.text_queries(pairs), keys), axis=2)

    def get_config(self):
        config = super().get_config()
        config.update(
            num_heads=self.text_pooling.num_heads, init_logit_bias=self.init_logit_bias,
            use_global_loss=self.use_global_loss, seed=self.seed, num_chunks=self.num_chunks,
        )
        return config


register_family(Family(
    "flair", FLAIR, score_loss="sigmoid",
    from_clip=CLIPTransfer(projections=(IMAGE_PROJECTION, TEXT_PROJECTION), embed_dim=True),
))
