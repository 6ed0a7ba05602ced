"""Text-conditioned image embeddings and sigmoid loss of Llip.

Lavoie et al. 2024, "Modeling Caption Diversity in Contrastive
Vision-Language Pretraining" (ICML). An image is
encoded into K visual mixture tokens; each caption `j` mixes them into its
own image embedding through a cross-attention with one query per head:

    Phi[i, j, m, :] = softmax_k(<Q[j, m], K[i, k, m]> / tau)        (eq. 1)
    z[i, j]         = sum_{m, k} Phi[i, j, m, k] U[i, k, m]        (eq. 2)
    S[i, j]         = <z[i, j] / |z[i, j]|, t[j] / |t[j]|>
    logits          = a * S + b

Here `U[i, k, m] = V[i, k, m] @ W_O[m * d_h:(m + 1) * d_h]` are the values
of head `m` already mapped through the output projection `W_O` (the
"folded" form: `sum_m` of the folded values equals the concatenation of
the heads times `W_O`, with fewer operations per pair whenever
`K * (M - 1) < D`). `LlipCrossAttention.image_keys_values` returns them.
There is no `1 / sqrt(d_h)` factor: the temperature `tau` is the only
scaling of the attention logits (the authors' code).

The image embedding is a different vector for every (image, caption)
pair: a `(N_I, N_T, D)` tensor. The scores and the loss are therefore
computed over chunks of `C` texts with a static number of chunks (a real
loop, each chunk wrapped in `keras.remat`), so memory grows with
`N_I * C * (M * K + D)`, not with `N_I * N_T * D`, in training too.

The loss is SigLIP's over the contextualised pairs (eq. 3):
`-(1/N) sum_ij log_sigmoid(y_ij * (a * S_ij + b))`, `y_ij = +1` iff
`i == j`. Every off-diagonal pair stays in: caption `j` is a negative for
every other image, which is what stops the captions from ignoring the image.

Conventions as in `contrastive.py`: float32 computation whatever the input
dtype, numpy or backend tensors accepted, `logit_scale` is the multiplier
(`exp` of the learned log-scale).
"""


from keras import ops

from vlzoo.losses._chunking import block_labels
from vlzoo.losses._chunking import cached_remat
from vlzoo.losses._chunking import check_positive_int
from vlzoo.losses._chunking import check_rows
from vlzoo.losses._chunking import chunking
from vlzoo.losses._chunking import pad_rows
from vlzoo.losses._chunking import put
from vlzoo.losses._chunking import slice_chunk
from vlzoo.losses._chunking import static_loop
from vlzoo.losses._chunking import unstack_columns
from vlzoo.losses._utils import format_shape
from vlzoo.losses._utils import check_float_tensor
from vlzoo.losses._utils import check_scalar
from vlzoo.losses._utils import static_shape
from vlzoo.losses.contrastive import l2_normalize

# ------------------------------------------------------------ validation


def _expect(x, name, layout, expected, matching):
    """Raises unless the static shape of `x` equals `expected` where both
    are known (`None` entries match anything)."""
    shape = static_shape(x)
    if any(a is not None and b is not None and a != b
           for a, b in zip(shape, expected)):
        raise ValueError(
            f"`{name}` must have shape {layout} = {format_shape(expected)} matching "
            f"{matching}; received {format_shape(shape)}."
        )


def _check_temperature(temperature):
    if isinstance(temperature, (int, float)) and not temperature > 0:
        raise ValueError(
            f"`temperature` must be > 0; received {temperature!r}."
        )
    return check_scalar(temperature, "temperature")


def _check_heads(queries, keys):
    """`queries (N_T, M, d_h)`, `keys (N_I, K, M, d_h)` as float32."""
    queries = check_float_tensor(queries, "queries", "(N_T, M, d_h)")
    keys = check_float_tensor(keys, "keys", "(N_I, K, M, d_h)")
    _, m, dh = static_shape(queries)
    _expect(keys, "keys", "(N_I, K, M, d_h)", (None, None, m, dh),
            f"`queries` {format_shape(static_shape(queries))} in M and d_h")
    return queries, keys


def _check_values(values, keys):
    values = check_float_tensor(values, "values", "(N_I, K, M, D)")
    n_i, k, m, _ = static_shape(keys)
    _expect(values, "values", "(N_I, K, M, D)", (n_i, k, m, None),
            f"`keys` {format_shape(static_shape(keys))} in N_I, K and M")
    return values


