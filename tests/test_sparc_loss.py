"""Tests of SPARC's alignment weights and fine-grained loss (any backend).

Golden values are a case worked by hand from the paper's equations; random
cases are compared with the float64 loops of reference_token_losses.py.
"""

import math
import re

import keras
import numpy as np
import pytest

import reference as ref
import reference_token_losses as tref
from backend_utils import finite_difference
from backend_utils import full_precision_matmul
from backend_utils import to_numpy
from backend_utils import value_and_grad
from vlzoo.losses import clip_loss
from vlzoo.losses.sparc import sparc_alignment_weights
from vlzoo.losses.sparc import sparc_fine_grained_loss
from vlzoo.losses.sparc import sparc_loss

BACKEND = keras.backend.backend()
# One shared random shape (eager JAX compiles every op once per shape).
B, P, T, D = 3, 5, 4, 6
LENGTHS = [4, 2, 3]
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(autouse=True)
def _full_precision():
    with full_precision_matmul():
        yield


def _inputs(seed=0, lengths=LENGTHS):
    rng = np.random.default_rng(seed)
    v = rng.normal(size=(len(lengths), P, D)).astype("float32")
    t = rng.normal(size=(len(lengths), T, D)).astype("float32")
    mask = np.arange(T)[None, :] < np.array(lengths)[:, None]
    return v, t, mask


def _golden():
    """Worked by hand: B = 2, T = 3, P = 4, D = 2, sigma = 1/4."""
    v = np.array([[[1, 0], [-0.6, 1], [1, 1], [-1, 0]],
                  [[2, 0], [0, 1], [0, -1], [1, 1]]], "float32")
    t = np.array([[[1, 0], [0, 1], [1, 1]],
                  [[0, 1], [1, -1], [-1, 2]]], "float32")
    mask = np.array([[True, True, True], [True, True, False]])
    return v, t, mask


def _loss(*args, **kwargs):
    return float(to_numpy(sparc_fine_grained_loss(*args, **kwargs)))


# ------------------------------------------------------------ golden case


def test_golden_alignment_weights():
    v, t, _ = _golden()
    a = to_numpy(sparc_alignment_weights(v, t))
    assert a.shape == (2, 3, 4) and a.dtype == np.float32
    expected = np.array([
        [[.5, 0, .5, 0], [0, .5, .5, 0], [.3125, .21875, .46875, 0]],
        [[.2, .4, 0, .4], [.5, 0, 1 / 3, 1 / 6], [0, 4 / 7, 0, 3 / 7]],
    ])
    np.testing.assert_allclose(a, expected, atol=1e-6)
    # Unnormalised language-grouped vision embeddings of sample 0.
    np.testing.assert_allclose(a[0] @ v[0],
                               [[1, .5], [.2, 1], [.65, .6875]], atol=1e-6)
    # sigma = 0: the 0.2 entry of row 0 is no longer pruned.
    a0 = to_numpy(sparc_alignment_weights(v, t, threshold=0.0))
    np.testing.assert_allclose(a0[0, 0], [5 / 11, 1 / 11, 5 / 11, 0],
                               atol=1e-6)
    np.testing.assert_allclose(tref.sparc_alignment_weights(v, t), expected,
                               atol=1e-12)


def test_golden_fine_grained_loss():
    v, t, mask = _golden()
    for reduction, (l_vl, l_lv, l_f) in {
        "tokens": (0.5404340, 0.5252875, 0.5328607),
        "samples": (0.4802998, 0.4670847, 0.4736923),
    }.items():
        np.testing.assert_allclose(
            tref.sparc_fine_grained(v, t, mask, 2.0, reduction=reduction),
            (l_vl, l_lv, l_f), atol=5e-8)
        np.testing.assert_allclose(
            _loss(v, t, mask, 2.0, reduction=reduction), l_f, atol=1e-6)
    # Default reduction is "tokens", default threshold 1/P.
    np.testing.assert_allclose(_loss(v, t, mask, 2.0, 0.25), 0.5328607,
                               atol=1e-6)


