"""Contractions of bfloat16 operands accumulated in float32, the same on every backend."""

import keras
from keras import ops


def float32_einsum(subscripts, *operands):
    """`ops.einsum(subscripts, *operands)` computed in float32; returns float32.

    Operands not already float32 are cast first, so every backend accumulates in float32 (as the
    towers' `Dense` products do; TensorFlow's bfloat16 einsum on some CPUs would not: figures in
    docs/precision.md). The caller casts the result back where it wants bfloat16.

    Args:
        subscripts: an einsum equation, e.g. `"ikw,kwd->ikd"`.
        *operands: tensors of any float dtype.

    Returns:
        The float32 contraction, shaped as `ops.einsum` would shape it.

    Example:
    >>> x = keras.ops.ones((2, 3, 8), dtype="bfloat16")
    >>> keras.backend.standardize_dtype(float32_einsum("ikw,kwd->ikd", x, keras.ops.ones((3, 8, 4))).dtype)
    'float32'
    """
    # Operands already float32 pass as they are: casting a variable would read it, and an abstract
    # build (`keras.StatelessScope` with symbolic inputs) must not allocate its weights.
    return ops.einsum(subscripts, *(x if keras.backend.standardize_dtype(x.dtype) == "float32"
                                    else ops.cast(x, "float32") for x in operands))
