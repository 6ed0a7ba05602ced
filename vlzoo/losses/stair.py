"""Sparse vocabulary pooling, FLOPs regulariser and contrastive loss of STAIR.

Chen et al. 2023, "STAIR: Learning Sparse Text and Image Representation in
Grounded Tokens" (EMNLP). Every token position `j` of a tower
gets vocabulary logits `p(h_j)` (`(B, S, V)`, from a head tied to the text
token embedding); the sparse embedding is

    ENC = log(1 + relu(max_{j real} p(h_j)))    # (B, V), >= 0, exact zeros

(eq. 5). `log1p` and `relu` are monotone, so this equals
`max_j log1p(relu(p(h_j)))`, which is how it is computed: the values are
`>= 0`, so padded positions are masked by a multiplication with 0.

The FLOPs regulariser (eq. 6-7, Paria et al. 2020) is
`sum_k (mean_i |x_ik|)^2`: the squared per-token batch mean summed over the
vocabulary (not a mean of squares, not an L1 norm).

The contrastive loss is CLIP's symmetric InfoNCE over the cosine of the
sparse vectors, with an epsilon guard: a strongly regularised text can come
out all zero, and then scores 0 against everything (finite loss and
gradients).

Conventions as in `contrastive.py`: tensors of the active backend or numpy
in, float32 out whatever the input dtype, `logit_scale` is the multiplier
(`exp` of the learned log-scale), masks are bool with True = real position.

At scale the `(B, S, V)` logits are never materialised: `stair_head_pool`
takes the head's transformed features `(B, S, D)` and the tied embedding
table `(V, D)` and reduces one block of vocabulary columns at a time
(`keras.ops.map` over a static number of chunks, each rematerialised in the
backward pass), so memory grows with `B * S * V / num_chunks`.
"""

import keras
from keras import ops

from vlzoo.losses._chunking import check_rows
from vlzoo.losses._chunking import symmetric_rows_loss
from vlzoo.losses._utils import check_float_tensor
from vlzoo.losses._utils import check_mask
from vlzoo.losses._utils import check_pair
from vlzoo.losses._utils import check_scalar
from vlzoo.losses._utils import static_shape
from vlzoo.losses.contrastive import l2_normalize

__all__ = [
    "flops_regularizer",
    "flops_weight",
    "stair_contrastive_loss",
    "stair_head_pool",
    "stair_logits",
    "stair_loss",
    "stair_pool",
]

# Lower bound on the L2 norm of a sparse embedding before normalisation.
COSINE_EPSILON = 1e-6


def _pool(logits, valid):
    """`max_j valid_j * log1p(relu(logits_j))`: float32 `(B, S, V)`, `(B, S)` -> `(B, V)`."""
    return ops.max(ops.log1p(ops.relu(logits)) * valid[:, :, None], axis=1)


def _valid(mask, tokens, tokens_name):
    """Float 0/1 `(B, S)` validity from an optional mask over `tokens` `(B, S, ...)`."""
    if mask is None:
        return ops.ones(ops.shape(tokens)[:2], "float32")
    return ops.cast(check_mask(mask, "mask", tokens, tokens_name), "float32")


def stair_pool(token_logits, mask=None):
    """STAIR's pooling of per-position vocabulary logits into a sparse vector.

    `ENC[b, k] = log1p(relu(max_{j real} token_logits[b, j, k]))`, computed
    as the max over real positions of `log1p(relu(.))` (the same value).
    Entries are `>= 0`, and exactly 0 where no real position has a positive
    logit. A row without any real position gives an all-zero vector.

    Args:
        token_logits: `(B, S, V)` logits `p(h_j)` of every position.
        mask: optional `(B, S)` bool, True = real position (padding is left
            out of the max); None: every position is real (images).

    Returns:
        `(B, V)` float32.

    Example:

    >>> logits = np.array([[[1.0, -2.0], [3.0, -1.0], [9.0, 9.0]]])
    >>> stair_pool(logits, np.array([[True, True, False]]))  # doctest: +SKIP
    [[log(4), 0.0]]
    """
    logits = check_float_tensor(token_logits, "token_logits", "(B, S, V)")
    return _pool(logits, _valid(mask, logits, "token_logits"))


