"""Property-based tests (hypothesis) of every loss and similarity, on the active backend.

Each case is drawn by hypothesis: batch size, token counts and widths, a mask pattern (random, a
single real token, one padded position, all real, and no real token where a loss defines that), a
magnitude of the inputs from 1e-15 to 1e15, logit scale and bias, Llip's temperature, and a seed
for the values. The properties:

- every loss is finite with finite gradients;
- permuting the batch leaves every loss unchanged and permutes every similarity matrix;
- padding positions (any values, mask False) change neither a loss nor the gradients of the real
  positions, and get zero gradients;
- chunked computations equal the unchunked ones, values and gradients;
  (these three compare two computations: cases whose maxima, thresholds or pooling fall within
  `margins.DECISION_MARGIN` of a tie, which float32 may decide either way, are left out by `assume`)
- float16 and bfloat16 inputs give float32 losses equal to the float32 loss of the same values.

Hypothesis runs derandomised (the same cases on every run; see conftest.py for the number of
examples, `VLZOO_HYPOTHESIS_EXAMPLES`) and shrinks a failure to a smallest case; `EDGE_CASES`
run every time on top of the drawn ones. On JAX each function is compiled (`JIT`), which is how
XLA's own rewrites were caught: a flushed subnormal in SPARC's min-max scaling, a softmax input
recomputed with different rounding in Llip's attention.

On JAX the time is compilation, one program per function and shape (it was one per call: a new
function each time, with the case's values as constants). Each function is now jitted once per loss
and shape (`jitted`), with the arrays, the masks and the scalars (scale, bias, temperature) as its
arguments, as they are in training, so that a case of a shape already seen, in any test of the file,
reuses the program. In `make test`, which draws few cases, JAX draws the shapes from `JAX_SHAPES`
(every axis of one; every axis above one, no two alike; a mix) besides the edge cases' shapes, and
every value, mask, magnitude and scalar freely; the free shapes are drawn on TensorFlow and PyTorch
in the same run (the losses' code is the same on every backend), and on JAX too when more cases are
drawn (`make test-numerics`).
"""

import dataclasses
from typing import Callable

import keras
import numpy as np
import pytest
from backend_utils import to_numpy
from backend_utils import value_and_grad
from hypothesis import assume
from hypothesis import example
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from margins import DECISION_MARGIN, late_interaction_margins, pooling_margin, sparc_alignment_margins

from vlzoo import losses
from vlzoo.models.sparo import normalize_slots

# JAX: one compilation per drawn shape costs less than eager dispatch of every op at a new shape.
JIT = keras.backend.backend() == "jax"
EPS = {"float16": 2.0**-10, "bfloat16": 2.0**-7}  # unit roundoff x 2
MASKS = ("full", "random", "one_real", "one_padded")
SCALES = (0.0, 1e-3, 1.0, 14.3, 100.0, 1000.0)
SHAPE_KEYS = ("b", "p", "t", "d", "heads", "mixtures")
SCALARS = ("scale", "bias", "temperature")  # arguments of the compiled programs, not constants in them
# `make test` on JAX (few cases drawn, see the module docstring): the shapes, each compiled once per function.
JAX_SHAPES = (
    dict(b=1, p=1, t=1, d=1, heads=1, mixtures=1),  # every axis of one (XLA's degenerate-axis rewrites)
    dict(b=5, p=6, t=2, d=3, heads=2, mixtures=4),  # every axis above one, no two batch/token/width axes alike
    dict(b=2, p=1, t=6, d=1, heads=1, mixtures=2),  # a mix: single patch, single width, many tokens
)
FIXED_SHAPES = JIT and settings().max_examples <= 10

_VALUES = dict(
    mask=st.sampled_from(MASKS + ("empty",)), image_mask=st.sampled_from((None,) + MASKS),
    magnitude=st.integers(-15, 15), scale=st.sampled_from(SCALES), bias=st.floats(-20.0, 20.0),
    temperature=st.floats(0.05, 10.0), seed=st.integers(0, 2**32 - 1),
)
if FIXED_SHAPES:
    cases = st.fixed_dictionaries(dict(shape=st.sampled_from(JAX_SHAPES), **_VALUES)).map(
        lambda c: {**c.pop("shape"), **c})
else:
    cases = st.fixed_dictionaries(dict(
        b=st.integers(1, 5), p=st.integers(1, 6), t=st.integers(1, 6), d=st.integers(1, 6),
        heads=st.integers(1, 2), mixtures=st.integers(1, 4), **_VALUES))

