"""Fine-grained (token-to-patch) loss of SPARC.

Bica et al. 2024, "Improving fine-grained understanding in image-text
pre-training" (ICML). For each image-text pair `b`, with
raw (projected, *unnormalised*) patch embeddings `V_b` `(P, D)` and token
embeddings `T_b` `(T, D)`:

1. `s_lp = t_l . v_p` (raw dot products);
2. min-max normalisation over the patches of each token (eq. 2), then
   sparsification at `sigma = 1/P` (eq. 3: `s < sigma -> 0`, a value equal
   to `sigma` is kept), then `a_lp = s_lp / sum_k s_lk` (eq. 4, not a
   softmax);
3. language-grouped vision embeddings `c_l = sum_p a_lp v_p` (eq. 5);
4. within the pair only (no other sample is a negative), a token-level
   InfoNCE between `l2n(c)` and `l2n(t)` in both directions (eq. 6), padded
   tokens removed as keys and as queries.

The global loss is CLIP's (`clip_loss`); `sparc_loss` adds the two with the
paper's weights. Conventions as in `contrastive.py`: float32 computation
whatever the input dtype, `logit_scale` is the multiplier (`exp` of the
learned log-scale), masks are bool with True = real token, masking with
finite values and `where`, so padded tokens get exactly zero gradient and
their content never changes the loss.
"""

from keras import ops

from vlzoo.losses._chunking import check_rows
from vlzoo.losses._chunking import take_rows
from vlzoo.losses._utils import format_shape
from vlzoo.losses._utils import check_mask
from vlzoo.losses._utils import check_scalar
from vlzoo.losses._utils import check_token_pair
from vlzoo.losses._utils import static_shape
from vlzoo.losses._utils import to_float32
from vlzoo.losses.contrastive import clip_loss
from vlzoo.losses.contrastive import l2_normalize

# Finite masking value for float32 logits (|logits| <= logit_scale).
_NEG = -1e9


def _check_options(threshold, alignment, epsilon):
    if alignment not in ("threshold", "softmax"):
        raise ValueError(
            "`alignment` must be one of ('threshold', 'softmax'); received "
            f"{alignment!r}."
        )
    if threshold is not None and (
            isinstance(threshold, bool)
            or not isinstance(threshold, (int, float))
            or not 0.0 <= threshold <= 1.0):
        raise ValueError(
            f"`threshold` must be None (1/P) or a python number in [0, 1]; "
            f"received {threshold!r}."
        )
    if isinstance(epsilon, bool) or not isinstance(
            epsilon, (int, float)) or epsilon < 0:
        raise ValueError(
            f"`epsilon` must be a python number >= 0; received {epsilon!r}."
        )


def _alignment(patch_embeds, token_embeds, threshold, alignment, epsilon):
    """`(B, T, P)` weights from validated float32 inputs."""
    sim = ops.einsum("btd,bpd->btp", token_embeds, patch_embeds)
    if alignment == "softmax":
        # Ablation of the paper's Table 6 (softmax over the raw similarities).
        return ops.softmax(sim, axis=-1)
    # Divided by the largest possible |s_lp| = |t_l| * max_p |v_p| (a constant
    # of the gradient), the similarities lie in [-1, 1] at any input scale:
    # for tiny inputs the min-max scaling's backward pass would otherwise
    # square a span below float32's normal range (flushed to 0 by XLA on CPU).
    bound = ops.stop_gradient(
        ops.norm(token_embeds, axis=-1, keepdims=True)
        * ops.max(ops.norm(patch_embeds, axis=-1), axis=-1)[:, None, None])
    sim = sim / ops.where(ops.greater(bound, 0.0), bound, 1.0)
    lo = ops.min(sim, axis=-1, keepdims=True)
    hi = ops.max(sim, axis=-1, keepdims=True)
    span = hi - lo
    # Degenerate rows (zero token, identical patches, P = 1): the spread is
    # within rounding of that bound. They get s = 1 everywhere, i.e. uniform
    # weights 1/P. The double `where` keeps the unused branch's 0/0 out of
    # the gradient.
    ok = ops.greater(span, epsilon)
    scaled = (sim - lo) / ops.where(ok, span, 1.0)
    scaled = ops.where(ok, scaled, 1.0)
    if threshold is None:
        threshold = 1.0 / ops.cast(ops.shape(patch_embeds)[1], "float32")
    # The argmax patch has scaled = 1 >= threshold, so the sum is >= 1.
    kept = ops.where(ops.less(scaled, threshold), 0.0, scaled)
    return kept / ops.sum(kept, axis=-1, keepdims=True)


