"""Gradient caching (`micro_batch_size`): every family's gradients over the whole contrastive batch,
computed a micro-batch of towers at a time, equal the one-pass gradients."""

import warnings

import keras
import numpy as np
import pytest

import vlzoo
from vlzoo import training
from vlzoo.models.micro_batching import micro_batched

from backend_utils import EAGER_REFERENCE
from conftest import tiny_batch, to_numpy
from families import FAMILIES
from margins import assert_decision_margin, margin_batch, threshold_gap, tiny_family_model, top_two_gap

BACKEND = keras.backend.backend()

# Every family on every backend: what depends on the backend is `keras.remat` around a micro-batch of
# towers; what depends on the family is which features it computes per example (keys, values, mixture
# tokens, queries, slots, sparse vocabulary vectors) and its loss's coupling of the batch. STAIR's loss
# changes with its stage (stage 2 freezes the image tower): each is checked, set by hand, since one step
# has no room for the one-`fit` schedule.
CASES = [(family, stage) for family in FAMILIES for stage in ((1, 2, 3) if family == "stair" else (None,))]
# FILIP, SPARC and STAIR take discrete choices (max, top-k, threshold, ReLU) that both paths must decide alike
# on any CPU: the models and the batch keep every choice a margin from ties (tests/margins.py), asserted.

# The cases whose micro-batched step runs compiled on every backend (a traced `fit` on TensorFlow, a jitted one
# on JAX), with the kinds of per-example features, (rank, dtype), that each carries across the micro-batches. The
# compiled part of gradient caching (JAX: `jax.checkpoint` inside one `lax.scan`, which stacks each feature by
# micro-batch; TensorFlow: `tf.recompute_grad`'s graph-mode custom gradient, which captures the variables a
# micro-batch reads and delays its recomputation to the backward pass) meets a family only through those kinds and
# through which of the variables it reads train: FILIP brings pooled embeddings, token features and a bool mask,
# Llip rank-4 keys and values, STAIR's stage 2 a frozen image tower (variables read inside the remat that do not
# train). Every other case's features are of those kinds (asserted), its towers draw nothing at random (FLAIR's
# caption sampling is in its loss), so the recomputation is the forward call again, and its loss sees the
# concatenated features as the whole batch's does. So the other cases are checked more cheaply where a compiled
# step per family costs seconds of graph building: TensorFlow runs their micro-batched step eagerly
# (`tf.recompute_grad`'s eager custom gradient: the same recomputation and backward). JAX (a jitted `fit`; its eager
# ops compile one by one, slower than the step) and PyTorch (eager, `torch.utils.checkpoint`) check every case's
# compiled or eager step; the towers' and losses' gradients are tied across the backends by
# tests/test_conformance.py.
COMPILED_CASES = {("filip", None): {(2, "float32"), (3, "float32"), (2, "bool")},
                  ("llip", None): {(2, "float32"), (3, "float32"), (4, "float32")},
                  ("stair", 2): {(2, "float32")}}
FEATURE_KINDS = set().union(*COMPILED_CASES.values())


def _model(family, stage=None):
    """`family`'s tiny model in `stage`, from one seed: both steps start from the same weights."""
    keras.utils.set_random_seed(0)
    model = tiny_family_model(family, logit_scale_max=None)
    if stage is not None:
        model.set_stage(stage)
    return model


def _one_sgd_step(model, micro_batch_size, batch, eager):
    """The change of every trainable variable of `model` after one SGD(lr=1) step of `fit` on `batch`: minus the
    gradient (the logit-scale clamp is off so that it cannot cut the step); `eager`: `compile(run_eagerly=True)`."""
    model.micro_batch_size = micro_batch_size
    before = [to_numpy(v).copy() for v in model.trainable_variables]
    model.compile(optimizer=keras.optimizers.SGD(1.0), run_eagerly=eager)
    model.fit(batch, batch_size=len(batch["images"]), epochs=1, verbose=0, shuffle=False)
    return [b - to_numpy(v) for b, v in zip(before, model.trainable_variables, strict=True)]


def _feature_kinds(outputs):
    """(rank, dtype) of each per-example output of a training call (the scalars, logit scale and bias, are not
    computed by micro-batches)."""
    return {(len(value.shape), keras.backend.standardize_dtype(value.dtype)) for value in outputs.values()
            if len(value.shape)}


def _assert_close(got, want):
    # Within 1e-5 of each gradient's scale (its largest entry, at least 1): both paths add the same
    # float32 terms in another order, an error that grows with the terms. Measured on the AVX2-only EPYC
    # with one block per tower, as a share of that scale: at most 2.1e-6 (JAX, TIPSv2), 1.4e-6 (TensorFlow,
    # PE-Core), 9.2e-7 (PyTorch, TIPSv2); the AVX-512 EPYC's, with two blocks, were of the same size.
    for g, w in zip(got, want, strict=True):
        w = to_numpy(w)
        np.testing.assert_allclose(to_numpy(g), w, rtol=0, atol=1e-5 * max(1.0, float(np.abs(w).max(initial=0.0))))


