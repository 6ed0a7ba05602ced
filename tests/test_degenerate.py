"""Degenerate inputs, for every family's tiny preset (one block per tower, `margins.shallow_towers`): each
test states the expected outcome.

- constant batches (every image the same constant, every caption the same, empty captions):
  a finite loss with finite gradients; where every pair scores the same, the loss is the one
  that a constant score matrix gives (log B for the softmax losses);
- zero embeddings (every weight zero): finite loss and gradients;
- a batch of one pair: finite loss and gradients (the softmax losses are exactly 0);
- all-padding captions inside a batch: finite loss and gradients;
- captions longer than the context: truncated by the tokenizer with the end token kept, so the
  model sees the words that fit;
- images of the wrong size: resized by the preprocessor, rejected by the model with an error
  naming `images` and the expected size (unless the vision tower has `dynamic_image_size`);
- non-finite pixels: rejected with an error naming `images`.
"""

import math

import keras
import numpy as np
import pytest
from conftest import to_numpy
from families import FAMILIES
from margins import shallow_towers

import vlzoo
from vlzoo.models import get_family

# Families whose loss at the first step is a softmax cross-entropy, or the sigmoid loss, of the batch's
# scores alone, as each declares (`Family.score_loss`; STAIR's FLOPs regularisers ramp up from 0).
SOFTMAX = tuple(family for family in FAMILIES if get_family(family).score_loss == "softmax")
SIGMOID = tuple(family for family in FAMILIES if get_family(family).score_loss == "sigmoid")
# The steps run eagerly on TensorFlow, where tracing a family's train step costs seconds of graph building and an
# eager step a fraction of one: what these tests check is the values of a step on degenerate inputs (a finite loss,
# finite gradients, the loss a constant score matrix gives), which the eager step computes with the same kernels;
# that `fit`'s traced step trains every family on TensorFlow is checked by
# tests/test_family_contract.py::test_fit_trains_on_the_familys_own_loss. JAX compiles the step (its eager ops
# compile one by one, slower than one compiled step), PyTorch's step is eager anyway.
EAGER_STEPS = keras.backend.backend() == "tensorflow"


@pytest.fixture(scope="module")
def tiny():
    """`tiny(family)`: the family's tiny preset (one block per tower), compiled for one SGD(0.1) step (eager on
    TensorFlow, `EAGER_STEPS`), built once per module and restored to its initial weights (step counters included)
    on every call."""
    built = {}

    def restore(family):
        if family not in built:
            keras.utils.set_random_seed(7)
            model = vlzoo.from_preset(f"{family}_tiny", **shallow_towers(family))
            model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1), run_eagerly=EAGER_STEPS)
            built[family] = model, model.get_weights()
        model, weights = built[family]
        model.set_weights(weights)
        if model.optimizer.built:
            model.optimizer.iterations.assign(0)
        if family == "stair":
            assert [float(to_numpy(w)) for w in model.flops_weights()] == [0.0, 0.0]
        return model

    return restore


def _batch(model, images, captions):
    tokens = model.tokenizer(captions)
    return {"images": np.asarray(images, "float32"), "token_ids": np.asarray(tokens["token_ids"]),
            "padding_mask": np.asarray(tokens["padding_mask"])}


def _step(model, batch):
    """One SGD step through Keras' own train step (compiled; eager on TensorFlow, `EAGER_STEPS`), after checking
    that the loss and every updated weight are finite (a non-finite gradient makes weights non-finite): the loss
    before it and the largest change of a weight."""
    before = [to_numpy(v).copy() for v in model.trainable_variables]
    loss = model.train_on_batch(batch, return_dict=True)["loss"]
    assert np.isfinite(loss), loss
    after = [to_numpy(v) for v in model.trainable_variables]
    for variable, value in zip(model.trainable_variables, after):
        assert np.isfinite(value).all(), f"non-finite weights in {variable.path} after one step"
    return loss, max(float(np.max(np.abs(a - b), initial=0.0)) for a, b in zip(after, before))


def _train_step(model, batch, learns=True):
    """`_step`'s loss, after checking, with `learns`, that some weight moved (where the loss is
    stationary, none may: the gradients of these stationary points are exactly zero)."""
    loss, step = _step(model, batch)
    # SGD(0.1): a step above 1e-6 is a gradient above 1e-5.
    assert (step > 1e-6) == learns, f"largest weight change {step:.3g}: the gradient should be {'non' if learns else ''}zero"
    return loss


