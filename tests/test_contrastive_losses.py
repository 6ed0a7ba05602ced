"""Tests of the CLIP / SigLIP contrastive losses (any Keras backend)."""

import functools
import math
import re

import keras
import numpy as np
import pytest

import reference as ref
from backend_utils import finite_difference
from backend_utils import full_precision_matmul
from backend_utils import to_numpy
from backend_utils import value_and_grad
from vlzoo.losses import clip_logits
from vlzoo.losses import clip_loss
from vlzoo.losses import l2_normalize
from vlzoo.losses import siglip_logits
from vlzoo.losses import siglip_loss

BACKEND = keras.backend.backend()
# (8, 6) is the common shape of the other tests: eager JAX compiles every
# op once per shape, so sharing shapes keeps the suite fast.
SHAPES = [(1, 1), (2, 1), (5, 3), (8, 6), (33, 7)]
RTOL = 1e-6


@pytest.fixture(autouse=True)
def _full_precision():
    # No TF32 on GPUs, so float32 results meet float64 goldens at 1e-6.
    with full_precision_matmul():
        yield


def _embeds(b, d, seed=0, dtype="float32"):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(b, d)).astype(dtype),
            rng.normal(size=(b, d)).astype(dtype))


def _dtype(x):
    return keras.backend.standardize_dtype(x.dtype)


def _assert_scalar_f32(x):
    assert _dtype(x) == "float32"
    assert tuple(x.shape) == ()
    assert np.isfinite(to_numpy(x))


# --------------------------------------------------------------- reference


def test_reference_vectorised_matches_loops():
    """The two numpy references (vectorised / plain loops) agree."""
    img, txt = _embeds(6, 5, seed=3)
    np.testing.assert_allclose(ref.clip_loss(img, txt, 7.0),
                               ref.clip_loss_loop(img, txt, 7.0), rtol=1e-12)
    np.testing.assert_allclose(ref.siglip_loss(img, txt, 7.0, -2.0),
                               ref.siglip_loss_loop(img, txt, 7.0, -2.0),
                               rtol=1e-12)


# ------------------------------------------------------------ golden values


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", [1.0, 14.3, 100.0])
def test_clip_loss_golden(shape, scale):
    img, txt = _embeds(*shape)
    out = clip_loss(img, txt, scale)
    _assert_scalar_f32(out)
    np.testing.assert_allclose(to_numpy(out), ref.clip_loss(img, txt, scale),
                               rtol=RTOL, atol=1e-6)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale,bias", [(10.0, -10.0), (1.0, 0.0),
                                        (30.0, 2.5)])
def test_siglip_loss_golden(shape, scale, bias):
    img, txt = _embeds(*shape, seed=1)
    out = siglip_loss(img, txt, scale, bias)
    _assert_scalar_f32(out)
    np.testing.assert_allclose(to_numpy(out),
                               ref.siglip_loss(img, txt, scale, bias),
                               rtol=RTOL, atol=1e-6)


@pytest.mark.parametrize("b_img,b_txt,d", [(4, 3, 8), (1, 5, 2), (6, 6, 1)])
def test_logits_golden(b_img, b_txt, d):
    rng = np.random.default_rng(2)
    img = rng.normal(size=(b_img, d)).astype("float32")
    txt = rng.normal(size=(b_txt, d)).astype("float32")
    out = clip_logits(img, txt, 20.0)
    assert _dtype(out) == "float32" and tuple(out.shape) == (b_img, b_txt)
    np.testing.assert_allclose(to_numpy(out), ref.clip_logits(img, txt, 20.0),
                               rtol=1e-5, atol=1e-5)
    out = siglip_logits(img, txt, 20.0, -3.0)
    assert _dtype(out) == "float32" and tuple(out.shape) == (b_img, b_txt)
    np.testing.assert_allclose(to_numpy(out),
                               ref.siglip_logits(img, txt, 20.0, -3.0),
                               rtol=1e-5, atol=1e-5)


