"""A family defined outside vlzoo, as a third party would write one, following docs/adding_a_family.md:
CLIP whose similarity is the mean over heads of per-head cosines, each with its own learned temperature.

Importing this module registers the family "headwise_clip", its preset `headwise_clip_tiny`
(defined in code, no file under presets/) and the checkpoint format "headwise" of its (imagined)
authors' code, with its converter (`vlzoo convert --from headwise --preset headwise_clip_tiny`). `tests/families.py` imports it, so every cross-cutting test
that takes its families from the registry covers it without naming it: the measure that a new family
is one registration.

The family: embeddings split into `num_heads` heads of `embed_dim / num_heads` features; the score of
image i and text j is `mean_h exp(s + o_h) * cos(image_i[h], text_j[h])`, with CLIP's learned
log-temperature `s` and a learned offset `o_h` per head (`head_logit_offset`, shape `(num_heads,)`,
zero at first); the loss is CLIP's symmetric InfoNCE on it.
"""

import math

import keras
import numpy as np
from keras import ops

import vlzoo
from vlzoo.convert import register_converter
from vlzoo.formats import CheckpointFormat, register_format
from vlzoo.losses import l2_normalize
from vlzoo.models import CLIP, CLIPTransfer, Family, register_family

FAMILY = "headwise_clip"


def headwise_logits(image, text, scales):
    """`(N_image, N_text)` float32: `mean_h scales[h] * cos(image[:, h], text[:, h])`.

    `image` `(N_image, H, d)`, `text` `(N_text, H, d)`, `scales` `(H,)`.
    """
    image, text = l2_normalize(image, axis=-1), l2_normalize(text, axis=-1)
    cosines = ops.einsum("ihd,jhd->hij", image, text)
    return ops.mean(ops.cast(scales, "float32")[:, None, None] * cosines, axis=0)


def _cross_entropy(logits, labels):
    """Mean over rows of `-log_softmax(logits)[row, labels[row]]`."""
    picked = ops.one_hot(labels, ops.shape(logits)[1], dtype="float32") * ops.log_softmax(logits, axis=-1)
    return -ops.mean(ops.sum(picked, axis=-1))


def headwise_loss(image, text, scales, rows=None):
    """The symmetric InfoNCE over `headwise_logits`; with `rows=(start, count)`, one replica's share: images
    `start .. start + count - 1` against every text, and those texts against every image. The shares of
    equal row ranges average to the whole batch's loss."""
    start, count = rows if rows is not None else (0, ops.shape(image)[0])
    rows = lambda x: ops.slice(x, (start, 0, 0), (count, ops.shape(x)[1], ops.shape(x)[2]))  # noqa: E731
    labels = start + ops.arange(count)
    image_to_text = _cross_entropy(headwise_logits(rows(image), text, scales), labels)
    text_to_image = _cross_entropy(headwise_logits(rows(text), image, scales), labels)
    return (image_to_text + text_to_image) / 2