def _head_pool_block(features, valid, embeddings, bias):
    """Pooled `(B, Vc)` of one block of vocabulary columns."""
    logits = ops.matmul(features, ops.transpose(ops.cast(embeddings, features.dtype)))
    return _pool(ops.cast(logits, "float32") + bias, valid)


_REMAT_CACHE = {}


def _head_pool_fn(remat):
    """`_head_pool_block`, `keras.remat`-wrapped when `remat`; one stable
    function object per backend (JAX reuses its traces)."""
    key = (keras.backend.backend(), remat)
    if key not in _REMAT_CACHE:
        _REMAT_CACHE[key] = keras.remat(_head_pool_block) if remat else _head_pool_block
    return _REMAT_CACHE[key]


def _check_num_chunks(num_chunks):
    if num_chunks is not None and (
        not isinstance(num_chunks, int) or isinstance(num_chunks, bool) or num_chunks < 1
    ):
        raise ValueError(f"`num_chunks` must be a python int >= 1 or None; received {num_chunks!r}.")


def stair_head_pool(token_features, embeddings, bias=None, mask=None, num_chunks=None, remat=True):
    """`stair_pool` of the tied head's logits, without materialising them.

    The logits are `token_features @ embeddings^T + bias` (`(B, S, V)`).
    With `num_chunks = K > 1` the vocabulary is split into `K` blocks of
    `C = ceil(V / K)` columns (the table is zero-padded to `K * C` rows and
    the padding dropped; `C` need not divide `V`); `keras.ops.map` (a scan
    on JAX, `tf.map_fn` on TensorFlow, a python loop on PyTorch) computes
    one `(B, S, C)` block at a time and reduces it to `(B, C)` at once. With
    `remat=True` each block is recomputed in the backward pass instead of
    stored, so training memory grows with `B * S * C`, not `B * S * V`.
    Value and gradients equal the unchunked computation (each column's max
    runs over all positions inside its block).

    Args:
        token_features: `(B, S, D)` transformed features (the head's
            `LayerNorm(GELU(W h + c))`, after the image bridge).
        embeddings: `(V, D)` decoder table (the text token embedding, tied).
        bias: optional `(V,)` output bias.
        mask: optional `(B, S)` bool, True = real position.
        num_chunks: static number of vocabulary blocks; None or 1: one block.
        remat: rematerialise each block in the backward pass.

    Returns:
        `(B, V)` float32, equal to
        `stair_pool(token_features @ embeddings.T + bias, mask)`.

    Example:

    >>> feats = np.random.randn(2, 5, 8); table = np.random.randn(100, 8)
    >>> stair_head_pool(feats, table, num_chunks=3).shape
    (2, 100)
    """
    _check_num_chunks(num_chunks)
    features = ops.convert_to_tensor(token_features)
    if len(features.shape) != 3:
        raise ValueError(
            f"`token_features` must have rank 3, shape (B, S, D); received shape {static_shape(features)}."
        )
    embeddings = ops.convert_to_tensor(embeddings)
    dim = features.shape[-1]
    if len(embeddings.shape) != 2 or embeddings.shape[1] != dim:
        raise ValueError(
            f"`embeddings` must have shape (V, D) with D = {features.shape[-1]} matching `token_features` "
            f"{static_shape(features)}; received shape {static_shape(embeddings)}."
        )
    vocabulary_size = int(embeddings.shape[0])
    bias = ops.zeros((vocabulary_size,), "float32") if bias is None else ops.cast(bias, "float32")
    if static_shape(bias) != (vocabulary_size,):
        raise ValueError(f"`bias` must have shape ({vocabulary_size},); received shape {static_shape(bias)}.")
    valid = _valid(mask, features, "token_features")
    block = _head_pool_fn(remat)
    count = min(num_chunks or 1, vocabulary_size)
    if count == 1:
        return block(features, valid, embeddings, bias)
    size = -(-vocabulary_size // count)
    pad = count * size - vocabulary_size
    # Zero rows: logits 0 -> pooled 0, dropped below.
    table = ops.reshape(ops.pad(embeddings, [[0, pad], [0, 0]]), (count, size, dim))
    biases = ops.reshape(ops.pad(bias, [[0, pad]]), (count, size))
    pooled = ops.map(lambda chunk: block(features, valid, chunk[0], chunk[1]), (table, biases))  # (K, B, C)
    pooled = ops.reshape(ops.transpose(pooled, (1, 0, 2)), (-1, count * size))
    return pooled[:, :vocabulary_size]


def flops_regularizer(sparse_embeds):
    """FLOPs regulariser `sum_k (mean_i |x_ik|)^2` (Paria et al. 2020).

    The squared batch mean of each vocabulary entry, summed over the
    vocabulary: it pushes the expected number of shared active entries of
    two vectors (the cost of an inverted-index dot product) down. Quadratic
    in scale (`F(c x) = c^2 F(x)`), invariant to permuting or duplicating
    the rows.

    Args:
        sparse_embeds: `(B, V)` sparse embeddings (STAIR's `ENC`, before
            any L2 normalisation).

    Returns:
        float32 scalar.

    Example:

    >>> flops_regularizer(np.array([[1.0, 0.0], [0.0, 1.0]]))  # 0.5^2 + 0.5^2
    0.5
    """
    x = check_float_tensor(sparse_embeds, "sparse_embeds", "(B, V)")
    return ops.sum(ops.square(ops.mean(ops.abs(x), axis=0)))


def flops_weight(step, weight, warmup_steps):
    """SPLADE's quadratic ramp of the FLOPs weight: `weight * min(1, step / warmup_steps)^2`.

    Args:
        step: number of training steps done (python number or scalar tensor).
        weight: the full weight `lambda`.
        warmup_steps: ramp length `T`; 0 gives the full weight at once.

    Returns:
        float32 scalar: 0 at step 0, `lambda / 4` at `T / 2`, `lambda` from `T` on.
    """
    step = ops.cast(ops.convert_to_tensor(step), "float32")
    ramp = ops.minimum(step / float(warmup_steps), 1.0) if warmup_steps else ops.ones_like(step)
    return weight * ops.square(ramp)


def stair_logits(image_embeds, text_embeds, logit_scale, epsilon=COSINE_EPSILON):
    """Scaled cosine similarities of sparse embeddings, `(B_img, B_txt)` float32.

    `s * <x / max(|x|, eps), y / max(|y|, eps)>`: an all-zero vector scores 0
    against everything, with finite gradients.

    Args:
        image_embeds: `(B_img, V)` sparse image embeddings.
        text_embeds: `(B_txt, V)` sparse text embeddings.
        logit_scale: scalar multiplier `s`.
        epsilon: lower bound on the norms.
    """
    image_embeds, text_embeds = check_pair(image_embeds, text_embeds, paired=False)
    logit_scale = check_scalar(logit_scale, "logit_scale")
    image = l2_normalize(image_embeds, epsilon=epsilon)
    text = l2_normalize(text_embeds, epsilon=epsilon)
    return logit_scale * _blocked_dot(image, text)


# The cosine sums over the whole vocabulary (30,522 terms for BERT's). For a
# few rows against so long a reduction, XLA's and PyTorch's CPU kernels
# lose about 1e-6 of the result, and two of them disagree by ten float32
# ulps of a logit; summing blocks first and then the block sums (pairwise,
# in two levels) keeps every backend within about 2e-7 of the exact value.
_DOT_BLOCK = 256


def _blocked_dot(a, b):
    """`a @ b.T` for `(N, V)` and `(M, V)`, reduced over V in blocks of `_DOT_BLOCK`."""
    size = a.shape[-1]
    if size <= _DOT_BLOCK:
        return ops.matmul(a, ops.transpose(b))
    pad = -size % _DOT_BLOCK
    blocks = (size + pad) // _DOT_BLOCK
    a, b = (ops.reshape(ops.pad(x, ((0, 0), (0, pad))), (-1, blocks, _DOT_BLOCK)) for x in (a, b))
    return ops.sum(ops.einsum("ikc,jkc->ijk", a, b), axis=-1)


def stair_contrastive_loss(image_embeds, text_embeds, logit_scale, epsilon=COSINE_EPSILON, *, rows=None):
    """`L_con = 0.5 * (CE(logits, diag) + CE(logits^T, diag))` over `stair_logits`, of the whole batch or of
    one replica's rows.

    The symmetric CLIP form (eq. 3 writes the image->text direction only;
    the positive is in the softmax denominator).

    Args:
        image_embeds, text_embeds, logit_scale, epsilon: as for `stair_loss`
            (the whole batch's, with `rows` too).
        rows: None for the loss of the whole batch; `(start, count)` for the
            share of pairs `start .. start + count - 1`: each cross-entropy
            averaged over those `count` images (against every text) and
            `count` texts (against every image), from `(count, B)` logits.
            The shares of a partition of the batch into equal row ranges
            average to the whole loss.

    Returns:
        float32 scalar.

    Raises:
        ValueError: if the embeddings' shapes do not pair, or `rows` is not a
            pair with a count >= 1.

    Example:

    >>> img = np.abs(np.random.randn(8, 64)); txt = np.abs(np.random.randn(8, 64))
    >>> loss = stair_contrastive_loss(img, txt, 1 / 0.07)
    >>> share = stair_contrastive_loss(img, txt, 1 / 0.07, rows=(4, 4))
    """
    image_embeds, text_embeds = check_pair(image_embeds, text_embeds)
    if rows is not None:
        start, count = check_rows(rows)
        return symmetric_rows_loss(lambda r, c: stair_logits(r, c, logit_scale, epsilon),
                                   image_embeds, text_embeds, start, count)
    logits = stair_logits(image_embeds, text_embeds, logit_scale, epsilon)
    i2t = ops.diagonal(ops.log_softmax(logits, axis=1))
    t2i = ops.diagonal(ops.log_softmax(logits, axis=0))
    return -0.5 * (ops.mean(i2t) + ops.mean(t2i))


def stair_loss(image_embeds, text_embeds, logit_scale, image_flops_weight=0.0, text_flops_weight=0.0,
               epsilon=COSINE_EPSILON):
    """STAIR's training loss: `L_con + l_1 F(ENC_I) + l_2 F(ENC_T)`.

    `L_con` is `stair_contrastive_loss` and `F` is `flops_regularizer` on
    the unnormalised embeddings.

    Args:
        image_embeds: `(B, V)` sparse image embeddings.
        text_embeds: `(B, V)` sparse text embeddings; row `i` is the caption
            of image `i` (in stage 1, already masked to the caption's ids).
        logit_scale: scalar multiplier `s`.
        image_flops_weight, text_flops_weight: `l_1`, `l_2` (python numbers
            or scalar tensors, e.g. from `flops_weight`).
        epsilon: lower bound on the norms in the cosine.

    Returns:
        float32 scalar.

    Example:

    >>> img = np.abs(np.random.randn(8, 64)); txt = np.abs(np.random.randn(8, 64))
    >>> loss = stair_loss(img, txt, 1 / 0.07, 1e-3, 1e-3)
    """
    contrastive = stair_contrastive_loss(image_embeds, text_embeds, logit_scale, epsilon)
    image_term = check_scalar(image_flops_weight, "image_flops_weight") * flops_regularizer(image_embeds)
    text_term = check_scalar(text_flops_weight, "text_flops_weight") * flops_regularizer(text_embeds)
    return contrastive + image_term + text_term