def sparc_alignment_weights(
    patch_embeds,
    token_embeds,
    threshold=None,
    *,
    alignment="threshold",
    epsilon=1e-5,
):
    """SPARC's sparse token-to-patch alignment weights (eqs. 2-4).

    `a_lp = s~_lp / sum_k s~_lk` with `s~ = s^ * (s^ >= threshold)` and
    `s^_lp = (s_lp - min_k s_lk) / (max_k s_lk - min_k s_lk)`, computed on
    the raw dot products `s_lp = t_l . v_p` of each pair. Every row is >= 0
    and sums to 1; the argmax patch always keeps a positive weight, the
    argmin patch always gets 0. Rows whose similarities are all equal (a
    zero token vector, identical patches, `P = 1`) get uniform weights
    `1/P`, with finite gradients.

    Args:
        patch_embeds: `(B, P, D)` projected patch embeddings (unnormalised).
        token_embeds: `(B, T, D)` projected token embeddings (unnormalised);
            row `b` is the caption of image `b`.
        threshold: sparsity threshold `sigma` in `[0, 1]`; None (default)
            uses `1/P` for the actual `P` (recomputed when `P` changes).
        alignment: "threshold" (the paper) or "softmax" (`softmax_p(s_lp)`
            over the raw similarities: the ablation of Table 6; `threshold`
            is then unused).
        epsilon: a row counts as degenerate when
            `max_p s_lp - min_p s_lp <= epsilon * |t_l| * max_p |v_p|`.

    Returns:
        `(B, T, P)` float32 weights (rows of padded tokens are computed too;
        the losses ignore them).

    Example:

    >>> v = np.random.randn(2, 49, 512); t = np.random.randn(2, 55, 512)
    >>> sparc_alignment_weights(v, t).shape
    (2, 55, 49)
    """
    _check_options(threshold, alignment, epsilon)
    patch_embeds, token_embeds = check_token_pair(
        patch_embeds, token_embeds, "patch_embeds", "token_embeds")
    return _alignment(patch_embeds, token_embeds, threshold, alignment,
                      epsilon)


def _masked_token_ce(logits, mask):
    """`(B, T)` cross-entropy of each query row `j` against key `j`, keys
    outside `mask` removed (finite `_NEG`, by `where`).

    The diagonal is read with `where` and a sum, not `ops.diagonal`: under
    TensorFlow's MultiWorkerMirroredStrategy the gradient of a diagonal
    whose batch size is traced fails TensorFlow's own shape check
    (`MatrixDiagV3`)."""
    logits = ops.where(mask[:, None, :], logits, _NEG)
    own = ops.eye(ops.shape(logits)[-1], dtype="bool")
    return -ops.sum(ops.where(own, ops.log_softmax(logits, axis=-1), 0.0), axis=-1)


def sparc_fine_grained_loss(
    patch_embeds,
    token_embeds,
    token_mask,
    logit_scale,
    threshold=None,
    reduction="tokens",
    *,
    alignment="threshold",
    epsilon=1e-5,
):
    """SPARC's fine-grained loss `L_f` (eq. 6), within each pair.

    With `c = l2n(A V)` (A from `sparc_alignment_weights`), `t = l2n(T)` and
    `Z_b[j, k] = s * c_bj . t_bk`: `L_vl` is the cross-entropy of each row
    `j` of `Z_b` (softmax over the real tokens `k` of the same caption,
    target `k = j`), `L_lv` the same for `Z_b^T`; `L_f = (L_vl + L_lv) / 2`.
    Only real tokens are queries or keys; other samples of the batch play no
    part. A caption with one real token contributes exactly 0; a caption
    with none contributes 0 (finite values and gradients).

    Args:
        patch_embeds: `(B, P, D)` projected patch embeddings (unnormalised).
        token_embeds: `(B, T, D)` projected token embeddings (unnormalised).
        token_mask: `(B, T)` bool, True = real token.
        logit_scale: scalar multiplier `s` (`exp` of the learned log-scale,
            shared with the global loss in the paper).
        threshold: see `sparc_alignment_weights` (None: `1/P`).
        reduction: "tokens" (default; the paper's Listing 1: the sum over
            all real tokens of the batch divided by their number, each token
            weighs the same) or "samples" (the paper's eq. 6: mean over the
            real tokens of each caption, then mean over the `B` captions,
            each caption weighs the same). They agree when all captions
            have the same length.
        alignment, epsilon: see `sparc_alignment_weights`.

    Returns:
        float32 scalar.

    Example:

    >>> v = np.random.randn(8, 49, 512); t = np.random.randn(8, 55, 512)
    >>> mask = np.arange(55)[None] < np.random.randint(2, 56, (8, 1))
    >>> loss = sparc_fine_grained_loss(v, t, mask, logit_scale=1 / 0.07)
    """
    patch_embeds, token_embeds, mask, logit_scale = _fine_grained_inputs(
        patch_embeds, token_embeds, token_mask, logit_scale, threshold,
        reduction, alignment, epsilon)
    ce, count = _fine_grained_terms(patch_embeds, token_embeds, mask,
                                    logit_scale, threshold, alignment, epsilon)
    if reduction == "tokens":
        return ops.sum(ce) / ops.maximum(ops.sum(count), 1.0)
    return ops.mean(ops.sum(ce, axis=1) / ops.maximum(count, 1.0))


