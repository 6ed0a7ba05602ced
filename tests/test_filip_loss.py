"""Tests of FILIP's late-interaction similarity and loss (any Keras backend).

Golden values are cases worked by hand from the paper's equations; random
cases are compared with the float64 loops of reference_token_losses.py.
"""

import functools
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
from vlzoo.losses.filip import _keep_count
from vlzoo.losses.filip import filip_loss
from vlzoo.losses.filip import filip_select_tokens
from vlzoo.losses.late_interaction import filip_ensemble_scores
from vlzoo.losses.late_interaction import filip_similarity
from vlzoo.losses.late_interaction import filip_token_alignment

BACKEND = keras.backend.backend()
# One shared random shape (eager JAX compiles every op once per shape).
B, P, T, D = 5, 4, 6, 8
LENGTHS = [2, 6, 3, 1, 4]  # real tokens per caption (a one-token caption)
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(autouse=True)
def _full_precision():
    with full_precision_matmul():
        yield


def _inputs(seed=0, lengths=LENGTHS, p=P, t=T, d=D):
    rng = np.random.default_rng(seed)
    img = rng.normal(size=(len(lengths), p, d)).astype("float32")
    txt = rng.normal(size=(len(lengths), t, d)).astype("float32")
    mask = np.arange(t)[None, :] < np.array(lengths)[:, None]
    return img, txt, mask


def _image_mask(seed=1, p=P, b=B):
    mask = np.random.default_rng(seed).random((b, p)) < 0.7
    mask[:, 0] = True
    return mask


