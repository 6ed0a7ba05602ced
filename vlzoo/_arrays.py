"""Array conversion shared by the tokenizers, image preprocessing and the converters, and where a tensor lives
(`on_the_cpu`); a leaf module."""

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


def on_the_cpu(x):
    """Whether a backend tensor lives in host memory: JAX's devices' platform, else its `device` name
    (PyTorch's "cpu", TensorFlow's ".../device:CPU:0"). False where that cannot be told (traced values)."""
    try:
        if callable(getattr(x, "devices", None)):  # a JAX array
            return all(device.platform == "cpu" for device in x.devices())
        return "cpu" in str(x.device).lower()
    except Exception:  # a traced or symbolic tensor
        return False
