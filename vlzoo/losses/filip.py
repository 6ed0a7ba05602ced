"""FILIP's loss and token selection, on the late-interaction similarity of `late_interaction.py`.

Yao et al. 2022, "FILIP: Fine-grained Interactive Language-Image
Pre-training" (ICLR). The loss is CLIP's symmetric InfoNCE with
`logits_i2t = s * S_I` (rows: images) and `logits_t2i = s * S_T^T` (rows:
texts, i.e. the softmax runs over the *column* of `S_T`, not over `S_I^T`),
where `S_I` and `S_T` are FILIP's token-wise similarities (eqs. 4 and 5,
`late_interaction.filip_similarity`). `logit_scale` is the multiplier itself
(`exp` of the learned log-scale, FILIP initialises it to `1 / 0.07`).

`filip_select_tokens` is the paper's token dropping for efficiency: each
tower keeps a fraction of its tokens before the interaction.
"""

import math

from keras import ops

from vlzoo.losses._chunking import check_positive_int
from vlzoo.losses._chunking import check_rows
from vlzoo.losses._chunking import chunking
from vlzoo.losses._chunking import own_log_likelihood
from vlzoo.losses._chunking import pad_rows
from vlzoo.losses._chunking import put
from vlzoo.losses._chunking import slice_chunk
from vlzoo.losses._chunking import static_loop
from vlzoo.losses._chunking import take_rows
from vlzoo.losses._utils import check_scalar
from vlzoo.losses._utils import check_token_pair
from vlzoo.losses._utils import format_shape
from vlzoo.losses._utils import static_shape
from vlzoo.losses.late_interaction import _NEG
from vlzoo.losses.late_interaction import _check_choice
from vlzoo.losses.late_interaction import _prepare
from vlzoo.losses.late_interaction import _similarity


