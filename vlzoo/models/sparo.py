"""SPARO (Vani et al., 2024): CLIP whose towers end in SPARO slot read-outs instead of pooling."""

import math

import keras
import numpy as np
from keras import ops

from vlzoo._backends import switches
from vlzoo.families import CLIPTransfer, Family, register_family
from vlzoo.layers.sparo import SPAROReadout
from vlzoo.layers.text import end_token_index
from vlzoo.losses import clip_loss, l2_normalize
from vlzoo.losses._utils import check_embeds
from vlzoo.models.base import ContrastiveModel
from vlzoo.models.clip import CLIP
from vlzoo.models.validation import concrete_numpy


def normalize_slots(embeds, slot_dim):
    """SPARO's normalisation: every slot L2-normalised, then divided by `sqrt(S)`.

    `y_l / max(||y_l||, 1e-12) / sqrt(S)` for the `S = D_total / slot_dim`
    slots of each row, so the result has unit norm and the dot product of
    two results is the mean of the per-slot cosines.

    Args:
        embeds: `(B, S * slot_dim)` slot concatenations (slot-major).
        slot_dim: width `V` of a slot.

    Returns:
        float32 `(B, S * slot_dim)`; a zero slot stays zero.

    Example:
    >>> normalize_slots(np.array([[3.0, 4.0, 0.0, 2.0]]), slot_dim=2)  # doctest: +SKIP
    [[0.4243, 0.5657, 0.0, 0.7071]]
    """
    embeds = check_embeds(embeds, "embeds")
    total = embeds.shape[-1]
    if total is not None and total % slot_dim:
        raise ValueError(
            f"`embeds` must have shape (B, S * {slot_dim}) (slots of width {slot_dim}); "
            f"received shape {tuple(embeds.shape)}."
        )
    slots = ops.reshape(embeds, (-1, total // slot_dim, slot_dim))
    return ops.reshape(l2_normalize(slots) * (1.0 / math.sqrt(total // slot_dim)), (-1, total))


def _slot_indices(slots, num_slots):
    """Sorted, unique int indices from a bool mask `(L,)` or a sequence of slot indices."""
    values = concrete_numpy(slots)
    if values is None:
        raise TypeError("`slots` must be concrete (a list, numpy array or eager tensor), not a traced tensor.")
    if values.dtype == bool:
        if values.shape != (num_slots,):
            raise ValueError(f"A bool `slots` mask must have shape ({num_slots},); received shape {values.shape}.")
        values = np.flatnonzero(values)
    elif values.ndim != 1 or (values.size and not np.issubdtype(values.dtype, np.integer)):
        raise TypeError(
            f"`slots` must be a bool mask of shape ({num_slots},) or a 1-D sequence of int slot "
            f"indices; received dtype {values.dtype}, shape {values.shape}."
        )
    if values.size == 0:
        raise ValueError("`slots` selects no slot; select at least one.")
    if values.min() < 0 or values.max() >= num_slots:
        raise ValueError(f"`slots` indices must lie in [0, {num_slots}); received {values.tolist()}.")
    if len(np.unique(values)) != values.size:
        raise ValueError(f"`slots` indices must be unique; received {values.tolist()}.")
    return np.sort(values).astype("int32")


@keras.saving.register_keras_serializable(package="vlzoo")
class SPARO(ContrastiveModel):
    """CLIP + SPARO: both towers lose their last block, pooling and projection to a SPARO read-out.

    Each tower (open_clip ViT and causal text transformer) is built with
    `num_layers - reduce_depth` blocks; its final LayerNorm output on every
    token (CLS included on the image side; up to the end token on the text
    side) feeds its own `SPAROReadout` (own queries, key and output maps, the
    same L and V in both towers). The encoding is the slot-major
    concatenation `y` of the `L` slots, `(B, L * V)`: `encode_image` /
    `encode_text` return it as `{"embeds": y}`, raw, or with
    `normalize=True` through SPARO's `normalize_slots` (every slot
    L2-normalised, then divided by `sqrt(L)`).

    Score: `exp(logit_scale) * mean_l cos(y^i_l, y^t_l)` (the dot product of
    the normalised encodings); loss: symmetric InfoNCE on the normalised
    encodings (`clip_loss`). At inference `slots=` restricts encodings and
    scores to chosen slots (`vlzoo.evaluation.slots.select_slots` ranks them by
    per-slot zero-shot accuracy, the paper's post-hoc concept selection).

    Args:
        vision, text: tower arguments of the **full-depth** towers
            (`num_layers` 12 for ViT-B); open_clip defaults (exact GELU,
            LayerNorm epsilon 1e-5, `ln_pre`, no patch bias), no projection.
        num_slots: `L` (64; 128 for the paper's LAION-400M run).
        slot_dim: `V` (64).
        key_dim: `D`; None (default) uses each tower's head width
            (`hidden_dim / num_heads`, 64 for ViT-B and the CLIP text tower),
            as the authors' `attn_dim=None`.
        group_size: slots sharing a key projection (1, the paper's SPARO).
        share_key_value: keys are values (True, the paper's SPARO).
        reduce_depth: blocks removed from the end of each tower (1: SPARO
            replaces the last block). Both towers are built with
            `num_layers - reduce_depth` blocks, and open_clip's depth-scaled
            initialisation uses that reduced depth.
        end_token_id: the text read-out attends positions up to the first
            occurrence of this id. None (default): the row's largest id,
            CLIP's end token (open_clip's `argmax`, first of ties).
        embed_dim: derived, `num_slots * slot_dim`; passing another value
            raises (the authors' `embed_dim` does not size the encoding).
        init_logit_scale: initial log-scale, `ln(1 / 0.07)`.

    Example:
    >>> model = SPARO(vision=dict(image_size=32, patch_size=8, hidden_dim=32, num_layers=3,
    ...               num_heads=4, intermediate_dim=64),
    ...               text=dict(vocabulary_size=64, sequence_length=12, hidden_dim=32,
    ...               num_layers=3, num_heads=4, intermediate_dim=64), num_slots=4, slot_dim=8)
    >>> model.encode_image(keras.ops.ones((2, 32, 32, 3)))["embeds"].shape
    (2, 32)
    """

    family = "sparo"
    image_tower_keys = text_tower_keys = ("tokens",)
    extra_layout_rules = (
        ("(vision|text)_readout/key/kernel", (None, "model")), ("(vision|text)_readout/key/bias", ("model",)),
    )
    vision_defaults = {**CLIP.vision_defaults, "output_dim": None, "activation": "gelu"}
    text_defaults = {**CLIP.text_defaults, "output_dim": None, "activation": "gelu"}

    def __init__(
        self, vision, text, num_slots=64, slot_dim=64, key_dim=None, group_size=1, share_key_value=True,
        reduce_depth=1, end_token_id=None, embed_dim=None, init_logit_scale=math.log(1 / 0.07), **kwargs,
    ):
        if embed_dim is not None and embed_dim != num_slots * slot_dim:
            raise ValueError(
                f"SPARO's embedding width is `num_slots * slot_dim` = {num_slots * slot_dim}; "
                f"received `embed_dim={embed_dim}`. Set `num_slots` / `slot_dim` instead."
            )
        if not isinstance(reduce_depth, int) or reduce_depth < 0:
            raise ValueError(f"`reduce_depth` must be an int >= 0; received {reduce_depth!r}.")
        towers = {}
        for name, tower in (("vision", vision), ("text", text)):
            layers = tower.get("num_layers")
            if not isinstance(layers, int) or layers - reduce_depth < 1:
                raise ValueError(
                    f"`{name}['num_layers']` must be an int > `reduce_depth` ({reduce_depth}): the "
                    f"SPARO tower keeps `num_layers - reduce_depth` blocks; received {layers!r}."
                )
            towers[name] = {**tower, "num_layers": layers - reduce_depth}
        super().__init__(
            towers["vision"], towers["text"], num_slots * slot_dim, init_logit_scale=init_logit_scale, **kwargs
        )
        self.num_slots = num_slots
        self.slot_dim = slot_dim
        self.key_dim = key_dim
        self.group_size = group_size
        self.share_key_value = share_key_value
        self.reduce_depth = reduce_depth
        self.end_token_id = end_token_id
        self.vision_readout = self._readout(self.vision, "vision_readout")
        self.text_readout = self._readout(self.text, "text_readout")

    def _readout(self, tower, name):
        layer = SPAROReadout(
            self.num_slots, self.slot_dim,
            self.key_dim if self.key_dim is not None else tower.hidden_dim // tower.num_heads,
            group_size=self.group_size, share_key_value=self.share_key_value, dtype=self.dtype_policy, name=name,
        )
        layer.build((None, None, tower.hidden_dim))
        return layer

    # ------------------------------------------------------------- features

    def _image_readout(self, images, training=None):
        return self.vision_readout(self._image_tower(images, training=training)["tokens"])

    def _text_readout(self, inputs, training=None):
        ids = inputs["token_ids"]
        tokens = self._text_tower(inputs, training=training)["tokens"]
        return self.text_readout(tokens, end_index=end_token_index(ids, self.end_token_id))

    def _flatten(self, slots):
        return ops.reshape(slots, (-1, self.embed_dim))

    def _image_features(self, images, training=None):
        return {"embeds": self._flatten(self._image_readout(images, training=training)["slots"])}

    def _text_features(self, inputs, training=None):
        return {"embeds": self._flatten(self._text_readout(inputs, training=training)["slots"])}

    def normalize_vectors(self, vectors):
        """`normalize_slots`: every `V`-wide slot L2-normalised, divided by the square root of the slot count."""
        return normalize_slots(vectors, self.slot_dim)

    def _check_encoding(self, embeds, name):
        embeds = check_embeds(embeds, name)
        if embeds.shape[-1] != self.embed_dim:
            raise ValueError(
                f"`{name}` must have shape (B, {self.embed_dim}) (L={self.num_slots} slots of "
                f"V={self.slot_dim}); received shape {tuple(embeds.shape)}."
            )
        return embeds

    def select_slots(self, embeds, slots):
        """The chosen slots of `(B, L * V)` encodings: `(B, |S| * V)`, in increasing slot order.

        Args:
            embeds: `(B, L * V)` encodings.
            slots: bool mask `(L,)` or a sequence of distinct slot indices
                (an integer array is always read as indices, never as a 0/1
                mask).
        """
        embeds = self._check_encoding(embeds, "embeds")
        indices = _slot_indices(slots, self.num_slots)
        chosen = ops.take(ops.reshape(embeds, (-1, self.num_slots, self.slot_dim)), indices, axis=1)
        return ops.reshape(chosen, (-1, len(indices) * self.slot_dim))

    def _finish(self, embeds, normalize, slots):
        if slots is not None:
            embeds = {"embeds": self.select_slots(embeds["embeds"], slots)}
        return self.normalize_embeds(embeds) if normalize else embeds

    def encode_image(self, images, normalize=False, slots=None):
        """Image encodings `{"embeds": (B, L * V)}` (`(B, |S| * V)` with `slots`).

        Args:
            images: float `(B, H, W, 3)` preprocessed pixels.
            normalize: apply `normalize_slots` (over the selected slots).
            slots: None (all), a bool mask `(L,)` or distinct slot indices.
        """
        return self._finish(super().encode_image(images), normalize, slots)

    def encode_text(self, texts, normalize=False, slots=None):
        """Text encodings `{"embeds": (B, L * V)}`; arguments as `encode_image` (texts: tokenizer dict or strings)."""
        return self._finish(super().encode_text(texts), normalize, slots)

    @switches.untracked_inference
    def image_attention(self, images):
        """Attention of every slot over the image tokens, float32 `(B, L, 1 + P)`.

        Position 0 is the CLS token, then the patches in row-major order.
        """
        self._check_image_inputs(images)
        return self._image_readout(images)["attention"]

    @switches.untracked_inference
    def text_attention(self, texts):
        """Attention of every slot over the text positions, float32 `(B, L, T)`; 0 after the end token."""
        inputs = self._tokenize(texts)
        self._check_text_inputs(inputs)
        return self._text_readout(inputs)["attention"]

    # --------------------------------------------------------------- scores

    def score(self, image_embeds, text_embeds, slots=None):
        """`exp(logit_scale) * mean_{l in S} cos(y^i_l, y^t_l)`, float32 `(N_images, N_texts)`.

        Args:
            image_embeds, text_embeds: `encode_image` / `encode_text`'s
                `{"embeds": (N, L * V)}` (raw or normalised, all slots).
            slots: None (all slots), a bool mask `(L,)` or distinct slot
                indices S (the order does not matter).
        """
        image, text = self._scored(image_embeds, "image", slots), self._scored(text_embeds, "text", slots)
        return self.logit_scale_value() * ops.matmul(image, ops.transpose(text))

    def _scored(self, embeds, side, slots):
        """Checked, slot-selected, normalised `(N, |S| * V)` encodings for `score`."""
        embeds = self._check_encoding(self.check_embeds(embeds, side)["embeds"], f"{side}_embeds")
        return self._finish({"embeds": embeds}, True, slots)["embeds"]

    def similarity(self, images, texts, slots=None):
        """Scores of every image against every text `(N_images, N_texts)`; see `score`."""
        return self.score(self.encode_image(images), self.encode_text(texts), slots=slots)

    def contrastive_loss(self, outputs, rows=None, training=False):
        """CLIP's loss on the SPARO encodings (normalised per slot; clip_loss's global re-normalisation is then
        a no-op); with `rows`, those rows' share (open_clip's `local_loss`)."""
        args = (self.normalize_vectors(outputs["image_embeds"]), self.normalize_vectors(outputs["text_embeds"]),
                outputs["logit_scale"])
        return clip_loss(*args, rows=rows)

    # ------------------------------------------------------ slot selection

    def get_config(self):
        config = super().get_config()
        del config["embed_dim"]  # derived: num_slots * slot_dim
        for tower in ("vision", "text"):
            config[tower]["num_layers"] += self.reduce_depth
        config.update(
            num_slots=self.num_slots, slot_dim=self.slot_dim, key_dim=self.key_dim, group_size=self.group_size,
            share_key_value=self.share_key_value, reduce_depth=self.reduce_depth, end_token_id=self.end_token_id,
        )
        return config


register_family(Family("sparo", SPARO, score_loss="softmax", from_clip=CLIPTransfer(logit_scale=True)))