@pytest.mark.parametrize("family, stage", CASES)
def test_micro_batched_gradients_equal_the_whole_batchs(family, stage):
    model = _model(family, stage)
    batch = margin_batch(model)
    micro = len(batch["images"]) // 2  # two micro-batches
    compiled = (family, stage) in COMPILED_CASES
    assert_decision_margin(model, batch)  # both paths decide FILIP's, SPARC's and STAIR's choices alike
    if BACKEND != "jax":  # the kinds are the backend's shapes and dtypes; JAX's eager call would compile op by op
        kinds = _feature_kinds(model(batch, training=True))
        assert kinds == COMPILED_CASES[family, stage] if compiled else kinds <= FEATURE_KINDS, kinds
    # The one-pass step is the reference: eager on TensorFlow (`EAGER_REFERENCE`).
    whole = _one_sgd_step(model, None, batch, eager=EAGER_REFERENCE)
    cached = _one_sgd_step(_model(family, stage), micro, batch, eager=EAGER_REFERENCE and not compiled)
    assert sum(float(np.abs(g).sum()) for g in whole) > 0
    _assert_close(cached, whole)


def test_a_batch_the_micro_batch_does_not_divide_is_refused():
    model = vlzoo.from_preset("clip_tiny")
    model.micro_batch_size = 3
    with pytest.raises(ValueError, match=r"batch size \(4\) must be a multiple of `micro_batch_size` \(3\)"):
        model(tiny_batch(4, image_size=model.vision.image_size, sequence_length=model.text.sequence_length,
                         vocabulary_size=model.text.vocabulary_size), training=True)


def test_configure_sets_it_and_warns_that_accumulation_shrinks_the_negatives():
    model = vlzoo.from_preset("clip_tiny")
    training.configure(model, learning_rate=1e-3, total_steps=10, micro_batch_size=4)
    assert model.micro_batch_size == 4
    with pytest.warns(UserWarning, match="contrastive batch stays the micro-batch"):
        training.configure(model, learning_rate=1e-3, total_steps=10, gradient_accumulation_steps=2)
    assert model.micro_batch_size is None
    with pytest.raises(ValueError, match="`micro_batch_size` must be a positive int"):
        training.configure(model, learning_rate=1e-3, total_steps=10, micro_batch_size=0)


def test_jax_traces_the_towers_once_whatever_the_number_of_micro_batches():
    """On JAX the micro-batches run in one `scan`, so the compiled step holds one copy of each tower, not
    N / m (a Python loop's copies made ViT-B/16 steps at N = 4096 take minutes to compile)."""
    calls = []

    def compute(x):
        calls.append(x.shape)
        return {"doubled": 2.0 * x}

    x = keras.ops.reshape(keras.ops.arange(16, dtype="float32"), (8, 2))
    out = micro_batched(compute, x, 2)
    np.testing.assert_array_equal(to_numpy(out["doubled"]), 2.0 * np.arange(16, dtype="float32").reshape(8, 2))
    assert all(tuple(shape) == (2, 2) for shape in calls)
    assert len(calls) == (1 if keras.backend.backend() == "jax" else 4)


def test_the_margin_check_refuses_the_near_tie_of_the_full_vocabulary():
    """With BERT's 30,522 entries, STAIR's 2 x 8 x 30,522 pooled maxima hold near-ties on every backend (with
    JAX's init, 3.7e-8 between two positions of one caption: a failure seen on an Intel AMX host); the check must say
    so rather than let the comparison depend on the CPU."""
    keras.utils.set_random_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vlzoo.from_preset("stair_tiny")
    batch = tiny_batch(8, seed=1, image_size=model.vision.image_size, sequence_length=model.text.sequence_length,
                       vocabulary_size=model.text.vocabulary_size)
    with pytest.raises(AssertionError, match="stair's (text|image) pooling is decided by"):
        assert_decision_margin(model, batch)


def test_margins_of_hand_made_choices():
    values = np.array([[0.5, 0.2, 0.49], [1.0, -1.0, 3.0]])
    np.testing.assert_allclose(top_two_gap(values, axis=1), [0.01, 2.0])
    np.testing.assert_allclose(top_two_gap(values, axis=1, valid=np.array([[1, 1, 0], [1, 0, 0]], bool)), [0.3, np.inf])
    np.testing.assert_allclose(threshold_gap(values, 0.25), [[0.25, 0.05, 0.24], [0.75, 1.25, 2.75]])


def test_an_unknown_batch_size_is_named_with_the_feeds_that_keep_it():
    # A batch size unknown when the step is traced (TensorFlow under a tf.distribute strategy fed a dataset it
    # distributes itself) cannot be split into micro-batches.
    unknown = keras.KerasTensor((None, 4))
    with pytest.raises(ValueError, match=r"needs a batch size known when the step is traced.*vlzoo\.parallel\.feed"):
        micro_batched(lambda x: {"y": x}, unknown, 2)
