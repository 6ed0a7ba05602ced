"""Contrastive image-text losses of CLIP and SigLIP.

All functions take the *projected, unnormalised* embeddings, L2-normalise
them internally, and compute in float32 whatever the input dtype
(float16 / bfloat16 inputs are cast first). They accept tensors of the
active Keras backend or numpy arrays; `logit_scale` / `logit_bias` may
also be python numbers. `logit_scale` is the multiplier itself, i.e.
`exp` of the learned log-scale, not the log-scale.

Conventions (row `i` of `image_embeds` and row `i` of `text_embeds` form
the positive pair):

* CLIP (Radford et al. 2021):
  `0.5 * (CE(logits, diag) + CE(logits.T, diag))`, each cross-entropy
  averaged over the batch, with `logits = s * cos(img_i, txt_j)`.
* SigLIP (Zhai et al. 2023):
  `-(1/B) * sum_ij log_sigmoid(y_ij * (s * cos_ij + b))`,
  `y_ij = +1` if `i == j` else `-1`; note the sum over all `B^2` pairs is
  divided by `B`, not `B^2`, as in big_vision.
"""

import keras
from keras import ops

from vlzoo.losses._chunking import block_labels
from vlzoo.losses._chunking import cached_remat
from vlzoo.losses._chunking import check_positive_int
from vlzoo.losses._chunking import check_rows
from vlzoo.losses._chunking import chunking
from vlzoo.losses._chunking import pad_rows
from vlzoo.losses._chunking import siglip_labels
from vlzoo.losses._chunking import slice_chunk
from vlzoo.losses._chunking import static_loop
from vlzoo.losses._chunking import symmetric_rows_loss
from vlzoo.losses._utils import check_pair
from vlzoo.losses._utils import check_scalar


def l2_normalize(x, axis=-1, epsilon=1e-12):
    """L2-normalises `x` along `axis`, with a guard for zero vectors.

    Computes `x * rsqrt(max(sum(x**2, axis), epsilon**2))` in float32, so a
    zero vector maps to a zero vector with a finite value and a finite
    gradient (`1 / epsilon` times the upstream one; the convention of
    `torch.nn.functional.normalize`).
    The result is float32 whatever the dtype of `x`: under a bfloat16
    policy the towers' outputs are normalised and scored in float32, since
    rounding unit vectors back to bfloat16 would put a relative error of
    2**-9 on every cosine.

    Args:
        x: tensor of any shape, e.g. `(B, D)` embeddings.
        axis: axis to normalise over (default: last).
        epsilon: lower bound on the norm.

    Returns:
        float32 tensor of the same shape as `x`.

    Example:

    >>> l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]]))  # doctest: +SKIP
    [[0.6, 0.8], [0.0, 0.0]]
    """
    x = ops.convert_to_tensor(x)
    dtype = keras.backend.standardize_dtype(x.dtype)
    x32 = ops.cast(x, "float32") if dtype != "float32" else x
    sq = ops.sum(ops.square(x32), axis=axis, keepdims=True)
    return x32 * ops.rsqrt(ops.maximum(sq, float(epsilon) ** 2))


def _cosine(image_embeds, text_embeds):
    """`(B_img, B_txt)` float32 cosine similarities (inputs already float32)."""
    return ops.matmul(
        l2_normalize(image_embeds), ops.transpose(l2_normalize(text_embeds))
    )


def clip_logits(image_embeds, text_embeds, logit_scale):
    """Scaled cosine-similarity logits of CLIP.

    Args:
        image_embeds: `(B_img, D)` image embeddings (unnormalised).
        text_embeds: `(B_txt, D)` text embeddings (unnormalised).
        logit_scale: scalar multiplier `s` (`exp` of the learned log-scale).

    Returns:
        `(B_img, B_txt)` float32 tensor `s * cos(image_i, text_j)`.

    Example:

    >>> img = np.random.randn(4, 8); txt = np.random.randn(3, 8)
    >>> clip_logits(img, txt, 100.0).shape
    (4, 3)
    """
    image_embeds, text_embeds = check_pair(
        image_embeds, text_embeds, paired=False
    )
    logit_scale = check_scalar(logit_scale, "logit_scale")
    return logit_scale * _cosine(image_embeds, text_embeds)


