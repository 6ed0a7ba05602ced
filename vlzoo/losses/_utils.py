"""Shared input handling for the contrastive losses.

Everything here is backend-agnostic (`keras.ops` only). Shape checks use
static shapes: a dimension that is unknown at trace time (`None`) is not
checked.
"""

import keras
from keras import ops


def to_float32(x):
    """Converts `x` (backend tensor, numpy array or python number) to a
    float32 tensor of the active backend. Low-precision inputs (float16,
    bfloat16) are cast *before* any arithmetic."""
    x = ops.convert_to_tensor(x)
    if keras.backend.standardize_dtype(x.dtype) != "float32":
        x = ops.cast(x, "float32")
    return x


def static_shape(x):
    """Static shape of a tensor as a tuple (entries may be `None`)."""
    return tuple(None if d is None else int(d) for d in x.shape)


def _fmt(shape):
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + (
        ",)" if len(shape) == 1 else ")")


def _mismatch(a, b):
    return a is not None and b is not None and a != b


def check_embeds(x, name):
    """Converts `x` to float32 and checks that it is a rank-2 `(B, D)` tensor."""
    x = to_float32(x)
    shape = static_shape(x)
    if len(shape) != 2:
        raise ValueError(
            f"`{name}` must have rank 2, shape (B, D); received shape "
            f"{_fmt(shape)} (rank {len(shape)})."
        )
    return x


def check_pair(image_embeds, text_embeds, paired=True):
    """Validates and casts a pair of embedding matrices.

    Args:
        image_embeds: `(B_img, D)`.
        text_embeds: `(B_txt, D)`.
        paired: if True the batch sizes must match too (`B_img == B_txt`),
            as the losses take row `i` of both as the positive pair.

    Returns:
        The two float32 tensors.
    """
    image_embeds = check_embeds(image_embeds, "image_embeds")
    text_embeds = check_embeds(text_embeds, "text_embeds")
    (bi, di), (bt, dt) = static_shape(image_embeds), static_shape(text_embeds)
    if _mismatch(di, dt) or (paired and _mismatch(bi, bt)):
        expected = "(B, D)" if paired else "(B_txt, D)"
        raise ValueError(
            f"`text_embeds` must have shape {expected} matching "
            f"`image_embeds` {_fmt((bi, di))}"
            + ("" if paired else " in D")
            + f"; received {_fmt((bt, dt))}."
        )
    return image_embeds, text_embeds


def check_scalar(x, name):
    """Converts `x` to a float32 scalar tensor.

    Accepts python numbers, 0-d tensors and single-element tensors such as
    a `(1,)` weight; anything with more than one element raises.
    """
    x = to_float32(x)
    shape = static_shape(x)
    if any(d != 1 for d in shape):
        raise ValueError(
            f"`{name}` must be a scalar; received shape {_fmt(shape)}."
        )
    if shape:
        x = ops.reshape(x, ())
    return x