def test_gradients_match_finite_differences_of_reference():
    """Backend gradients vs central differences of the float64 reference."""
    img, txt = _embeds(8, 6, seed=4)
    s, b = 5.0, -1.5
    cases = [
        (clip_loss, ref.clip_loss, [img, txt, np.float32(s)]),
        (siglip_loss, ref.siglip_loss,
         [img, txt, np.float32(s), np.float32(b)]),
    ]
    for ours, theirs, args in cases:
        _, grads = value_and_grad(ours, *args)
        for i, g in enumerate(grads):
            np.testing.assert_allclose(g, finite_difference(theirs, args, i),
                                       rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------- hand-computed


def test_hand_computed_orthogonal_pairs():
    """B=2, image_i and text_i along the same axis, the two axes orthogonal.

    After normalisation cos = I (the scale of the raw vectors, 3 and 0.5
    here, must not matter), so with multiplier s:
      CLIP: logits = [[s, 0], [0, s]]; every row and column gives
        CE = -log(e^s / (e^s + e^0)) = log(1 + e^{-s}),
        so the loss is log(1 + e^{-s}); s = 1 -> log(1 + 1/e)
        = 0.31326168751822286.
      SigLIP: diagonal logits s + b (label +1), off-diagonal b (label -1):
        loss = -(1/2) * [2 log sig(s + b) + 2 log sig(-b)]
             = log(1 + e^{-(s+b)}) + log(1 + e^{b});
        s = 2, b = 0 -> log(1 + e^{-2}) + log 2
        = 0.12692801104297263 + 0.6931471805599453 = 0.8200751916029179.
    """
    img = np.array([[3.0, 0.0], [0.0, 3.0]], "float32")
    txt = np.array([[0.5, 0.0], [0.0, 0.5]], "float32")
    np.testing.assert_allclose(to_numpy(clip_loss(img, txt, 1.0)),
                               0.31326168751822286, rtol=RTOL)
    np.testing.assert_allclose(to_numpy(siglip_loss(img, txt, 2.0, 0.0)),
                               0.8200751916029179, rtol=RTOL)
    # s = 10, b = -10: log(1 + e^0) + log(1 + e^{-10})
    # = 0.6931471805599453 + 4.5398899216870535e-05 = 0.6931925794591622.
    np.testing.assert_allclose(to_numpy(siglip_loss(img, txt, 10.0, -10.0)),
                               0.6931925794591622, rtol=RTOL)
    for k in (1, 2):
        np.testing.assert_allclose(
            to_numpy(siglip_loss(img, txt, 2.0, 0.0, num_chunks=k)),
            0.8200751916029179, rtol=RTOL)


def test_hand_computed_constant_rows():
    """All texts identical: every logit equals s * cos(45 deg) = s/sqrt(2),
    so every softmax is uniform and CLIP's loss is log B = log 2
    = 0.6931471805599453 whatever s. SigLIP with b = 0: all logits
    z = s/sqrt(2); loss = -(1/2)[2 log sig(z) + 2 log sig(-z)]
    = log(1 + e^{-z}) + log(1 + e^{z}); s = sqrt(2) -> z = 1:
    0.31326168751822286 + 1.3132616875182228 = 1.6265233750364456."""
    img = np.array([[1.0, 0.0], [0.0, 1.0]], "float32")
    txt = np.array([[2.0, 2.0], [2.0, 2.0]], "float32")
    np.testing.assert_allclose(to_numpy(clip_loss(img, txt, 50.0)),
                               0.6931471805599453, rtol=RTOL)
    np.testing.assert_allclose(
        to_numpy(siglip_loss(img, txt, math.sqrt(2.0), 0.0)),
        1.6265233750364456, rtol=RTOL)


@pytest.mark.parametrize("b", [1, 8])
def test_hand_computed_zero_vectors(b):
    """Zero embeddings normalise to zero, so all cosines are 0:
    CLIP: uniform softmax -> log B.
    SigLIP: diagonal log sig(b_), off-diagonal log sig(-b_):
      loss = -(log sig(b_) + (B - 1) log sig(-b_)) = B log 2 when b_ = 0."""
    z = np.zeros((b, 6), "float32")
    np.testing.assert_allclose(to_numpy(clip_loss(z, z, 100.0)), math.log(b),
                               rtol=RTOL, atol=1e-7)
    np.testing.assert_allclose(to_numpy(siglip_loss(z, z, 10.0, 0.0)),
                               b * math.log(2.0), rtol=RTOL)
    # b_ = -10: log(1 + e^{10}) + (B-1) log(1 + e^{-10})
    expected = math.log1p(math.exp(10.0)) + (b - 1) * math.log1p(
        math.exp(-10.0))
    np.testing.assert_allclose(to_numpy(siglip_loss(z, z, 10.0, -10.0)),
                               expected, rtol=RTOL)


# ---------------------------------------------------------- dtypes / inputs


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_inputs_give_float32(dtype):
    img, txt = _embeds(8, 6, seed=5)
    img_lp = keras.ops.cast(img, dtype)
    txt_lp = keras.ops.cast(txt, dtype)
    # The reference sees the same rounded inputs, in float64.
    img_r = to_numpy(keras.ops.cast(img_lp, "float32"))
    txt_r = to_numpy(keras.ops.cast(txt_lp, "float32"))
    scale = keras.ops.cast(np.float32(20.0), dtype)
    bias = keras.ops.cast(np.float32(-4.0), dtype)
    out = clip_loss(img_lp, txt_lp, scale)
    _assert_scalar_f32(out)
    np.testing.assert_allclose(to_numpy(out), ref.clip_loss(img_r, txt_r, 20),
                               rtol=1e-5)
    for out in (siglip_loss(img_lp, txt_lp, scale, bias),
                siglip_loss(img_lp, txt_lp, scale, bias, num_chunks=2)):
        _assert_scalar_f32(out)
        np.testing.assert_allclose(to_numpy(out),
                                   ref.siglip_loss(img_r, txt_r, 20, -4),
                                   rtol=1e-5)
    for out in (clip_logits(img_lp, txt_lp, scale),
                siglip_logits(img_lp, txt_lp, scale, bias)):
        assert _dtype(out) == "float32"


def test_float16_large_values_are_cast_before_squaring():
    """|x| = 200, D = 6: sum x^2 = 240000 overflows float16 (max 65504),
    so a loss that normalised before casting would see inf norms."""
    rng = np.random.default_rng(6)
    img = (200.0 * np.sign(rng.normal(size=(8, 6)))).astype("float16")
    txt = (200.0 * np.sign(rng.normal(size=(8, 6)))).astype("float16")
    np.testing.assert_allclose(to_numpy(clip_loss(img, txt, 10.0)),
                               ref.clip_loss(img, txt, 10.0), rtol=1e-5)
    np.testing.assert_allclose(to_numpy(siglip_loss(img, txt, 10.0, -1.0)),
                               ref.siglip_loss(img, txt, 10.0, -1.0),
                               rtol=1e-5)


def test_accepts_backend_tensors_numpy_and_python_floats():
    img, txt = _embeds(8, 6, seed=7)
    expected = ref.siglip_loss(img, txt, 10.0, -10.0)
    t_img = keras.ops.convert_to_tensor(img)
    t_txt = keras.ops.convert_to_tensor(txt)
    t_s = keras.ops.convert_to_tensor(np.float32(10.0))
    t_b = keras.ops.convert_to_tensor(np.array([-10.0], "float32"))  # (1,)
    for args in [(img, txt, 10.0, -10.0), (t_img, t_txt, t_s, t_b),
                 (t_img, txt, np.float64(10.0), -10)]:
        np.testing.assert_allclose(to_numpy(siglip_loss(*args)), expected,
                                   rtol=RTOL)
    np.testing.assert_allclose(to_numpy(clip_loss(t_img, t_txt, t_s)),
                               ref.clip_loss(img, txt, 10.0), rtol=RTOL)


def test_l2_normalize():
    x = np.array([[3.0, 4.0], [0.0, 0.0], [1e-30, 0.0]], "float32")
    y = l2_normalize(x)
    assert _dtype(y) == "float32"
    np.testing.assert_allclose(to_numpy(y),
                               [[0.6, 0.8], [0.0, 0.0], [1e-18, 0.0]],
                               rtol=1e-6, atol=1e-30)
    y = l2_normalize(keras.ops.cast(x[:2], "float16"))  # normalised in, and returned as, float32
    assert _dtype(y) == "float32"
    np.testing.assert_allclose(to_numpy(y), [[0.6, 0.8], [0.0, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(to_numpy(l2_normalize(x[:1].T, axis=0)),
                               [[0.6], [0.8]], rtol=1e-6)
    _, (g,) = value_and_grad(lambda v: keras.ops.sum(l2_normalize(v)),
                             np.zeros((2, 3), "float32"))
    assert np.all(np.isfinite(g))


# ------------------------------------------------- finite values and grads


def _degenerate_inputs():
    rng = np.random.default_rng(8)
    rand = rng.normal(size=(8, 6)).astype("float32")
    zeros = np.zeros((8, 6), "float32")
    const = np.ones((8, 6), "float32")  # all rows identical
    mixed = rand.copy()
    mixed[1] = 0.0
    return {
        "zeros": (zeros, zeros),
        "zeros_vs_random": (zeros, rand),
        "constant_rows": (const, const),
        "one_zero_row": (mixed, rand),
    }


@pytest.mark.parametrize("case", list(_degenerate_inputs()))
def test_degenerate_inputs_finite_loss_and_gradients(case):
    img, txt = _degenerate_inputs()[case]
    s, b = np.float32(100.0), np.float32(-10.0)
    fns = {
        "clip": (lambda i, t, s, b: clip_loss(i, t, s), ref.clip_loss),
        "siglip": (siglip_loss, ref.siglip_loss),
        "siglip_chunked": (
            lambda i, t, s, b: siglip_loss(i, t, s, b, num_chunks=3),
            ref.siglip_loss),
    }
    for name, (fn, ref_fn) in fns.items():
        value, grads = value_and_grad(fn, img, txt, s, b)
        assert np.isfinite(value), name
        expected = (ref_fn(img, txt, s) if name == "clip"
                    else ref_fn(img, txt, s, b))
        np.testing.assert_allclose(value, expected, rtol=1e-5, err_msg=name)
        for g in grads:
            assert np.all(np.isfinite(g)), name


# ------------------------------------------------------------------ chunked


@functools.cache
def _unchunked_value_and_grad(b):
    """The unchunked loss's value and gradients on `test_chunked_matches_unchunked`'s inputs of `b` rows: the same
    for each of its cases of that batch size, computed once."""
    img, txt = _embeds(b, 6, seed=9)
    return value_and_grad(siglip_loss, img, txt, np.float32(12.0), np.float32(-6.0))


@pytest.mark.parametrize("b,num_chunks,remat", [
    (8, 3, True),      # 3 + 3 + 2: last chunk padded by 1
    (8, 3, False),
    (8, 2, False),     # dividing
    (8, 1, True),      # one chunk
    (8, 20, True),     # more chunks than rows: 8 of 1
    (1, 3, False),
])
def test_chunked_matches_unchunked(b, num_chunks, remat):
    img, txt = _embeds(b, 6, seed=9)
    args = (img, txt, np.float32(12.0), np.float32(-6.0))
    v0, g0 = _unchunked_value_and_grad(b)
    v1, g1 = value_and_grad(
        lambda *a: siglip_loss(*a, num_chunks=num_chunks, remat=remat), *args,
        jit=True)
    np.testing.assert_allclose(v1, v0, rtol=1e-6, atol=1e-6)
    for a, c in zip(g1, g0):
        np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v1, ref.siglip_loss(*args), rtol=RTOL)


def test_chunked_argument_errors():
    img, txt = _embeds(4, 3)
    with pytest.raises(ValueError, match="`num_chunks` must be a python int >= 1"):
        siglip_loss(img, txt, 1.0, 0.0, num_chunks=0)
    with pytest.raises(ValueError, match="`num_chunks` must be a python int >= 1"):
        siglip_loss(img, txt, 1.0, 0.0, num_chunks=2.0)
    with pytest.raises(ValueError, match="text_embeds"):
        siglip_loss(img, txt[:3], 1.0, 0.0, num_chunks=2)


# ------------------------------------------------------------- invariances


def test_batch_permutation_invariance():
    img, txt = _embeds(8, 6, seed=10)
    perm = np.random.default_rng(0).permutation(8)
    for fn in (lambda i, t: clip_loss(i, t, 30.0),
               lambda i, t: siglip_loss(i, t, 10.0, -5.0),
               lambda i, t: siglip_loss(i, t, 10.0, -5.0, num_chunks=2)):
        base = to_numpy(fn(img, txt))
        np.testing.assert_allclose(to_numpy(fn(img[perm], txt[perm])), base,
                                   rtol=RTOL)
        # Permuting only the texts breaks the pairing: the loss changes.
        assert abs(to_numpy(fn(img, txt[perm])) - base) > 1e-3


def test_scale_invariance_of_inputs():
    """Embeddings are normalised: rescaling rows does not change anything."""
    img, txt = _embeds(8, 6, seed=11)
    r = np.array([[0.1], [1.0], [7.0], [123.0], [2.0], [1e-3], [3.0], [0.5]],
                 "float32")
    np.testing.assert_allclose(to_numpy(clip_loss(img * r, txt / r, 10.0)),
                               to_numpy(clip_loss(img, txt, 10.0)), rtol=1e-5)
    np.testing.assert_allclose(
        to_numpy(siglip_loss(img * r, txt / r, 10.0, -3.0)),
        to_numpy(siglip_loss(img, txt, 10.0, -3.0)), rtol=1e-5)


# ------------------------------------------------- known-wrong variants


def _wrong_variants():
    """Plausible mistakes, each in numpy float64."""

    def clip_unnormalised(img, txt, s):
        logits = s * np.asarray(img, np.float64) @ np.asarray(txt, np.float64).T
        n = len(logits)
        return -0.5 * (np.trace(ref.log_softmax(logits, 1)) / n
                       + np.trace(ref.log_softmax(logits, 0)) / n)

    def clip_one_direction(img, txt, s):
        logits = ref.clip_logits(img, txt, s)
        return -np.trace(ref.log_softmax(logits, 1)) / len(logits)

    def clip_log_scale(img, txt, s):
        return ref.clip_loss(img, txt, math.exp(s))

    def siglip_mean_over_pairs(img, txt, s, b):
        return ref.siglip_loss(img, txt, s, b) / len(img)

    def siglip_unnormalised(img, txt, s, b):
        logits = s * np.asarray(img, np.float64) @ np.asarray(txt, np.float64).T
        labels = 2 * np.eye(len(logits)) - 1
        return -np.sum(ref.log_sigmoid(labels * (logits + b))) / len(logits)

    def siglip_bias_outside_label(img, txt, s, b):
        # y * (s cos) + b instead of y * (s cos + b).
        logits = ref.clip_logits(img, txt, s)
        labels = 2 * np.eye(len(logits)) - 1
        return -np.sum(ref.log_sigmoid(labels * logits + b)) / len(logits)

    return {
        "clip": [clip_unnormalised, clip_one_direction, clip_log_scale],
        "siglip": [siglip_mean_over_pairs, siglip_unnormalised,
                   siglip_bias_outside_label],
    }


def test_known_wrong_variants_differ():
    rng = np.random.default_rng(12)
    img = (3.0 * rng.normal(size=(8, 6))).astype("float32")
    txt = (0.5 * rng.normal(size=(8, 6))).astype("float32")
    txt[:3] += img[:3] / 3.0  # some pairs are aligned -> asymmetric logits
    s, b = 2.0, -1.0
    ours = to_numpy(clip_loss(img, txt, s))
    np.testing.assert_allclose(ours, ref.clip_loss(img, txt, s), rtol=RTOL)
    for wrong in _wrong_variants()["clip"]:
        assert abs(ours - wrong(img, txt, s)) > 1e-2, wrong.__name__
    ours = to_numpy(siglip_loss(img, txt, s, b))
    np.testing.assert_allclose(ours, ref.siglip_loss(img, txt, s, b),
                               rtol=RTOL)
    for wrong in _wrong_variants()["siglip"]:
        assert abs(ours - wrong(img, txt, s, b)) > 1e-2, wrong.__name__


# ---------------------------------------------------------- validation


def test_error_messages_name_the_argument():
    img, txt = _embeds(4, 8)
    msg = ("`text_embeds` must have shape (B, D) matching `image_embeds` "
           "(4, 8); received (3, 8)")
    for fn in (lambda i, t: clip_loss(i, t, 1.0),
               lambda i, t: siglip_loss(i, t, 1.0, 0.0),
               lambda i, t: siglip_loss(i, t, 1.0, 0.0, num_chunks=2)):
        with pytest.raises(ValueError, match=re.escape(msg)):
            fn(img, txt[:3])
        with pytest.raises(ValueError, match="text_embeds"):
            fn(img, txt[:, :5])
        with pytest.raises(ValueError, match="image_embeds"):
            fn(img[0], txt)
        with pytest.raises(ValueError, match="text_embeds"):
            fn(img, txt[None])
    # Logits accept different batch sizes but not different widths.
    assert tuple(clip_logits(img, txt[:3], 1.0).shape) == (4, 3)
    with pytest.raises(ValueError, match="text_embeds"):
        clip_logits(img, txt[:, :5], 1.0)
    with pytest.raises(ValueError, match="text_embeds"):
        siglip_logits(img, txt[:, :5], 1.0, 0.0)
    with pytest.raises(ValueError, match="logit_scale"):
        clip_loss(img, txt, np.ones((2,), "float32"))
    with pytest.raises(ValueError, match="logit_scale"):
        siglip_loss(img, txt, np.ones((1, 2), "float32"), 0.0)
    with pytest.raises(ValueError, match="logit_bias"):
        siglip_loss(img, txt, 1.0, np.zeros((4,), "float32"))
    with pytest.raises(ValueError, match="logit_bias"):
        siglip_logits(img, txt, 1.0, np.zeros((4,), "float32"))


# ------------------------------------------------------- traced execution


def test_traced_function():
    """Inside the backend's compiler / graph mode: `jax.jit`, and for
    TensorFlow an XLA-compiled gradient with an unknown batch dimension."""
    img, txt = _embeds(8, 6, seed=13)
    s, b = np.float32(10.0), np.float32(-3.0)
    expected = (ref.clip_loss(img, txt, s), ref.siglip_loss(img, txt, s, b))

    def every_loss(i, t):
        return (clip_loss(i, t, s), siglip_loss(i, t, s, b),
                siglip_loss(i, t, s, b, num_chunks=3))

    if BACKEND == "jax":
        import jax

        out = jax.jit(every_loss)(img, txt)
        v1, g1 = value_and_grad(
            lambda *a: siglip_loss(*a, num_chunks=3), img, txt, s, b,
            jit=True)
        v0, g0 = value_and_grad(siglip_loss, img, txt, s, b)
        np.testing.assert_allclose(v1, v0, rtol=1e-6)
        for x, y in zip(g1, g0):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    elif BACKEND == "tensorflow":
        import tensorflow as tf

        spec = tf.TensorSpec((None, 6), tf.float32)
        out = tf.function(every_loss, input_signature=[spec, spec])(img, txt)

        def grads(chunked, remat=True):
            def f(i, t):
                with tf.GradientTape() as tape:
                    tape.watch([i, t])
                    loss = (siglip_loss(i, t, s, b, num_chunks=3, remat=remat)
                            if chunked else siglip_loss(i, t, s, b))
                return loss, tape.gradient(loss, [i, t])
            return tf.function(f, input_signature=[spec, spec],
                               jit_compile=True)(img, txt)

        v0, g0 = grads(False)
        for remat in (False, True):
            v1, g1 = grads(True, remat)
            np.testing.assert_allclose(to_numpy(v1), to_numpy(v0), rtol=1e-6)
            for x, y in zip(g1, g0):
                np.testing.assert_allclose(to_numpy(x), to_numpy(y),
                                           rtol=1e-5, atol=1e-6)
    else:
        pytest.skip("torch runs eagerly; covered by the other tests")
    out = [to_numpy(o) for o in out]
    np.testing.assert_allclose(out[0], expected[0], rtol=RTOL)
    np.testing.assert_allclose(out[1], expected[1], rtol=RTOL)
    np.testing.assert_allclose(out[2], expected[1], rtol=RTOL)


@pytest.mark.skipif(BACKEND != "jax", reason="XLA memory analysis (JAX)")
def test_chunked_memory_grows_with_chunk_not_batch_squared():
    """Compiled temp memory of value+grad: the full loss holds B^2 floats;
    the chunked one with remat only about B * C."""
    import jax

    bsz, chunk = 1024, 128
    img, txt = _embeds(bsz, 8, seed=14)

    def temp_mib(loss_fn):
        fn = jax.jit(jax.value_and_grad(loss_fn, argnums=(0, 1)))
        analysis = fn.lower(img, txt).compile().memory_analysis()
        if analysis is None:
            pytest.skip("no memory analysis on this platform")
        return analysis.temp_size_in_bytes / 2**20

    full = temp_mib(lambda i, t: siglip_loss(i, t, 10.0, -10.0))
    chunked = temp_mib(lambda i, t: siglip_loss(
        i, t, 10.0, -10.0, num_chunks=bsz // chunk))
    assert full >= bsz * bsz * 4 / 2**20  # the (B, B) logits: 4 MiB
    assert chunked < full / 2, (chunked, full)


# ---------------------------------------------------------------- one replica's rows (vlzoo.parallel)


def _share_reference(name, img, txt, start, count, scale=5.0, bias=-3.0):
    """One replica's share, from the whole batch's logits in float64 NumPy."""
    rows = slice(start, start + count)
    if name == "clip":
        logits = ref.clip_logits(img, txt, scale)
        i2t = np.diag(ref.log_softmax(logits, axis=1))[rows]
        t2i = np.diag(ref.log_softmax(logits, axis=0))[rows]
        return -0.5 * (i2t.mean() + t2i.mean())
    logits = ref.siglip_logits(img, txt, scale, bias)
    labels = 2.0 * np.eye(len(img)) - 1.0
    return -ref.log_sigmoid(labels * logits)[rows].sum() / count


def _share(name, img, txt, start, count, num_chunks=None):
    if name == "clip":
        return clip_loss(img, txt, 5.0, rows=(start, count))
    return siglip_loss(img[start:start + count], txt, 5.0, -3.0, rows=(start, count), num_chunks=num_chunks)


@pytest.mark.parametrize("name, num_chunks", [("clip", None), ("siglip", None), ("siglip", 3)])
def test_row_shares_are_the_replicas_parts_of_the_whole_batch_loss(name, num_chunks):
    rng = np.random.default_rng(0)
    img, txt = rng.normal(size=(8, 16)).astype("float32"), rng.normal(size=(8, 16)).astype("float32")
    img64, txt64 = img.astype("float64"), txt.astype("float64")
    for start, count in ((0, 2), (2, 2), (6, 2), (4, 4)):
        share = float(to_numpy(_share(name, img, txt, start, count, num_chunks)))
        np.testing.assert_allclose(share, _share_reference(name, img64, txt64, start, count), rtol=2e-6)
    whole = (lambda i, t: clip_loss(i, t, 5.0)) if name == "clip" else (lambda i, t: siglip_loss(i, t, 5.0, -3.0))
    # On JAX the gradients are compiled (`jit=True`), one program each: eagerly, every replica's row slice and its
    # transpose is an op of its own shape to compile. The shares' eager values are held to NumPy above.
    expected_value, expected_grads = value_and_grad(whole, img, txt, jit=True)  # the whole batch's, for every split
    for replicas in (2, 4):
        count = 8 // replicas
        value, grads = value_and_grad(
            lambda i, t: sum(_share(name, i, t, r * count, count, num_chunks) for r in range(replicas)) / replicas,
            img, txt, jit=True)
        np.testing.assert_allclose(value, expected_value, rtol=2e-6)
        for grad, expected in zip(grads, expected_grads):
            np.testing.assert_allclose(grad, expected, atol=2e-6 * np.abs(expected).max())


def test_row_shares_check_their_arguments():
    img = np.ones((4, 8), "float32")
    with pytest.raises(ValueError, match="`count` must be a python int >= 1"):
        clip_loss(img, img, 5.0, rows=(0, 0))
    with pytest.raises(ValueError, match="`num_chunks` must be a python int >= 1"):
        siglip_loss(img, img, 5.0, -3.0, rows=(0, 4), num_chunks=0)
    with pytest.raises(ValueError, match="holds the replica's 2 images; received 4 rows"):
        siglip_loss(img, img, 5.0, -3.0, rows=(0, 2))
