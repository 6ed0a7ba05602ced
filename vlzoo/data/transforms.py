"""Image transforms of the input pipelines (PIL + numpy, no TensorFlow).

- Evaluation: the model's own `ImagePreprocessor` (resize the shortest side, centre
  crop, normalise), so pipeline pixels equal `model.preprocessor(image)` exactly.
- Training: `RandomResizedCrop` as torchvision/open_clip (crop of a random area
  fraction in `scale` and aspect ratio in `ratio`, resized to the model's size with the
  preprocessor's interpolation), then the preprocessor's mean/std normalisation.

Example:
>>> from PIL import Image
>>> from vlzoo.preprocessing import ImagePreprocessor
>>> rng = np.random.default_rng(0)
>>> image = Image.new("RGB", (64, 48), (200, 100, 50))
>>> train_transform(image, ImagePreprocessor(32), (0.9, 1.0), (3 / 4, 4 / 3), rng).shape
(32, 32, 3)
"""

from __future__ import annotations

import math

import numpy as np


def output_size(preprocessor):
    """(height, width) of the images `preprocessor` makes."""
    size = preprocessor.image_size
    return (size, size) if isinstance(size, int) else tuple(size)


def check_preprocessor(preprocessor):
    """TypeError unless `preprocessor` is an `ImagePreprocessor`-like object."""
    missing = [
        name
        for name in ("image_size", "mean", "std", "interpolation")
        if not hasattr(preprocessor, name)
    ]
    if missing or not callable(preprocessor):
        raise TypeError(
            "`preprocessor` must be a vlzoo `ImagePreprocessor` (e.g. `model.preprocessor`): "
            f"callable with `image_size`, `mean`, `std` and `interpolation`; received "
            f"{type(preprocessor).__name__}" + (f" without {missing}" if missing else "") + "."
        )


def check_crop_range(value, name, upper=None):
    """(low, high) floats with 0 < low <= high (<= upper); ValueError naming `name`."""
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"`{name}` must be a pair (low, high); received {value!r}.") from None
    if not 0 < low <= high or (upper is not None and high > upper):
        bound = f" <= {upper}" if upper is not None else ""
        raise ValueError(f"`{name}` must satisfy 0 < low <= high{bound}; received {value!r}.")
    return low, high


def random_resized_crop_box(height, width, scale, ratio, rng):
    """torchvision's `RandomResizedCrop.get_params`: `(top, left, h, w)` of the crop.

    Up to 10 tries of an area fraction uniform in `scale` and an aspect ratio
    (width / height) log-uniform in `ratio`; if none fits, the largest centred crop
    with its ratio clamped to `ratio`.
    """
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif in_ratio > ratio[1]:
        h, w = height, int(round(height * ratio[1]))
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


def _normalize(pixels, preprocessor):
    mean = np.asarray(preprocessor.mean, np.float32)
    std = np.asarray(preprocessor.std, np.float32)
    return (pixels - mean) / std


def train_transform(image, preprocessor, scale, ratio, rng):
    """Random resized crop + normalisation of one RGB `PIL.Image`.

    Args:
        image: RGB `PIL.Image`.
        preprocessor: gives the output size, interpolation, mean and std.
        scale: (low, high) area fraction of the crop.
        ratio: (low, high) aspect ratio (width / height) of the crop.
        rng: `numpy.random.Generator`.

    Returns:
        float32 `(H, W, 3)`: `(pixel / 255 - mean) / std`.
    """
    from PIL import Image

    top, left, h, w = random_resized_crop_box(image.height, image.width, scale, ratio, rng)
    out_h, out_w = output_size(preprocessor)
    resample = Image.BICUBIC if preprocessor.interpolation == "bicubic" else Image.BILINEAR
    crop = image.crop((left, top, left + w, top + h)).resize((out_w, out_h), resample)
    return _normalize(np.asarray(crop, np.float32) / np.float32(255.0), preprocessor)


def eval_transform(image, preprocessor):
    """`preprocessor(image)[0]`: float32 `(H, W, 3)` (resize, centre crop, normalise)."""
    return np.asarray(preprocessor(image)[0], np.float32)