# Named cases that run every time besides the drawn ones: a single real token at extreme
# magnitudes and the largest scale, all but one token real, no real token in a batch of one.
_EDGE = dict(b=3, p=4, t=5, d=4, heads=2, mixtures=3, image_mask="one_real", bias=-10.0, temperature=5.0, seed=0)
EDGE_CASES = (
    dict(_EDGE, mask="one_real", magnitude=15, scale=1000.0),
    dict(_EDGE, mask="one_real", magnitude=-15, scale=1000.0),
    dict(_EDGE, mask="one_padded", magnitude=0, scale=100.0),
    dict(_EDGE, mask="empty", magnitude=0, scale=14.3, b=1),
)


def with_edge_cases(**arguments):
    """Adds `EDGE_CASES` as explicit hypothesis examples (`arguments`: the test's other ones)."""
    def decorate(test):
        for case in reversed(EDGE_CASES):
            test = example(c=case, **arguments)(test)
        return test
    return decorate


def make_mask(rng, rows, length, mode):
    """`(rows, length)` bool mask of pattern `mode` (True = real)."""
    if mode in ("full", "empty"):
        return np.full((rows, length), mode == "full")
    pick = (np.arange(rows), rng.integers(0, length, rows))
    if mode == "one_real":
        mask = np.zeros((rows, length), bool)
        mask[pick] = True
    elif mode == "one_padded":
        mask = np.ones((rows, length), bool)
        if length > 1:
            mask[pick] = False
    else:
        mask = rng.random((rows, length)) < 0.5
        mask[pick] = True
    return mask


@dataclasses.dataclass(frozen=True)
class Loss:
    """A loss under test.

    `arrays(c, normal)` gives the float inputs (the first `batched` have the batch on axis 0),
    `masks(c, rng)` the bool masks (batch on axis 0; None = not given), and
    `fn(c, *arrays, *masks, chunk=None)` the float32 scalar. `padded` lists
    `(array index, token axis, mask index)` of the masked token axes; `chunk` is the `num_chunks`
    that `fn` takes (None: no chunked form). `float32_inside=False` marks a computation whose
    matrix product belongs to a tower and runs in the input dtype (the compute dtype under mixed
    precision), only the reductions after it in float32.
    """

    fn: Callable
    arrays: Callable
    masks: Callable = lambda c, rng: []
    batched: int = 99
    padded: tuple = ()
    chunk: int = None
    allows_empty: bool = False
    float32_inside: bool = True


def _filip(c, img, txt, text_mask, image_mask, chunk=None):
    return losses.filip_loss(img, txt, text_mask, c["scale"], image_mask=image_mask, num_chunks=chunk)


def _sparc(c, img, txt, patches, tokens, token_mask, chunk=None):
    return losses.sparc_loss(img, txt, patches, tokens, token_mask, c["scale"])


def _llip(c, q, k, v, t, chunk=None):
    return losses.llip_loss(q, k, v, t, c["scale"], c["bias"], c["temperature"], num_chunks=chunk)


def _siglip(c, img, txt, chunk=None):
    return losses.siglip_loss(img, txt, c["scale"], c["bias"], num_chunks=chunk)


def _sparo(c, img, txt, chunk=None):
    return losses.clip_loss(normalize_slots(img, c["d"]), normalize_slots(txt, c["d"]), c["scale"])


def _stair_head_pool(c, features, table, mask, chunk=None):
    return keras.ops.sum(losses.stair_head_pool(features, table, mask=mask, num_chunks=chunk))


def _sparse(c, normal):
    """STAIR's embeddings: non-negative, mostly zero, some rows all zero."""
    x = [np.maximum(normal(c["b"], 4 * c["d"]), 0.0) for _ in range(2)]
    for row in x:
        row[normal(c["b"]) > 1.0] = 0.0
    return x