def test_golden_global_and_total_loss():
    """L_g = 0.4613523 with the masked text mean (1.1509290 with the
    Listing's unmasked mean); total with lambda_g = 0.5, lambda_f = 1:
    0.7635369."""
    v, t, mask = _golden()
    img_g = v.mean(1)
    txt_g = tref.masked_mean(t, mask).astype("float32")
    np.testing.assert_allclose(to_numpy(clip_loss(img_g, txt_g, 2.0)),
                               0.4613523, atol=1e-6)
    np.testing.assert_allclose(to_numpy(clip_loss(img_g, t.mean(1), 2.0)),
                               1.1509290, atol=1e-6)
    total = to_numpy(sparc_loss(img_g, txt_g, v, t, mask, 2.0))
    assert keras.backend.standardize_dtype(total.dtype) == "float32"
    np.testing.assert_allclose(total, 0.7635369, atol=1e-6)
    # lambda_f = 0: half of CLIP's loss.
    np.testing.assert_allclose(
        to_numpy(sparc_loss(img_g, txt_g, v, t, mask, 2.0, lambda_fine=0.0)),
        0.5 * ref.clip_loss(img_g, txt_g, 2.0), rtol=1e-6)
    # A separate fine-grained multiplier (ablation; shared by default).
    np.testing.assert_allclose(
        to_numpy(sparc_loss(img_g, txt_g, v, t, mask, 2.0,
                            fine_logit_scale=0.0)),
        0.5 * 0.4613523 + 0.9364262, atol=1e-6)


def test_golden_zero_temperature_limit():
    """Inverse temperature 0: uniform softmaxes, L_f = sum_i L_i log L_i /
    sum_i L_i ("tokens") or mean_i log L_i ("samples")."""
    v, t, mask = _golden()
    np.testing.assert_allclose(_loss(v, t, mask, 0.0), 0.9364262, atol=1e-6)
    np.testing.assert_allclose(
        (3 * math.log(3) + 2 * math.log(2)) / 5, 0.9364262, atol=1e-7)
    np.testing.assert_allclose(_loss(v, t, mask, 0.0, reduction="samples"),
                               0.8958797, atol=1e-6)


def test_known_wrong_variants_differ():
    v, t, mask = _inputs(seed=1)
    ours = _loss(v, t, mask, 5.0)
    np.testing.assert_allclose(ours, tref.sparc_fine_grained_loss(
        v, t, mask, 5.0), **TOL)
    # Patches normalised before the similarity and the weighted sum.
    v_n = ref.l2_normalize(v)
    soft = _softmax(np.einsum("btd,bpd->btp", t, v))
    wrong = {
        "patches_normalised_early": tref.sparc_fine_grained_loss(
            v_n, t, mask, 5.0),
        "padding_not_masked": tref.sparc_fine_grained_loss(
            v, t, np.ones_like(mask), 5.0),
        "samples_reduction": tref.sparc_fine_grained_loss(
            v, t, mask, 5.0, reduction="samples"),
        "no_threshold": tref.sparc_fine_grained_loss(v, t, mask, 5.0, 0.0),
        "softmax_weights": tref.sparc_fine_grained_loss(
            v, t, mask, 5.0, weights=soft),
    }
    for name, value in wrong.items():
        assert abs(value - ours) > 1e-3, name


def _softmax(x):
    return np.exp(ref.log_softmax(x, -1))


# -------------------------------------------------------- numpy reference


@pytest.mark.parametrize("threshold", [None, 0.0, 0.3])
def test_matches_reference(threshold):
    v, t, mask = _inputs(seed=2)
    np.testing.assert_allclose(
        to_numpy(sparc_alignment_weights(v, t, threshold)),
        tref.sparc_alignment_weights(v, t, threshold), **TOL)
    for reduction in ("tokens", "samples"):
        for scale in (1.0, 1 / 0.07, 100.0):
            np.testing.assert_allclose(
                _loss(v, t, mask, scale, threshold, reduction),
                tref.sparc_fine_grained_loss(v, t, mask, scale, threshold,
                                             reduction), **TOL)


def test_softmax_alignment_option():
    v, t, mask = _inputs(seed=3)
    a = _softmax(np.einsum("btd,bpd->btp", t.astype(np.float64), v))
    np.testing.assert_allclose(
        to_numpy(sparc_alignment_weights(v, t, alignment="softmax")), a,
        **TOL)
    np.testing.assert_allclose(
        _loss(v, t, mask, 10.0, alignment="softmax"),
        tref.sparc_fine_grained_loss(v, t, mask, 10.0, weights=a), **TOL)


