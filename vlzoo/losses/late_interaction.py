"""Token-wise late-interaction similarity (FILIP's), its prompt ensembling and word-patch alignment.

Yao et al. 2022, "FILIP: Fine-grained Interactive Language-Image
Pre-training" (ICLR). Every image token (patch) and every
text token is L2-normalised on its own; with `A[i, j, p, t] = <x_ip, y_jt>`:

* image -> text (eq. 4): `S_I[i, j] = mean_p max_{t real} A[i, j, p, t]`
* text -> image (eq. 5): `S_T[i, j] = mean_{t real} max_{p real} A[i, j, p, t]`

Padding is left out of the max (a finite `-1e4` put in by `where`, never a
multiplication by the mask, since similarities can be negative) and out of
the mean (divided by the number of real tokens). A text (or image) with no
real token at all gets similarity 0 to everything.

Conventions as in `contrastive.py`: inputs are the *projected, unnormalised*
token embeddings (tensors of the active backend or numpy), computation is
float32 whatever the input dtype, and masks are bool with True = real token
(integer 0/1 masks are accepted).

At scale the `(B, B, P, T)` interaction is never materialised: with
`num_chunks=K`, a loop with the static trip count `K` (`ops.fori_loop`, a
scan on JAX; `ops.while_loop` with `maximum_iterations` on TensorFlow; a
python loop on PyTorch) reduces one `(B_img, C, P, T)` block of
`C = ceil(B_txt / K)` texts at a time to `(B_img, C)` similarities, each
block wrapped in `keras.remat`, so memory grows with `C`, not with `B^2`,
in training too; `K` is a count, so it works when the batch size is unknown
at trace time. The loop, the padding of the chunked batch and the remat
cache are shared with the other chunked losses (`_chunking.py`). FILIP's
loss and token selection are in `filip.py`.
"""

from keras import ops

from vlzoo.losses._chunking import cached_remat
from vlzoo.losses._chunking import check_positive_int
from vlzoo.losses._chunking import chunking
from vlzoo.losses._chunking import pad_rows
from vlzoo.losses._chunking import put
from vlzoo.losses._chunking import slice_chunk
from vlzoo.losses._chunking import static_loop
from vlzoo.losses._chunking import unstack_columns
from vlzoo.losses._utils import check_mask
from vlzoo.losses._utils import check_token_pair
from vlzoo.losses._utils import format_shape
from vlzoo.losses._utils import static_shape
from vlzoo.losses._utils import to_float32
from vlzoo.losses.contrastive import l2_normalize

# Finite masking value: below any cosine (>= -1) and representable in
# float16 / bfloat16 (for `similarity_dtype`).
_NEG = -1e4

_SIMILARITY_DTYPES = (None, "float32", "float16", "bfloat16")


# ------------------------------------------------------------ validation


def _check_choice(value, name, choices):
    if value not in choices:
        raise ValueError(
            f"`{name}` must be one of {choices}; received {value!r}."
        )


# ------------------------------------------------------ similarity blocks


def _masked_mean(values, valid, axis, count):
    """`sum(values where valid) / max(count, 1)` along `axis`."""
    total = ops.sum(ops.where(valid, values, 0.0), axis=axis)
    return total / ops.maximum(count, 1.0)