LOSSES = {
    "clip": Loss(lambda c, i, t, chunk=None: losses.clip_loss(i, t, c["scale"]),
                 lambda c, normal: [normal(c["b"], c["d"]), normal(c["b"], c["d"])]),
    "siglip": Loss(_siglip, lambda c, normal: [normal(c["b"], c["d"]), normal(c["b"], c["d"])], chunk=2),
    "sparo": Loss(_sparo, lambda c, normal: [normal(c["b"], c["p"] * c["d"]), normal(c["b"], c["p"] * c["d"])]),
    "filip": Loss(
        _filip, lambda c, normal: [normal(c["b"], c["p"], c["d"]), normal(c["b"], c["t"], c["d"])],
        lambda c, rng: [make_mask(rng, c["b"], c["t"], c["mask"]),
                        None if c["image_mask"] is None else make_mask(rng, c["b"], c["p"], c["image_mask"])],
        padded=((1, 1, 0), (0, 1, 1)), chunk=2, allows_empty=True),
    "sparc": Loss(
        _sparc, lambda c, normal: [normal(c["b"], c["d"]), normal(c["b"], c["d"]),
                                   normal(c["b"], c["p"], c["d"]), normal(c["b"], c["t"], c["d"])],
        lambda c, rng: [make_mask(rng, c["b"], c["t"], c["mask"])], padded=((3, 1, 0),), allows_empty=True),
    "llip": Loss(
        _llip, lambda c, normal: [normal(c["b"], c["heads"], 3), normal(c["b"], c["mixtures"], c["heads"], 3),
                                  normal(c["b"], c["mixtures"], c["heads"], c["d"]), normal(c["b"], c["d"])],
        chunk=2),
    "stair": Loss(lambda c, i, t, chunk=None: losses.stair_loss(i, t, c["scale"], 1e-3, 1e-3), _sparse),
    "stair_head_pool": Loss(
        _stair_head_pool, lambda c, normal: [normal(c["b"], c["t"], c["d"]), normal(4 * c["d"] + 1, c["d"])],
        lambda c, rng: [make_mask(rng, c["b"], c["t"], c["mask"])], batched=1, padded=((0, 1, 0),), chunk=3,
        allows_empty=True, float32_inside=False),
}
CHUNKED = [name for name, loss in LOSSES.items() if loss.chunk]
MASKED = [name for name, loss in LOSSES.items() if loss.padded]


def draw_inputs(loss, c, magnitude=None):
    """The float arrays (scaled by 10**magnitude) and masks of `loss` for case `c`."""
    rng = np.random.default_rng(c["seed"])
    scale = 10.0 ** (c["magnitude"] if magnitude is None else magnitude)

    def normal(*shape):
        return (rng.normal(size=shape) * scale).astype("float32")

    if not loss.allows_empty and c["mask"] == "empty":
        c = dict(c, mask="random")
    return loss.arrays(c, normal), loss.masks(c, rng), c


def tie_margin(name, arrays, masks):
    """How far the case's inputs keep the loss's discrete choices from a tie (`tests/margins.py`): FILIP's
    token-wise maxima, SPARC's threshold and min-max, STAIR's pooling (inf for the smooth losses)."""
    if name == "filip":
        return min(late_interaction_margins(*arrays, *masks).values())
    if name == "sparc":
        return min(sparc_alignment_margins(arrays[2], arrays[3], masks[0]).values())
    if name == "stair_head_pool":
        features, table = arrays
        return pooling_margin(np.einsum("btd,vd->btv", features.astype("float64"), table), masks[0])
    return np.inf


_PROGRAMS = {}


def jitted(key, c, fn, grad=False):
    """JAX: `fn(case, arrays, masks)` (or its value and gradients with respect to `arrays`) as one jitted
    program per `key` and shape of the case (`SHAPE_KEYS`), called as `program(arrays, masks, scalars)`. The
    scalars (`SCALARS`, Python floats: weakly typed, as the constants they were) and the masks are arguments,
    so a case of a shape seen before, in any test of the file, reuses the compiled program."""
    import jax

    key = (key, tuple(c[k] for k in SHAPE_KEYS), grad)
    if key not in _PROGRAMS:
        static = {k: c[k] for k in SHAPE_KEYS}

        def program(arrays, masks, scalars):
            return fn(dict(static, **scalars), arrays, masks)

        _PROGRAMS[key] = jax.jit(jax.value_and_grad(program) if grad else program)
    return _PROGRAMS[key]


def scalars_of(c):
    return {k: float(c[k]) for k in SCALARS}


def evaluate(loss, c, arrays, masks, chunk=None):
    if JIT:
        program = jitted((loss, chunk), c, lambda case, xs, ms: loss.fn(case, *xs, *ms, chunk=chunk), grad=True)
        value, grads = program([np.asarray(a) for a in arrays], list(masks), scalars_of(c))
        return float(value), [np.asarray(g) for g in grads]
    value, grads = value_and_grad(lambda *xs: loss.fn(c, *xs, *masks, chunk=chunk), *arrays)
    return float(value), grads