def filip_loss(
    image_tokens,
    text_tokens,
    text_mask,
    logit_scale,
    image_mask=None,
    *,
    num_chunks=None,
    keep_ratio=1.0,
    selection_group_size=None,
    keep_mode="static",
    image_ids=None,
    chunk_axis="text",
    similarity_dtype=None,
    remat=True,
    rows=None,
):
    """Contrastive loss of FILIP (eq. 1) over the late-interaction scores, of the whole batch or of one
    replica's rows.

    `0.5 * (CE(s * S_I, diag) + CE(s * S_T^T, diag))`, each cross-entropy
    a batch mean over rows: image `i` against all texts with `S_I[i, :]`,
    text `j` against all images with the column `S_T[:, j]`.

    Token dropping (`keep_ratio < 1`, **training only**: the paper keeps
    25% of the tokens of each image and each text during pre-training and
    drops nothing at evaluation; a model passes `keep_ratio` only when
    training). Each image keeps its `k_P = max(1, round(keep_ratio * P))`
    patches with the highest score `max_j max_{t real} <x_ip, y_jt>` over
    the texts `j` of its selection group, each text its
    `k_T = max(1, round(keep_ratio * T))` tokens with the highest
    `max_i max_{p real} <x_ip, y_jt>` (`round` is half-up, so 0.25 keeps
    12 of 49 patches, 64 of 256, 19 of 77 text positions). The scores
    carry no gradient; the kept token values do, dropped tokens get zero
    gradient. Padding: padded tokens score below every real one, so they
    are never kept over a real token; when a text has fewer than `k_T`
    real tokens the extra kept positions are padding and stay masked
    (`S_T` is then the mean over the kept real tokens). The count `k_T`
    is a fraction of the padded length `T` (static shapes); with
    `keep_mode="per_row"` each text further keeps at most
    `ceil(keep_ratio * n_j)` of its `n_j` real tokens (and each image at
    most `ceil(keep_ratio * n_i)` real patches with `image_mask`).

    Args:
        image_tokens: `(B, P, D)` projected patch embeddings.
        text_tokens: `(B, T, D)` projected token embeddings; row `i` is the
            caption of image `i`.
        text_mask: `(B, T)` bool, True = real token.
        logit_scale: scalar multiplier `s` (`exp` of the learned log-scale,
            `1 / 0.07` at FILIP's initialisation); shared by both directions.
        image_mask: optional `(B, P)` bool, True = real patch.
        keep_ratio: fraction of tokens kept per sample, in `(0, 1]`;
            1.0 (default) keeps everything and skips the selection.
        selection_group_size: None scores tokens against the whole batch;
            an int `b` scores them only against the partners of the same
            contiguous block of `b` samples, as the paper's per-worker
            selection before the all-gather.
        keep_mode: "static" (default, `k` of the padded length) or
            "per_row" (also capped at `ceil(keep_ratio * n)` real tokens).
        image_ids: optional `(B,)` integer ids for several captions per
            image (retrieval fine-tuning): samples with the same id are
            all positives, with soft targets `1 / #positives` in both
            directions. None (default): one positive per row.
        num_chunks: None (one block) or a python int `K`: the late
            interaction in at most `K` blocks of the `chunk_axis` batch
            (see `filip_similarity`; with `rows`, of the other side's batch,
            below); chunked and unchunked values and gradients agree.
        chunk_axis, similarity_dtype, remat: see `filip_similarity`.
        rows: None for the loss of the whole batch; `(start, count)` for the
            share of pairs `start .. start + count - 1` (one replica's; every
            argument still the whole batch's): `CE_i2t` averaged over those
            `count` images against every text, `CE_t2i` over those `count`
            texts against every image. The late interaction is chunked over
            the other side's batch (texts for `CE_i2t`, images for
            `CE_t2i`, whatever `chunk_axis`): blocks of `count * C * P * T`,
            `C = ceil(B / num_chunks)`, never the `(B, B)` similarities.
            Token dropping scores the tokens against the whole batch first,
            so the shares keep the tokens the whole loss keeps, and the
            shares of a partition of the batch into equal row ranges average
            to the whole loss. `image_ids` must be None.

    Returns:
        float32 scalar.

    Raises:
        ValueError: on shapes that do not match (the message names the
            argument), a bad chunking (see `filip_similarity`) or
            token-dropping setting, `rows` not a pair with a count >= 1, or
            `rows` with `image_ids`.

    Example:

    >>> img = np.random.randn(8, 49, 256); txt = np.random.randn(8, 77, 256)
    >>> mask = np.arange(77)[None] < np.random.randint(2, 78, (8, 1))
    >>> loss = filip_loss(img, txt, mask, 1 / 0.07, num_chunks=2,
    ...                   keep_ratio=0.25)
    >>> share = filip_loss(img, txt, mask, 1 / 0.07, num_chunks=4, rows=(4, 4))
    """
    check_positive_int(num_chunks, "num_chunks")
    if rows is not None:
        if image_ids is not None:
            raise ValueError("`image_ids` (several captions per image) cannot be combined with `rows`.")
        start, count = check_rows(rows)
        return _filip_share(image_tokens, text_tokens, text_mask, logit_scale, start, count, image_mask, num_chunks,
                            keep_ratio, selection_group_size, keep_mode, similarity_dtype, remat)
    img, img_valid, txt, txt_valid, mask_img = _kept_tokens(
        image_tokens, text_tokens, text_mask, image_mask, num_chunks, chunk_axis,
        keep_ratio, selection_group_size, keep_mode, similarity_dtype)
    logit_scale = check_scalar(logit_scale, "logit_scale")
    sim_dtype = similarity_dtype or "float32"
    s_i, s_t = _similarity(img, img_valid, txt, txt_valid, num_chunks,
                           chunk_axis, sim_dtype, mask_img, remat)
    logits_i2t = logit_scale * s_i
    logits_t2i = logit_scale * ops.transpose(s_t)
    if image_ids is None:
        i2t = ops.diagonal(ops.log_softmax(logits_i2t, axis=1))
        t2i = ops.diagonal(ops.log_softmax(logits_t2i, axis=1))
        return -0.5 * (ops.mean(i2t) + ops.mean(t2i))
    targets = _soft_targets(image_ids, static_shape(s_i)[0])
    i2t = ops.sum(targets * ops.log_softmax(logits_i2t, axis=1), axis=1)
    t2i = ops.sum(targets * ops.log_softmax(logits_t2i, axis=1), axis=1)
    return -0.5 * (ops.mean(i2t) + ops.mean(t2i))


def _filip_share(image_tokens, text_tokens, text_mask, logit_scale, start, count, image_mask, num_chunks, keep_ratio,
                 selection_group_size, keep_mode, similarity_dtype, remat):
    """`filip_loss(..., rows=(start, count))`."""
    img, img_valid, txt, txt_valid, mask_img = _kept_tokens(
        image_tokens, text_tokens, text_mask, image_mask, num_chunks, "text",
        keep_ratio, selection_group_size, keep_mode, similarity_dtype)
    logit_scale = check_scalar(logit_scale, "logit_scale")
    sim_dtype = similarity_dtype or "float32"
    s_i, _ = _similarity(take_rows(img, start, count), take_rows(img_valid, start, count), txt, txt_valid,
                         num_chunks, "text", sim_dtype, mask_img, remat)
    _, s_t = _similarity(img, img_valid, take_rows(txt, start, count), take_rows(txt_valid, start, count),
                         num_chunks, "image", sim_dtype, mask_img, remat)
    i2t = own_log_likelihood(logit_scale * s_i, start)
    t2i = own_log_likelihood(logit_scale * ops.transpose(s_t), start)
    return -0.5 * (ops.mean(i2t) + ops.mean(t2i))