def _late_interaction(x, x_valid, y, y_valid, sim_dtype, mask_x):
    """Both token-wise max-mean similarities of one block.

    Args:
        x: `(Bx, P, D)` normalised tokens; x_valid: `(Bx, P)` float 0/1.
        y: `(By, T, D)` normalised tokens; y_valid: `(By, T)` float 0/1.
        sim_dtype: dtype of the einsum and of the maxima.
        mask_x: static flag, False when every `x` token is real (saves the
            `(Bx, By, P, T)` mask).

    Returns:
        `(mean_x_max_y, mean_y_max_x)`, each `(Bx, By)` float32:
        `mean_{p valid} max_{t valid} A` and `mean_{t valid} max_{p valid} A`
        (`S_I` and `S_T` when `x` are the images); 0 where a side has no
        real token.
    """
    if sim_dtype != "float32":
        x, y = ops.cast(x, sim_dtype), ops.cast(y, sim_dtype)
    xv = ops.greater(x_valid, 0.5)
    yv = ops.greater(y_valid, 0.5)
    sim = ops.einsum("ipd,jtd->ijpt", x, y)
    valid = yv[None, :, None, :]
    if mask_x:
        valid = ops.logical_and(valid, xv[:, None, :, None])
    sim = ops.where(valid, sim, ops.cast(_NEG, sim.dtype))
    best_y = ops.cast(ops.max(sim, axis=3), "float32")  # (Bx, By, P)
    best_x = ops.cast(ops.max(sim, axis=2), "float32")  # (Bx, By, T)
    nx = ops.sum(x_valid, axis=1)  # (Bx,)
    ny = ops.sum(y_valid, axis=1)  # (By,)
    s_xy = _masked_mean(best_y, xv[:, None, :], 2, nx[:, None])
    s_yx = _masked_mean(best_x, yv[None, :, :], 2, ny[None, :])
    # A side without real tokens: the max ran over `_NEG` only.
    s_xy = ops.where(ops.greater(ny, 0.0)[None, :], s_xy, 0.0)
    s_yx = ops.where(ops.greater(nx, 0.0)[:, None], s_yx, 0.0)
    return s_xy, s_yx


def _block_fn(sim_dtype, mask_x, remat):
    """The block function for the static flags, `keras.remat`-wrapped when
    `remat` (then one stable function object per configuration: JAX reuses
    its traces)."""
    def block(x, x_valid, y, y_valid):
        return _late_interaction(x, x_valid, y, y_valid, sim_dtype, mask_x)

    if not remat:
        return block
    return cached_remat((__name__, "block", sim_dtype, mask_x),
                        lambda: block)


def _similarity_chunked(x, x_valid, y, y_valid, num_chunks, sim_dtype, mask_x,
                        remat):
    """`_late_interaction` over at most `num_chunks` blocks of the `y` batch; `(Bx, By)` each."""
    plan = chunking(y, num_chunks)
    if plan is None:
        return _late_interaction(x, x_valid, y, y_valid, sim_dtype, mask_x)
    count, size, n = plan
    # Padded rows have no real token: similarity 0, zero gradient.
    y, y_valid = pad_rows(y, plan.pad), pad_rows(y_valid, plan.pad)
    block = _block_fn(sim_dtype, mask_x, remat)

    def body(k, carry):
        s_xy, s_yx = carry
        _, yc, vc = slice_chunk(k, size, y, y_valid)
        a, b = block(x, x_valid, yc, vc)
        return put(s_xy, k, a), put(s_yx, k, b)

    zeros = ops.zeros((count, ops.shape(x)[0], size), "float32")
    s_xy, s_yx = static_loop(count, body, (zeros, zeros))
    return (unstack_columns(s_xy, count, size, n),
            unstack_columns(s_yx, count, size, n))


def _similarity(img, img_valid, txt, txt_valid, num_chunks=None,
                chunk_axis="text", sim_dtype="float32", mask_img=True,
                remat=True):
    """`(S_I, S_T)`, each `(B_img, B_txt)`, from normalised tokens and
    float 0/1 masks, in at most `num_chunks` blocks (checked) of the `chunk_axis` batch."""
    if chunk_axis == "text":
        return _similarity_chunked(img, img_valid, txt, txt_valid, num_chunks,
                                   sim_dtype, mask_img, remat)
    # The two similarities are symmetric in the roles of the sides:
    # with texts as `x`, `mean_x max_y` is `S_T^T` and `mean_y max_x` `S_I^T`.
    s_t, s_i = _similarity_chunked(txt, txt_valid, img, img_valid, num_chunks,
                                   sim_dtype, True, remat)
    return ops.transpose(s_i), ops.transpose(s_t)