def assert_same(got, want, name, arrays, scale):
    """Values and gradients agree up to float32 rounding.

    A gradient through an L2 normalisation is `(I - n n^T) g / |x|`: its rounding error grows
    as `eps * |g| / |x|` (with `|g|` up to the logit scale), which matters where the exact
    gradient vanishes (a width of 1, where every normalised vector is +-1). That term is
    added per row of `arrays` (the inputs the gradients belong to) to the relative tolerance.
    """
    (value, grads), (value_want, grads_want) = got, want
    np.testing.assert_allclose(value, value_want, rtol=1e-5, atol=1e-6, err_msg=f"{name}: loss")
    eps = np.finfo(np.float32).eps
    for k, (g, w, x) in enumerate(zip(grads, grads_want, arrays)):
        norm = np.linalg.norm(x.astype("float64"), axis=-1, keepdims=True) if x.ndim > 1 else np.abs(x)
        rounding = 16 * eps * (1.0 + scale) / np.maximum(norm, np.finfo(np.float32).tiny)
        atol = 1e-5 * max(1.0, float(np.max(np.abs(w), initial=0.0))) + rounding
        bad = np.abs(g - w) > atol + 1e-4 * np.abs(w)
        assert not bad.any(), (
            f"{name}: gradient of input {k} differs at {np.argwhere(bad)[:5].tolist()}: "
            f"got {g[bad][:5]}, want {w[bad][:5]}")


@pytest.mark.parametrize("name", LOSSES)
@given(c=cases)
@with_edge_cases()
def test_finite_values_and_gradients(name, c):
    loss = LOSSES[name]
    arrays, masks, c = draw_inputs(loss, c)
    value, grads = evaluate(loss, c, arrays, masks)
    assert np.isfinite(value), f"{name}: loss {value}"
    for k, g in enumerate(grads):
        assert np.isfinite(g).all(), f"{name}: non-finite gradient of input {k}"


@pytest.mark.parametrize("name", LOSSES)
@given(c=cases)
@with_edge_cases()
def test_batch_permutation_invariance(name, c):
    loss = LOSSES[name]
    arrays, masks, c = draw_inputs(loss, c)
    assume(tie_margin(name, arrays, masks) >= DECISION_MARGIN)  # both computations decide alike
    order = np.random.default_rng(c["seed"] + 1).permutation(c["b"])
    permuted = [a[order] if k < loss.batched else a for k, a in enumerate(arrays)]
    value, grads = evaluate(loss, c, permuted, [m if m is None else m[order] for m in masks])
    value_want, grads_want = evaluate(loss, c, arrays, masks)
    grads_want = [g[order] if k < loss.batched else g for k, g in enumerate(grads_want)]
    assert_same((value, grads), (value_want, grads_want), name, permuted, c["scale"])


@pytest.mark.parametrize("name", MASKED)
@given(c=cases, extra=st.integers(1, 3))
@with_edge_cases(extra=2)
def test_padding_changes_nothing_and_gets_zero_gradient(name, c, extra):
    loss = LOSSES[name]
    arrays, masks, c = draw_inputs(loss, c)
    assume(tie_margin(name, arrays, masks) >= DECISION_MARGIN)  # both computations decide alike
    rng = np.random.default_rng(c["seed"] + 2)
    padded_arrays, padded_masks, spans = list(arrays), list(masks), []
    for index, axis, mask_index in loss.padded:
        if masks[mask_index] is None:
            continue
        shape = list(arrays[index].shape)
        shape[axis] = extra
        junk = (rng.normal(size=shape) * 1e6).astype("float32")  # any values: they must not count
        padded_arrays[index] = np.concatenate([arrays[index], junk], axis=axis)
        padded_masks[mask_index] = np.concatenate([masks[mask_index], np.zeros((c["b"], extra), bool)], axis=1)
        spans.append((index, axis, arrays[index].shape[axis]))
    value, grads = evaluate(loss, c, padded_arrays, padded_masks)
    for index, axis, length in spans:
        tail = np.take(grads[index], np.arange(length, length + extra), axis=axis)
        assert not tail.any(), f"{name}: padding positions of input {index} get gradients"
        grads[index] = np.take(grads[index], np.arange(length), axis=axis)
    assert_same((value, grads), evaluate(loss, c, arrays, masks), name, arrays, c["scale"])


