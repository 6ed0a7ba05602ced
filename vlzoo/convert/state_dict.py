"""Reading checkpoints: `{key: tensor}` state dicts from files or mappings.

- `load_state_dict(path)`: a `.pt`/`.pth`/`.bin` (torch) or `.safetensors`
  file; a training checkpoint's `"state_dict"` entry is unwrapped.
- `read_state_dict(path_or_state_dict)`: the same for a path or a mapping,
  with DDP / `torch.compile` key prefixes removed.

torch and safetensors are imported only when a file needs them.
"""

import os
import pathlib


def numpy_state_dict(state_dict):
    """A plain `{str key: value}` dict of a state dict (values become numpy when a rule reads them).

    Raises:
        TypeError: `state_dict` is not a mapping.
    """
    if not hasattr(state_dict, "items"):
        raise TypeError(f"`state_dict` must be a mapping of names to tensors; received {type(state_dict).__name__}.")
    return {str(k): v for k, v in state_dict.items()}


def strip_prefix(state_dict, prefixes=("module.", "_orig_mod.")):
    """Drops DDP/compile wrappers' key prefixes (`module.`, `_orig_mod.`) when every key has them.

    Nested wrappers are peeled in any order (`torch.compile` of a DDP model
    gives `_orig_mod.module.`).
    """
    stripped = True
    while stripped and state_dict:
        stripped = False
        for prefix in prefixes:
            if all(k.startswith(prefix) for k in state_dict):
                state_dict = {k[len(prefix):]: v for k, v in state_dict.items()}
                stripped = True
    return state_dict


def read_state_dict(path_or_state_dict):
    """`{key: tensor}` of a checkpoint file or mapping, training-checkpoint wrapper and prefixes removed.

    Args:
        path_or_state_dict: a `.pt`/`.pth`/`.bin`/`.safetensors` path, a bare
            state dict, or a training checkpoint `{"state_dict": ..., ...}`.

    Returns:
        `{str key: torch tensor or numpy array}`, `module.` and `_orig_mod.` prefixes removed.

    Raises:
        TypeError: neither a path nor a mapping; `load_state_dict`'s errors for a file.

    Example:
    >>> import numpy as np
    >>> read_state_dict({"module.logit_scale": np.zeros(())})
    {'logit_scale': array(0.)}
    """
    if isinstance(path_or_state_dict, (str, os.PathLike)):
        return strip_prefix(numpy_state_dict(load_state_dict(path_or_state_dict)))
    if not hasattr(path_or_state_dict, "items"):
        raise TypeError(
            "`path_or_state_dict` must be a checkpoint file path or a state dict mapping keys to tensors; "
            f"received {type(path_or_state_dict).__name__}."
        )
    state_dict = path_or_state_dict
    if "state_dict" in state_dict and hasattr(state_dict["state_dict"], "items"):
        state_dict = state_dict["state_dict"]
    return strip_prefix(numpy_state_dict(state_dict))


def load_state_dict(path, log=print, torchscript=True):
    """`{key: tensor}` from a .pt/.pth/.bin/.safetensors file (a training checkpoint's `state_dict` is unwrapped).

    Pickled files are read with torch's weights-only unpickler. `torchscript=True` also reads
    TorchScript archives (OpenAI's original checkpoints) with `torch.jit.load`; files from a
    download are read with `torchscript=False`, so nothing in them can run code.

    Raises:
        FileNotFoundError: `path` is missing.
        ValueError: a file that is not a state dict, or that the weights-only unpickler refuses
            (a TorchScript archive with `torchscript=False`).

    Example:
    >>> state_dict = load_state_dict("open_clip_model.safetensors")  # doctest: +SKIP
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Checkpoint file not found: {path}.")
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            from safetensors.numpy import load_file
        return dict(load_file(str(path)))
    import torch

    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as error:  # OpenAI's original checkpoints are TorchScript archives
        if not torchscript:
            raise ValueError(
                f"Could not read {path} with torch's weights-only unpickler (TorchScript archives are not "
                f"read from downloads): {error}"
            ) from error
        try:
            obj = torch.jit.load(str(path), map_location="cpu").state_dict()
        except Exception:
            raise ValueError(f"Could not read {path} as a torch state dict: {error}") from error
        log(f"{path.name}: TorchScript archive, read its state dict with torch.jit.load.")
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise ValueError(f"{path} does not hold a state dict (found {type(obj).__name__}).")
    return obj
