"""Locked towers (LiT): open_clip's groups, and locked weights unchanged bit for bit by `fit`."""

import keras
import numpy as np
import pytest

from vlzoo import training
from vlzoo.training import lock_tower, tower_groups

from conftest import TINY_TEXT, TINY_VISION, tiny_batch, tiny_model, to_numpy


def _variables(members):
    return [v for m in members for v in (m.weights if isinstance(m, keras.layers.Layer) else [m])]


def _values(variables):
    return [to_numpy(v).copy() for v in variables]


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_groups_partition_each_tower_in_forward_order(family):
    # CLIP's image tower: [patch, class token, positions, pre-norm], one group per block but the last,
    # [last block, post-norm], [projection]; SigLIP's has no class token or pre-norm but a MAP head.
    model = tiny_model(family)
    for tower, first in ((model.vision, 4 if family == "clip" else 2), (model.text, 2)):
        groups = tower_groups(tower)
        assert len(groups) == tower.num_layers + 2
        assert len(groups[0]) == first and groups[-1] == [tower.projection]
        assert groups[-2][0] is tower.blocks[-1] and tower.post_norm in groups[-2]
        has_map_head = getattr(tower, "map_head", None) is not None
        assert has_map_head == (family == "siglip" and tower is model.vision) and len(groups[-2]) == 2 + has_map_head
        grouped = [id(v) for group in groups for v in _variables(group)]
        assert sorted(grouped) == sorted(id(v) for v in tower.weights)  # each variable once


@pytest.mark.parametrize("tower,unlocked", [("image", 0), ("text", 0), ("image", 2)])
def test_locked_weights_are_unchanged_by_fit_and_the_rest_trains(tower, unlocked):
    model = tiny_model("clip")
    locked = lock_tower(model, tower, unlocked_groups=unlocked)
    groups = tower_groups(model.vision if tower == "image" else model.text)
    frozen = _variables([m for group in groups[:len(groups) - unlocked] for m in group])
    assert locked == sum(int(np.prod(v.shape)) for v in frozen)
    assert not {id(v) for v in frozen} & {id(v) for v in model.trainable_weights}
    free = [v for v in model.weights if id(v) not in {id(f) for f in frozen}]
    before_frozen, before_free = _values(frozen), _values(free)
    model.compile(optimizer=keras.optimizers.AdamW(1e-2, weight_decay=0.5))  # decay must skip them too
    model.fit(tiny_batch(4), batch_size=4, epochs=3, verbose=0, shuffle=False)
    for got, want in zip(_values(frozen), before_frozen):
        np.testing.assert_array_equal(got, want)
    moved = [not np.array_equal(a, b) for a, b in zip(_values(free), before_free)]
    assert all(moved)  # every unlocked variable, the other tower's and the logit scale, trained


def test_configure_locks_and_checks_its_arguments():
    model = tiny_model("clip")
    training.configure(model, learning_rate=1e-3, total_steps=10, warmup_steps=0, lock_text=True,
                       lock_text_unlocked_groups=1)
    groups = tower_groups(model.text)
    trainable = {id(v) for v in model.trainable_weights}
    assert all(id(v) in trainable for v in _variables(groups[-1]))
    assert not any(id(v) in trainable for v in _variables([m for g in groups[:-1] for m in g]))
    assert all(id(v) in trainable for v in model.vision.weights)
    with pytest.raises(ValueError, match="`lock_image_unlocked_groups` needs `lock_image=True`"):
        training.configure(tiny_model("clip"), learning_rate=1e-3, total_steps=10, lock_image_unlocked_groups=1)
    with pytest.raises(ValueError, match=r"`unlocked_groups` must be an int in \[0, 3\]"):
        lock_tower(tiny_model("clip"), "text", unlocked_groups=4)
    with pytest.raises(ValueError, match="`tower` must be one of"):
        lock_tower(tiny_model("clip"), "vision")
    assert TINY_VISION["num_layers"] == TINY_TEXT["num_layers"] == 2