@keras.saving.register_keras_serializable(package="vlzoo_tests")
class HeadwiseCLIP(CLIP):
    """CLIP with a temperature per head of the embedding.

    Args:
        vision, text, embed_dim, init_logit_scale: as `vlzoo.models.CLIP`.
        num_heads: heads the embedding is split into; must divide `embed_dim`.
    """

    family = FAMILY

    def __init__(self, vision, text, embed_dim=512, init_logit_scale=math.log(1 / 0.07), num_heads=2, **kwargs):
        super().__init__(vision, text, embed_dim, init_logit_scale=init_logit_scale, **kwargs)
        if embed_dim % num_heads:
            raise ValueError(f"`num_heads` must divide `embed_dim` {embed_dim}; received {num_heads}.")
        self.num_heads = num_heads
        self.head_logit_offset = self.add_weight(
            shape=(num_heads,), initializer="zeros", dtype="float32", autocast=False, name="head_logit_offset",
        )

    def head_scales(self, logit_scale):
        """`exp(s + o_h)` per head, `(num_heads,)`, from `logit_scale` = `exp(s)`."""
        return logit_scale * ops.exp(ops.convert_to_tensor(self.head_logit_offset))

    def _heads(self, embeds):
        return ops.reshape(embeds, (-1, self.num_heads, ops.shape(embeds)[-1] // self.num_heads))

    def score(self, image_embeds, text_embeds):
        """The head-wise logits of the global embeddings, `(N_images, N_texts)` float32."""
        image, text = self.check_embeds(image_embeds, "image"), self.check_embeds(text_embeds, "text")
        scales = self.head_scales(self.logit_scale_value())
        return headwise_logits(self._heads(image["embeds"]), self._heads(text["embeds"]), scales)

    def contrastive_loss(self, outputs, rows=None, training=False):
        image, text = self._heads(outputs["image_embeds"]), self._heads(outputs["text_embeds"])
        return headwise_loss(image, text, self.head_scales(outputs["logit_scale"]), rows)

    def get_config(self):
        return {**super().get_config(), "num_heads": self.num_heads}


TOWER = dict(hidden_dim=32, num_layers=2, num_heads=4, intermediate_dim=64, activation="quick_gelu")
TINY = {
    "family": FAMILY,
    "class_name": "HeadwiseCLIP",
    "description": "Tiny head-wise CLIP, a family defined in the tests.",
    "paper": "vlzoo's tests (tests/extension_family.py)",
    "weights_note": "Random initialisation; for tests.",
    "config": {
        "vision": dict(image_size=32, patch_size=8, **TOWER),
        "text": dict(vocabulary_size=49408, sequence_length=16, **TOWER),
        "embed_dim": 24,
        "num_heads": 2,
    },
    "tokenizer": {"class_name": "CLIPTokenizer", "assets": "clip_bpe"},
    "preprocessor": {"image_size": 32},
}

register_family(Family(
    FAMILY, HeadwiseCLIP, score_loss="softmax",
    # No `configure`: CLIP's defaults project both towers to `embed_dim`, so a transfer keeps CLIP's projections.
    from_clip=CLIPTransfer(logit_scale=True),
    presets={f"{FAMILY}_tiny": TINY},
))


def from_headwise_checkpoint(weights, preset, *, dtype=None, progress=None):
    """The `headwise_clip` model of `preset` holding `weights`, the `{variable path: array}` its authors' code
    saves (`progress`: unused, the model is small).

    Raises:
        KeyError: naming the variables the checkpoint lacks and the keys no variable takes.
        ValueError: naming a key whose array has another shape than its variable.
    """
    del progress
    model = vlzoo.from_preset(preset, dtype=dtype, load_weights=False)
    variables = {variable.path: variable for variable in model.weights}
    missing, unused = sorted(set(variables) - set(weights)), sorted(set(weights) - set(variables))
    if missing or unused:
        raise KeyError(f"headwise checkpoint: no array for {missing}; no variable for {unused}.")
    for path, variable in variables.items():
        if tuple(weights[path].shape) != tuple(variable.shape):
            raise ValueError(f"headwise checkpoint: {path} is {tuple(weights[path].shape)}, the variable "
                             f"{tuple(variable.shape)}.")
    for path, variable in variables.items():
        variable.assign(np.asarray(weights[path]))
    return model


register_format(CheckpointFormat("headwise", "a checkpoint of the head-wise CLIP authors' code",
                                 architecture=f"{FAMILY}_tiny"))
register_converter("headwise", from_headwise_checkpoint)


def reference_loss(image, text, scales, num_heads):
    """The family's whole-batch loss in numpy (float64), the independent reference of its tests."""
    def split(x):
        x = np.asarray(x, "float64").reshape(len(x), num_heads, -1)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    image, text = split(image), split(text)
    logits = np.mean(np.asarray(scales, "float64")[:, None, None]
                     * np.einsum("ihd,jhd->hij", image, text), axis=0)

    def cross_entropy(z):
        z = z - z.max(axis=1, keepdims=True)
        return -np.mean(np.diag(z) - np.log(np.exp(z).sum(axis=1)))

    return (cross_entropy(logits) + cross_entropy(logits.T)) / 2
