"""Input checks shared by the public model methods.

Static shapes are checked everywhere (they are known while tracing). Values
(token ids in range, finite pixels) are checked by the user-facing calls
(`encode_image`, `encode_text`, `similarity`) when the input's values are
already on the host (numpy data, tensors on the CPU: `host_values`), never in
`call`: reading a tensor on an accelerator copies the batch to the host and
waits for the device, a round trip at every call (each `fit` step and each
`predict` batch on PyTorch, whose steps run eagerly).
"""

import numpy as np
from keras import ops

from vlzoo._arrays import on_the_cpu


def _static_shape(x):
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


def concrete_numpy(x):
    """Returns `x` as numpy when its values are available, else None."""
    if isinstance(x, (np.ndarray, list, tuple, int, float)):
        return np.asarray(x)
    try:
        return ops.convert_to_numpy(x)
    except Exception:  # a symbolic or traced tensor: values unknown.
        return None


def host_values(x):
    """`x` as numpy when its values are on the host (numpy data, a tensor on the CPU), else None.

    A tensor on an accelerator (or a traced or symbolic one) gives None: reading it would copy it
    to the host and wait for the device.
    """
    if isinstance(x, (np.ndarray, list, tuple, int, float)):
        return np.asarray(x)
    return concrete_numpy(x) if on_the_cpu(x) else None


# Tower arguments that must be positive integers (None allowed where a tower accepts it).
TOWER_SIZES = ("image_size", "patch_size", "hidden_dim", "num_layers", "num_heads", "intermediate_dim",
               "vocabulary_size", "sequence_length", "output_dim", "map_num_heads", "map_intermediate_dim")


def check_tower_config(config, tower):
    """Each size in `config` (the `vision` or `text` dict) is a positive int; the error names `tower[key]`."""
    for key in TOWER_SIZES:
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ValueError(f"`{tower}[{key!r}]` must be a positive integer; received {value!r}.")


def check_tower_outputs(outputs, keys, name):
    """A locked tower's cached outputs: a dict holding `keys`, each with a batch axis first."""
    if not isinstance(outputs, dict) or not set(keys) <= set(outputs):
        received = sorted(outputs) if isinstance(outputs, dict) else type(outputs).__name__
        raise ValueError(f"`{name}` must be a dict of the tower's outputs {list(keys)} "
                         f"(`vlzoo.training.cache_tower`); received {received}.")
    for key in keys:
        shape = _static_shape(outputs[key])
        if len(shape) < 2:
            raise ValueError(f"`{name}['{key}']` must have a batch axis and a feature axis; received shape {shape}.")


def _check_not_empty(shape, label, what):
    if shape and shape[0] == 0:
        raise ValueError(f"{label} is an empty batch (shape {shape}); pass at least one {what}.")


def check_images(images, num_channels=3, patch_size=None, image_size=None, name="images"):
    """Static shape of `images`: `(B, H, W, num_channels)` with `B > 0`, `H = W = image_size` when
    given, else `H` and `W` multiples of `patch_size` when given."""
    shape = _static_shape(images)
    if len(shape) != 4 or shape[-1] != num_channels:
        raise ValueError(
            f"`{name}` must be a float tensor of shape (B, H, W, {num_channels}), channels last; "
            f"received shape {shape}."
        )
    _check_not_empty(shape, f"`{name}`", "image")
    if image_size is not None and any(size is not None and size != image_size for size in shape[1:3]):
        raise ValueError(
            f"`{name}` must be {image_size} x {image_size} pixels, the image tower's resolution; received "
            f"shape {shape}. Resize with the model's preprocessor (`model.preprocessor(images)`), or set "
            "`dynamic_image_size=True` in the vision config to resize the position embedding instead."
        )
    if patch_size is not None:
        for axis, size in zip(("height", "width"), shape[1:3]):
            if size is not None and size % patch_size:
                raise ValueError(
                    f"`{name}` {axis} ({size}) must be a multiple of the patch size "
                    f"({patch_size}); received shape {shape}. Resize with the model's preprocessor."
                )


