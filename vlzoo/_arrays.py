"""Array conversion shared by the tokenizers, image preprocessing and the converters (a leaf module)."""

import numpy as np


def to_numpy(x):
    """A backend tensor, torch tensor, Keras variable or array-like -> numpy (no copy when possible).

    No backend is imported: torch tensors (bfloat16 and float8 widened to
    float32, which numpy lacks) and TensorFlow eager tensors are read through
    their own methods, JAX arrays and lists through `np.asarray`.
    """
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "path") and hasattr(x, "assign"):  # a Keras variable
        return to_numpy(x.value)
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch tensor or parameter
        tensor = x.detach().cpu()
        if str(getattr(tensor, "dtype", "")) in ("torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e5m2"):
            tensor = tensor.float()
        return tensor.numpy()
    if hasattr(x, "numpy") and callable(x.numpy):  # tf eager
        return np.asarray(x.numpy())
    return np.asarray(x)  # jax arrays, lists, scalars
