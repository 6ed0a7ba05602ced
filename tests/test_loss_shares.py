"""One replica's share of each family's loss (`rows=(start, count)`): the shares of a partition of the batch into
equal row ranges average to the whole batch's loss, in value and in gradient, and differ from each other.

The whole-batch losses are checked against independent references in their own test files; here they are
the reference of their shares. CLIP's and SigLIP's shares are in test_contrastive_losses.py.
"""

import keras
import numpy as np
import pytest

from backend_utils import value_and_grad
from vlzoo.losses import filip_loss
from vlzoo.losses import flair_loss
from vlzoo.losses import llip_loss
from vlzoo.losses import sparc_loss
from vlzoo.losses import stair_contrastive_loss

BATCH = 8
RNG_SEED = 3


def _rows(x, start, count):
    """Rows `start .. start + count - 1` of `x`; `start` a python int or a scalar tensor (a traced one on JAX, see
    `_shares`), as a replica's `replica_index() * count` is in training."""
    return keras.ops.slice(x, (start,) + (0,) * (len(x.shape) - 1), (count,) + tuple(x.shape[1:]))


def _mask(rng, batch, length):
    """Bool `(batch, length)` with 1 .. length real tokens per row, the first row all padding but one."""
    lengths = rng.integers(1, length + 1, batch)
    lengths[0] = 1
    return np.arange(length)[None] < lengths[:, None]


def _cases():
    """`name -> (inputs, whole(*inputs), share(*inputs, start, count))`; the float inputs come first."""
    rng = np.random.default_rng(RNG_SEED)
    normal = lambda *shape: rng.normal(size=shape).astype("float32")  # noqa: E731
    text_mask, token_mask = _mask(rng, BATCH, 6), _mask(rng, BATCH, 6)
    cases = {
        "llip": ((normal(BATCH, 2, 4), normal(BATCH, 3, 2, 4), normal(BATCH, 3, 2, 8), normal(BATCH, 8)),
                 lambda q, k, v, t: llip_loss(q, k, v, t, 4.0, -2.0, 0.5, num_chunks=3),
                 lambda q, k, v, t, start, count: llip_loss(
                     q, _rows(k, start, count), _rows(v, start, count), t, 4.0, -2.0, 0.5, num_chunks=3,
                     rows=(start, count))),
        "llip_unchunked": ((normal(BATCH, 2, 4), normal(BATCH, 3, 2, 4), normal(BATCH, 3, 2, 8),
                            normal(BATCH, 8)),
                           lambda q, k, v, t: llip_loss(q, k, v, t, 4.0, -2.0, 0.5),
                           lambda q, k, v, t, start, count: llip_loss(
                               q, _rows(k, start, count), _rows(v, start, count), t, 4.0, -2.0, 0.5,
                               rows=(start, count))),
        "stair": ((np.abs(normal(BATCH, 40)), np.abs(normal(BATCH, 40))),
                  lambda i, t: stair_contrastive_loss(i, t, 6.0),
                  lambda i, t, start, count: stair_contrastive_loss(i, t, 6.0, rows=(start, count))),
        "flair": ((normal(BATCH, BATCH + 1), normal(BATCH, 2 * BATCH)),
                  lambda c, g: flair_loss(c, 2, g),
                  lambda c, g, start, count: flair_loss(_rows(c, start, count), 2, _rows(g, start, count),
                                                        rows=(start, count))),
    }
    for keep_ratio, num_chunks in ((1.0, None), (0.5, 3)):
        tokens = (normal(BATCH, 5, 16), normal(BATCH, 6, 16))
        options = dict(keep_ratio=keep_ratio, num_chunks=num_chunks)
        cases[f"filip_keep{keep_ratio}_chunks{num_chunks}"] = (
            tokens,
            lambda i, t, options=options: filip_loss(i, t, text_mask, 5.0, **options),
            lambda i, t, start, count, options=options: filip_loss(i, t, text_mask, 5.0, **options,
                                                                   rows=(start, count)))
    for reduction in ("tokens", "samples"):
        inputs = (normal(BATCH, 16), normal(BATCH, 16), normal(BATCH, 5, 16), normal(BATCH, 6, 16))
        cases[f"sparc_{reduction}"] = (
            inputs,
            lambda a, b, v, t, reduction=reduction: sparc_loss(a, b, v, t, token_mask, 5.0, reduction=reduction),
            lambda a, b, v, t, start, count, reduction=reduction: sparc_loss(
                a, b, _rows(v, start, count), _rows(t, start, count), token_mask, 5.0, reduction=reduction,
                rows=(start, count)))
    return cases


