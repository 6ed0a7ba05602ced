"""FLAIR's losses (Xiao et al., CVPR 2025): sigmoid losses over text-conditioned image embeddings.

A batch holds B images with K captions each, image `i`'s captions at rows
`i*K .. i*K + K - 1` of the text batch. As in the authors' `FlairLoss`
(ExplainableML/flair, `src/flair/loss.py`):

* Each image is conditioned on S = B + K - 1 captions, not on all B * K:
  its own K and one caption drawn at random from each other image
  (`flair_caption_indices`), in the order of their rows in the text batch,
  so that image `i`'s own captions are columns `i .. i + K - 1`.
* Text-conditioned sigmoid loss (TCS) over those `(B, S)` logits,
  `a * cos(z_ij, t_j) + b` (`flair_pair_logits`), label +1 for an image's
  own captions, -1 otherwise; summed and divided by S.
* Multi-positive sigmoid loss (MPS, the authors' `--add-mps-loss`, on in
  every released model) over the global `(B, B * K)` logits
  `a * cos(v_i, t_j) + b`, label +1 for the K captions of image `i`;
  summed and divided by B * K. The loss is then `(TCS + MPS) / 2`.

Both sums are over every pair and both divisors are the authors' (not the
number of pairs). `keras.ops` only; float32 whatever the input dtype.
"""

from keras import ops

from vlzoo.losses._chunking import check_rows
from vlzoo.losses._utils import check_float_tensor, check_scalar, format_shape, static_shape, to_float32
from vlzoo.losses.contrastive import l2_normalize


def _check_captions(num_captions):
    if isinstance(num_captions, bool) or not isinstance(num_captions, int) or num_captions < 1:
        raise ValueError(f"`num_captions` must be a python int >= 1; received {num_captions!r}.")


def flair_caption_indices(offsets, num_captions):
    """Rows of the text batch each image is conditioned on, `(B, B + K - 1)` int32.

    Row `i` lists, in increasing order, caption `j*K + offsets[i, c]` of each
    other image `j` (`c` counts the other images in order: `c = j` below `i`,
    `c = j - 1` above) and image `i`'s own K captions, which therefore fill
    columns `i .. i + K - 1`.

    Args:
        offsets: int `(B, B - 1)`, entries in `[0, K)`: which caption of each
            other image (the authors draw them uniformly at every step).
        num_captions: K, captions per image (a python int).

    Returns:
        `(B, B + K - 1)` int32 indices into the `(B * K, D)` text batch.

    Example:
    >>> flair_caption_indices(np.array([[1], [0]]), 2)
    [[0, 1, 3], [0, 2, 3]]
    """
    _check_captions(num_captions)
    offsets = ops.cast(ops.convert_to_tensor(offsets), "int32")
    shape = static_shape(offsets)
    if len(shape) != 2 or (None not in shape and shape[1] != shape[0] - 1):
        raise ValueError(f"`offsets` must have shape (B, B - 1); received {format_shape(shape)}.")
    batch, k = ops.shape(offsets)[0], num_captions
    # A spare column, so that the gather below has an index to read when B = 1 (no other image).
    offsets = ops.concatenate([offsets, ops.zeros((batch, 1), "int32")], axis=1)
    i = ops.arange(batch, dtype="int32")[:, None]
    s = ops.arange(batch + k - 1, dtype="int32")[None, :]
    own = ops.logical_and(s >= i, s < i + k)
    other = ops.clip(ops.where(s < i, s, s - k), 0, batch - 1)  # c: which other image, in order
    image = ops.where(other < i, other, other + 1)
    other_rows = image * k + ops.take_along_axis(offsets, ops.broadcast_to(other, ops.shape(own)), axis=1)
    return ops.where(own, i * k + (s - i), other_rows)


def flair_pair_logits(image_embeds, text_embeds, logit_scale, logit_bias):
    """`a * cos(z_ns, t_ns) + b` for paired embeddings, `(N, S)` float32.

    Args:
        image_embeds: `(N, S, D)` text-conditioned image embeddings `z`.
        text_embeds: `(N, S, D)` the captions that conditioned them, `t`.
        logit_scale: scalar multiplier `a`.
        logit_bias: scalar bias `b`.

    Example:
    >>> z = np.random.randn(2, 3, 8); t = np.random.randn(2, 3, 8)
    >>> flair_pair_logits(z, t, 10.0, -10.0).shape
    (2, 3)
    """
    z = check_float_tensor(image_embeds, "image_embeds", "(N, S, D)")
    t = check_float_tensor(text_embeds, "text_embeds", "(N, S, D)")
    if any(a is not None and b is not None and a != b for a, b in zip(static_shape(z), static_shape(t))):
        raise ValueError(f"`text_embeds` must have the shape of `image_embeds` {format_shape(static_shape(z))}; "
                         f"received {format_shape(static_shape(t))}.")
    scale, bias = check_scalar(logit_scale, "logit_scale"), check_scalar(logit_bias, "logit_bias")
    return scale * ops.sum(l2_normalize(z) * l2_normalize(t), axis=-1) + bias