def _prepare(queries, keys, values, text_embeds, logit_scale, logit_bias,
             temperature, paired):
    """Validates every input (the chunking aside: `check_positive_int`); returns
    float32 tensors, the text embeddings L2-normalised."""
    queries, keys = _check_heads(queries, keys)
    values = _check_values(values, keys)
    text_embeds = check_float_tensor(text_embeds, "text_embeds", "(N_T, D)")
    n_t = static_shape(queries)[0]
    _expect(text_embeds, "text_embeds", "(N_T, D)",
            (n_t, static_shape(values)[3]),
            f"`queries` in N_T and `values` {format_shape(static_shape(values))} in D")
    n_i = static_shape(keys)[0]
    if paired and n_i is not None and n_t is not None and n_i != n_t:
        raise ValueError(
            "The loss pairs image `i` with caption `i`: `keys` (N, K, M, d_h) "
            "and `queries` (N, M, d_h) must have the same N; received "
            f"{format_shape(static_shape(keys))} and {format_shape(static_shape(queries))}."
        )
    return (queries, keys, values, l2_normalize(text_embeds),
            check_scalar(logit_scale, "logit_scale"),
            check_scalar(logit_bias, "logit_bias"),
            _check_temperature(temperature))


# ----------------------------------------------------------- computation


def _attention_weights(queries, keys, temperature):
    # 1/tau scales the queries, not the logits: XLA recomputes an elementwise
    # producer inside each consumer fusion, and a divide rounded differently
    # in the softmax's max than in its exp gives exp(+ulp) = inf for logits
    # beyond ~1e9 (NaN weights); a matmul's output is computed once.
    logits = ops.einsum("jmd,ikmd->ijmk", queries / temperature, keys)
    # exp(log_softmax): where one token takes all the weight (K = 1, a
    # SigLIP-style Llip, or a saturated row) its log-weight is exactly 0, so
    # the weight is exactly 1 and the logits get exactly zero gradient on
    # every backend. A softmax kernel need not give 1 there (TensorFlow's
    # AVX2 kernel returns 1 - 2**-24), which leaves 6e-8 of the upstream
    # gradient on W_Q and W_K.
    return ops.exp(ops.log_softmax(logits, axis=-1))


def _contextualize(queries, keys, values, temperature):
    phi = _attention_weights(queries, keys, temperature)
    return ops.einsum("ijmk,ikme->ije", phi, values)


def _block_logits(queries, keys, values, text_embeds, temperature, scale,
                  bias):
    """`a * <normalize(z_ij), t_j> + b`, `(N_I, C)`, for one block of texts
    (`text_embeds` already normalised)."""
    z = l2_normalize(_contextualize(queries, keys, values, temperature))
    cosine = ops.einsum("ije,je->ij", z, text_embeds)
    # ops.multiply / ops.add: `scale` may be a concrete tensor and `z` a
    # symbolic one (abstract builds).
    return ops.add(ops.multiply(scale, cosine), bias)


def _block_loss_sum(queries, keys, values, text_embeds, temperature, scale,
                    bias, labels, valid):
    """`sum_ij valid_j * log_sigmoid(labels_ij * logits_ij)` over one block
    of texts (float inputs only: TensorFlow's remat watches every input)."""
    logits = _block_logits(queries, keys, values, text_embeds, temperature,
                           scale, bias)
    return ops.sum(ops.log_sigmoid(labels * logits) * valid)


def _block(fn, remat):
    """`fn`, `keras.remat`-wrapped when `remat`; one stable function object
    per backend (JAX reuses its traces)."""
    if not remat:
        return fn
    return cached_remat((__name__, fn.__name__), lambda: fn)


def _text_chunks(queries, text_embeds, num_chunks):
    """`(count, size, n, padded queries, padded text_embeds)` of at most
    `num_chunks` blocks, or None for a single block. Padded texts have zero
    queries and embeddings: finite scores, removed by the callers."""
    plan = chunking(queries, num_chunks)
    if plan is None:
        return None
    count, size, n = plan
    return (count, size, n, pad_rows(queries, plan.pad),
            pad_rows(text_embeds, plan.pad))


# ------------------------------------------------------------ public API


def llip_attention_weights(queries, keys, temperature):
    """Cross-attention weights of Llip (eq. 1): one softmax over the K
    mixture tokens per (image, text, head).

    `Phi[i, j, m, k] = softmax_k(<queries[j, m], keys[i, k, m]> / tau)`;
    no `1 / sqrt(d_h)` factor.

    Args:
        queries: `(N_T, M, d_h)` text queries, heads split.
        keys: `(N_I, K, M, d_h)` keys of the mixture tokens.
        temperature: `tau > 0`; large values flatten the weights towards
            the plain average of the tokens, small ones make them one-hot.

    Returns:
        `(N_I, N_T, M, K)` float32, non-negative, summing to 1 over K.

    Example:

    >>> q = np.random.randn(3, 8, 64); k = np.random.randn(2, 32, 8, 64)
    >>> llip_attention_weights(q, k, 5.0).shape
    (2, 3, 8, 32)
    """
    queries, keys = _check_heads(queries, keys)
    return _attention_weights(queries, keys, _check_temperature(temperature))