def _kept_tokens(image_tokens, text_tokens, text_mask, image_mask, num_chunks,
                 chunk_axis, keep_ratio, selection_group_size, keep_mode,
                 similarity_dtype):
    """The loss's normalised tokens, float masks and image-mask flag, after
    token dropping when `keep_ratio < 1`."""
    _check_keep(keep_ratio, selection_group_size, keep_mode)
    img, img_valid, txt, txt_valid, mask_img = _prepare(
        image_tokens, text_tokens, text_mask, image_mask, True, chunk_axis,
        similarity_dtype)
    if keep_ratio == 1.0:
        return img, img_valid, txt, txt_valid, mask_img
    kept = _select(img, img_valid, txt, txt_valid, keep_ratio,
                   selection_group_size, keep_mode, num_chunks,
                   similarity_dtype or "float32")
    (img, img_valid, _), (txt, txt_valid, _) = kept
    return img, img_valid, txt, txt_valid, mask_img or keep_mode == "per_row"


def _soft_targets(image_ids, batch_size):
    """`pos / rowsum(pos)` with `pos[a, b] = image_ids[a] == image_ids[b]`."""
    image_ids = ops.convert_to_tensor(image_ids)
    shape, expected = static_shape(image_ids), (batch_size,)
    if len(shape) != 1 or (None not in (shape[0], batch_size)
                           and shape[0] != batch_size):
        raise ValueError(
            f"`image_ids` must have shape (B,) = {format_shape(expected)}; received "
            f"{format_shape(shape)}."
        )
    pos = ops.cast(ops.equal(image_ids[:, None], image_ids[None, :]),
                   "float32")
    return pos / ops.sum(pos, axis=1, keepdims=True)


# ----------------------------------------------------------- token dropping


def _keep_count(n, keep_ratio):
    """`max(1, round_half_up(keep_ratio * n))`, at most `n`."""
    return min(n, max(1, int(math.floor(keep_ratio * n + 0.5))))


def _check_keep(keep_ratio, selection_group_size, keep_mode):
    if isinstance(keep_ratio, bool) or not isinstance(
            keep_ratio, (int, float)) or not 0.0 < keep_ratio <= 1.0:
        raise ValueError(
            f"`keep_ratio` must be a python number in (0, 1]; received "
            f"{keep_ratio!r}."
        )
    check_positive_int(selection_group_size, "selection_group_size")
    _check_choice(keep_mode, "keep_mode", ("static", "per_row"))


def _score_block(x, x_valid, y, y_valid, x_group, y_group, sim_dtype):
    """Selection scores from one block: `(Bx, P)` best over the `y` tokens
    of the same group, `(By, T)` best over the `x` tokens."""
    if sim_dtype != "float32":
        x, y = ops.cast(x, sim_dtype), ops.cast(y, sim_dtype)
    sim = ops.einsum("ipd,jtd->ijpt", x, y)
    same = ops.equal(x_group[:, None], y_group[None, :])[:, :, None, None]
    valid = ops.logical_and(ops.greater(x_valid, 0.5)[:, None, :, None],
                            ops.greater(y_valid, 0.5)[None, :, None, :])
    sim = ops.where(ops.logical_and(same, valid), sim,
                    ops.cast(_NEG, sim.dtype))
    return (ops.cast(ops.max(sim, axis=(1, 3)), "float32"),
            ops.cast(ops.max(sim, axis=(0, 2)), "float32"))


def _selection_scores(img, img_valid, txt, txt_valid, group_size, num_chunks,
                      sim_dtype):
    """`(B, P)` patch and `(B, T)` token scores, chunked over texts like the
    similarity (forward only: the inputs carry no gradient)."""
    img, txt = ops.stop_gradient(img), ops.stop_gradient(txt)
    ids = ops.arange(ops.shape(img)[0], dtype="int32")
    # Contiguous blocks of `group_size` samples; None: one group.
    group = ops.zeros_like(ids) if group_size is None else ids // group_size
    plan = chunking(txt, num_chunks)
    if plan is None:
        return _score_block(img, img_valid, txt, txt_valid, group, group,
                            sim_dtype)
    count, size, n = plan
    txt, txt_valid, txt_group = (pad_rows(v, plan.pad)
                                 for v in (txt, txt_valid, group))
    t = txt.shape[1]

    def body(k, carry):
        best_img, best_txt = carry
        _, tc, vc, gc = slice_chunk(k, size, txt, txt_valid, txt_group)
        a, b = _score_block(img, img_valid, tc, vc, group, gc, sim_dtype)
        return ops.maximum(best_img, a), put(best_txt, k, b)

    init = (ops.full(ops.shape(img_valid), _NEG, "float32"),
            ops.zeros((count, size, t), "float32"))
    best_img, best_txt = static_loop(count, body, init)
    return best_img, ops.reshape(best_txt, (count * size, t))[:n]


