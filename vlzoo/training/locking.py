"""Locked towers (LiT): train one tower, or the last groups of it, and keep the rest fixed.

LiT (Zhai et al., "LiT: Zero-Shot Transfer with Locked-image text Tuning", CVPR
2022) trains the text tower against a pretrained image tower that does not move.
open_clip exposes it as `--lock-image --lock-image-unlocked-groups N` (and the same
for text), and vlzoo groups a tower's parameters as open_clip does, in forward order:

    image: [patch embedding, class token, position embedding, pre-norm]
           [block 0] ... [block L-2] [block L-1, post-norm, MAP head] [projection]
    text:  [token embedding, position embedding]
           [block 0] ... [block L-2] [block L-1, post-norm] [projection]

Locking with `unlocked_groups=N` fixes every group but the last `N`. Only the
tower is locked: a family's own heads outside it (SPARC's and FILIP's local
projections, Llip's cross-attention, SPARO's readouts, STAIR's vocabulary heads)
and the logit scale/bias keep training. Lock before `compile` (`configure` does):
the optimizer takes the trainable variables when it is built. A locked variable
is left alone by the optimizer, weight decay included, so it ends a `fit` bit for
bit as it started.

Example:
>>> model = vlzoo.from_preset("clip_vit_b16_openai")
>>> lock_tower(model, "image")                     # LiT
>>> lock_tower(model, "text", unlocked_groups=2)   # all but the last block and the projection
>>> model.compile(optimizer="adamw")
"""

import math
import numbers

import keras

from vlzoo.layers.vision import VisionTransformer
from vlzoo.models.base import ContrastiveModel

__all__ = ["lock_tower", "tower_groups"]

TOWERS = {"image": "vision", "text": "text"}


def tower_groups(tower):
    """A tower's layers and variables in open_clip's locking groups, in forward order.

    Args:
        tower: a model's `vision` (`VisionTransformer`) or `text` tower.

    Returns:
        A list of non-empty lists of `keras.layers.Layer`s and `keras.Variable`s.
    """
    if isinstance(tower, VisionTransformer):
        first = [tower.patch_embedding, getattr(tower, "prefix_tokens", None), tower.position_embedding,
                 tower.pre_norm]
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
            tower's number of groups (`num_layers + 2`, one more for an image
            tower with a pre-norm or class token group).

    Returns:
        The number of parameters locked.
    """
    if not isinstance(model, ContrastiveModel):
        raise TypeError(f"`model` must be a vlzoo model (a ContrastiveModel); received {type(model).__name__}.")
    if tower not in TOWERS:
        raise ValueError(f"`tower` must be one of {list(TOWERS)}; received {tower!r}.")
    groups = tower_groups(getattr(model, TOWERS[tower]))
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
