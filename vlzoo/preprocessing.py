"""Image preprocessing for vlzoo models: `ImagePreprocessor` (resize the shortest side,
bicubic, + centre crop + normalise, as open_clip's inference transform) and the CLIP
and SigLIP normalisation constants.

Backend-neutral: images may be numpy arrays, backend tensors or PIL images, and the
output is always a float32 numpy array. Runs eagerly in Python.

Example:
>>> pre = ImagePreprocessor(image_size=224)
>>> x = pre(np.zeros((480, 640, 3), np.uint8))
>>> x.shape, x.dtype
((1, 224, 224, 3), dtype('float32'))

`PIL` is imported lazily, on the first call.
"""

from __future__ import annotations

import math

import keras
import numpy as np

from vlzoo._arrays import to_numpy

__all__ = ["ImagePreprocessor", "NaFlexPreprocessor", "naflex_size", "CLIP_MEAN", "CLIP_STD", "SIGLIP_MEAN",
           "SIGLIP_STD"]

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
SIGLIP_MEAN = (0.5, 0.5, 0.5)
SIGLIP_STD = (0.5, 0.5, 0.5)

_FLOAT_TOLERANCE = 1e-3


@keras.saving.register_keras_serializable(package="vlzoo")
class ImagePreprocessor:
    """Resize, centre-crop and normalise images, as open_clip's inference transform.

    Per image: resize so the shortest side is `image_size` (long side
    `int(image_size * long / short)`, as torchvision), with PIL's antialiased bicubic
    filter; centre crop `image_size x image_size` (offsets rounded as torchvision);
    scale to [0, 1]; subtract `mean` and divide by `std`. With `crop="none"` the
    image is resized straight to `image_size x image_size` (aspect ratio not kept; as
    SigLIP / big_vision). uint8 images go through PIL in RGB mode, exactly like
    open_clip on a PIL image (the resized pixels are rounded to uint8); float images,
    assumed in [0, 1], are resized per channel in PIL's float mode (no rounding to
    uint8; horizontal then vertical pass, each clipped to [0, 1] as PIL clips uint8),
    so they differ from the uint8 path only by uint8 rounding (about one grey level).

    Args:
        image_size: output side `S` (int) or `(height, width)`.
        mean, std: per-channel normalisation (CLIP's by default; SigLIP uses 0.5).
        interpolation: `"bicubic"` or `"bilinear"`.
        crop: `"center"` or `"none"`.

    Call: `pre(images)` with `images` one image `(H, W, 3)`, a batch
    `(B, H, W, 3)`, or a list of images of different sizes (numpy arrays, backend
    tensors or PIL images). uint8 (or integer in [0, 255]) or float in [0, 1].
    Returns float32 numpy `(B, S, S, 3)` (`B = 1` for a single image).

    Raises:
        ValueError: a bad `image_size`, `mean`/`std` (3 values, `std > 0`), `interpolation` or
            `crop`; when called, images not `(H, W, 3)` (or a batch or list of them), empty, of
            another dtype than uint8 or float, non-finite, or out of range (uint8-like values
            in [0, 255], floats in [0, 1]).

    Example:
    >>> pre = ImagePreprocessor(224)
    >>> pre([np.zeros((300, 400, 3), np.uint8), np.ones((50, 60, 3), np.float32)]).shape
    (2, 224, 224, 3)
    """

    def __init__(
        self,
        image_size=224,
        mean=CLIP_MEAN,
        std=CLIP_STD,
        interpolation="bicubic",
        crop="center",
    ):
        if isinstance(image_size, (int, np.integer)) and not isinstance(
            image_size, bool
        ):
            size = (int(image_size), int(image_size))
        elif (
            isinstance(image_size, (list, tuple))
            and len(image_size) == 2
            and all(isinstance(s, (int, np.integer)) for s in image_size)
        ):
            size = tuple(int(s) for s in image_size)
        else:
            raise ValueError(
                f"`image_size` must be an int or (height, width); received {image_size!r}."
            )
        if min(size) < 1:
            raise ValueError(f"`image_size` must be positive; received {image_size!r}.")
        self.image_size = size[0] if size[0] == size[1] else size
        self._size = size
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        if len(self.mean) != 3 or len(self.std) != 3:
            raise ValueError("`mean` and `std` must have 3 values (RGB).")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"`std` must be positive; received {self.std}.")
        if interpolation not in ("bicubic", "bilinear"):
            raise ValueError(
                "`interpolation` must be 'bicubic' or 'bilinear'; received "
                f"{interpolation!r}."
            )
        if crop not in ("center", "none"):
            raise ValueError(f"`crop` must be 'center' or 'none'; received {crop!r}.")
        self.interpolation = interpolation
        self.crop = crop

    def get_config(self):
        return {
            "image_size": self.image_size
            if isinstance(self.image_size, int)
            else list(self.image_size),
            "mean": list(self.mean),
            "std": list(self.std),
            "interpolation": self.interpolation,
            "crop": self.crop,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        return (
            f"ImagePreprocessor(image_size={self.image_size}, mean={self.mean}, "
            f"std={self.std}, interpolation={self.interpolation!r}, crop={self.crop!r})"
        )

    # -- helpers -----------------------------------------------------------------------
    def _images_list(self, images):
        from PIL import Image

        if isinstance(images, Image.Image):
            return [images]
        if isinstance(images, (list, tuple)):
            if len(images) == 0:
                return []
            out = []
            for i, im in enumerate(images):
                if isinstance(im, Image.Image):
                    out.append(im)
                    continue
                arr = to_numpy(im)
                if arr.ndim != 3:
                    raise ValueError(
                        "`images` given as a list must hold (H, W, 3) images; "
                        f"element {i} has shape {arr.shape}."
                    )
                out.append(arr)
            return out
        arr = to_numpy(images)
        if arr.ndim == 3:
            return [arr]
        if arr.ndim == 4:
            return list(arr)
        raise ValueError(
            "`images` must be an image (H, W, 3), a batch (B, H, W, 3) or a list of "
            f"images; received shape {arr.shape}."
        )

    def _target_size(self, h, w):
        """(resize_h, resize_w) before cropping."""
        th, tw = self._size
        if self.crop == "none":
            return th, tw
        if th == tw:  # torchvision Resize(int): shortest side
            short, long = (w, h) if w <= h else (h, w)
            new_short, new_long = th, int(th * long / short)
            return (new_long, new_short) if w <= h else (new_short, new_long)
        scale = max(th / h, tw / w)  # cover the target, then crop
        return max(th, round(h * scale)), max(tw, round(w * scale))

    def region_mask(self, boxes, image_shape):
        """Where boxes of an original image land in its preprocessed pixels: float32 `(S, S)` coverage.

        Args:
            boxes: `(K, 4)` boxes `(x0, y0, x1, y1)` in the original image's pixels (the box
                covers `[x0, x1) x [y0, y1)`).
            image_shape: the original image's `(height, width)`.

        Returns:
            Each output pixel's share covered by the boxes (the largest over the boxes), after the
            same resize and centre crop as `__call__`; parts cropped away are dropped.

        Raises:
            ValueError: `boxes` not finite `(x0, y0, x1, y1)` with `x0 <= x1`, `y0 <= y1`.

        Example:
        >>> ImagePreprocessor(4, crop="none").region_mask([[0, 0, 8, 2]], (8, 8))[:, 0]  # the top row
        array([1., 0., 0., 0.], dtype=float32)
        """
        boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
        if not np.all(np.isfinite(boxes)) or np.any(boxes[:, 2:] < boxes[:, :2]):
            raise ValueError(f"`boxes` must be finite (x0, y0, x1, y1) with x0 <= x1 and y0 <= y1; received "
                             f"{boxes.tolist()}.")
        h, w = (int(v) for v in image_shape)
        rh, rw = self._target_size(h, w)
        th, tw = self._size
        top, left = (int(round((rh - th) / 2.0)), int(round((rw - tw) / 2.0))) if self.crop == "center" else (0, 0)
        mask = np.zeros((th, tw), np.float32)

        def cover(start, stop, count):  # each pixel's share of [start, stop)
            edges = np.arange(count, dtype=np.float64)
            return np.clip(np.minimum(stop, edges + 1) - np.maximum(start, edges), 0.0, 1.0)

        for x0, y0, x1, y1 in boxes:
            rows = cover(y0 * rh / h - top, y1 * rh / h - top, th)
            cols = cover(x0 * rw / w - left, x1 * rw / w - left, tw)
            mask = np.maximum(mask, np.outer(rows, cols).astype(np.float32))
        return mask

    def _one(self, image):
        from PIL import Image

        resample = Image.BICUBIC if self.interpolation == "bicubic" else Image.BILINEAR
        if isinstance(image, Image.Image):
            image = np.asarray(image.convert("RGB"))
        arr = image
        if arr.ndim != 3 or arr.shape[-1] != 3:
            raise ValueError(
                "`images` must have 3 (RGB) channels last: (H, W, 3) per image; "
                f"received an image of shape {arr.shape}."
            )
        h, w = arr.shape[:2]
        if h < 1 or w < 1:
            raise ValueError(f"`images` has an empty image of shape {arr.shape}.")
        rh, rw = self._target_size(h, w)
        kind = arr.dtype.kind
        if kind == "b":
            raise ValueError("`images` must be uint8 or float; received dtype bool.")
        if kind in ("u", "i"):
            if arr.dtype != np.uint8:
                lo, hi = arr.min(), arr.max()
                if lo < 0 or hi > 255:
                    raise ValueError(
                        "Integer `images` must be in [0, 255]; received values in "
                        f"[{lo}, {hi}]."
                    )
                arr = arr.astype(np.uint8)
            pil = Image.fromarray(np.ascontiguousarray(arr), mode="RGB")
            if (rw, rh) != pil.size:
                pil = pil.resize((rw, rh), resample)
            out = np.asarray(pil, dtype=np.float32) / np.float32(255.0)
        elif kind == "f":
            arr = arr.astype(np.float32)
            if not np.all(np.isfinite(arr)):
                raise ValueError("`images` contains non-finite (NaN or inf) pixels.")
            lo, hi = float(arr.min()), float(arr.max())
            if lo < -_FLOAT_TOLERANCE or hi > 1 + _FLOAT_TOLERANCE:
                raise ValueError(
                    "Float `images` must be in [0, 1] (uint8 images may be in "
                    f"[0, 255]); received values in [{lo:.4g}, {hi:.4g}]."
                )
            arr = np.clip(arr, 0.0, 1.0)
            # PIL resamples separably, horizontal pass first; for uint8 images each
            # pass clips to [0, 255]. Do the same passes in float mode with the same
            # clipping (only the uint8 rounding differs).
            for size in ((rw, h), (rw, rh)):
                if size != (arr.shape[1], arr.shape[0]):
                    chans = [
                        np.asarray(
                            Image.fromarray(
                                np.ascontiguousarray(arr[..., c]), mode="F"
                            ).resize(size, resample),
                            dtype=np.float32,
                        )
                        for c in range(3)
                    ]
                    arr = np.clip(np.stack(chans, axis=-1), 0.0, 1.0)
            out = arr
        else:
            raise ValueError(
                f"`images` must be uint8 or float; received dtype {arr.dtype}."
            )
        th, tw = self._size
        if self.crop == "center":
            top = int(round((rh - th) / 2.0))
            left = int(round((rw - tw) / 2.0))
            out = out[top : top + th, left : left + tw]
        mean = np.asarray(self.mean, np.float32)
        std = np.asarray(self.std, np.float32)
        return (out - mean) / std

    def __call__(self, images):
        """Preprocess `images`; returns float32 numpy `(B, S, S, 3)`."""
        items = self._images_list(images)
        th, tw = self._size
        if not items:
            return np.zeros((0, th, tw, 3), np.float32)
        return np.stack([self._one(im) for im in items]).astype(np.float32)


def naflex_size(height, width, patch_size, max_num_patches, eps=1e-5):
    """SigLIP 2's NaFlex resolution for an image: `(height, width)` in pixels, multiples of `patch_size`.

    The largest scale (found by bisection to `eps`, between `eps / 10` and
    100) at which the image, each side rounded up to a multiple of
    `patch_size` (at least one patch), has at most `max_num_patches`
    patches: the aspect ratio is kept up to that rounding (SigLIP 2's image
    processor, `get_image_size_for_max_num_patches` in transformers).

    Example:
    >>> naflex_size(480, 640, 16, 256)
    (224, 288)
    """
    def scaled(scale, size):
        return int(max(patch_size, math.ceil(size * scale / patch_size) * patch_size))

    low, high = eps / 10, 100.0
    while high - low >= eps:
        scale = (low + high) / 2
        if (scaled(scale, height) / patch_size) * (scaled(scale, width) / patch_size) <= max_num_patches:
            low = scale
        else:
            high = scale
    return scaled(low, height), scaled(low, width)


@keras.saving.register_keras_serializable(package="vlzoo")
class NaFlexPreprocessor:
    """SigLIP 2's NaFlex preprocessing: each image at its own aspect ratio, cut into patches, padded.

    Per image: resize to `naflex_size(H, W, patch_size, max_num_patches)`
    (bilinear, through `ImagePreprocessor` with `crop="none"`, so uint8 and
    float images are handled as there), normalise with `mean` and `std`, cut
    into `patch_size` patches in row-major order, each flattened in row,
    column, channel order, and pad with zero patches to `max_num_patches`.

    Args:
        patch_size: the model's patch side in pixels.
        max_num_patches: the patch budget N per image (SigLIP 2 uses 256,
            576, 1024, ...).
        mean, std: per-channel normalisation (SigLIP's 0.5 by default).

    Call: `pre(images)` with one image `(H, W, 3)`, a batch, or a list of
    images of different sizes (as `ImagePreprocessor`). Returns the dict
    `VisionTransformer` takes: `patches` float32 `(B, N, p * p * 3)`,
    `patch_mask` bool `(B, N)` and `spatial_shapes` int32 `(B, 2)` (each
    image's patch rows and columns).

    Raises:
        ValueError: `patch_size` or `max_num_patches` not a positive int; when called, images
            not `(H, W, 3)`.

    Example:
    >>> pre = NaFlexPreprocessor(patch_size=16, max_num_patches=256)
    >>> batch = pre([np.zeros((480, 640, 3), np.uint8), np.zeros((640, 480, 3), np.uint8)])
    >>> batch["spatial_shapes"].tolist()
    [[14, 18], [18, 14]]
    >>> model.encode_image(batch)["embeds"].shape  # (2, D)  # doctest: +SKIP
    """

    def __init__(self, patch_size=16, max_num_patches=256, mean=SIGLIP_MEAN, std=SIGLIP_STD):
        for name, value in (("patch_size", patch_size), ("max_num_patches", max_num_patches)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"`{name}` must be a positive int; received {value!r}.")
        self.patch_size = int(patch_size)
        self.max_num_patches = int(max_num_patches)
        self._normalise = ImagePreprocessor(self.patch_size, mean, std)  # checks mean and std
        self.mean, self.std = self._normalise.mean, self._normalise.std

    def get_config(self):
        return {"patch_size": self.patch_size, "max_num_patches": self.max_num_patches, "mean": list(self.mean),
                "std": list(self.std)}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        return (f"NaFlexPreprocessor(patch_size={self.patch_size}, max_num_patches={self.max_num_patches}, "
                f"mean={self.mean}, std={self.std})")

    def _patches(self, image):
        """`(patches (h * w, p * p * 3), (h, w))` of one image."""
        from PIL import Image

        array = np.asarray(image.convert("RGB")) if isinstance(image, Image.Image) else image
        if array.ndim != 3 or array.shape[-1] != 3:
            raise ValueError("`images` must have 3 (RGB) channels last: (H, W, 3) per image; received an image of "
                             f"shape {array.shape}.")
        size = naflex_size(array.shape[0], array.shape[1], self.patch_size, self.max_num_patches)
        resize = ImagePreprocessor(size, self.mean, self.std, interpolation="bilinear", crop="none")
        pixels = resize._one(array)
        p = self.patch_size
        rows, cols = size[0] // p, size[1] // p
        patches = pixels.reshape(rows, p, cols, p, 3).transpose(0, 2, 1, 3, 4).reshape(rows * cols, p * p * 3)
        return patches, (rows, cols)

    def __call__(self, images):
        """Preprocess `images` into a NaFlex batch (the dict described above)."""
        items = self._normalise._images_list(images)
        width = self.patch_size * self.patch_size * 3
        batch = {"patches": np.zeros((len(items), self.max_num_patches, width), np.float32),
                 "patch_mask": np.zeros((len(items), self.max_num_patches), bool),
                 "spatial_shapes": np.zeros((len(items), 2), np.int32)}
        for i, image in enumerate(items):
            patches, grid = self._patches(image)
            batch["patches"][i, : len(patches)] = patches
            batch["patch_mask"][i, : len(patches)] = True
            batch["spatial_shapes"][i] = grid
        return batch