def _fine_grained_inputs(patch_embeds, token_embeds, token_mask, logit_scale,
                         threshold, reduction, alignment, epsilon):
    """Validates the fine-grained loss's arguments; returns the checked
    embeddings, the bool mask and the scale."""
    _check_options(threshold, alignment, epsilon)
    if reduction not in ("tokens", "samples"):
        raise ValueError(
            "`reduction` must be one of ('tokens', 'samples'); received "
            f"{reduction!r}."
        )
    patch_embeds, token_embeds = check_token_pair(
        patch_embeds, token_embeds, "patch_embeds", "token_embeds")
    mask = check_mask(token_mask, "token_mask", token_embeds, "token_embeds")
    return patch_embeds, token_embeds, mask, check_scalar(logit_scale, "logit_scale")


def _fine_grained_terms(patch_embeds, token_embeds, mask, logit_scale,
                        threshold, alignment, epsilon):
    """`(ce, count)`: `(B, T)` token cross-entropies (0 at padding) and
    `(B,)` float numbers of real tokens."""
    weights = _alignment(patch_embeds, token_embeds, threshold, alignment,
                         epsilon)
    grouped = l2_normalize(ops.einsum("btp,bpd->btd", weights, patch_embeds))
    tokens = l2_normalize(token_embeds)
    logits = logit_scale * ops.einsum("bjd,bkd->bjk", grouped, tokens)
    ce = (_masked_token_ce(logits, mask)  # rows c_j, keys t_k
          + _masked_token_ce(ops.transpose(logits, (0, 2, 1)), mask))
    # Padded queries are left out with `where`, never by multiplying.
    ce = ops.where(mask, 0.5 * ce, 0.0)
    return ce, _token_counts(mask)


def _token_counts(mask):
    """`(B,)` float32 numbers of real tokens."""
    return ops.cast(ops.sum(ops.cast(mask, "int32"), axis=1), "float32")


def _check_batch(image_global, x, name):
    """Raises unless `x` (`name`) has the batch size of `image_global` where both are known."""
    b_global = static_shape(to_float32(image_global))[0]
    shape = static_shape(ops.convert_to_tensor(x))
    if None not in (b_global, shape[0]) and b_global != shape[0]:
        raise ValueError(
            f"`{name}` must have the batch size B = {b_global} of "
            f"`image_global`; received shape {format_shape(shape)}."
        )