@pytest.mark.parametrize("name", CHUNKED)
@given(c=cases)
@with_edge_cases()
def test_chunked_equals_unchunked(name, c):
    loss = LOSSES[name]
    arrays, masks, c = draw_inputs(loss, c)
    assume(tie_margin(name, arrays, masks) >= DECISION_MARGIN)  # both computations decide alike
    got = evaluate(loss, c, arrays, masks, chunk=loss.chunk)
    assert_same(got, evaluate(loss, c, arrays, masks), name, arrays, c["scale"])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", LOSSES)
@given(c=cases, magnitude=st.integers(-3, 3))
@with_edge_cases(magnitude=3)
def test_low_precision_inputs_give_float32_losses(name, dtype, c, magnitude):
    loss = LOSSES[name]
    if not loss.float32_inside:
        # A float16 product of two inputs of size 10**2 overflows (65504) in any matmul; the
        # tower's LayerNorm keeps real features near 1.
        magnitude = min(magnitude, 1)
    arrays, masks, c = draw_inputs(loss, c, magnitude)
    low = [keras.ops.cast(keras.ops.convert_to_tensor(a), dtype) for a in arrays]
    if JIT:  # jitted once per loss and shape (the dtype is the arguments')
        value = jitted((loss, "low"), c, lambda case, xs, ms: loss.fn(case, *xs, *ms))(low, list(masks), scalars_of(c))
        want = jitted((loss, "float32"), c, lambda case, xs, ms: loss.fn(
            case, *[keras.ops.cast(x, "float32") for x in xs], *ms))(low, list(masks), scalars_of(c))
    else:
        value = loss.fn(c, *low, *masks)
        want = loss.fn(c, *[keras.ops.cast(x, "float32") for x in low], *masks)
    assert keras.backend.standardize_dtype(value.dtype) == "float32"
    assert np.isfinite(to_numpy(value))
    # Low-precision products: rounding of the input dtype per product term.
    tol = 1e-6 if loss.float32_inside else 4 * EPS[dtype] * (1 + c["d"])
    np.testing.assert_allclose(to_numpy(value), to_numpy(want), rtol=tol, atol=tol)


# Similarities: (image-side arrays, text-side arrays) -> (B_img, B_txt) scores, or a tuple of them.
SIMILARITIES = {
    "clip_logits": lambda c, i, t: losses.clip_logits(i, t, c["scale"]),
    "siglip_logits": lambda c, i, t: losses.siglip_logits(i, t, c["scale"], c["bias"]),
    "stair_logits": lambda c, i, t: losses.stair_logits(i, t, c["scale"]),
    "filip_similarity": lambda c, i, t, m: losses.filip_similarity(i, t, m),
    "llip_logits": lambda c, k, v, q, t: losses.llip_logits(q, k, v, t, c["scale"], c["bias"], c["temperature"]),
}


def similarity_inputs(name, c, b_img, b_txt, normal, rng):
    """Image-side and text-side inputs of `name` (a text mask counts as text-side)."""
    d = c["d"]
    if name == "filip_similarity":
        return [normal(b_img, c["p"], d)], [normal(b_txt, c["t"], d), make_mask(rng, b_txt, c["t"], c["mask"])]
    if name == "llip_logits":
        k = normal(b_img, c["mixtures"], c["heads"], 3)
        return [k, normal(b_img, c["mixtures"], c["heads"], d)], [normal(b_txt, c["heads"], 3), normal(b_txt, d)]
    return [normal(b_img, d)], [normal(b_txt, d)]


@pytest.mark.parametrize("name", SIMILARITIES)
@given(c=cases, b_txt=st.sampled_from((1, 2, 5)) if FIXED_SHAPES else st.integers(1, 5))  # (eager on JAX)
@with_edge_cases(b_txt=2)
def test_similarities_are_permutation_equivariant(name, c, b_txt):
    fn = SIMILARITIES[name]
    rng = np.random.default_rng(c["seed"])

    def normal(*shape):
        return (rng.normal(size=shape) * 10.0 ** c["magnitude"]).astype("float32")

    images, texts = similarity_inputs(name, c, c["b"], b_txt, normal, rng)
    p, q = rng.permutation(c["b"]), rng.permutation(b_txt)
    got = fn(c, *[x[p] for x in images], *[x[q] for x in texts])
    want = fn(c, *images, *texts)
    for g, w in zip(*(out if isinstance(out, tuple) else (out,) for out in (got, want))):
        w = to_numpy(w)
        assert w.shape == (c["b"], b_txt) and np.isfinite(w).all()
        np.testing.assert_allclose(to_numpy(g), w[p][:, q], rtol=1e-5, atol=1e-5 * max(1.0, c["scale"]))
