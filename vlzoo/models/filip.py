"""FILIP (Yao et al., ICLR 2022): fine-grained late interaction between patch and word tokens."""

import math

import keras
from keras import ops

from vlzoo._backends import switches
from vlzoo.families import CLIPTransfer, Family, IMAGE_PROJECTION, TEXT_PROJECTION, register_family
from vlzoo.losses import filip_ensemble_scores, filip_loss, filip_similarity, filip_token_alignment
from vlzoo.losses._chunking import check_positive_int
from vlzoo.models.clip import CLIP
from vlzoo.models.ensembling import TokenSimilarityMean
from vlzoo.models.token_level import TokenContrastiveModel

DIRECTIONS = ("i2t", "t2i")


def filip_match_weights(token_to_patch, num_patches, offset=0):
    """One-hot rows `(..., T, P)` from FILIP's token -> best patch indices `(..., T)`.

    `offset` is subtracted first (the number of prefix tokens when the
    interaction includes the CLS token); a token whose best match is a
    prefix token gets an all-zero row.
    """
    index = ops.convert_to_tensor(token_to_patch, "int32") - offset
    inside = ops.cast(index >= 0, "float32")
    return ops.one_hot(ops.maximum(index, 0), num_patches, dtype="float32") * inside[..., None]


@keras.saving.register_keras_serializable(package="vlzoo")
class FILIP(TokenContrastiveModel):
    """FILIP: CLIP towers whose every token is projected; token-wise max-mean late interaction.

    Image side: a CLIP ViT (CLS token in the input, `ln_pre`, final LN on
    every token); each token goes through `image_projection` (no bias) to
    `embed_dim` (256 in the paper). The CLS output is left out of the
    interaction unless `interaction_include_cls=True`.
    Text side: CLIP's causal transformer (so real tokens never see the
    padding); every token goes through `text_projection`. Tokens are
    L2-normalised inside the losses.

    Score (`similarity`): `exp(logit_scale) * S_I`, the image->text
    late-interaction similarity (eq. 4: mean over patches of the best real
    token), as the paper ranks texts for an image and zero-shot classes;
    `score(..., direction="t2i")` gives `exp(logit_scale) * S_T` (eq. 5).
    Loss: `vlzoo.losses.filip_loss` (InfoNCE over `S_I` and the columns of
    `S_T`), with token dropping (`keep_ratio`) **only in training**.

    Args:
        vision, text: tower arguments (CLIP defaults; the towers carry no
            projection of their own: `output_dim=None`).
        embed_dim: width of the token embeddings, 256 in the paper.
        init_logit_scale: initial log-scale, `ln(1 / 0.07)`.
        interaction_include_cls: use the CLS output as one more image token.
        num_chunks: None computes the late interaction of scores and loss
            at once; a python int computes it in at most `num_chunks` blocks
            of texts (memory `B_img * ceil(B_txt / num_chunks) * P * T` per
            block), the batch size possibly unknown while tracing.
        keep_ratio: fraction of tokens each image and text keeps in training
            (FILIP's 25% token dropping: 0.25); 1.0 keeps all. Never applied
            outside training.
        selection_group_size: see `filip_loss` (per-worker selection).
        keep_mode: "static" or "per_row", see `filip_loss`.
        similarity_dtype: None, "float16" or "bfloat16" for the token dot
            products (FILIP's fp16 trick); results stay float32.
        projection_bias: bias in the token projections (CLIP: none).

    Raises:
        ValueError: `keep_ratio` outside `(0, 1]`; `num_chunks` not None or
            a python int >= 1.

    `encode_image` returns `{"embeds", "tokens"}` and `encode_text`
    `{"embeds", "tokens", "mask"}`: `tokens` are the projected interaction
    tokens, `embeds` their (masked) mean, a pooled convenience that FILIP's
    score does not use.

    Example:
    >>> model = vlzoo.from_preset("filip_tiny")
    >>> model.similarity(images, model.tokenizer(["a red circle"])).shape
    (B, 1)
    """

    family = "filip"
    # CLIP's towers, without the towers' own pooled projection.
    vision_defaults = {**CLIP.vision_defaults, "output_dim": None}
    text_defaults = {**CLIP.text_defaults, "output_dim": None}

    def __init__(
        self, vision, text, embed_dim=256, init_logit_scale=math.log(1 / 0.07),
        interaction_include_cls=False, num_chunks=None, keep_ratio=1.0,
        selection_group_size=None, keep_mode="static", similarity_dtype=None,
        projection_bias=False, **kwargs,
    ):
        super().__init__(
            vision, text, embed_dim, init_logit_scale=init_logit_scale, projection_bias=projection_bias, **kwargs
        )
        if not 0.0 < float(keep_ratio) <= 1.0:
            raise ValueError(f"`keep_ratio` must lie in (0, 1]; received {keep_ratio!r}.")
        check_positive_int(num_chunks, "num_chunks")
        self.num_chunks = num_chunks
        self.interaction_include_cls = interaction_include_cls
        self.keep_ratio = keep_ratio
        self.selection_group_size = selection_group_size
        self.keep_mode = keep_mode
        self.similarity_dtype = similarity_dtype
        self._build_token_projections()

    # ------------------------------------------------------------- features

    def _image_features(self, images, training=None):
        tokens = self._image_tower(images, training=training)["tokens"]
        if not self.interaction_include_cls:
            tokens = tokens[:, self.vision.num_prefix_tokens:]
        tokens = self.image_projection(tokens)
        return {"embeds": ops.mean(tokens, axis=1), "tokens": tokens}

    has_dense_embeddings = True

    def _dense_image_features(self, images):
        """The projected patch tokens `(B, P, D)` (never the CLS token): the image side of the late
        interaction, patch by patch."""
        tokens = self.vision(images)["tokens"][:, self.vision.num_prefix_tokens:]
        return self.image_projection(tokens)

    # --------------------------------------------------------------- scores

    def _chunks(self):
        """The keyword arguments of the similarity functions: the chunking and `similarity_dtype`."""
        return {"num_chunks": self.num_chunks, "similarity_dtype": self.similarity_dtype}

    def score(self, image_embeds, text_embeds, direction="i2t"):
        """`exp(logit_scale) * S_I` (`direction="i2t"`, default) or `* S_T`
        (`"t2i"`), each `(N_images, N_texts)`, from `encode_image` /
        `encode_text` outputs."""
        if direction not in DIRECTIONS:
            raise ValueError(f"`direction` must be one of {DIRECTIONS}; received {direction!r}.")
        image = self.check_embeds(image_embeds, "image", keys=("tokens",))
        text = self.check_embeds(text_embeds, "text", keys=("tokens", "mask"))
        s_i, s_t = filip_similarity(image["tokens"], text["tokens"], text["mask"], **self._chunks())
        return self.logit_scale_value() * (s_i if direction == "i2t" else s_t)

    def similarity(self, images, texts, direction="i2t"):
        """Late-interaction scores `(N_images, N_texts)`; see `score`."""
        return self.score(self.encode_image(images), self.encode_text(texts), direction=direction)

    @switches.untracked_inference
    def ensemble_scores(self, images, class_texts):
        """Prompt-ensembled zero-shot scores `(B, N)` (FILIP averages S_I over templates).

        Args:
            images: float `(B, H, W, 3)`.
            class_texts: tokenizer dict whose `token_ids` / `padding_mask`
                have shape `(N, K, T)`: K templates for each of N classes.
        """
        ids = class_texts["token_ids"]
        n, k, t = ids.shape
        flat = {"token_ids": ops.reshape(ids, (n * k, t)),
                "padding_mask": ops.reshape(self._padding_mask(class_texts), (n * k, t))}
        text = self.encode_text(flat)
        tokens = ops.reshape(text["tokens"], (n, k, t, self.embed_dim))
        return filip_ensemble_scores(self.encode_image(images)["tokens"], tokens,
                                     ops.reshape(text["mask"], (n, k, t)), **self._chunks())

    has_token_alignment = True
    symmetric_score = False

    @property
    def prompt_ensembling(self):
        """The mean over templates of the token-wise similarity `S_I`, prompts encoded once."""
        return TokenSimilarityMean()

    def token_patch_alignment(self, images, texts):
        """One-hot `(B, T, P)`: each token of caption `b` on its best patch of image `b` (eq. 4's argmax).

        A token whose best match is the CLS token (`interaction_include_cls`)
        gets an all-zero row.
        """
        _, token_to_patch = self.token_alignment(images, texts)
        pairs = ops.transpose(ops.diagonal(token_to_patch, axis1=0, axis2=1))  # (B, T): image b with caption b
        offset = self.vision.num_prefix_tokens if self.interaction_include_cls else 0
        return filip_match_weights(pairs, (self.vision.image_size // self.vision.patch_size) ** 2, offset)

    @switches.untracked_inference
    def token_alignment(self, images, texts):
        """Word-patch alignment `(patch_to_token, token_to_patch)`; see
        `vlzoo.losses.filip_token_alignment`."""
        text = self.encode_text(texts)
        return filip_token_alignment(self.encode_image(images)["tokens"], text["tokens"], text["mask"])

    replica_local_outputs = ("image_embeds", "text_embeds")  # the loss reads the tokens

    def contrastive_loss(self, outputs, rows=None, training=False):
        """InfoNCE over the late-interaction scores; with `rows`, this replica's images against every caption
        and its captions against every image, each chunked over the global batch (tokens dropped as on the
        whole batch)."""
        args = (outputs["image_tokens"], outputs["text_tokens"], outputs["text_mask"], outputs["logit_scale"])
        return filip_loss(*args, **self._loss_options(training), rows=rows)

    def _loss_options(self, training):
        return dict(keep_ratio=self.keep_ratio if training else 1.0, selection_group_size=self.selection_group_size,
                    keep_mode=self.keep_mode, **self._chunks())

    def get_config(self):
        config = super().get_config()
        config.update(
            interaction_include_cls=self.interaction_include_cls, keep_ratio=self.keep_ratio,
            selection_group_size=self.selection_group_size, keep_mode=self.keep_mode,
            similarity_dtype=self.similarity_dtype, num_chunks=self.num_chunks,
        )
        return config


register_family(Family(
    "filip", FILIP, score_loss="softmax",
    from_clip=CLIPTransfer(projections=(IMAGE_PROJECTION, TEXT_PROJECTION), logit_scale=True, embed_dim=True),
))