def check_patch_batch(batch, patch_size, num_channels=3, name="images"):
    """A NaFlex batch (`vlzoo.preprocessing.NaFlexPreprocessor`'s dict): `patches` `(B, N, p * p * C)`,
    `patch_mask` `(B, N)` and `spatial_shapes` `(B, 2)`, one batch size, each grid within `N` patches."""
    patches, mask, shapes = (_static_shape(batch[key]) for key in ("patches", "patch_mask", "spatial_shapes"))
    width = patch_size * patch_size * num_channels
    if len(patches) != 3 or patches[-1] != width:
        raise ValueError(f"`{name}['patches']` must have shape (B, N, {width}) (patches of {patch_size} x "
                         f"{patch_size} x {num_channels} pixels, flattened); received shape {patches}.")
    _check_not_empty(patches, f"`{name}['patches']`", "image")
    if tuple(mask) != tuple(patches[:2]):
        raise ValueError(f"`{name}['patch_mask']` must have shape (B, N) = {tuple(patches[:2])}, one flag per "
                         f"patch; received shape {mask}.")
    if len(shapes) != 2 or shapes[1] != 2 or shapes[0] != patches[0]:
        raise ValueError(f"`{name}['spatial_shapes']` must have shape (B, 2) = ({patches[0]}, 2), each image's "
                         f"patch rows and columns; received shape {shapes}.")
    grids, flags = concrete_numpy(batch["spatial_shapes"]), concrete_numpy(batch["patch_mask"])
    if grids is not None and flags is not None:
        counts = np.prod(grids.astype(np.int64), axis=-1)
        real = np.sum(flags.astype(bool), axis=-1)
        if np.any(grids < 1) or np.any(counts > patches[1]) or np.any(counts != real):
            raise ValueError(f"`{name}['spatial_shapes']` must give each image a grid of at least 1 x 1 whose "
                             f"patch count equals its `patch_mask` count and fits N = {patches[1]}; received "
                             f"grids {grids.tolist()} for mask counts {real.tolist()}.")


def check_images_values(images, name="images"):
    values = host_values(images)
    if values is None:
        return
    if not np.issubdtype(values.dtype, np.floating):
        raise TypeError(
            f"`{name}` must be float pixels (preprocessed); received dtype {values.dtype}. "
            "Use `model.preprocessor(images)` for uint8 images."
        )
    if not np.all(np.isfinite(values)):
        raise ValueError(f"`{name}` contains non-finite values (NaN or inf).")


def check_text(inputs, vocabulary_size, sequence_length, name="texts", values=True):
    """The tokenizer's dict: `token_ids` `(B, T)` with `B > 0` and `T <= sequence_length`, a
    `padding_mask` of the same shape, and (with `values`, when concrete) ids in the vocabulary."""
    if not isinstance(inputs, dict) or "token_ids" not in inputs:
        raise TypeError(
            f"`{name}` must be the tokenizer's dict with `token_ids` (B, T) and `padding_mask` "
            f"(B, T); received {type(inputs).__name__}."
        )
    ids = inputs["token_ids"]
    mask = inputs.get("padding_mask")
    shape = _static_shape(ids)
    if len(shape) != 2:
        raise ValueError(f"`token_ids` must have shape (B, T); received shape {shape}.")
    _check_not_empty(shape, f"`{name}['token_ids']`", "caption")
    if shape[1] is not None and shape[1] > sequence_length:
        raise ValueError(
            f"`token_ids` has {shape[1]} positions but the text tower's context length is "
            f"{sequence_length}; received shape {shape}."
        )
    if mask is not None and tuple(_static_shape(mask)) != shape:
        raise ValueError(
            f"`padding_mask` must have the shape of `token_ids` {shape}; "
            f"received {tuple(_static_shape(mask))}."
        )
    values = host_values(ids) if values else None
    if values is not None:
        if not np.issubdtype(values.dtype, np.integer):
            raise TypeError(f"`token_ids` must be integers; received dtype {values.dtype}.")
        if values.size and (values.min() < 0 or values.max() >= vocabulary_size):
            raise ValueError(
                f"`token_ids` must lie in [0, {vocabulary_size}); received values in "
                f"[{values.min()}, {values.max()}]."
            )


def check_batch_sizes(images, token_ids):
    b_img, b_txt = _static_shape(images)[0], _static_shape(token_ids)[0]
    if b_img is not None and b_txt is not None and b_img != b_txt:
        raise ValueError(
            f"`images` and `token_ids` must have the same batch size for paired training; "
            f"received {b_img} images and {b_txt} captions."
        )