def _hand_case():
    """Worked by hand: D = B = P = T = 2 (unit vectors already)."""
    img = np.array([[[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [1.0, 0.0]]],
                   "float32")
    txt = np.array([[[0.6, 0.8], [0.0, 1.0]], [[0.0, 1.0], [0.0, 1.0]]],
                   "float32")
    mask = np.array([[True, False], [True, True]])
    return img, txt, mask


def _sims(*args, **kwargs):
    return [to_numpy(s) for s in filip_similarity(*args, **kwargs)]


# ------------------------------------------------------------ golden cases


@pytest.mark.parametrize("kwargs", [{}, dict(num_chunks=2),
                                    dict(num_chunks=2, chunk_axis="image")])
def test_hand_case_similarities(kwargs):
    """S_I = [[0.7, 0.5], [0.6, 0.0]] and S_T = [[0.8, 1.0], [0.6, 0.0]]."""
    s_i, s_t = _sims(*_hand_case(), **kwargs)
    np.testing.assert_allclose(s_i, [[0.7, 0.5], [0.6, 0.0]], atol=1e-6)
    np.testing.assert_allclose(s_t, [[0.8, 1.0], [0.6, 0.0]], atol=1e-6)
    assert s_i.dtype == np.float32 and s_t.dtype == np.float32


def test_hand_case_loss_and_known_wrong_variants():
    img, txt, mask = _hand_case()
    np.testing.assert_allclose(to_numpy(filip_loss(img, txt, mask, 1.0)),
                               0.886756844191823, rtol=1e-6)
    np.testing.assert_allclose(
        to_numpy(filip_loss(img, txt, mask, 1 / 0.07, num_chunks=2)),
        5.742255182927085, rtol=1e-6)
    ours = 0.886756844191823
    # The known-wrong values of docs/families/filip.md §Hand-checked cases, recomputed in numpy (scale 1).
    s_i, s_t = tref.filip_similarity(img, txt, mask)
    wrong = tref.filip_wrong_variants(s_i, s_t, 1.0)
    unmasked = tref.filip_loss(img, txt, np.ones_like(mask), 1.0)
    x, y = ref.l2_normalize(img), ref.l2_normalize(txt)
    # "Sum instead of mean" of the valid-token maxima in S_T (summing in
    # S_I too would give 1.175341, not the number in docs/families/filip.md).
    s_t_sum = np.array([[(x[i] @ y[j][mask[j]].T).max(0).sum()
                         for j in range(2)] for i in range(2)])
    summed = tref.filip_loss_from_similarity(s_i, s_t_sum, 1.0)
    expected = {
        "t2i_from_s_i": (wrong["t2i_from_s_i"], 0.813525),
        "i2t_from_s_t": (wrong["i2t_from_s_t"], 0.936757),
        "pads_unmasked": (unmasked, 0.835648),
        "sum_not_mean": (summed, 1.090173),
        "t2i_rows_of_s_t": (wrong["t2i_rows_of_s_t"], 0.867813),
    }
    for name, (value, spec) in expected.items():
        np.testing.assert_allclose(value, spec, atol=1e-6, err_msg=name)
        assert abs(value - ours) > 1e-2, name


def test_hand_case_alignment_indices():
    """Patch 1 of image 0, (0, 1), matches the pad (0, 1) of text 0 exactly,
    but its best *real* token is index 0."""
    p2t, t2p = [to_numpy(a) for a in filip_token_alignment(*_hand_case())]
    assert p2t.shape == (2, 2, 2) and t2p.shape == (2, 2, 2)
    assert p2t.dtype == np.int32
    assert p2t[0, 0, 1] == 0 and p2t[0, 0, 0] == 0
    assert t2p[0, 0, 0] == 1  # token (0.6, 0.8) prefers patch (0, 1)
    assert t2p[0, 1, 1] == 1 and t2p[1, 1, 0] == 0


def test_prompt_ensemble_toy_case():
    """One image with patches (1,0), (0,1); one class with templates A =
    [(1,0)] and B = [(0,1)]: FILIP's ensemble 0.5, not the union of tokens
    (1.0) nor the mean embedding (0.7071)."""
    img = np.array([[[1.0, 0.0], [0.0, 1.0]]], "float32")
    txt = np.array([[[[1.0, 0.0]], [[0.0, 1.0]]]], "float32")  # (1, 2, 1, 2)
    mask = np.ones((1, 2, 1), bool)
    scores = to_numpy(filip_ensemble_scores(img, txt, mask))
    assert scores.shape == (1, 1)
    np.testing.assert_allclose(scores, [[0.5]], atol=1e-7)
    union = tref.filip_similarity(img, txt.reshape(1, 2, 2),
                                  np.ones((1, 2), bool))[0]
    mean_emb = tref.filip_similarity(
        img, ref.l2_normalize(txt.sum(1)), np.ones((1, 1), bool))[0]
    np.testing.assert_allclose(union, [[1.0]])
    np.testing.assert_allclose(mean_emb, [[math.sqrt(0.5)]])


def test_prompt_ensemble_matches_reference():
    img, txt, mask = _inputs(seed=2)  # 5 prompts: as 1 class x 5 templates
    scores = to_numpy(filip_ensemble_scores(img, txt[None], mask[None]))
    np.testing.assert_allclose(
        scores, tref.filip_ensemble_scores(img, txt[None], mask[None]), **TOL)
    # One template per class: exactly S_I.
    s_i = _sims(img, txt, mask)[0]
    one = to_numpy(filip_ensemble_scores(img, txt[:, None], mask[:, None]))
    np.testing.assert_allclose(one, s_i, **TOL)


# -------------------------------------------------------- numpy reference


@pytest.mark.parametrize("with_image_mask", [False, True])
def test_similarity_matches_reference(with_image_mask):
    img, txt, mask = _inputs(seed=3)
    im = _image_mask() if with_image_mask else None
    s_i, s_t = _sims(img, txt, mask, im)
    e_i, e_t = tref.filip_similarity(img, txt, mask, im)
    np.testing.assert_allclose(s_i, e_i, **TOL)
    np.testing.assert_allclose(s_t, e_t, **TOL)
    assert np.all(np.abs(s_i) <= 1 + 1e-6) and np.all(np.abs(s_t) <= 1 + 1e-6)
    # Asymmetric: S_I != S_T and S_T != S_I^T.
    assert np.max(np.abs(s_i - s_t)) > 1e-2
    assert np.max(np.abs(s_t - s_i.T)) > 1e-2
    # Different batch sizes of images and texts.
    s_i, s_t = _sims(img[:3], txt, mask, None if im is None else im[:3])
    assert s_i.shape == (3, B)
    np.testing.assert_allclose(s_t, e_t[:3], **TOL)


@pytest.mark.parametrize("scale", [1.0, 1 / 0.07, 100.0])
def test_loss_matches_reference(scale):
    img, txt, mask = _inputs(seed=4)
    im = _image_mask()
    np.testing.assert_allclose(
        to_numpy(filip_loss(img, txt, mask, scale)),
        tref.filip_loss(img, txt, mask, scale), **TOL)
    np.testing.assert_allclose(
        to_numpy(filip_loss(img, txt, mask, scale, image_mask=im)),
        tref.filip_loss(img, txt, mask, scale, image_mask=im), **TOL)


def test_gradients_match_finite_differences_of_reference():
    img, txt, mask = _inputs(seed=5)
    scale = np.float32(3.0)
    _, grads = value_and_grad(
        lambda i, t, s: filip_loss(i, t, mask, s), img, txt, scale)

    def f(i, t, s):
        return tref.filip_loss(i, t, mask, s)

    for k, g in enumerate(grads):
        np.testing.assert_allclose(g, finite_difference(f, [img, txt, scale],
                                                         k),
                                   rtol=1e-4, atol=1e-5)


def test_reduces_to_clip():
    """P = T = 1: S_I = S_T = cosine, the loss is CLIP's InfoNCE; the same
    with all tokens of each sample identical."""
    img, txt, mask = _inputs(seed=6)
    one = np.ones((B, 1), bool)
    for scale in (1.0, 30.0):
        expected = to_numpy(clip_loss(img[:, 0], txt[:, 0], scale))
        np.testing.assert_allclose(
            to_numpy(filip_loss(img[:, :1], txt[:, :1], one, scale)),
            expected, rtol=1e-6, atol=1e-6)
        rep_img = np.repeat(img[:, :1], P, axis=1)
        rep_txt = np.repeat(txt[:, :1], T, axis=1)
        np.testing.assert_allclose(
            to_numpy(filip_loss(rep_img, rep_txt, mask, scale)),
            expected, rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------ invariances


def _loss_fn(mask, image_mask=None, **kwargs):
    return lambda i, t, s: filip_loss(i, t, mask, s, image_mask=image_mask,
                                      **kwargs)


@pytest.mark.parametrize("num_chunks", [None, 3])
def test_padding_invariance_and_zero_gradient(num_chunks):
    img, txt, mask = _inputs(seed=7)
    im = _image_mask()
    scale = np.float32(10.0)
    fn = _loss_fn(mask, im, num_chunks=num_chunks)
    v0, g0 = value_and_grad(fn, img, txt, scale)
    np.testing.assert_allclose(
        v0, tref.filip_loss(img, txt, mask, scale, image_mask=im), **TOL)
    # Gradient on padding exactly 0, nonzero on real tokens.
    assert np.all(g0[0][~im] == 0) and np.all(g0[1][~mask] == 0)
    assert np.all(np.abs(g0[0][im]).sum(-1) > 0)
    assert np.all(np.abs(g0[1][mask]).sum(-1) > 0)
    # Arbitrary (huge) padding content: same value and gradients.
    rng = np.random.default_rng(0)
    img2, txt2 = img.copy(), txt.copy()
    img2[~im] = 1e6 * rng.normal(size=img2[~im].shape)
    txt2[~mask] = rng.normal(size=txt2[~mask].shape) * 1e6
    v1, g1 = value_and_grad(fn, img2, txt2, scale)
    np.testing.assert_allclose(v1, v0, rtol=1e-6)
    for a, b in zip(g1, g0):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    if num_chunks is None:
        # More padding (T -> T + 3): same value.
        txt3 = np.concatenate([txt, np.ones((B, 3, D), "float32")], axis=1)
        mask3 = np.concatenate([mask, np.zeros((B, 3), bool)], axis=1)
        np.testing.assert_allclose(
            to_numpy(filip_loss(img, txt3, mask3, scale, image_mask=im)), v0,
            rtol=1e-6)


def test_batch_and_token_permutations():
    img, txt, mask = _inputs(seed=8)
    perm = np.random.default_rng(1).permutation(B)
    s_i, s_t = _sims(img, txt, mask)
    p_i, p_t = _sims(img[perm], txt[perm], mask[perm], num_chunks=3)
    np.testing.assert_allclose(p_i, s_i[perm][:, perm], **TOL)
    np.testing.assert_allclose(p_t, s_t[perm][:, perm], **TOL)
    loss = to_numpy(filip_loss(img, txt, mask, 10.0))
    np.testing.assert_allclose(
        to_numpy(filip_loss(img[perm], txt[perm], mask[perm], 10.0)), loss,
        rtol=1e-6)
    assert abs(to_numpy(filip_loss(img, txt[perm], mask[perm], 10.0))
               - loss) > 1e-3
    # Token order within each sample (mask permuted with it).
    tp, pp = np.random.default_rng(2).permutation(T), np.arange(P)[::-1]
    q_i, q_t = _sims(img[:, pp], txt[:, tp], mask[:, tp])
    np.testing.assert_allclose(q_i, s_i, **TOL)
    np.testing.assert_allclose(q_t, s_t, **TOL)


def test_equal_similarities_give_log_batch():
    """All tokens the same vector: every similarity is 1, loss = log B."""
    img = np.ones((B, P, D), "float32")
    txt = 3 * np.ones((B, T, D), "float32")
    mask = _inputs()[2]
    np.testing.assert_allclose(to_numpy(filip_loss(img, txt, mask, 50.0)),
                               math.log(B), rtol=1e-6)


# ---------------------------------------------------------------- chunking


@functools.cache
def _unchunked_value_and_grad():
    """The unchunked loss's value and gradients on `test_chunked_matches_unchunked`'s inputs: the same for each of
    its cases, computed once."""
    img, txt, mask = _inputs(seed=9)
    return value_and_grad(_loss_fn(mask, _image_mask()), img, txt, np.float32(14.0))


@pytest.mark.parametrize("chunks,axis,remat", [
    (dict(num_chunks=3), "text", True),    # 2 + 2 + 1: last chunk padded
    (dict(num_chunks=2), "text", False),   # 3 + 2
    (dict(num_chunks=5), "text", True),    # one text a block
    (dict(num_chunks=3), "image", True),
    (dict(num_chunks=64), "text", True),   # more blocks than rows: B blocks of one
    (dict(num_chunks=1), "text", True),    # one block
])
def test_chunked_matches_unchunked(chunks, axis, remat):
    img, txt, mask = _inputs(seed=9)
    im = _image_mask()
    scale = np.float32(14.0)
    v0, g0 = _unchunked_value_and_grad()
    v1, g1 = value_and_grad(
        _loss_fn(mask, im, chunk_axis=axis, remat=remat, **chunks), img, txt,
        scale)
    np.testing.assert_allclose(v1, v0, rtol=1e-6, atol=1e-6)
    for a, b in zip(g1, g0):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)



# ------------------------------------------------------------- degenerate


def _degenerate_cases():
    img, txt, mask = _inputs(seed=10)
    zeros_img, zeros_txt = np.zeros_like(img), np.zeros_like(txt)
    no_text = mask.copy()
    no_text[2] = False  # a caption that is all padding
    no_image = np.ones((B, P), bool)
    no_image[1] = False  # an image with no real patch
    return {
        "zeros": (zeros_img, zeros_txt, mask, None),
        "zero_image_tokens": (zeros_img, txt, mask, None),
        "constant": (np.ones_like(img), np.ones_like(txt), mask, None),
        "empty_caption": (img, txt, no_text, None),
        "empty_image": (img, txt, mask, no_image),
    }


@pytest.mark.parametrize("case", list(_degenerate_cases()))
def test_degenerate_inputs_finite(case):
    img, txt, mask, im = _degenerate_cases()[case]
    scale = np.float32(100.0)
    # The padded-batch cases also run chunked (a padded chunk row is itself
    # an empty caption).
    num_chunks = 3 if case.startswith("empty") else None
    value, grads = value_and_grad(_loss_fn(mask, im, num_chunks=num_chunks),
                                  img, txt, scale)
    assert np.isfinite(value)
    for g in grads:
        assert np.all(np.isfinite(g))
    np.testing.assert_allclose(
        value, tref.filip_loss(img, txt, mask, scale, image_mask=im), **TOL)


# ------------------------------------------------------- dtypes / inputs


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_inputs_give_float32(dtype):
    img, txt, mask = _inputs(seed=11)
    img_lp, txt_lp = keras.ops.cast(img, dtype), keras.ops.cast(txt, dtype)
    img_r = to_numpy(keras.ops.cast(img_lp, "float32"))
    txt_r = to_numpy(keras.ops.cast(txt_lp, "float32"))
    scale = keras.ops.cast(np.float32(20.0), dtype)
    out = filip_loss(img_lp, txt_lp, mask, scale, num_chunks=3)
    assert keras.backend.standardize_dtype(out.dtype) == "float32"
    np.testing.assert_allclose(to_numpy(out),
                               tref.filip_loss(img_r, txt_r, mask, 20.0),
                               rtol=1e-5)
    for s in filip_similarity(img_lp, txt_lp, mask):
        assert keras.backend.standardize_dtype(s.dtype) == "float32"
    # FILIP's reduced-precision dot products: float32 outputs, close values.
    s_lp = _sims(img, txt, mask, similarity_dtype=dtype, num_chunks=3)
    for a, b in zip(s_lp, tref.filip_similarity(img, txt, mask)):
        assert a.dtype == np.float32
        np.testing.assert_allclose(a, b, atol=1e-2)


def test_error_messages_name_the_argument():
    img, txt, mask = _inputs()
    msg = ("`text_tokens` must have shape (B, T, D) with B and D matching "
           "`image_tokens` (5, 4, 8); received (4, 6, 8)")
    with pytest.raises(ValueError, match=re.escape(msg)):
        filip_loss(img, txt[:4], mask[:4], 1.0)
    with pytest.raises(ValueError, match="`text_tokens` must have shape "
                       r"\(B_txt, T, D\) with D matching"):
        filip_similarity(img, txt[..., :5], mask)
    with pytest.raises(ValueError, match=re.escape(
            "`text_mask` must have shape (B, N) = (5, 6) matching "
            "`text_tokens` (5, 6, 8); received (5, 5)")):
        filip_similarity(img, txt, mask[:, :5])
    with pytest.raises(ValueError, match="image_mask"):
        filip_similarity(img, txt, mask, image_mask=np.ones((5, 3), bool))
    with pytest.raises(TypeError, match="text_mask.*float32"):
        filip_similarity(img, txt, mask.astype("float32"))
    with pytest.raises(ValueError, match="`image_tokens` must have rank 3"):
        filip_similarity(img[0], txt, mask)
    with pytest.raises(ValueError, match="logit_scale"):
        filip_loss(img, txt, mask, np.ones((2,), "float32"))
    with pytest.raises(ValueError, match="`num_chunks` must be a python int >= 1"):
        filip_loss(img, txt, mask, 1.0, num_chunks=0)
    with pytest.raises(ValueError, match="`num_chunks` must be a python int >= 1"):
        filip_similarity(img, txt, mask, num_chunks=2.0)
    with pytest.raises(ValueError, match="chunk_axis"):
        filip_similarity(img, txt, mask, chunk_axis="rows")
    with pytest.raises(ValueError, match="keep_ratio"):
        filip_loss(img, txt, mask, 1.0, keep_ratio=0.0)
    with pytest.raises(ValueError, match="keep_mode"):
        filip_loss(img, txt, mask, 1.0, keep_ratio=0.5, keep_mode="x")
    with pytest.raises(ValueError, match="selection_group_size"):
        filip_loss(img, txt, mask, 1.0, keep_ratio=0.5,
                   selection_group_size=0)
    with pytest.raises(ValueError, match="similarity_dtype"):
        filip_similarity(img, txt, mask, similarity_dtype="int8")
    with pytest.raises(ValueError, match=re.escape(
            "`image_ids` must have shape (B,) = (5,); received (4,)")):
        filip_loss(img, txt, mask, 1.0, image_ids=np.arange(4))
    with pytest.raises(ValueError, match="`text_mask` must have shape "
                       r"\(N, K, T\)"):
        filip_ensemble_scores(img, txt[None], mask)
    # Integer 0/1 masks are read as masks.
    np.testing.assert_allclose(
        _sims(img, txt, mask.astype("int32"))[0], _sims(img, txt, mask)[0])


# ------------------------------------------------------- multi-positive


def test_multi_positive_soft_targets():
    img, txt, mask = _inputs(seed=12)
    plain = to_numpy(filip_loss(img, txt, mask, 10.0))
    np.testing.assert_allclose(
        to_numpy(filip_loss(img, txt, mask, 10.0, image_ids=np.arange(B))),
        plain, rtol=1e-6)
    # Samples 0, 2 (and 1, 4) show the same image (different crops here;
    # with identical features soft and hard targets give the same loss).
    ids = np.array([0, 1, 0, 2, 1])
    out = to_numpy(filip_loss(img, txt, mask, 10.0, image_ids=ids))
    np.testing.assert_allclose(
        out, tref.filip_loss(img, txt, mask, 10.0, image_ids=ids), **TOL)
    assert abs(out - plain) > 1e-3


# ------------------------------------------------------- token dropping


def test_keep_counts():
    """k = max(1, round_half_up(keep_ratio * n)): 12 of 49 patches (B/32),
    64 of 256 (L/14), 19 of 77 text positions."""
    assert [_keep_count(n, 0.25) for n in (49, 256, 77, 196, 2, 1)] == [
        12, 64, 19, 49, 1, 1]
    assert _keep_count(49, 0.5) == 25 and _keep_count(77, 1.0) == 77


@pytest.mark.parametrize("group", [None, 2])
def test_selection_matches_numpy_top_k(group):
    img, txt, mask = _inputs(seed=14)
    out = filip_select_tokens(img, txt, mask, 0.5, selection_group_size=group,
                              num_chunks=3)
    e_img, e_txt = tref.filip_selection(img, txt, mask, 0.5, group)
    np.testing.assert_array_equal(to_numpy(out["image_indices"]), e_img)
    np.testing.assert_array_equal(to_numpy(out["text_indices"]), e_txt)
    kept = to_numpy(out["text_mask"])
    np.testing.assert_array_equal(kept, np.take_along_axis(mask, e_txt, 1))
    # Pads are never kept over real tokens.
    k = e_txt.shape[1]
    np.testing.assert_array_equal(kept.sum(1), np.minimum(LENGTHS, k))
    np.testing.assert_allclose(
        to_numpy(out["text_tokens"]), np.take_along_axis(txt, e_txt[..., None],
                                                         1))
    # The group changes the choice for this seed.
    other = tref.filip_selection(img, txt, mask, 0.5,
                                 None if group else 2)
    assert not (np.array_equal(other[0], e_img)
                and np.array_equal(other[1], e_txt))


def test_token_dropping_loss_and_gradients():
    img, txt, mask = _inputs(seed=15)
    scale = np.float32(10.0)
    # Keeping every token (through the selection path) changes nothing.
    np.testing.assert_allclose(
        to_numpy(filip_loss(img, txt, mask, scale, keep_ratio=0.99)),
        tref.filip_loss(img, txt, mask, scale), **TOL)
    fn = _loss_fn(mask, keep_ratio=0.5, selection_group_size=2)
    v0, g0 = value_and_grad(fn, img, txt, scale)
    np.testing.assert_allclose(
        v0, tref.filip_loss_dropped(img, txt, mask, scale, 0.5, 2), **TOL)
    # Chunked selection and similarity: same value and gradients.
    v1, g1 = value_and_grad(
        _loss_fn(mask, keep_ratio=0.5, selection_group_size=2, num_chunks=3),
        img, txt, scale)
    np.testing.assert_allclose(v1, v0, rtol=1e-6)
    for a, b in zip(g1, g0):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # Dropped tokens get exactly zero gradient, kept real ones do not.
    e_img, e_txt = tref.filip_selection(img, txt, mask, 0.5, 2)
    kept_img = np.zeros((B, P), bool)
    np.put_along_axis(kept_img, e_img, True, 1)
    kept_txt = np.zeros((B, T), bool)
    np.put_along_axis(kept_txt, e_txt, True, 1)
    assert np.all(g0[0][~kept_img] == 0) and np.all(g0[1][~kept_txt] == 0)
    assert np.all(np.abs(g0[0][kept_img]).sum(-1) > 0)
    assert np.all(np.abs(g0[1][kept_txt & mask]).sum(-1) > 0)


def test_token_dropping_per_row_cap():
    img, txt, mask = _inputs(seed=16)
    out = filip_select_tokens(img, txt, mask, 0.5, keep_mode="per_row")
    kept = to_numpy(out["text_mask"]).sum(1)
    np.testing.assert_array_equal(
        kept, np.minimum(3, np.ceil(0.5 * np.array(LENGTHS))))
    static = to_numpy(filip_loss(img, txt, mask, 10.0, keep_ratio=0.5))
    capped = to_numpy(filip_loss(img, txt, mask, 10.0, keep_ratio=0.5,
                                 keep_mode="per_row"))
    assert np.isfinite(capped) and abs(capped - static) > 1e-4


# ----------------------------------------------------- traced execution


def test_traced_function():
    """`jax.jit` / an XLA-compiled TF gradient of the chunked loss."""
    img, txt, mask = _inputs(seed=17)
    s = np.float32(10.0)
    expected = tref.filip_loss(img, txt, mask, s)
    if BACKEND == "jax":
        import jax

        out = jax.jit(lambda i, t: filip_loss(i, t, mask, s, num_chunks=3,
                                              keep_ratio=0.5))(img, txt)
        np.testing.assert_allclose(
            to_numpy(out), tref.filip_loss_dropped(img, txt, mask, s, 0.5),
            **TOL)
    elif BACKEND == "tensorflow":
        import tensorflow as tf

        # Unknown batch size (as in `fit` graphs): `num_chunks` works.
        specs = [tf.TensorSpec((None, P, D), tf.float32),
                 tf.TensorSpec((None, T, D), tf.float32),
                 tf.TensorSpec((None, T), tf.bool)]

        def grads(**kwargs):
            def f(i, t, m):
                with tf.GradientTape() as tape:
                    tape.watch([i, t])
                    loss = filip_loss(i, t, m, s, **kwargs)
                return loss, tape.gradient(loss, [i, t])
            return tf.function(f, input_signature=specs,
                               jit_compile=True)(img, txt, mask)

        v0, g0 = grads()
        v1, g1 = grads(num_chunks=2)
        np.testing.assert_allclose(to_numpy(v0), expected, **TOL)
        np.testing.assert_allclose(to_numpy(v1), to_numpy(v0), rtol=1e-6)
        for a, b in zip(g1, g0):
            np.testing.assert_allclose(to_numpy(a), to_numpy(b), rtol=1e-5,
                                       atol=1e-6)
        v2, _ = grads(num_chunks=3, keep_ratio=0.5)
        np.testing.assert_allclose(
            to_numpy(v2), tref.filip_loss_dropped(img, txt, mask, s, 0.5),
            **TOL)
    else:
        pytest.skip("torch runs eagerly; covered by the other tests")


@pytest.mark.skipif(BACKEND != "jax", reason="XLA memory analysis (JAX)")
def test_chunked_memory_grows_with_chunk_not_batch_squared():
    """Compiled temp memory of value+grad: the unchunked loss holds the
    (B, B, P, T) interaction; the chunked one with remat about B*C*P*T."""
    import jax

    bsz, p, t, num_chunks = 64, 16, 16, 8  # blocks of 8 texts
    rng = np.random.default_rng(18)
    img = rng.normal(size=(bsz, p, 8)).astype("float32")
    txt = rng.normal(size=(bsz, t, 8)).astype("float32")
    mask = np.ones((bsz, t), bool)

    def temp_mib(**kwargs):
        fn = jax.jit(jax.value_and_grad(
            lambda i, x: filip_loss(i, x, mask, 10.0, **kwargs),
            argnums=(0, 1)))
        analysis = fn.lower(img, txt).compile().memory_analysis()
        if analysis is None:
            pytest.skip("no memory analysis on this platform")
        return analysis.temp_size_in_bytes / 2**20

    full = temp_mib()
    chunked = temp_mib(num_chunks=num_chunks)
    assert full >= bsz * bsz * p * t * 4 / 2**20  # the 4-D tensor: 4 MiB
    assert chunked < full / 3, (chunked, full)