def _constant_score_loss(family, logit, batch_size):
    """The loss of a batch whose B x B scores all equal `logit`."""
    if family in SOFTMAX:
        return math.log(batch_size)
    # Sigmoid loss, normalised by B: one positive and B - 1 negatives per row.
    softplus = lambda x: max(x, 0.0) + math.log1p(math.exp(-abs(x)))  # noqa: E731
    return softplus(-logit) + (batch_size - 1) * softplus(logit)


def _expected_loss(model, family, batch, batch_size):
    """`_constant_score_loss` of the batch's constant score; FLAIR averages two sigmoid losses (one caption per
    image: each normalised by B), over its conditioned scores and over its global ones."""
    if family in SOFTMAX:  # whatever the score
        return _constant_score_loss(family, None, batch_size)
    texts = {k: batch[k] for k in ("token_ids", "padding_mask")}
    logit = float(to_numpy(model.similarity(batch["images"], texts))[0, 0])
    if family != "flair":
        return _constant_score_loss(family, logit, batch_size)
    overall = float(to_numpy(model.score(model.encode_image(batch["images"]), model.encode_text(texts),
                                         mode="global"))[0, 0])
    return (_constant_score_loss(family, logit, batch_size) + _constant_score_loss(family, overall, batch_size)) / 2