def test_gradients_flow_through_the_alignment():
    """Backend gradients = central differences of the reference; they differ
    from a stop-gradient on the alignment weights (the paper has none)."""
    v, t, mask = _inputs(seed=4)
    scale = np.float32(4.0)
    _, grads = value_and_grad(
        lambda a, b, s: sparc_fine_grained_loss(a, b, mask, s), v, t, scale)

    def f(a, b, s):
        return tref.sparc_fine_grained_loss(a, b, mask, s)

    expected = [finite_difference(f, [v, t, scale], k) for k in range(3)]
    for g, e in zip(grads, expected):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)
    weights = tref.sparc_alignment_weights(v, t)
    frozen = finite_difference(
        lambda a, b: tref.sparc_fine_grained_loss(a, b, mask, scale,
                                                  weights=weights), [v, t], 1)
    assert np.max(np.abs(frozen - expected[1])) > 1e-3


def test_logit_scale_gets_gradient_from_both_terms():
    v, t, mask = _inputs(seed=5)
    img_g, txt_g = v.mean(1), tref.masked_mean(t, mask).astype("float32")
    s = np.float32(10.0)
    _, (g_total,) = value_and_grad(
        lambda s: sparc_loss(img_g, txt_g, v, t, mask, s), s)
    _, (g_global,) = value_and_grad(lambda s: clip_loss(img_g, txt_g, s), s)
    _, (g_fine,) = value_and_grad(
        lambda s: sparc_fine_grained_loss(v, t, mask, s), s)
    assert abs(g_global) > 1e-4 and abs(g_fine) > 1e-4
    np.testing.assert_allclose(g_total, 0.5 * g_global + g_fine, rtol=1e-5)


# ------------------------------------------------------------ invariants


def test_alignment_invariants():
    v, t, _ = _inputs(seed=6)
    a = to_numpy(sparc_alignment_weights(v, t))
    np.testing.assert_allclose(a.sum(-1), 1.0, rtol=1e-6)
    assert np.all(a >= 0)
    s = np.einsum("btd,bpd->btp", t.astype(np.float64), v)
    sh = (s - s.min(-1, keepdims=True)) / np.ptp(s, -1, keepdims=True)
    np.testing.assert_array_equal(a == 0, sh < 1 / P)
    idx = np.indices(s.shape[:2])
    assert np.all(a[idx[0], idx[1], s.argmax(-1)] > 0)
    assert np.all(a[idx[0], idx[1], s.argmin(-1)] == 0)
    # An entry exactly at the threshold is kept: s = [0, .25, 1, .5, .75].
    v_eq = np.zeros((B, P, D), "float32")
    v_eq[:, :, 0] = [0, 0.25, 1, 0.5, 0.75]
    t_eq = np.zeros((B, T, D), "float32")
    t_eq[..., 0] = 1
    a_eq = to_numpy(sparc_alignment_weights(v_eq, t_eq, threshold=0.25))
    np.testing.assert_allclose(a_eq[0, 0],
                               np.array([0, .25, 1, .5, .75]) / 2.5, rtol=1e-6)


def test_scale_invariances():
    v, t, mask = _inputs(seed=7)
    a = to_numpy(sparc_alignment_weights(v, t))
    np.testing.assert_allclose(to_numpy(sparc_alignment_weights(v, 7.0 * t)),
                               a, **TOL)
    loss = _loss(v, t, mask, 10.0)
    np.testing.assert_allclose(_loss(0.1 * v, 30.0 * t, mask, 10.0), loss,
                               **TOL)
    # Not invariant to rescaling a single patch (catches V normalised early).
    v1 = v.copy()
    v1[:, 0] *= 5.0
    assert np.max(np.abs(to_numpy(sparc_alignment_weights(v1, t)) - a)) > 1e-3


def test_permutations():
    v, t, mask = _inputs(seed=8)
    for reduction in ("tokens", "samples"):
        loss = _loss(v, t, mask, 10.0, reduction=reduction)
        pp = np.random.default_rng(0).permutation(P)
        np.testing.assert_allclose(
            _loss(v[:, pp], t, mask, 10.0, reduction=reduction), loss, **TOL)
        tp = np.random.default_rng(1).permutation(T)  # mask permuted too
        np.testing.assert_allclose(
            _loss(v, t[:, tp], mask[:, tp], 10.0, reduction=reduction), loss,
            **TOL)
        bp = np.array([2, 0, 1])
        np.testing.assert_allclose(
            _loss(v[bp], t[bp], mask[bp], 10.0, reduction=reduction), loss,
            **TOL)