def llip_contextualize(queries, keys, values, temperature):
    """The text-conditioned image embeddings of Llip (eq. 2), all pairs.

    `z[i, j] = sum_{m, k} Phi[i, j, m, k] values[i, k, m]`. Memory grows
    with `N_I * N_T * D`: meant for inspection and small batches;
    `llip_logits` and `llip_loss` chunk the same computation.

    Args:
        queries: `(N_T, M, d_h)` text queries.
        keys: `(N_I, K, M, d_h)` keys of the mixture tokens.
        values: `(N_I, K, M, D)` values folded through the output
            projection (`LlipCrossAttention.image_keys_values`).
        temperature: `tau > 0`.

    Returns:
        `(N_I, N_T, D)` float32, unnormalised.

    Example:

    >>> q = np.random.randn(3, 2, 4); k = np.random.randn(2, 5, 2, 4)
    >>> v = np.random.randn(2, 5, 2, 8)
    >>> llip_contextualize(q, k, v, 5.0).shape
    (2, 3, 8)
    """
    queries, keys = _check_heads(queries, keys)
    values = _check_values(values, keys)
    return _contextualize(queries, keys, values,
                          _check_temperature(temperature))


def llip_logits(queries, keys, values, text_embeds, logit_scale, logit_bias,
                temperature, *, num_chunks=None, remat=True):
    """Scores of every image against every text, each pair with its own
    contextualised image embedding: `a * cos(z_ij, t_j) + b`.

    Args:
        queries: `(N_T, M, d_h)` text queries.
        keys: `(N_I, K, M, d_h)` keys of the mixture tokens.
        values: `(N_I, K, M, D)` folded values.
        text_embeds: `(N_T, D)` text embeddings (unnormalised).
        logit_scale: scalar multiplier `a`.
        logit_bias: scalar bias `b`.
        temperature: `tau > 0`.
        num_chunks: None scores all texts at once; a python int loops over
            at most `num_chunks` blocks of `C = ceil(N_T / num_chunks)`
            texts (memory `N_I * C * (M * K + D)` per block). It need not
            divide `N_T`, which may be unknown while tracing.
        remat: rematerialise each block in the backward pass.

    Returns:
        `(N_I, N_T)` float32; same value chunked or not.

    Raises:
        ValueError: shapes that do not match (the message names the
            argument), a temperature not > 0, or `num_chunks` not None or a
            python int >= 1.

    Example:

    >>> q = np.random.randn(6, 2, 4); k = np.random.randn(3, 5, 2, 4)
    >>> v = np.random.randn(3, 5, 2, 8); t = np.random.randn(6, 8)
    >>> llip_logits(q, k, v, t, 10.0, -10.0, 5.0, num_chunks=2).shape
    (3, 6)
    """
    check_positive_int(num_chunks, "num_chunks")
    q, k, v, t, scale, bias, tau = _prepare(
        queries, keys, values, text_embeds, logit_scale, logit_bias,
        temperature, False)
    chunking = _text_chunks(q, t, num_chunks)
    if chunking is None:
        return _block_logits(q, k, v, t, tau, scale, bias)
    count, size, n, q, t = chunking
    block = _block(_block_logits, remat)

    def body(index, carry):
        _, qc, tc = slice_chunk(index, size, q, t)
        return (put(carry[0], index, block(qc, k, v, tc, tau, scale, bias)),)

    stack = ops.zeros((count, ops.shape(k)[0], size), "float32")
    (stack,) = static_loop(count, body, (stack,))
    return unstack_columns(stack, count, size, n)