def _prepare(image_tokens, text_tokens, text_mask, image_mask, paired,
             chunk_axis, similarity_dtype):
    """Validates the inputs (the chunking aside: `check_positive_int`); returns
    normalised tokens, float masks and whether an image mask is in use."""
    _check_choice(chunk_axis, "chunk_axis", ("text", "image"))
    _check_choice(similarity_dtype, "similarity_dtype", _SIMILARITY_DTYPES)
    image_tokens, text_tokens = check_token_pair(
        image_tokens, text_tokens, "image_tokens", "text_tokens", paired)
    text_mask = check_mask(text_mask, "text_mask", text_tokens, "text_tokens")
    if image_mask is None:
        image_valid = ops.ones(ops.shape(image_tokens)[:2], "float32")
    else:
        image_mask = check_mask(image_mask, "image_mask", image_tokens,
                                "image_tokens")
        image_valid = ops.cast(image_mask, "float32")
    return (l2_normalize(image_tokens), image_valid,
            l2_normalize(text_tokens), ops.cast(text_mask, "float32"),
            image_mask is not None)


def _filip_similarity(image_tokens, text_tokens, text_mask, image_mask,
                      num_chunks, chunk_axis, similarity_dtype, remat):
    """`filip_similarity` with its chunking already checked."""
    img, img_valid, txt, txt_valid, mask_img = _prepare(
        image_tokens, text_tokens, text_mask, image_mask, False, chunk_axis,
        similarity_dtype)
    return _similarity(img, img_valid, txt, txt_valid, num_chunks, chunk_axis,
                       similarity_dtype or "float32", mask_img, remat)


# ------------------------------------------------------------ public API


def filip_similarity(
    image_tokens,
    text_tokens,
    text_mask,
    image_mask=None,
    *,
    num_chunks=None,
    chunk_axis="text",
    similarity_dtype=None,
    remat=True,
):
    """Token-wise max-mean similarities of FILIP, both directions.

    `S_I[i, j] = mean_{p real} max_{t real} <x_ip, y_jt>` (eq. 4) and
    `S_T[i, j] = mean_{t real} max_{p real} <x_ip, y_jt>` (eq. 5), on
    L2-normalised tokens. `S_I != S_T` in general; both lie in `[-1, 1]`;
    a text (image) without any real token scores 0.

    Args:
        image_tokens: `(B_img, P, D)` projected patch embeddings.
        text_tokens: `(B_txt, T, D)` projected token embeddings.
        text_mask: `(B_txt, T)` bool, True = real token (BOS/EOS included).
        image_mask: optional `(B_img, P)` bool, True = real patch; None: all.
        num_chunks: None computes the `(B_img, B_txt, P, T)` interaction at
            once; a python int `K` loops over at most `K` blocks of
            `C = ceil(B_txt / K)` texts (of `ceil(B_img / K)` images with
            `chunk_axis="image"`), each rematerialised in the backward pass,
            so peak memory is `B_img * C * P * T`. `K` need not divide the
            batch (the last block is zero-padded and masked); it works when
            the batch size is unknown at trace time (e.g. TensorFlow graphs
            of `fit`).
        chunk_axis: "text" (default) or "image", the batch that is chunked.
        similarity_dtype: None / "float32", or "float16" / "bfloat16" to
            compute the dot products and maxima in that dtype (FILIP's
            fp16 trick); means and outputs stay float32.
        remat: rematerialise each chunk in the backward pass.

    Returns:
        `(sim_i2t, sim_t2i)`: `S_I` and `S_T`, each `(B_img, B_txt)`
        float32, indexed `[image, text]`; the same values chunked or not.

    Raises:
        ValueError: shapes that do not match (the message names the
            argument), or `num_chunks` not None or a python int >= 1.

    Example:

    >>> img = np.random.randn(4, 49, 256); txt = np.random.randn(6, 77, 256)
    >>> mask = np.arange(77)[None] < np.array([[5], [9], [3], [77], [2], [8]])
    >>> s_i, s_t = filip_similarity(img, txt, mask, num_chunks=2)
    >>> s_i.shape, s_t.shape
    ((4, 6), (4, 6))
    """
    check_positive_int(num_chunks, "num_chunks")
    return _filip_similarity(image_tokens, text_tokens, text_mask, image_mask,
                             num_chunks, chunk_axis, similarity_dtype, remat)