def _check_logits(logits, name, columns, layout):
    """`logits` as float32 after checking it is `(rows, columns(rows))`, or any `(rows, n)` when `columns` is
    None."""
    logits = to_float32(logits)
    shape = static_shape(logits)
    if len(shape) != 2 or (columns is not None and None not in shape and shape[1] != columns(shape[0])):
        raise ValueError(f"`{name}` must have shape {layout}; received {format_shape(shape)}.")
    return logits


def _sigmoid_sum(logits, positive):
    labels = ops.where(positive, 1.0, -1.0)
    return -ops.sum(ops.log_sigmoid(labels * logits))


def _check_global(global_logits, tcs, k, layout):
    """The checked `(rows, B * K)` global logits matching the rows of `tcs` `(rows, B + K - 1)`."""
    mps = _check_logits(global_logits, "global_logits", None, layout)
    (rows, columns), (mps_rows, mps_columns) = static_shape(tcs), static_shape(mps)
    expected = (rows, None if columns is None else (columns - k + 1) * k)
    if any(a is not None and b is not None and a != b for a, b in zip(expected, (mps_rows, mps_columns))):
        raise ValueError(f"`global_logits` must have shape {layout} = {format_shape(expected)}, matching "
                         f"`conditioned_logits` {format_shape(static_shape(tcs))}; received "
                         f"{format_shape(static_shape(mps))}.")
    return mps


def _loss_of_rows(tcs, k, start, mps):
    """TCS (and MPS) summed over the logits' rows, which are rows `start ..` of the batch, and divided by
    the authors' S (and B * K)."""
    i = ops.cast(start, "int32") + ops.arange(ops.shape(tcs)[0], dtype="int32")[:, None]
    s = ops.arange(ops.shape(tcs)[1], dtype="int32")[None, :]
    loss = _sigmoid_sum(tcs, ops.logical_and(s >= i, s < i + k)) / ops.cast(ops.shape(tcs)[1], "float32")
    if mps is None:
        return loss
    s = ops.arange(ops.shape(mps)[1], dtype="int32")[None, :]
    mps_loss = _sigmoid_sum(mps, (s // k) == i) / ops.cast(ops.shape(mps)[1], "float32")
    return (loss + mps_loss) / 2


def flair_loss(conditioned_logits, num_captions, global_logits=None, *, rows=None):
    """FLAIR's loss from its logits: TCS, or `(TCS + MPS) / 2` with `global_logits`; of the whole batch or
    of one replica's rows.

    Args:
        conditioned_logits: `(B, B + K - 1)` logits of each image conditioned
            on the captions `flair_caption_indices` picks (its own at columns
            `i .. i + K - 1`), from `flair_pair_logits`. With `rows`,
            `(count, B + K - 1)`: the replica's rows only.
        num_captions: K, captions per image.
        global_logits: optional `(B, B * K)` logits of the global image
            embeddings against every caption (`siglip_logits`); image `i`'s
            captions are columns `i*K .. i*K + K - 1`. None: TCS alone. With
            `rows`, the same rows as `conditioned_logits`.
        rows: None for the loss of the whole batch; `(start, count)` for the
            share of images `start .. start + count - 1`. The authors' loss
            is a sum over the batch's rows divided by S (and B * K), not a
            mean over rows, so a share is its rows' part of that sum times
            `B / count`: the shares of a partition of the batch into equal
            row ranges average to the whole loss, and a replica pools only
            its own images' conditioned embeddings.

    Returns:
        Scalar float32.

    Raises:
        ValueError: if `num_captions` is not an int >= 1, a logits shape is
            not the one above, or `rows` is not a pair with a count >= 1.

    Example:
    >>> flair_loss(np.zeros((2, 3)), 2, np.zeros((2, 4)))  # (6 ln 2 / 3 + 8 ln 2 / 4) / 2
    1.3862944
    >>> flair_loss(np.zeros((1, 3)), 2, np.zeros((1, 4)), rows=(1, 1))  # one of B = 2 rows
    1.3862944
    """
    _check_captions(num_captions)
    k = num_captions
    if rows is None:
        tcs = _check_logits(conditioned_logits, "conditioned_logits", lambda b: b + k - 1, f"(B, B + {k} - 1)")
        mps = None if global_logits is None else _check_global(global_logits, tcs, k, f"(B, B * {k})")
        return _loss_of_rows(tcs, k, 0, mps)
    start, _ = check_rows(rows)
    tcs = _check_logits(conditioned_logits, "conditioned_logits", None, f"(R, B + {k} - 1)")
    mps = None if global_logits is None else _check_global(global_logits, tcs, k, f"(R, B * {k})")
    batch = ops.shape(tcs)[1] - k + 1
    return _loss_of_rows(tcs, k, start, mps) * (ops.cast(batch, "float32") / ops.cast(ops.shape(tcs)[0], "float32"))