def siglip_logits(image_embeds, text_embeds, logit_scale, logit_bias):
    """Scaled and shifted cosine-similarity logits of SigLIP.

    Args:
        image_embeds: `(B_img, D)` image embeddings (unnormalised).
        text_embeds: `(B_txt, D)` text embeddings (unnormalised).
        logit_scale: scalar multiplier `s` (`exp` of the learned log-scale).
        logit_bias: scalar bias `b`.

    Returns:
        `(B_img, B_txt)` float32 tensor `s * cos(image_i, text_j) + b`.

    Example:

    >>> img = np.random.randn(4, 8); txt = np.random.randn(4, 8)
    >>> siglip_logits(img, txt, 10.0, -10.0).shape
    (4, 4)
    """
    image_embeds, text_embeds = check_pair(
        image_embeds, text_embeds, paired=False
    )
    logit_scale = check_scalar(logit_scale, "logit_scale")
    logit_bias = check_scalar(logit_bias, "logit_bias")
    return logit_scale * _cosine(image_embeds, text_embeds) + logit_bias


def _batch_size(x):
    """Batch size: python int when static, scalar tensor otherwise."""
    return ops.shape(x)[0]


def clip_loss(image_embeds, text_embeds, logit_scale, rows=None):
    """Symmetric InfoNCE loss of CLIP, of the whole batch or of one replica's rows.

    `0.5 * (CE_i2t + CE_t2i)` where `CE_i2t` is the mean cross-entropy of
    each image's row of logits with its own text (the diagonal) as target,
    and `CE_t2i` the same over columns.

    Args:
        image_embeds: `(B, D)` image embeddings (unnormalised).
        text_embeds: `(B, D)` text embeddings (unnormalised); row `i` is
            the caption of image `i`.
        logit_scale: scalar multiplier `s` (`exp` of the learned
            log-scale, e.g. 100.0 for a trained CLIP).
        rows: None for the loss of the whole batch; `(start, count)` for the
            share of pairs `start .. start + count - 1` (one replica's in a
            step over several): `CE_i2t` averaged over those `count` images
            against every text, `CE_t2i` over those `count` texts against
            every image, from `(count, B)` logits (open_clip's
            `local_loss`). The shares of a partition of the batch into equal
            row ranges average to the whole loss. `start` and `count` are
            python ints or int scalar tensors.

    Returns:
        float32 scalar.

    Raises:
        ValueError: if the embeddings' shapes do not pair, `logit_scale` is
            not a scalar, or `rows` is not a pair with a count >= 1.

    Example:

    >>> img = np.random.randn(8, 512); txt = np.random.randn(8, 512)
    >>> loss = clip_loss(img, txt, logit_scale=100.0)  # float32 scalar
    >>> share = clip_loss(img, txt, 100.0, rows=(4, 4))  # pairs 4..7
    """
    image_embeds, text_embeds = check_pair(image_embeds, text_embeds)
    if rows is not None:
        start, count = check_rows(rows)
        logit_scale = check_scalar(logit_scale, "logit_scale")
        return symmetric_rows_loss(lambda r, c: logit_scale * ops.matmul(r, ops.transpose(c)),
                                   l2_normalize(image_embeds), l2_normalize(text_embeds), start, count)
    logits = clip_logits(image_embeds, text_embeds, logit_scale)
    i2t = ops.diagonal(ops.log_softmax(logits, axis=1))
    t2i = ops.diagonal(ops.log_softmax(logits, axis=0))
    return -0.5 * (ops.mean(i2t) + ops.mean(t2i))


