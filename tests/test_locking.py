"""Locked towers (LiT): open_clip's groups, and locked weights unchanged bit for bit by `fit`."""

import keras
import numpy as np
import pytest

from vlzoo import training
from vlzoo.training import lock_tower, tower_groups

from backend_utils import EAGER_REFERENCE
from conftest import TWO_BLOCKS, tiny_batch, tiny_model, to_numpy
from families import FAMILIES
from margins import assert_decision_margin, margin_batch, tiny_family_model


def _variables(members):
    return [v for m in members for v in (m.weights if isinstance(m, keras.layers.Layer) else [m])]


def _values(variables):
    return [to_numpy(v).copy() for v in variables]


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_groups_partition_each_tower_in_forward_order(family):
    # CLIP's image tower: [patch, class token, positions, pre-norm], one group per block but the last,
    # [last block, post-norm], [projection]; SigLIP's has no class token or pre-norm but a MAP head.
    model = tiny_model(family, **TWO_BLOCKS)
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
    model = tiny_model("clip", **TWO_BLOCKS)
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
    model = tiny_model("clip", **TWO_BLOCKS)
    training.configure(model, learning_rate=1e-3, total_steps=10, warmup_steps=0, lock_text=True,
                       lock_text_unlocked_groups=1)
    groups = tower_groups(model.text)
    trainable = {id(v) for v in model.trainable_weights}
    assert all(id(v) in trainable for v in _variables(groups[-1]))
    assert not any(id(v) in trainable for v in _variables([m for g in groups[:-1] for m in g]))
    assert all(id(v) in trainable for v in model.vision.weights)
    with pytest.raises(ValueError, match="`lock_image_unlocked_groups` needs `lock_image=True`"):
        training.configure(tiny_model("clip", **TWO_BLOCKS), learning_rate=1e-3, total_steps=10,
                           lock_image_unlocked_groups=1)
    with pytest.raises(ValueError, match=r"`unlocked_groups` must be an int in \[0, 3\]"):
        lock_tower(tiny_model("clip", **TWO_BLOCKS), "text", unlocked_groups=4)
    with pytest.raises(ValueError, match="`tower` must be one of"):
        lock_tower(tiny_model("clip", **TWO_BLOCKS), "vision")
    assert model.vision.num_layers == model.text.num_layers == 2


# ------------------------------------------------------------------ a locked tower's cached outputs

# The cached path is the same code on every backend (a dict passed where the tower's output was); what
# differs by family is which outputs it reads. So every family and tower runs on PyTorch; on JAX and
# TensorFlow, whose compilations cost 10-20 s each, CLIP's image tower (the pooled output) and SPARC's
# text tower (the token outputs, with the text mask beside them).
CACHE_CASES = ([(family, tower) for family in FAMILIES for tower in ("image", "text")]
               if keras.backend.backend() == "torch" else [("clip", "image"), ("sparc", "text")])


def _one_sgd_step(family, tower, cached, micro_batch_size=None):
    """The change of every trainable variable after one SGD(lr=1) step of `fit` with `tower` locked,
    on the raw pairs or on the tower's cached outputs. The step on the raw pairs is the reference the cached
    step is compared with: eager on TensorFlow (`EAGER_REFERENCE`: tracing a second train step costs seconds, an
    eager step a fraction of one; the same float32 arithmetic to rounding, well inside the comparison's 1e-5),
    so that the traced step under test is the cached one."""
    keras.utils.set_random_seed(0)
    model = tiny_family_model(family, logit_scale_max=None)
    batch = margin_batch(model)
    assert_decision_margin(model, batch)  # the cached and direct paths decide FILIP's, SPARC's, STAIR's choices alike
    if family == "stair":
        model.stage_fractions = None  # one step: stage 1, by hand
    lock_tower(model, tower)
    model.micro_batch_size = micro_batch_size
    data = training.cache_tower(model, batch, tower, batch_size=3) if cached else batch
    before = _values(model.trainable_variables)
    model.compile(optimizer=keras.optimizers.SGD(1.0), run_eagerly=EAGER_REFERENCE and not cached)
    model.fit(data, batch_size=8, epochs=1, verbose=0, shuffle=False)
    return [b - to_numpy(v) for b, v in zip(before, model.trainable_variables, strict=True)], data


@pytest.mark.parametrize("family, tower", CACHE_CASES)
def test_fit_on_a_cached_tower_takes_the_step_of_fit_on_the_pairs(family, tower):
    want, _ = _one_sgd_step(family, tower, cached=False)
    got, data = _one_sgd_step(family, tower, cached=True)
    model_keys = {"image": "image_tower", "text": "text_tower"}
    assert model_keys[tower] in data and ("images" in data) == (tower == "text")
    assert sum(float(np.abs(g).sum()) for g in want) > 0
    # The cached outputs came from batches of 3, the step's from a batch of 8: the same float32 sums in
    # another order, an error that grows with the terms (1e-5 of each gradient's scale, at least 1).
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 * max(1.0, float(np.abs(w).max())))


def test_a_cached_tower_with_micro_batches_and_the_errors():
    want, _ = _one_sgd_step("filip", "image", cached=False)
    got, _ = _one_sgd_step("filip", "image", cached=True, micro_batch_size=2)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 * max(1.0, float(np.abs(w).max())))
    model = tiny_model("clip", **TWO_BLOCKS)
    batch = tiny_batch(4)
    with pytest.raises(ValueError, match=r"The image tower is not wholly locked .*lock_tower\(model, 'image'\)"):
        training.cache_tower(model, batch, "image")
    lock_tower(model, "image", unlocked_groups=1)
    with pytest.raises(ValueError, match="not wholly locked"):
        training.cache_tower(model, batch, "image")
    lock_tower(model, "text")
    with pytest.raises(ValueError, match=r"`data` must be a dict of arrays with \['token_ids', 'padding_mask'\]"):
        training.cache_tower(model, {"images": batch["images"]}, "text")
    cached = training.cache_tower(model, batch, "text")
    # Batches from an iterable (a dataset read once) give the dict's cache: the same calls on the same rows.
    halves = [{key: value[start:start + 2] for key, value in batch.items()} for start in (0, 2)]
    streamed = training.cache_tower(model, iter(halves), "text")
    by_rows = training.cache_tower(model, batch, "text", batch_size=2)
    assert sorted(streamed) == sorted(by_rows) == ["images", "padding_mask", "text_tower", "token_ids"]
    np.testing.assert_array_equal(streamed["text_tower"]["pooled"], by_rows["text_tower"]["pooled"])
    np.testing.assert_array_equal(streamed["token_ids"], batch["token_ids"])
    with pytest.raises(ValueError, match=r"Each batch of `data` must be a dict of arrays"):
        training.cache_tower(model, iter([batch["images"]]), "text")
    with pytest.raises(ValueError, match="holds no examples"):
        training.cache_tower(model, iter([]), "text")
    cached["text_tower"] = {"tokens": cached["text_tower"]["pooled"]}
    with pytest.raises(ValueError, match=r"`inputs\['text_tower'\]` must be a dict of the tower's outputs \['pooled'\]"):
        model(cached)