@pytest.mark.parametrize("family", FAMILIES)
def test_constant_batch_gives_the_constant_score_loss(tiny, family):
    # Four copies of one constant image and one empty caption: every pair scores the same.
    model = tiny(family)
    size = model.vision.image_size
    batch = _batch(model, np.full((4, size, size, 3), 0.5), [""] * 4)
    logits = to_numpy(model.similarity(batch["images"], {k: batch[k] for k in ("token_ids", "padding_mask")}))
    np.testing.assert_allclose(logits, np.full((4, 4), logits[0, 0]), rtol=1e-5, atol=1e-5)
    expected = _expected_loss(model, family, batch, 4)
    # Constant scores: the sigmoid losses' bias moves, the softmax losses' gradients vanish.
    if family not in SOFTMAX:
        loss = _train_step(model, batch)
    else:
        # Each row's terms cancel exactly (every pair is the same pair), and float32 leaves only their
        # rounding: about its epsilon (1.2e-7) of the terms a real gradient is made of. So the step is
        # measured against the step of the same weights on a batch whose pairs differ: at most 8e-7 of
        # it on the three backends (tipsv2's 1.1e-6, with a logit scale of 100, is 2e-7 of its own).
        loss, step = _step(model, batch)
        varied = _batch(model, np.random.default_rng(0).normal(size=(4, size, size, 3)),
                        ["a cat", "a dog", "a red circle", "two blue squares"])
        _, reference = _step(tiny(family), varied)
        assert step < 1e-4 * reference, f"largest weight change {step:.3g}, {step / reference:.2g} of a real step's"
    if family in SOFTMAX + SIGMOID:
        assert loss == pytest.approx(expected, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_constant_images_empty_and_all_padding_captions_train_finitely(tiny, family):
    # Black, white and constant images; an empty caption and an all-padding row next to real ones.
    model = tiny(family)
    size = model.vision.image_size
    images = np.stack([np.full((size, size, 3), value) for value in (0.0, 1.0, -1.0, 0.0)])
    batch = _batch(model, images, ["", "a photo of a cat", "a red circle", "two dogs"])
    batch["padding_mask"][3] = False
    _train_step(model, batch)


@pytest.mark.parametrize("family", FAMILIES)
def test_zero_embeddings_train_finitely(tiny, family):
    # Every weight zero: every embedding (and every normalised one) is the zero vector.
    model = tiny(family)
    for variable in model.trainable_variables:
        variable.assign(np.zeros(variable.shape, variable.dtype))
    size = model.vision.image_size
    batch = _batch(model, np.random.default_rng(0).normal(size=(4, size, size, 3)), ["a cat", "a dog", "", "a red circle"])
    image_embeds = model.encode_image(batch["images"])
    for value in keras.tree.flatten(image_embeds):
        assert not to_numpy(value).any()
    # A stationary point: every score is 0, so only the sigmoid losses' bias has a gradient.
    loss = _train_step(model, batch, learns=family in SIGMOID)
    if family in SOFTMAX:
        assert loss == pytest.approx(math.log(4), rel=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_batch_of_one(tiny, family):
    # One pair: its own only negative-free row; the softmax losses are exactly 0.
    model = tiny(family)
    size = model.vision.image_size
    batch = _batch(model, np.random.default_rng(0).normal(size=(1, size, size, 3)), ["a red circle"])
    expected = _expected_loss(model, family, batch, 1)
    loss = _train_step(model, batch, learns=family not in SOFTMAX)
    if family in SOFTMAX + SIGMOID:
        assert loss == pytest.approx(expected, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_captions_longer_than_the_context_are_truncated(tiny, family):
    # The tokenizer keeps the first T - 2 tokens and the end token; the model sees those words.
    model = tiny(family)
    tokenizer = model.tokenizer
    length = model.text.sequence_length
    words = ["cat", "dog", "red", "blue"] * length
    long = tokenizer([" ".join(words)])
    ids, mask = np.asarray(long["token_ids"])[0], np.asarray(long["padding_mask"])[0]
    assert ids.shape == (length,) and mask.all()
    fitting = tokenizer([" ".join(words[: length - 2])])
    np.testing.assert_array_equal(ids, np.asarray(fitting["token_ids"])[0])
    for got, want in zip(keras.tree.flatten(model.encode_text(long)), keras.tree.flatten(model.encode_text(fitting))):
        np.testing.assert_array_equal(to_numpy(got), to_numpy(want))


@pytest.mark.parametrize("family", FAMILIES)
def test_images_of_the_wrong_size_are_resized_by_the_preprocessor_and_rejected_by_the_model(tiny, family):
    model = tiny(family)
    size, patch = model.vision.image_size, model.vision.patch_size
    photo = np.random.default_rng(0).integers(0, 256, size=(2, 3 * size // 2, 2 * size, 3), dtype=np.uint8)
    pixels = to_numpy(model.preprocessor(photo))
    assert pixels.shape == (2, size, size, 3) and np.isfinite(pixels).all()
    wrong = np.zeros((2, size + patch, size + patch, 3), "float32")
    message = rf"`images` must be {size} x {size} pixels.*\(2, {size + patch}, {size + patch}, 3\).*preprocessor"
    with pytest.raises(ValueError, match=message):
        model.encode_image(wrong)
    texts = model.tokenizer(["a cat", "a dog"])
    with pytest.raises(ValueError, match=message):
        model({"images": wrong, **texts})


def test_dynamic_image_size_resizes_the_position_embedding(tiny):
    # Opting in: another multiple of the patch size is accepted, the native size is unchanged.
    fixed = tiny("clip")
    config = fixed.get_config()
    config["vision"] = {**config["vision"], "dynamic_image_size": True}
    dynamic = type(fixed).from_config(config)
    dynamic.set_weights(fixed.get_weights())
    size, patch = fixed.vision.image_size, fixed.vision.patch_size
    images = np.random.default_rng(0).normal(size=(2, size, size, 3)).astype("float32")
    np.testing.assert_array_equal(to_numpy(dynamic.encode_image(images)["embeds"]),
                                  to_numpy(fixed.encode_image(images)["embeds"]))
    bigger = np.random.default_rng(1).normal(size=(2, size + 2 * patch, size, 3)).astype("float32")
    assert np.isfinite(to_numpy(dynamic.encode_image(bigger)["embeds"])).all()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_pixels_are_rejected(tiny, family, value):
    model = tiny(family)
    size = model.vision.image_size
    images = np.zeros((2, size, size, 3), "float32")
    images[1, size // 2, 3, 2] = value
    with pytest.raises(ValueError, match="`images` contains non-finite values"):
        model.encode_image(images)
    with pytest.raises(ValueError, match="`images` contains non-finite values"):
        model.similarity(images, ["a cat", "a dog"])
    # A backend tensor on the CPU is read as well (only a tensor on an accelerator is left unread).
    with pytest.raises(ValueError, match="`images` contains non-finite values"):
        model.encode_image(keras.ops.convert_to_tensor(images))