def llip_loss(queries, keys, values, text_embeds, logit_scale, logit_bias,
              temperature, *, num_chunks=None, remat=True, rows=None):
    """Sigmoid loss of Llip over the contextualised pairs (eq. 3), of the whole batch or of one replica's images.

    `-(1/R) sum_ij log_sigmoid(y_ij * (a * S_ij + b))` over the `R` images
    `i` (the batch's `N`, or a replica's) and every caption `j`, `y_ij = +1`
    iff `i == j`, `S_ij = cos(z_ij, t_j)` with `z_ij` image `i` mixed by
    caption `j`.

    Args:
        queries: `(N, M, d_h)` queries of the captions.
        keys: `(N, K, M, d_h)` keys of the images; image `i` and caption
            `i` form the positive pair. With `rows`, `(count, K, M, d_h)`:
            the replica's images only.
        values: `(N, K, M, D)` folded values (with `rows`, the replica's).
        text_embeds: `(N, D)` caption embeddings (unnormalised).
        logit_scale: scalar multiplier `a` (`exp` of the learned
            log-scale; Llip starts at `1 / 0.07`).
        logit_bias: scalar bias `b` (Llip starts at -10).
        temperature: `tau > 0` of the cross-attention.
        num_chunks, remat: see `llip_logits`; each block of texts is
            reduced to a scalar before the next one.
        rows: None for the loss of the whole batch; `(start, count)` for the
            share of images `start .. start + count - 1`, each mixed by
            every caption. The shares of a partition of the batch into
            equal row ranges average to the whole loss; a replica needs no
            other replica's keys and values and forms only its own
            `(count, C)` blocks of pairs. `start` and `count` are python
            ints or int scalar tensors.

    Returns:
        float32 scalar; chunked and unchunked values and gradients agree.

    Raises:
        ValueError: on inputs whose shapes do not match (the message names
            the argument), a bad chunking (see `llip_logits`), or `rows` not
            a pair with a count >= 1.

    Example:

    >>> q = np.random.randn(4, 2, 4); k = np.random.randn(4, 5, 2, 4)
    >>> v = np.random.randn(4, 5, 2, 8); t = np.random.randn(4, 8)
    >>> loss = llip_loss(q, k, v, t, 1 / 0.07, -10.0, 5.0, num_chunks=2)
    >>> share = llip_loss(q, k[2:], v[2:], t, 1 / 0.07, -10.0, 5.0, rows=(2, 2))
    """
    check_positive_int(num_chunks, "num_chunks")
    start = 0
    if rows is not None:
        start, _ = check_rows(rows)
    q, k, v, t, scale, bias, tau = _prepare(
        queries, keys, values, text_embeds, logit_scale, logit_bias,
        temperature, rows is None)
    total = _loss_sum(q, k, v, t, tau, scale, bias, num_chunks, remat, start)
    return -total / ops.cast(ops.shape(k)[0], "float32")


def _loss_sum(q, k, v, t, tau, scale, bias, num_chunks, remat, row_start):
    """`sum_ij log_sigmoid(y_ij * logits_ij)` of the images `k, v` (rows
    `row_start ..` of the batch) against every caption, in at most
    `num_chunks` blocks of captions."""
    n_images = ops.shape(k)[0]
    chunking = _text_chunks(q, t, num_chunks)
    if chunking is None:
        n = ops.shape(q)[0]
        labels, valid = block_labels(n_images, 0, n, n, row_start)
        return _block_loss_sum(q, k, v, t, tau, scale, bias, labels, valid)
    count, size, n, q, t = chunking
    block = _block(_block_loss_sum, remat)

    def body(index, carry):
        start, qc, tc = slice_chunk(index, size, q, t)
        labels, valid = block_labels(n_images, start, size, n, row_start)
        return (carry[0] + block(qc, k, v, tc, tau, scale, bias, labels,
                                 valid),)

    (total,) = static_loop(count, body, (ops.zeros((), "float32"),))
    return total


def llip_template_average(queries, text_embeds):
    """Prompt-template ensembling of Llip's text side (zero-shot).

    For each class: the query is the mean over its templates of the
    (normalised, when the model has `qkv_norm`) per-prompt queries, not
    renormalised; the text target is the renormalised mean of the
    L2-normalised per-prompt embeddings (CLIP's ensembling). One
    cross-attention per (image, class) then scores the class.

    Args:
        queries: `(C, P, M, d_h)` queries of `P` templates for `C` classes.
        text_embeds: `(C, P, D)` their text embeddings (unnormalised).

    Returns:
        `(queries, text_embeds)`: `(C, M, d_h)` and `(C, D)` float32, the
        latter unit-norm.

    Example:

    >>> q = np.random.randn(10, 7, 8, 64); t = np.random.randn(10, 7, 512)
    >>> q_c, t_c = llip_template_average(q, t)
    >>> q_c.shape, t_c.shape
    ((10, 8, 64), (10, 512))
    """
    queries = check_float_tensor(queries, "queries", "(C, P, M, d_h)")
    text_embeds = check_float_tensor(text_embeds, "text_embeds", "(C, P, D)")
    c, p, _, _ = static_shape(queries)
    _expect(text_embeds, "text_embeds", "(C, P, D)", (c, p, None),
            f"`queries` {format_shape(static_shape(queries))} in C and P")
    return (ops.mean(queries, axis=1),
            l2_normalize(ops.mean(l2_normalize(text_embeds), axis=1)))
