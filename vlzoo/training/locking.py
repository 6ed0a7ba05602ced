"""Locked towers (LiT): train one tower, or the last groups of it, and keep the rest fixed.

LiT (Zhai et al., "LiT: Zero-Shot Transfer with Locked-image text Tuning", CVPR 2022) trains
the text tower against a pretrained image tower that does not move (open_clip's `--lock-image
--lock-image-unlocked-groups N`, and the same for text).
A tower's parameters are grouped as open_clip groups them, in forward order:

    image: [patch embedding, class token, position embedding, pre-norm]
           [block 0] ... [block L-2] [block L-1, post-norm, MAP head] [projection]
    text:  [token embedding, position embedding]
           [block 0] ... [block L-2] [block L-1, post-norm] [projection]

`lock_tower(model, tower, unlocked_groups=N)` fixes every group but the last `N`. Only the
tower is locked: a family's heads outside it (SPARC's and FILIP's local projections, Llip's
cross-attention, SPARO's readouts, STAIR's vocabulary heads) and the logit scale/bias keep
training. Lock before `compile` (`configure` does): the optimizer takes the trainable variables
when it is built. A locked variable ends a `fit` bit for bit as it started (no update, no weight
decay). `cache_tower` computes a wholly locked tower's outputs once per dataset, so that `fit`
runs only the rest.

Example:
>>> model = vlzoo.from_preset("clip_vit_b16_openai")  # doctest: +SKIP
>>> lock_tower(model, "image")  # LiT  # doctest: +SKIP
>>> model.compile(optimizer="adamw")  # doctest: +SKIP
>>> model.fit(cache_tower(model, data, "image"), batch_size=256, epochs=10)  # doctest: +SKIP
"""

import math
import numbers

import keras
import numpy as np

from vlzoo.layers.vision import VisionTransformer
from vlzoo.training._models import tower_layer

__all__ = ["cache_tower", "lock_tower", "tower_groups"]


def tower_groups(tower):
    """A tower's layers and variables in open_clip's locking groups, in forward order.

    Args:
        tower: a model's `vision` (`VisionTransformer`) or `text` tower.

    Returns:
        A list of non-empty lists of `keras.layers.Layer`s and `keras.Variable`s: `num_layers + 2`
        groups.

    Example:
    >>> len(tower_groups(model.vision)) == model.vision.num_layers + 2  # doctest: +SKIP
    True
    """
    if isinstance(tower, VisionTransformer):
        first = [tower.patch_embedding, getattr(tower, "prefix_tokens", None), tower.position_embedding,
                 getattr(tower, "register_tokens", None), tower.pre_norm]
        last = [tower.blocks[-1], tower.post_norm, tower.map_head]
    else:
        first = [tower.token_embedding, tower.position_embedding]
        last = [tower.blocks[-1], tower.post_norm]
    groups = [first, *([block] for block in tower.blocks[:-1]), last, [tower.projection]]
    return [members for members in ([m for m in group if m is not None] for group in groups) if members]


def lock_tower(model, tower, unlocked_groups=0):
    """Makes every group of `model`'s image or text tower but the last `unlocked_groups` non-trainable.

    Args:
        model: a vlzoo model.
        tower: `"image"` or `"text"`.
        unlocked_groups: how many of the last groups (`tower_groups`) keep
            training, from 0 (the whole tower locked) to one less than the
            tower's number of groups (`num_layers + 2`: the embeddings, one
            group per block but the last, the last block with the final norm,
            the projection).

    Returns:
        The number of parameters locked.

    Raises:
        TypeError: `model` is not a vlzoo model.
        ValueError: an unknown `tower`, or `unlocked_groups` not an int in that range.

    Example:
    >>> locked = lock_tower(model, "text", unlocked_groups=2)  # all but the last block and projection  # doctest: +SKIP
    """
    groups = tower_groups(tower_layer(model, tower))
    if isinstance(unlocked_groups, bool) or not isinstance(unlocked_groups, numbers.Integral) \
            or not 0 <= unlocked_groups < len(groups):
        raise ValueError(f"`unlocked_groups` must be an int in [0, {len(groups) - 1}] (the {tower} tower has "
                         f"{len(groups)} groups); received {unlocked_groups!r}.")
    locked = 0
    for group in groups[:len(groups) - unlocked_groups]:
        for member in group:
            variables = member.weights if isinstance(member, keras.layers.Layer) else [member]
            locked += sum(math.prod(v.shape) for v in variables)
            member.trainable = False
    return locked