def sparc_loss(
    image_global,
    text_global,
    patch_embeds,
    token_embeds,
    token_mask,
    logit_scale,
    lambda_global=0.5,
    lambda_fine=1.0,
    threshold=None,
    reduction="tokens",
    *,
    fine_logit_scale=None,
    alignment="threshold",
    epsilon=1e-5,
    rows=None,
):
    """Total SPARC loss (eq. 7): `lambda_global * L_g + lambda_fine * L_f`, of the whole batch or of one
    replica's rows.

    `L_g = clip_loss(image_global, text_global, logit_scale)` (eq. 1, with
    its own factor 1/2, so the default global term is
    `0.25 * (CE_i2t + CE_t2i)`), `L_f = sparc_fine_grained_loss(...)`.
    The paper learns one temperature shared by both terms.

    Args:
        image_global: `(B, D)` global image embeddings (in the paper
            `g_v(h_v(mean_p F_v))`; unnormalised).
        text_global: `(B, D)` global text embeddings (the masked mean of the
            token features, projected; unnormalised).
        patch_embeds, token_embeds, token_mask: see
            `sparc_fine_grained_loss`.
        logit_scale: shared scalar multiplier (`exp` of the learned
            log-scale).
        lambda_global: weight of `L_g`; 0.5 in the paper.
        lambda_fine: weight of `L_f`; the paper sweeps {0.5, 1, 5, 10}
            without reporting its choice; 1.0 by default.
        threshold, reduction: see `sparc_fine_grained_loss`.
        fine_logit_scale: None (default) shares `logit_scale`; a scalar
            gives the fine-grained term its own multiplier (an ablation).
        alignment, epsilon: see `sparc_alignment_weights`.
        rows: None for the loss of the whole batch; `(start, count)` for the
            share of pairs `start .. start + count - 1` (one replica's):
            `patch_embeds` and `token_embeds` then hold those `count` pairs
            only, `image_global`, `text_global` and `token_mask` the whole
            batch. The global term is `clip_loss`'s share; the fine-grained
            term, within each pair, needs the replica's own tokens only. With
            `reduction="tokens"` its sum over them is divided by the number
            of real tokens of the whole batch and multiplied by `B / count`;
            with "samples" it is their mean. The shares of a partition of the
            batch into equal row ranges average to the whole loss.

    Returns:
        float32 scalar.

    Raises:
        ValueError: on shapes that do not match (the message names the
            argument), an unknown `reduction` or `alignment`, or `rows` not a
            pair with a count >= 1.

    Example:

    >>> g = np.random.randn(8, 64); v = np.random.randn(8, 49, 64)
    >>> t = np.random.randn(8, 16, 64); mask = np.ones((8, 16), bool)
    >>> loss = sparc_loss(g, g, v, t, mask, 1 / 0.07)
    >>> share = sparc_loss(g, g, v[4:], t[4:], mask, 1 / 0.07, rows=(4, 4))
    """
    if rows is not None:
        start, count = check_rows(rows)
        return _sparc_share(image_global, text_global, patch_embeds, token_embeds, token_mask, logit_scale,
                            start, count, lambda_global, lambda_fine, threshold, reduction, fine_logit_scale,
                            alignment, epsilon)
    global_loss = clip_loss(image_global, text_global, logit_scale)
    _check_batch(image_global, patch_embeds, "patch_embeds")
    fine_loss = sparc_fine_grained_loss(
        patch_embeds, token_embeds, token_mask,
        logit_scale if fine_logit_scale is None else fine_logit_scale,
        threshold, reduction, alignment=alignment, epsilon=epsilon)
    return (check_scalar(lambda_global, "lambda_global") * global_loss
            + check_scalar(lambda_fine, "lambda_fine") * fine_loss)


def _sparc_share(image_global, text_global, patch_embeds, token_embeds, token_mask, logit_scale, start, count,
                 lambda_global, lambda_fine, threshold, reduction, fine_logit_scale, alignment, epsilon):
    """`sparc_loss(..., rows=(start, count))`."""
    global_share = clip_loss(image_global, text_global, logit_scale, rows=(start, count))
    mask = ops.convert_to_tensor(token_mask)
    _check_batch(image_global, mask, "token_mask")
    patch_embeds, token_embeds, rows_mask, fine_scale = _fine_grained_inputs(
        patch_embeds, token_embeds, take_rows(mask, start, count),
        logit_scale if fine_logit_scale is None else fine_logit_scale,
        threshold, reduction, alignment, epsilon)
    ce, tokens = _fine_grained_terms(patch_embeds, token_embeds, rows_mask, fine_scale, threshold, alignment,
                                     epsilon)
    if reduction == "tokens":
        replicas = ops.cast(ops.shape(mask)[0], "float32") / ops.cast(count, "float32")
        fine = ops.sum(ce) * replicas / ops.maximum(ops.sum(_token_counts(ops.cast(mask, "bool"))), 1.0)
    else:
        fine = ops.mean(ops.sum(ce, axis=1) / ops.maximum(tokens, 1.0))
    return (check_scalar(lambda_global, "lambda_global") * global_share
            + check_scalar(lambda_fine, "lambda_fine") * fine)