def _keep_top(tokens, valid, score, keep_ratio, keep_mode):
    """Gathers the `k` best-scoring tokens of each row; returns the kept
    tokens `(B, k, D)`, their float validity `(B, k)` and indices `(B, k)`."""
    n = tokens.shape[1]
    if n is None:
        raise ValueError("Token dropping needs a static number of tokens.")
    k = _keep_count(n, keep_ratio)
    # Padding scores below every real token (whose scores are >= _NEG),
    # decreasing with the position: kept padding is the first padded
    # positions on every backend (no ties).
    position = ops.cast(ops.arange(n), "float32")
    score = ops.where(ops.greater(valid, 0.5), score,
                      2.0 * _NEG - position[None, :])
    _, idx = ops.top_k(score, k)
    kept = ops.take_along_axis(tokens, ops.expand_dims(idx, -1), axis=1)
    kept_valid = ops.take_along_axis(valid, idx, axis=1)
    if keep_mode == "per_row":
        cap = ops.ceil(keep_ratio * ops.sum(valid, axis=1) - 1e-6)
        rank = ops.cast(ops.arange(k), "float32")
        kept_valid = kept_valid * ops.cast(
            ops.less(rank[None, :], cap[:, None]), "float32")
    return kept, kept_valid, idx


def _select(img, img_valid, txt, txt_valid, keep_ratio, group_size,
            keep_mode, num_chunks, sim_dtype):
    best_img, best_txt = _selection_scores(img, img_valid, txt, txt_valid,
                                           group_size, num_chunks, sim_dtype)
    return (_keep_top(img, img_valid, best_img, keep_ratio, keep_mode),
            _keep_top(txt, txt_valid, best_txt, keep_ratio, keep_mode))


def filip_select_tokens(
    image_tokens,
    text_tokens,
    text_mask,
    keep_ratio,
    image_mask=None,
    *,
    selection_group_size=None,
    keep_mode="static",
    num_chunks=None,
):
    """FILIP's token dropping on its own (what `filip_loss` does with
    `keep_ratio < 1`; training only).

    Useful to drop tokens before an all-gather, as in the paper. See
    `filip_loss` for the selection rule and how padding is handled.

    Args:
        image_tokens: `(B, P, D)` projected patch embeddings.
        text_tokens: `(B, T, D)` projected token embeddings.
        text_mask: `(B, T)` bool, True = real token.
        keep_ratio: fraction kept, in `(0, 1]`.
        image_mask: optional `(B, P)` bool.
        selection_group_size, keep_mode, num_chunks: see `filip_loss` (the
            scores are computed in at most `num_chunks` blocks of texts).

    Returns:
        dict with `image_tokens` `(B, k_P, D)` and `text_tokens`
        `(B, k_T, D)` (the kept input tokens, float32, unnormalised,
        ordered by decreasing score), `image_mask` `(B, k_P)` and
        `text_mask` `(B, k_T)` (bool, False for kept padding) and
        `image_indices` / `text_indices` (int32 positions in the input).
    """
    check_positive_int(num_chunks, "num_chunks")
    _check_keep(keep_ratio, selection_group_size, keep_mode)
    image_tokens, text_tokens = check_token_pair(
        image_tokens, text_tokens, "image_tokens", "text_tokens")
    img, img_valid, txt, txt_valid, _ = _prepare(
        image_tokens, text_tokens, text_mask, image_mask, True, "text", None)
    (_, iv, ii), (_, tv, ti) = _select(
        img, img_valid, txt, txt_valid, keep_ratio, selection_group_size,
        keep_mode, num_chunks, "float32")
    ii, ti = ops.cast(ii, "int32"), ops.cast(ti, "int32")
    return {
        "image_tokens": ops.take_along_axis(
            image_tokens, ops.expand_dims(ii, -1), axis=1),
        "image_mask": ops.greater(iv, 0.5),
        "image_indices": ii,
        "text_tokens": ops.take_along_axis(
            text_tokens, ops.expand_dims(ti, -1), axis=1),
        "text_mask": ops.greater(tv, 0.5),
        "text_indices": ti,
    }