CASES = _cases()


def _shares(share, inputs, count):
    """`[(value, grads)]` of `share(*inputs, start, count)` for the replicas `start = 0, count, 2 * count, ...` of a
    partition of the batch into row ranges of `count`.

    On JAX one compiled program per `count`, with `start` a traced argument (as a replica's start is in training),
    called once per replica: compiling is this test's time there, and one program per partition holding all its
    shares (three times the shares to compile), with the check of their differences run op by op, took 56 CPU
    seconds for the eight cases on the AVX2 EPYC, this about 27. TensorFlow's and PyTorch's are eager. The mean of the
    shares' gradients is the gradient of their mean (the derivative is linear)."""
    starts = range(0, BATCH, count)
    if keras.backend.backend() == "jax":
        import jax

        grad = jax.jit(jax.value_and_grad(lambda start, *x: share(*x, start, count),
                                          argnums=tuple(range(1, len(inputs) + 1))))
        results = [grad(np.int32(start), *inputs) for start in starts]
        return [(np.asarray(value), [np.asarray(g) for g in grads]) for value, grads in results]
    return [value_and_grad(lambda *x: share(*x, start, count), *inputs) for start in starts]


@pytest.mark.parametrize("name", sorted(CASES))
def test_replica_shares_average_to_the_whole_loss_in_value_and_gradient(name):
    inputs, whole, share = CASES[name]
    expected_value, expected_grads = value_and_grad(whole, *inputs, jit=True)
    for replicas in (2, 4):
        shares = _shares(share, inputs, BATCH // replicas)
        value = sum(value for value, _ in shares) / np.float32(replicas)
        grads = [sum(grad) / np.float32(replicas) for grad in zip(*(grads for _, grads in shares))]
        np.testing.assert_allclose(value, expected_value, rtol=2e-6)
        for grad, expected in zip(grads, expected_grads, strict=True):
            np.testing.assert_allclose(grad, expected, atol=2e-6 * np.abs(expected).max())
    values = [float(value) for value, _ in shares]  # the last partition's: 4 replicas of 2 rows
    assert max(values) - min(values) > 1e-2 * abs(float(expected_value))  # each replica its own rows


def test_shares_check_their_row_count():
    img = np.ones((4, 3, 8), "float32")
    with pytest.raises(ValueError, match="`count` must be a python int >= 1"):
        filip_loss(img, img, np.ones((4, 3), bool), 5.0, rows=(0, 0))
    with pytest.raises(ValueError, match=r"`token_mask` must have the batch size B = 4 of `image_global`"):
        sparc_loss(np.ones((4, 8)), np.ones((4, 8)), img[:2], img[:2], np.ones((2, 3), bool), 5.0, rows=(0, 2))
    with pytest.raises(ValueError, match=r"`values` must have shape \(N_I, K, M, D\) = \(2, 3, 2, None\)"):
        llip_loss(np.ones((4, 2, 4)), np.ones((2, 3, 2, 4)), np.ones((4, 3, 2, 8)), np.ones((4, 8)),
                  4.0, -2.0, 0.5, rows=(0, 2))
    with pytest.raises(ValueError, match="`count` must be a python int >= 1"):
        stair_contrastive_loss(np.ones((4, 8)), np.ones((4, 8)), 5.0, rows=(0, -1))
    with pytest.raises(ValueError, match=r"`rows` must be a pair `\(start, count\)` or None"):
        stair_contrastive_loss(np.ones((4, 8)), np.ones((4, 8)), 5.0, rows=2)
    with pytest.raises(ValueError, match="`image_ids` .* cannot be combined with `rows`"):
        filip_loss(img, img, np.ones((4, 3), bool), 5.0, image_ids=np.arange(4), rows=(0, 2))