# ------------------------------------------------------------- inference


def filip_ensemble_scores(
    image_tokens,
    text_tokens,
    text_mask,
    image_mask=None,
    *,
    num_chunks=None,
    similarity_dtype=None,
):
    """Prompt-ensembled zero-shot scores of FILIP.

    Each template of a class yields its own token set, so FILIP averages
    *similarities*, not embeddings:
    `score[b, c] = (1/K) sum_k S_I(image_b, text_{c,k})`, the image->text
    similarity (eq. 4). This is neither the max over the union of the
    templates' tokens nor CLIP's mean text embedding. The temperature is
    monotone, so it is left out.

    Args:
        image_tokens: `(B, P, D)` projected patch embeddings.
        text_tokens: `(N, K, T, D)` projected tokens of `K` templates for
            each of `N` classes.
        text_mask: `(N, K, T)` bool, True = real token.
        image_mask: optional `(B, P)` bool.
        num_chunks: at most this many blocks of the `N * K` prompts (see
            `filip_similarity`); None: all at once.
        similarity_dtype: see `filip_similarity`.

    Returns:
        `(B, N)` float32 scores; `argmax` over classes is the prediction.

    Example:

    >>> img = np.random.randn(2, 49, 256)
    >>> txt = np.random.randn(10, 30, 16, 256)  # 30 templates per class
    >>> mask = np.ones((10, 30, 16), bool)
    >>> filip_ensemble_scores(img, txt, mask, num_chunks=5).shape
    (2, 10)
    """
    check_positive_int(num_chunks, "num_chunks")
    text_tokens = to_float32(text_tokens)
    shape = static_shape(text_tokens)
    if len(shape) != 4:
        raise ValueError(
            f"`text_tokens` must have rank 4, shape (N, K, T, D) "
            f"(classes, templates, tokens, dim); received shape "
            f"{format_shape(shape)} (rank {len(shape)})."
        )
    n, k, t, d = shape
    mask = ops.convert_to_tensor(text_mask)
    mshape = static_shape(mask)
    if len(mshape) != 3 or any(
            a is not None and b is not None and a != b
            for a, b in zip(mshape, (n, k, t))):
        raise ValueError(
            f"`text_mask` must have shape (N, K, T) = {format_shape((n, k, t))} "
            f"matching `text_tokens` {format_shape(shape)}; received {format_shape(mshape)}."
        )
    flat = ops.reshape(text_tokens, (-1, t, d))
    flat_mask = ops.reshape(mask, (-1, t))
    s_i, _ = _filip_similarity(image_tokens, flat, flat_mask, image_mask,
                               num_chunks, "text", similarity_dtype, True)
    return ops.mean(ops.reshape(s_i, (-1, n, k)), axis=2)


def filip_token_alignment(image_tokens, text_tokens, text_mask,
                          image_mask=None):
    """Word-patch alignment of FILIP's visualisations (eq. 4 / 5 argmaxes).

    Not chunked: meant for inspecting a few pairs.

    Args:
        image_tokens: `(B_img, P, D)`; text_tokens: `(B_txt, T, D)`;
        text_mask: `(B_txt, T)` bool; image_mask: optional `(B_img, P)`.

    Returns:
        `(patch_to_token, token_to_patch)`: int32 `(B_img, B_txt, P)`, the
        index of the best real token of text `j` for each patch of image
        `i` (0-based, BOS = 0), and int32 `(B_img, B_txt, T)`, the best
        real patch for each token (meaningless at padded positions).
    """
    img, img_valid, txt, txt_valid, _ = _prepare(
        image_tokens, text_tokens, text_mask, image_mask, False, "text", None)
    sim = ops.einsum("ipd,jtd->ijpt", img, txt)
    valid = ops.logical_and(ops.greater(img_valid, 0.5)[:, None, :, None],
                            ops.greater(txt_valid, 0.5)[None, :, None, :])
    sim = ops.where(valid, sim, _NEG)
    return (ops.cast(ops.argmax(sim, axis=3), "int32"),
            ops.cast(ops.argmax(sim, axis=2), "int32"))