def cache_tower(model, data, tower="image", batch_size=64, verbose=False):
    """`data` with a wholly locked tower's outputs computed once, for `fit` to train the rest on.

    The model's `call` takes the image tower's cached outputs under
    `"image_tower"` in place of `"images"`, and the text tower's under
    `"text_tower"` beside `"token_ids"` and `"padding_mask"` (which the text
    features still read). Only the outputs the family reads are kept
    (`model.image_tower_keys`, `model.text_tower_keys`: the pooled output
    for CLIP, SigLIP and Llip's text, the token outputs for the others). The
    tower runs in inference mode, which is its training mode too (vlzoo's
    towers have no dropout); any augmentation of its inputs is fixed at what
    `data` holds. Batches of the cached data need `batch_size` rows as usual;
    `micro_batch_size` (gradient caching) applies to them as well.

    Args:
        model: a vlzoo model whose `tower` is wholly locked (`lock_tower(model, tower)`).
        data: a dict of arrays `{"images": (N, H, W, 3), "token_ids": (N, T), "padding_mask": (N, T)}`,
            or an iterable of such dicts (batches, e.g. `vlzoo.data.image_text_dataset(...)` without
            training augmentation), read once: only the tower's outputs and the other inputs are kept.
        tower: `"image"` or `"text"`.
        batch_size: rows per tower call (a dict's; an iterable's batches are its own).
        verbose: a progress bar.

    Returns:
        A new dict: for `"image"`, `{"image_tower": {key: (N, ...)}, "token_ids", "padding_mask"}`; for
        `"text"`, `data` plus `{"text_tower": {key: (N, ...)}}`. Arrays are numpy.

    Raises:
        TypeError: `model` is not a vlzoo model.
        ValueError: an unknown `tower`, a tower not wholly locked, `data` (or one of its batches)
            without the tower's inputs, or no examples.

    Example:
    >>> lock_tower(model, "image"); model.compile(optimizer="adamw")  # doctest: +SKIP
    >>> cached = cache_tower(model, {"images": x, "token_ids": ids, "padding_mask": mask})  # doctest: +SKIP
    >>> model.fit(cached, batch_size=64, epochs=20)  # doctest: +SKIP
    """
    layer = tower_layer(model, tower)
    if layer.trainable_weights:
        raise ValueError(f"The {tower} tower is not wholly locked ({len(layer.trainable_weights)} trainable "
                         f"variables): its outputs change as it trains. Lock it first: lock_tower(model, {tower!r}).")
    needed = ("images",) if tower == "image" else ("token_ids", "padding_mask")
    keys = model.image_tower_keys if tower == "image" else model.text_tower_keys
    rows = len(data[needed[0]]) if isinstance(data, dict) and needed[0] in data else None
    bar = keras.utils.Progbar(rows, unit_name="example") if verbose else None
    parts, done = {}, 0
    for batch in _batches(data, needed, batch_size):
        if tower == "image":
            outputs = model._image_tower(batch["images"], training=False)
        else:
            outputs = model._text_tower({key: batch[key] for key in needed}, training=False)
        kept = {key: value for key, value in batch.items() if not (tower == "image" and key == "images")}
        for key, value in [*kept.items(), *((f"{tower}_tower/{key}", outputs[key]) for key in keys)]:
            parts.setdefault(key, []).append(keras.ops.convert_to_numpy(value))
        done += len(batch[needed[0]])
        if bar is not None:
            bar.update(done)
    if bar is not None:
        bar.update(done, finalize=True)
    if not done:
        raise ValueError("`data` holds no examples to cache.")
    merged = {key: np.concatenate(values) for key, values in parts.items()}
    cached = {key: merged.pop(f"{tower}_tower/{key}") for key in keys}
    return {**merged, f"{tower}_tower": cached}


def _batches(data, needed, batch_size):
    """`data`'s batches as dicts of arrays: a dict's rows `batch_size` at a time, or an iterable's own."""
    if isinstance(data, dict):
        if not set(needed) <= set(data):
            raise ValueError(f"`data` must be a dict of arrays with {list(needed)}; received {sorted(data)}.")
        rows = len(data[needed[0]])
        for start in range(0, rows, batch_size):
            yield {key: value[start:start + batch_size] for key, value in data.items()}
        return
    if not hasattr(data, "__iter__"):
        raise ValueError(f"`data` must be a dict of arrays with {list(needed)}, or an iterable of such batches; "
                         f"received {type(data).__name__}.")
    for batch in data.as_numpy_iterator() if hasattr(data, "as_numpy_iterator") else data:
        if not isinstance(batch, dict) or not set(needed) <= set(batch):
            received = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
            raise ValueError(f"Each batch of `data` must be a dict of arrays with {list(needed)}; received {received}.")
        yield batch

