"""Shared machinery of the chunked pairwise losses (SigLIP, FILIP, Llip) and of FLAIR's chunked scores.

A chunked loss never materialises its `(B, B, ...)` pairwise tensor: the
partner batch (usually the texts) is zero-padded to `count * size` rows
and a loop with a static trip count reduces one block of `size` rows at a
time, each block wrapped in `keras.remat` so that the backward pass
recomputes it instead of storing it.

* `check_positive_int`, `check_rows`: argument validation.
* `chunking`: how many blocks of how many rows (`Chunks`), or None: at most
  `num_chunks` blocks, the one chunking setting of every chunked loss and
  model (static, so it holds when the batch size is unknown at trace time).
* `pad_rows`, `slice_chunk`: padding of the batch and the block `k`;
  `take_rows`: one replica's rows (the losses' `rows=` shares).
* `static_loop`: the loop itself (a real loop: XLA would fuse unrolled
  blocks back together).
* `put`, `unstack_columns`: writing block `k` into a stack and reading
  the stack back as the columns of a `(R, n)` matrix.
* `siglip_labels`, `block_labels`: the +1 / -1 pair labels and the 0/1
  validity of a block of columns (padding excluded); `own_log_likelihood`:
  the cross-entropy terms of a block of rows, `symmetric_rows_loss` a
  replica's share of a symmetric InfoNCE.
* `cached_remat`: one `keras.remat`-wrapped function per configuration.

`keras.ops` only; runs on JAX, TensorFlow and PyTorch.
"""

import collections

import keras
from keras import ops

from vlzoo._backends import switches

# ------------------------------------------------------------ validation


def check_positive_int(value, name, allow_none=True):
    """Raises a `ValueError` unless `value` is a python int >= 1 (bools
    excluded), or None when `allow_none`."""
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(
            f"`{name}` must be a python int >= 1"
            + (" or None" if allow_none else "") + f"; received {value!r}."
        )


def check_rows(rows):
    """Validates a loss's `rows` argument, `(start, count)`, and returns it: a python `count` must be an
    int >= 1 (a traced one is the batch size of a replica's outputs).

    Raises:
        ValueError: if `rows` is not a pair, or a python `count` is not an int >= 1.
    """
    if not isinstance(rows, (tuple, list)) or len(rows) != 2:
        raise ValueError(f"`rows` must be a pair `(start, count)` or None; received {rows!r}.")
    start, count = rows
    if isinstance(count, (int, float, bool)):
        check_positive_int(count, "count", allow_none=False)
    return start, count


# -------------------------------------------------------------- chunking


class Chunks(collections.namedtuple("Chunks", ["count", "size", "n"])):
    """`count` blocks of `size` rows over a batch of `n` rows.

    `count` is a python int (the static trip count of the loop); `size` and
    `n` are tensors when the batch size is unknown at trace time. Unpacks
    as `count, size, n`.
    """

    __slots__ = ()

    @property
    def pad(self):
        """Rows of zero padding that make the batch `count * size` rows."""
        return self.count * self.size - self.n