def siglip_loss(image_embeds, text_embeds, logit_scale, logit_bias, rows=None, num_chunks=None, remat=True):
    """Pairwise sigmoid loss of SigLIP, of the whole batch or of one replica's images, optionally chunked.

    `-(1/R) * sum_{i, j} log_sigmoid(y_ij * (s * cos_ij + b))` over the `R`
    images `i` (the batch's `B`, or a replica's) and every text `j` of the
    batch, with `y_ij = +1` for an image's own text and `-1` elsewhere.

    With `num_chunks=K`, the `(R, B)` logits are never formed: the texts
    are taken `C = ceil(B / K)` at a time in a loop with a static trip
    count (zero-padded to `K * C` rows, the padding masked out), each block
    reduced to a scalar before the next (big_vision's chunked sigmoid
    loss). With `remat=True` each block is recomputed in the backward pass
    instead of stored, so memory grows with `R * C`, not `R * B`. Value and
    gradient equal the unchunked loss's up to float rounding.

    Args:
        image_embeds: `(B, D)` image embeddings (unnormalised); with `rows`,
            `(count, D)`: only the replica's images.
        text_embeds: `(B, D)` text embeddings (unnormalised) of the whole
            batch; row `i` is the caption of image `i`.
        logit_scale: scalar multiplier `s` (`exp` of the learned
            log-scale; SigLIP initialises it to 10).
        logit_bias: scalar bias `b` (SigLIP initialises it to -10).
        rows: None for the loss of the whole batch; `(start, count)` for the
            share of images `start .. start + count - 1` against every
            text. The shares of a partition of the batch into equal row
            ranges average to the whole loss; a replica needs no other
            replica's images. `start` and `count` are python ints or int
            scalar tensors.
        num_chunks: number of text blocks `K` (python int >= 1), or None
            for one block. Works with a batch size unknown at trace time.
        remat: rematerialise each block in the backward pass (with
            `num_chunks`).

    Returns:
        float32 scalar.

    Raises:
        ValueError: if the embeddings' shapes do not pair, a scalar is not
            one, `rows` is not a pair with a count >= 1 (and equal to the
            images' rows when both are static), or `num_chunks` is not a
            python int >= 1.

    Example:

    >>> img = np.random.randn(8, 512); txt = np.random.randn(8, 512)
    >>> loss = siglip_loss(img, txt, logit_scale=10.0, logit_bias=-10.0)
    >>> same = siglip_loss(img, txt, 10.0, -10.0, num_chunks=4)
    >>> share = siglip_loss(img[4:], txt, 10.0, -10.0, rows=(4, 4))
    """
    check_positive_int(num_chunks, "num_chunks")
    image_embeds, text_embeds = check_pair(image_embeds, text_embeds, paired=rows is None)
    if rows is None and num_chunks is None:
        logits = siglip_logits(image_embeds, text_embeds, logit_scale, logit_bias)
        n = _batch_size(logits)
        idx = ops.arange(n)
        labels = siglip_labels(idx, idx)
        total = ops.sum(ops.log_sigmoid(labels * logits))
        return -total / ops.cast(n, "float32")
    start = 0
    if rows is not None:
        start, count = check_rows(rows)
        if isinstance(count, int) and image_embeds.shape[0] is not None and image_embeds.shape[0] != count:
            raise ValueError(
                f"With `rows=(start, count)`, `image_embeds` holds the replica's {count} images; received "
                f"{image_embeds.shape[0]} rows."
            )
    return _siglip_blocks_loss(image_embeds, text_embeds, logit_scale, logit_bias, num_chunks, remat, start)


def _siglip_blocks_loss(image_embeds, text_embeds, logit_scale, logit_bias, num_chunks, remat, row_start):
    """The loss of the images (the batch's rows `row_start ..`) against every text, the texts taken in at most
    `num_chunks` blocks (one block when None; remat only for several)."""
    logit_scale = check_scalar(logit_scale, "logit_scale")
    logit_bias = check_scalar(logit_bias, "logit_bias")
    plan = chunking(text_embeds, num_chunks)
    if plan is None:
        n = ops.shape(text_embeds)[0]
        plan, pad = (1, n, n), 0
    else:
        pad = plan.pad
    total = _siglip_chunked_sum(l2_normalize(image_embeds), l2_normalize(text_embeds), logit_scale, logit_bias,
                                tuple(plan), pad, remat and num_chunks is not None, row_start=row_start)
    return -total / ops.cast(ops.shape(image_embeds)[0], "float32")


def _siglip_chunked_sum(img, txt, logit_scale, logit_bias, plan, pad, remat, row_start):
    """`sum_ij log_sigmoid(y_ij * (s * img_i . txt_j + b))` over `(count, size, n)` blocks of text columns,
    the image rows being rows `row_start ..` of the batch (normalised inputs)."""
    count, size, n = plan
    txt = pad_rows(txt, pad)  # zero rows: logits = b, masked out
    chunk_fn = (
        cached_remat((__name__, "siglip_chunk_sum"), lambda: _siglip_chunk_sum)
        if remat else _siglip_chunk_sum
    )
    n_tensor = ops.convert_to_tensor(n, "int32")
    row_start = ops.convert_to_tensor(row_start, "int32")

    def body(k, carry):
        (total,) = carry
        start, txt_chunk = slice_chunk(k, size, txt)
        return (total + chunk_fn(
            img, txt_chunk, logit_scale, logit_bias, start, n_tensor, row_start
        ),)

    (total,) = static_loop(count, body, (ops.zeros((), "float32"),))
    return total


def _siglip_chunk_sum(img, txt_chunk, logit_scale, logit_bias, start, n, row_start):
    """`sum_ij mask_j * log_sigmoid(y_ij * (s * img_i . txt_j + b))` over one
    `(R, C)` block whose rows are images `row_start .. row_start + R - 1` and
    columns texts `start .. start + C - 1`; columns `>= n` are padding
    (mask 0). Inputs are already normalised."""
    logits = logit_scale * ops.matmul(img, ops.transpose(txt_chunk))
    logits = logits + logit_bias
    labels, mask = block_labels(ops.shape(img)[0], start,
                                ops.shape(txt_chunk)[0], n, row_start)
    return ops.sum(ops.log_sigmoid(labels * logits) * mask)