def test_batch_independence():
    """Only the pair itself enters: each sample's loss alone, combined with
    the reduction's weights, gives the batch loss."""
    v, t, mask = _inputs(seed=9)
    alone = [_loss(v[i:i + 1], t[i:i + 1], mask[i:i + 1], 10.0)
             for i in range(B)]
    np.testing.assert_allclose(_loss(v, t, mask, 10.0, reduction="samples"),
                               np.mean(alone), **TOL)
    np.testing.assert_allclose(_loss(v, t, mask, 10.0),
                               np.dot(alone, LENGTHS) / sum(LENGTHS), **TOL)
    # A caption with one real token contributes exactly 0.
    one = mask.copy()
    one[1] = [True, False, False, False]
    np.testing.assert_allclose(
        _loss(v, t, one, 10.0, reduction="samples"),
        (alone[0] + alone[2]) / 3, **TOL)


def test_padding_invariance_and_zero_gradient():
    v, t, mask = _inputs(seed=10)
    scale = np.float32(10.0)

    def fn(a, b, s):
        return sparc_fine_grained_loss(a, b, mask, s)

    v0, g0 = value_and_grad(fn, v, t, scale)
    assert np.all(g0[1][~mask] == 0)
    assert np.all(np.abs(g0[1][mask]).sum(-1) > 0)
    t2 = t.copy()
    t2[~mask] = 1e6 * np.random.default_rng(0).normal(size=t2[~mask].shape)
    t2[1, 3] = 0.0  # a zero (degenerate) padding row
    v1, g1 = value_and_grad(fn, v, t2, scale)
    np.testing.assert_allclose(v1, v0, rtol=1e-6)
    for a, b in zip(g1, g0):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------- degenerate


def _degenerate_cases():
    v, t, mask = _inputs(seed=11)
    zero_token = t.copy()
    zero_token[0, 1] = 0.0
    same_patches = np.repeat(v[:, :1], P, axis=1)
    empty = mask.copy()
    empty[2] = False  # a caption that is all padding
    return {
        "zero_token": (v, zero_token, mask),
        "identical_patches": (same_patches, t, mask),
        "all_zero": (np.zeros_like(v), np.zeros_like(t), mask),
        "empty_caption": (v, t, empty),
        "no_real_token": (v, t, np.zeros_like(mask)),
    }


@pytest.mark.parametrize("case", list(_degenerate_cases()))
def test_degenerate_inputs_finite(case):
    v, t, mask = _degenerate_cases()[case]
    scale = np.float32(100.0)
    for reduction in ("tokens", "samples"):
        value, grads = value_and_grad(
            lambda a, b, s: sparc_fine_grained_loss(a, b, mask, s,
                                                    reduction=reduction),
            v, t, scale)
        assert np.isfinite(value)
        for g in grads:
            assert np.all(np.isfinite(g))
        np.testing.assert_allclose(
            value, tref.sparc_fine_grained_loss(v, t, mask, scale,
                                                reduction=reduction), **TOL)
    a = to_numpy(sparc_alignment_weights(v, t))
    assert np.all(np.isfinite(a))
    np.testing.assert_allclose(a.sum(-1), 1.0, rtol=1e-6)
    if case == "zero_token":
        np.testing.assert_allclose(a[0, 1], 1 / P, rtol=1e-6)
    if case == "identical_patches":
        # Uniform weights, c = the mean patch, and the lv cross-entropy of
        # each token is exactly log L_i (all c_k equal).
        np.testing.assert_allclose(a, 1 / P, rtol=1e-6)
        _, l_lv, _ = tref.sparc_fine_grained(v, t, mask, scale,
                                             reduction="samples")
        np.testing.assert_allclose(l_lv, np.mean(np.log(LENGTHS)), rtol=1e-9)
    if case == "no_real_token":
        assert value == 0


# ------------------------------------------------------- dtypes / inputs


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_inputs_give_float32(dtype):
    v, t, mask = _inputs(seed=12)
    v_lp, t_lp = keras.ops.cast(v, dtype), keras.ops.cast(t, dtype)
    v_r = to_numpy(keras.ops.cast(v_lp, "float32"))
    t_r = to_numpy(keras.ops.cast(t_lp, "float32"))
    scale = keras.ops.cast(np.float32(20.0), dtype)
    out = sparc_fine_grained_loss(v_lp, t_lp, mask, scale)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    np.testing.assert_allclose(
        to_numpy(out), tref.sparc_fine_grained_loss(v_r, t_r, mask, 20.0),
        rtol=1e-5)
    a = sparc_alignment_weights(v_lp, t_lp)
    assert keras.backend.standardize_dtype(a.dtype) == "float32"
    total = sparc_loss(v_lp[:, 0], t_lp[:, 0], v_lp, t_lp, mask, scale)
    assert keras.backend.standardize_dtype(total.dtype) == "float32"