def chunking(x, num_chunks):
    """The chunks over the batch (first axis) of `x`.

    Args:
        x: tensor whose first axis is chunked.
        num_chunks: None or a python int >= 1 (checked by `check_positive_int`): at most this many
            blocks.

    Returns:
        None when there is nothing to chunk (`num_chunks` None, or a single block);
        otherwise `Chunks(count, size, n)`: blocks of `ceil(n / min(K, n))` rows
        (so at most `K = num_chunks` blocks). With a batch size unknown at
        trace time, `count = K` and `size`, `n` are tensors.
    """
    if num_chunks is None:
        return None
    n = x.shape[0]
    if n is None:
        n = ops.shape(x)[0]
        return Chunks(num_chunks, (n + num_chunks - 1) // num_chunks, n)
    size = -(-n // min(num_chunks, n))
    count = -(-n // size)
    return None if count == 1 else Chunks(count, size, n)


def pad_rows(x, pad):
    """`x` with `pad` rows of zeros appended on its first axis (`pad` a
    python int or a scalar tensor; `x` itself when it is the int 0)."""
    if isinstance(pad, int) and pad == 0:
        return x
    return ops.pad(x, [[0, pad]] + [[0, 0]] * (len(x.shape) - 1))


def take_rows(x, start, count):
    """Rows `start .. start + count - 1` of `x` (`start` a python int or a
    scalar tensor): one replica's rows of the global batch."""
    return ops.slice(x, (ops.cast(start, "int32"),) + (0,) * (len(x.shape) - 1),
                     (count,) + tuple(ops.shape(x)[1:]))


def slice_chunk(k, size, *tensors):
    """`(start, block_0, block_1, ...)`: rows `start .. start + size - 1`
    of each tensor, `start = k * size` (int32), for a loop index `k`
    (`ops.slice`, a dynamic slice)."""
    start = ops.cast(k * size, "int32")
    blocks = tuple(
        ops.slice(x, (start,) + (0,) * (len(x.shape) - 1),
                  (size,) + tuple(ops.shape(x)[1:]))
        for x in tensors
    )
    return (start,) + blocks


def static_loop(count, body, init):
    """`carry = body(k, carry)` for `k = 0 .. count - 1`; returns `carry`.

    A real loop with the static trip count `count` (a python int), not
    unrolled blocks, which XLA would fuse back together: `ops.fori_loop`
    (a scan on JAX, reverse-differentiable; a python loop on PyTorch), and
    `ops.while_loop` with `maximum_iterations` on TensorFlow, whose
    gradient needs it to compile with XLA (`fori_loop` does not pass it).

    Args:
        count: python int >= 1.
        body: `body(k, carry) -> carry`, `carry` a tuple of tensors of
            fixed shapes and dtypes, `k` a scalar loop index.
        init: the initial carry (any sequence of tensors).

    Returns:
        The final carry, a tuple.
    """
    init = tuple(init)
    return switches.loop(count, body, init)


def put(stack, k, value):
    """`stack[k] = value` for a loop index `k` (a `where`, since the
    backends' dynamic update ops are not all differentiable)."""
    count = stack.shape[0]
    hit = ops.equal(ops.arange(count, dtype="int32"), ops.cast(k, "int32"))
    hit = ops.reshape(hit, (count,) + (1,) * (len(stack.shape) - 1))
    return ops.where(hit, ops.expand_dims(value, 0), stack)


def unstack_columns(stack, count, size, n):
    """`(count, R, size)` stacked blocks of columns -> the `(R, n)` matrix
    (the padding columns dropped)."""
    out = ops.reshape(ops.transpose(stack, (1, 0, 2)), (-1, count * size))
    return out[:, :n]


# ---------------------------------------------------------------- labels


def siglip_labels(rows, cols):
    """`+1` where `rows[i] == cols[j]`, `-1` elsewhere: `(R, C)` float32
    pair labels of the sigmoid losses."""
    eq = ops.cast(
        ops.equal(ops.expand_dims(rows, 1), ops.expand_dims(cols, 0)),
        "float32",
    )
    return 2.0 * eq - 1.0


def block_labels(num_rows, start, size, n, row_start=0):
    """`(labels, valid)` of the columns `start .. start + size - 1` against
    rows `row_start .. row_start + num_rows - 1`: `labels` `(num_rows, size)`
    from `siglip_labels` (+1 for row `i` with column `i`), `valid` `(1, size)`
    float 0/1, 0 for the padding columns `>= n`."""
    rows = row_start + ops.arange(num_rows, dtype="int32")
    cols = start + ops.arange(size, dtype="int32")
    valid = ops.cast(ops.less(cols, n), "float32")
    return siglip_labels(rows, cols), ops.expand_dims(valid, 0)


def own_log_likelihood(logits, start):
    """`(R,)` float32: `log_softmax` of each row of the `(R, n)` `logits`, read
    at the row's own column `start + i` (row `i` is the batch's row
    `start + i`; the cross-entropy terms of one replica's share)."""
    rows = ops.shape(logits)[0]
    targets = ops.cast(start, "int32") + ops.arange(rows, dtype="int32")
    picked = ops.take_along_axis(ops.log_softmax(logits, axis=1), ops.expand_dims(targets, 1), axis=1)
    return ops.squeeze(picked, 1)


def symmetric_rows_loss(logits, image_embeds, text_embeds, start, count):
    """One replica's share of a symmetric InfoNCE (CLIP's form): `-0.5 * (mean
    CE_i2t + mean CE_t2i)` over rows `start .. start + count - 1`, each row
    against every column; `logits(rows, columns)` scores a block."""
    terms = [ops.mean(own_log_likelihood(logits(take_rows(rows, start, count), columns), start))
             for rows, columns in ((image_embeds, text_embeds), (text_embeds, image_embeds))]
    return -0.5 * (terms[0] + terms[1])


# ----------------------------------------------------------------- remat

_REMAT_CACHE = {}


def cached_remat(key, build):
    """`keras.remat(build())`, built once per `(backend, *key)`.

    A stable function object lets JAX reuse its traces of the
    rematerialised block across calls.

    Args:
        key: tuple of hashables naming the block and its static
            configuration; prefix it with the caller's module name to keep
            the modules' entries apart.
        build: zero-argument callable returning the block function; called
            only the first time the key is seen.

    Returns:
        The cached `keras.remat`-wrapped function.
    """
    key = (keras.backend.backend(),) + tuple(key)
    if key not in _REMAT_CACHE:
        _REMAT_CACHE[key] = keras.remat(build())
    return _REMAT_CACHE[key]
