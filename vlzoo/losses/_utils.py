"""Shared input handling for the contrastive losses.

Everything here is backend-agnostic (`keras.ops` only). Shape checks use
static shapes: a dimension that is unknown at trace time (`None`) is not
checked.
"""

import numbers
import operator

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
    """Static shape of a tensor as a tuple of ints, `None` for a dimension not known while tracing (unknown,
    or symbolic, as a batch under jax2tf's shape polymorphism in a SavedModel export)."""
    return tuple(_static_dimension(d) for d in x.shape)


def _static_dimension(d):
    if isinstance(d, numbers.Integral):
        return int(d)
    if getattr(d, "shape", None) == () and hasattr(d, "__index__"):  # PyTorch's tracer: sizes are 0-d tensors
        return operator.index(d)
    return None


def format_shape(shape):
    """`(2, None, 3)` -> "(2, None, 3)", `(4,)` -> "(4,)": shapes as error messages print them."""
    return "(" + ", ".join("None" if d is None else str(d) for d in shape) + (
        ",)" if len(shape) == 1 else ")")


def _mismatch(a, b):
    return a is not None and b is not None and a != b


def check_float_tensor(x, name, layout):
    """Converts `x` to float32 and checks its rank against `layout`, e.g. `"(B, D)"`."""
    x = to_float32(x)
    shape = static_shape(x)
    rank = layout.count(",") + 1
    if len(shape) != rank:
        raise ValueError(
            f"`{name}` must have rank {rank}, shape {layout}; received shape "
            f"{format_shape(shape)} (rank {len(shape)})."
        )
    return x


def check_embeds(x, name):
    """`check_float_tensor` for `(B, D)` embeddings."""
    return check_float_tensor(x, name, "(B, D)")


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
            f"`image_embeds` {format_shape((bi, di))}"
            + ("" if paired else " in D")
            + f"; received {format_shape((bt, dt))}."
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
            f"`{name}` must be a scalar; received shape {format_shape(shape)}."
        )
    if shape:
        x = ops.reshape(x, ())
    return x


def check_tokens(x, name):
    """`check_float_tensor` for `(B, N, D)` token embeddings."""
    return check_float_tensor(x, name, "(B, N, D)")


def check_token_pair(image_tokens, text_tokens, image_name, text_name,
                     paired=True):
    """Validates two token tensors `(B_img, P, D)` and `(B_txt, T, D)`: same
    `D`, and the same batch size when `paired`."""
    image_tokens = check_tokens(image_tokens, image_name)
    text_tokens = check_tokens(text_tokens, text_name)
    (bi, _, di), (bt, _, dt) = static_shape(image_tokens), static_shape(
        text_tokens)
    bad_d = di is not None and dt is not None and di != dt
    bad_b = paired and bi is not None and bt is not None and bi != bt
    if bad_d or bad_b:
        expected = "(B, T, D)" if paired else "(B_txt, T, D)"
        matching = "B and D" if paired else "D"
        raise ValueError(
            f"`{text_name}` must have shape {expected} with {matching} "
            f"matching `{image_name}` {format_shape(static_shape(image_tokens))}; "
            f"received {format_shape(static_shape(text_tokens))}."
        )
    return image_tokens, text_tokens


def check_mask(mask, name, tokens, tokens_name):
    """Converts `mask` to a bool tensor and checks that it has shape
    `(B, N)` matching `tokens` `(B, N, D)`.

    Bool and integer (0/1) masks are accepted; float masks raise a
    `TypeError` (an additive attention bias passed by mistake would
    otherwise be read as a mask)."""
    mask = ops.convert_to_tensor(mask)
    dtype = keras.backend.standardize_dtype(mask.dtype)
    if dtype != "bool":
        if "int" not in dtype:
            raise TypeError(
                f"`{name}` must be a bool (or integer 0/1) mask with True = "
                f"real token; received dtype {dtype}."
            )
        mask = ops.not_equal(mask, 0)
    shape, tshape = static_shape(mask), static_shape(tokens)
    expected = tshape[:2]
    if len(shape) != 2 or any(
        a is not None and b is not None and a != b
        for a, b in zip(shape, expected)
    ):
        raise ValueError(
            f"`{name}` must have shape (B, N) = {format_shape(expected)} matching "
            f"`{tokens_name}` {format_shape(tshape)}; received {format_shape(shape)}."
        )
    return mask