def test_error_messages_name_the_argument():
    v, t, mask = _inputs()
    with pytest.raises(ValueError, match=re.escape(
            "`token_embeds` must have shape (B, T, D) with B and D matching "
            "`patch_embeds` (3, 5, 6); received (2, 4, 6)")):
        sparc_fine_grained_loss(v, t[:2], mask[:2], 1.0)
    with pytest.raises(ValueError, match="`token_embeds` must have shape"):
        sparc_alignment_weights(v, t[..., :5])
    with pytest.raises(ValueError, match=re.escape(
            "`token_mask` must have shape (B, N) = (3, 4) matching "
            "`token_embeds` (3, 4, 6); received (3, 3)")):
        sparc_fine_grained_loss(v, t, mask[:, :3], 1.0)
    with pytest.raises(TypeError, match="token_mask.*float32"):
        sparc_fine_grained_loss(v, t, mask.astype("float32"), 1.0)
    with pytest.raises(ValueError, match="`patch_embeds` must have rank 3"):
        sparc_alignment_weights(v[0], t)
    with pytest.raises(ValueError, match="logit_scale"):
        sparc_fine_grained_loss(v, t, mask, np.ones((2,), "float32"))
    with pytest.raises(ValueError, match="reduction"):
        sparc_fine_grained_loss(v, t, mask, 1.0, reduction="mean")
    with pytest.raises(ValueError, match="threshold"):
        sparc_alignment_weights(v, t, threshold=1.5)
    with pytest.raises(ValueError, match="alignment"):
        sparc_alignment_weights(v, t, alignment="sparsemax")
    with pytest.raises(ValueError, match="lambda_fine"):
        sparc_loss(v[:, 0], t[:, 0], v, t, mask, 1.0,
                   lambda_fine=np.ones(2, "float32"))
    with pytest.raises(ValueError, match=re.escape(
            "`patch_embeds` must have the batch size B = 2 of "
            "`image_global`; received shape (3, 5, 6)")):
        sparc_loss(v[:2, 0], t[:2, 0], v, t, mask, 1.0)
    with pytest.raises(ValueError, match="text_embeds"):
        sparc_loss(v[:, 0], t[:2, 0], v, t, mask, 1.0)
    # Integer 0/1 masks are read as masks.
    np.testing.assert_allclose(_loss(v, t, mask.astype("int32"), 3.0),
                               _loss(v, t, mask, 3.0))


# ----------------------------------------------------- traced execution


def test_traced_function():
    v, t, mask = _inputs(seed=13)
    s = np.float32(10.0)
    expected = tref.sparc_fine_grained_loss(v, t, mask, s)
    if BACKEND == "jax":
        import jax

        _, g0 = value_and_grad(
            lambda a, b: sparc_fine_grained_loss(a, b, mask, s), v, t)
        out, g1 = jax.jit(jax.value_and_grad(
            lambda a, b: sparc_fine_grained_loss(a, b, mask, s),
            argnums=(0, 1)))(v, t)
    elif BACKEND == "tensorflow":
        import tensorflow as tf

        def f(a, b):
            with tf.GradientTape() as tape:
                tape.watch([a, b])
                loss = sparc_fine_grained_loss(a, b, mask, s)
            return loss, tape.gradient(loss, [a, b])

        _, g0 = value_and_grad(
            lambda a, b: sparc_fine_grained_loss(a, b, mask, s), v, t)
        spec = tf.TensorSpec((None, P, D), tf.float32)
        spec_t = tf.TensorSpec((None, T, D), tf.float32)
        out, g1 = tf.function(f, input_signature=[spec, spec_t],
                              jit_compile=True)(v, t)
    else:
        pytest.skip("torch runs eagerly; covered by the other tests")
    np.testing.assert_allclose(to_numpy(out), expected, **TOL)
    for a, b in zip(g1, g0):
        np.testing.assert_allclose(to_numpy(a), b, rtol=1e-5, atol=1e-6)
