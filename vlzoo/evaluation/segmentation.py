"""Zero-shot semantic segmentation on PASCAL VOC 2012 with per-patch image embeddings.

SPARC's method (Bica et al., 2024, app. D.7, after PACL): each patch embedding
(`model.dense_image_embeddings`) is scored by cosine against the class prompts (SPARC: the
prompt-ensembled global text embeddings, `EmbeddingMean`; FILIP: per patch, the best cosine over a
prompt's real tokens averaged over the templates, `TokenSimilarityMean`), the patch-by-class map
is upsampled bilinearly to the label's size, and each pixel takes its best class. Only families
with per-patch embeddings qualify (`patch_families()`: FILIP, SPARC, TIPSv2, PE-Core); the others raise
`TypeError`.

`background=` chooses the convention (the numbers are not comparable across them): `"ignore"`
(VOC20, default: background pixels ignored, 20 object classes; SPARC's paper's), `"prompts"`
(VOC21: background scored by `background_names`' prompts) or a threshold `t` in (0, 1) (VOC21:
background where no object class's softmax probability reaches `t`). `candidates="present"`
restricts each image's pixels to its own ground-truth object classes (the paper's "given a text
label" protocol); `"all"` (default) is plain zero-shot segmentation.

Metrics (`segmentation_metrics`, mmseg's `IoUMetric`): areas summed over the whole dataset,
`IoU_c = I_c / U_c`, `mIoU` their mean over the classes with a non-zero union; also
`pixel_accuracy`, `mean_accuracy` and `mIoU_per_image` (each image's mean IoU over the classes of
its label, averaged over images). Fractions in [0, 1], not %. Protocol notes and how they map to
the paper's table: docs/evaluation.md, *Zero-shot semantic segmentation*.

Example:
>>> benchmark = voc2012("VOCdevkit/VOC2012")  # doctest: +SKIP
>>> evaluate_segmentation(vlzoo.from_preset("sparc_..."), benchmark, SIMPLE_TEMPLATES)["metrics"]  # doctest: +SKIP
{'mIoU': ..., 'pixel_accuracy': ..., 'mean_accuracy': ..., 'mIoU_per_image': ...}
"""

import dataclasses
import os

import numpy as np
from keras import ops
from PIL import Image

from vlzoo.data.labels import ImageFiles
from vlzoo.evaluation._common import batches, finite_numpy
from vlzoo.evaluation.templates import DEFAULT_TEMPLATES
from vlzoo.evaluation.zeroshot import zero_shot_classifier
from vlzoo.losses import l2_normalize
from vlzoo.models import get_family, registered_families
from vlzoo.preprocessing import ImagePreprocessor

__all__ = [
    "BACKGROUND_NAMES", "CANDIDATES", "VOC_CLASSES", "SegmentationBenchmark", "SegmentationMetrics",
    "evaluate_segmentation", "patch_families", "patch_embeddings", "segmentation_metrics", "voc2012",
]

# Indices 0-20 of the masks; the dataset's `diningtable`, `pottedplant`, `tvmonitor` written as words.
VOC_CLASSES = (
    "background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
    "dining table", "dog", "horse", "motorbike", "person", "potted plant", "sheep", "sofa", "train", "tv monitor",
)
IGNORE_INDEX = 255
# Stuff that fills VOC's background, each scored as a class with `background="prompts"`.
BACKGROUND_NAMES = ("background", "sky", "wall", "floor", "ground", "grass", "tree", "road", "water", "building")
CANDIDATES = ("all", "present")


@dataclasses.dataclass(frozen=True)
class SegmentationBenchmark:
    """Image paths, their label PNG paths (class indices, `ignore_index` = void) and the class names
    (index 0 the background), read from `source`."""

    name: str
    images: tuple
    masks: tuple
    class_names: tuple
    source: str
    ignore_index: int = IGNORE_INDEX


def voc2012(directory, split="val"):
    """PASCAL VOC 2012 segmentation from `VOCdevkit/VOC2012` (`ImageSets/Segmentation/<split>.txt`,
    `JPEGImages/<id>.jpg`, `SegmentationClass/<id>.png`); a missing file raises naming it."""
    source = os.path.join(directory, "ImageSets", "Segmentation", f"{split}.txt")
    if not os.path.isfile(source):
        raise FileNotFoundError(f"Benchmark file not found: {source} (expected VOCdevkit/VOC2012's layout).")
    with open(source, encoding="utf-8") as f:
        ids = [line.strip() for line in f if line.strip()]
    if not ids:
        raise ValueError(f"{source}: no image id.")
    images, masks = [], []
    for image_id in ids:
        for folder, ext, paths in (("JPEGImages", "jpg", images), ("SegmentationClass", "png", masks)):
            path = os.path.join(directory, folder, f"{image_id}.{ext}")
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{source}, entry {image_id}: file not found: {path}.")
            paths.append(path)
    return SegmentationBenchmark("voc2012", tuple(images), tuple(masks), VOC_CLASSES, source)


# ------------------------------------------------------------------------------------ metrics


class SegmentationMetrics:
    """Accumulates per-class areas over images, as mmseg's `IoUMetric`.

    Args:
        num_classes: `C`; labels and predictions lie in `[0, C)`.
        ignore_index: label value of the pixels left out (VOC's 255).

    Raises:
        ValueError: `num_classes` not a positive int; in `update`, maps of different shapes,
            not ints, or values outside `[0, C)` and `ignore_index`; in `result`, `class_names`
            not naming `C` classes, or no labelled pixel.

    Example:
    >>> metrics = SegmentationMetrics(2)
    >>> metrics.update(np.array([[0, 1]]), np.array([[0, 0]]))
    >>> metrics.result()["mIoU"]   # IoU 0.5 for class 0; class 1: union 1, IoU 0
    0.25
    """

    def __init__(self, num_classes, ignore_index=IGNORE_INDEX):
        if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
            raise ValueError(f"`num_classes` must be a positive int; received {num_classes!r}.")
        self.num_classes, self.ignore_index = int(num_classes), ignore_index
        self.intersection = np.zeros(self.num_classes, np.int64)
        self.predicted = np.zeros(self.num_classes, np.int64)
        self.labelled = np.zeros(self.num_classes, np.int64)
        self.image_ious = []

    def update(self, prediction, label, source="label"):
        """Adds one image: int `prediction` and `label` of the same `(H, W)` shape."""
        prediction, label = np.asarray(prediction), np.asarray(label)
        if prediction.shape != label.shape:
            raise ValueError(f"{source}: prediction {prediction.shape} and label {label.shape} differ in shape.")
        for name, values in (("prediction", prediction), ("label", label)):
            if not np.issubdtype(values.dtype, np.integer):
                raise ValueError(f"{source}: the {name} must hold ints; received {values.dtype}.")
        valid = label != self.ignore_index
        label, prediction = label[valid].astype(np.int64), prediction[valid].astype(np.int64)
        for name, values in (("label", label), ("prediction", prediction)):
            if values.size and (values.min() < 0 or values.max() >= self.num_classes):
                raise ValueError(f"{source}: {name} values must lie in [0, {self.num_classes}) or be "
                                 f"{self.ignore_index}; received values in [{values.min()}, {values.max()}].")
        areas = [np.bincount(x, minlength=self.num_classes) for x in (label[label == prediction], prediction, label)]
        self.intersection += areas[0]
        self.predicted += areas[1]
        self.labelled += areas[2]
        present = areas[2] > 0
        if present.any():
            union = areas[1] + areas[2] - areas[0]
            self.image_ious.append(float(np.mean(areas[0][present] / union[present])))

    def result(self, class_names=None):
        """`{"mIoU", "pixel_accuracy", "mean_accuracy", "mIoU_per_image", "per_class": {name: {"IoU",
        "accuracy"}}}`; a class with no labelled and no predicted pixel has `None` entries and is left
        out of the means."""
        names = list(class_names) if class_names is not None else [str(c) for c in range(self.num_classes)]
        if len(names) != self.num_classes:
            raise ValueError(f"`class_names` must name the {self.num_classes} classes; received {len(names)}.")
        if not self.labelled.sum():
            raise ValueError("No labelled pixel was seen (every pixel is ignored); the mIoU is undefined.")
        union = self.predicted + self.labelled - self.intersection
        with np.errstate(divide="ignore", invalid="ignore"):
            iou = np.where(union > 0, self.intersection / union, np.nan)
            accuracy = np.where(self.labelled > 0, self.intersection / self.labelled, np.nan)
        per_class = {name: {"IoU": None if np.isnan(i) else float(i), "accuracy": None if np.isnan(a) else float(a)}
                     for name, i, a in zip(names, iou, accuracy)}
        return {"mIoU": float(np.nanmean(iou)), "pixel_accuracy": float(self.intersection.sum() / self.labelled.sum()),
                "mean_accuracy": float(np.nanmean(accuracy)), "mIoU_per_image": float(np.mean(self.image_ious)),
                "per_class": per_class}


def _maps(maps):
    """A list of `(H, W)` maps from one map, an `(N, H, W)` array or a sequence of maps."""
    if isinstance(maps, np.ndarray):
        return [maps] if maps.ndim == 2 else list(maps)
    maps = list(maps)
    return [np.asarray(maps)] if maps and np.ndim(maps[0]) == 1 else maps


def segmentation_metrics(predictions, labels, num_classes, ignore_index=IGNORE_INDEX, class_names=None):
    """mIoU and pixel accuracies of predicted label maps, areas summed over the whole dataset.

    Args:
        predictions, labels: int maps, one `(H, W)` pair, `(N, H, W)` arrays, or sequences of `(H_i,
            W_i)` maps (sizes may differ between images, not within a pair).
        num_classes: `C`.
        ignore_index: label value left out of every area.
        class_names: names of the `per_class` entries (default `"0"`, `"1"`, ...).

    Returns:
        See `SegmentationMetrics.result`.

    Raises:
        ValueError: as `SegmentationMetrics`, or different numbers of predictions and labels.

    Example:
    >>> segmentation_metrics([[0, 0, 1, 1]], [[0, 255, 1, 0]], 2)["mIoU"]   # I = (1, 1), U = (2, 2)
    0.5
    """
    predictions, labels = _maps(predictions), _maps(labels)
    if len(predictions) != len(labels):
        raise ValueError(f"{len(predictions)} predictions for {len(labels)} labels.")
    metrics = SegmentationMetrics(num_classes, ignore_index)
    for index, (prediction, label) in enumerate(zip(predictions, labels)):
        metrics.update(prediction, label, source=f"image {index}")
    return metrics.result(class_names)


# ------------------------------------------------------------------------------ patch scores


def patch_families():
    """The registered families whose models give per-patch embeddings (`has_dense_embeddings`), sorted.

    >>> patch_families()  # doctest: +SKIP
    ('filip', 'pe_core', 'sparc', 'tipsv2')
    """
    return tuple(name for name in registered_families() if get_family(name).model_class.has_dense_embeddings)


def check_family(model):
    """Raises a `TypeError` naming the families that qualify unless `model` has per-patch embeddings."""
    if not model.has_dense_embeddings:
        raise TypeError(
            f"Zero-shot segmentation needs per-patch image embeddings; {type(model).__name__} models give only a "
            "global one. "
            f"Families that qualify: {', '.join(patch_families())} (`has_dense_embeddings`)."
        )


def patch_embeddings(model, images):
    """L2-normalised per-patch embeddings `(B, H / p, W / p, D)` of float `(B, H, W, 3)` pixels:
    `model.dense_image_embeddings` on the patch grid (`p` is `model.vision.patch_size`)."""
    check_family(model)
    patches = model.dense_image_embeddings(images)
    patch = model.vision.patch_size
    grid = (images.shape[1] // patch, images.shape[2] // patch)
    return ops.reshape(l2_normalize(patches), (-1,) + grid + (patches.shape[-1],))


def _patch_class_scores(patches, classes):
    """Cosine scores `(B, h, w, C)` of patches against a class representation of `zero_shot_classifier`."""
    if "tokens" in classes:  # FILIP: per patch, best real token of each prompt, mean over the K prompts
        tokens, mask = l2_normalize(classes["tokens"]), classes["mask"]
        per_class = []
        for c in range(tokens.shape[0]):
            similarity = ops.einsum("bhwd,ktd->bhwkt", patches, tokens[c])
            best = ops.max(ops.where(mask[c], similarity, -2.0), axis=-1)
            per_class.append(ops.mean(best, axis=-1))
        return ops.stack(per_class, axis=-1)
    return ops.einsum("bhwd,cd->bhwc", patches, ops.cast(classes["embeds"], patches.dtype))


# -------------------------------------------------------------------------------- evaluation


def _check_background(background):
    if background in ("ignore", "prompts"):
        return background
    if isinstance(background, (float, int)) and not isinstance(background, bool) and 0 < background < 1:
        return float(background)
    raise ValueError(f"`background` must be 'ignore', 'prompts' or a probability threshold in (0, 1); "
                     f"received {background!r}.")


def _read_label(path, image_path, num_classes, ignore_index):
    """The class-index map `(H, W)` of a palette (or greyscale) PNG; errors name the file."""
    try:
        with Image.open(path) as mask:
            mode, label = mask.mode, np.array(mask)
        with Image.open(image_path) as image:
            width, height = image.size
    except OSError as error:
        raise ValueError(f"{path}: cannot read the label or its image {image_path}: {error}") from None
    if mode not in ("P", "L"):
        raise ValueError(f"{path}: expected a palette ('P') or greyscale PNG of class indices; received mode {mode!r}.")
    if label.shape != (height, width):
        raise ValueError(f"{path}: label size {label.shape[1]}x{label.shape[0]} differs from its image "
                         f"{image_path} ({width}x{height}).")
    bad = (label >= num_classes) & (label != ignore_index)
    if bad.any():
        raise ValueError(f"{path}: label values must be class indices in [0, {num_classes}) or {ignore_index}; "
                         f"found {sorted(set(label[bad].tolist()))[:5]}.")
    return label.astype(np.int64)


def _pixel_scores(scores, size, num_objects, background, scale, allowed):
    """`(H, W, C')` pixel scores from patch scores `(h, w, C)`: the object classes (only the `allowed`
    ones, bool `(num_objects,)`, can win), after the background's column 0 unless it is ignored."""
    if not allowed.any():  # no candidate object: VOC21's pixels are all background
        return np.zeros(tuple(size) + (1 if background != "ignore" else num_objects,), np.float32)
    scores = ops.convert_to_numpy(ops.image.resize(scores[None], size, interpolation="bilinear"))[0]
    objects = np.where(allowed, scores[..., :num_objects], -np.inf)
    if background == "ignore":
        return objects
    if background == "prompts":
        return np.concatenate([scores[..., num_objects:].max(axis=-1, keepdims=True), objects], axis=-1)
    logits = scale * (objects - objects.max(axis=-1, keepdims=True))
    top = 1.0 / np.sum(np.exp(logits), axis=-1, keepdims=True)  # the largest softmax probability
    return np.concatenate([np.where(top < background, np.inf, -np.inf), objects], axis=-1)


def evaluate_segmentation(model, benchmark, templates=DEFAULT_TEMPLATES, background="ignore", candidates="all",
                          background_names=BACKGROUND_NAMES, batch_size=32, verbose=False):
    """Zero-shot semantic segmentation mIoU of a model with per-patch embeddings (FILIP, SPARC).

    Images are resized whole (no crop) to the model's input size, the patch scores upsampled
    bilinearly to each label's size; see the module docstring for the conventions.

    Args:
        model: a FILIP or SPARC model (`patch_families()`); others raise `TypeError`.
        benchmark: a `SegmentationBenchmark` (`voc2012(...)`); class 0 is the background.
        templates: prompt templates, e.g. `vlzoo.evaluation.SIMPLE_TEMPLATES`.
        background: `"ignore"` (VOC20, default), `"prompts"` or a threshold in (0, 1) (VOC21).
        candidates: `"all"` or `"present"` (each image's own object classes only).
        background_names: the background's prompts for `background="prompts"`.
        batch_size: images per forward pass.
        verbose: progress bars.

    Returns:
        `{"dataset": "voc2012/voc20" (or "/voc21", "+ /present"), "task": "zeroshot_segmentation",
        "metrics": {"mIoU", "pixel_accuracy", "mean_accuracy", "mIoU_per_image"},
        "groups": {class name: {"IoU", "accuracy"}}}`.

    Raises:
        TypeError: `model` has no per-patch embeddings.
        ValueError: a bad `background` or `candidates`, an unreadable or mismatched label PNG, or
            no labelled pixel at all.

    Example:
    >>> evaluate_segmentation(sparc, voc2012("VOCdevkit/VOC2012"), SIMPLE_TEMPLATES,
    ...                       background=0.5)["dataset"]  # doctest: +SKIP
    'voc2012/voc21'
    """
    check_family(model)
    background = _check_background(background)
    if candidates not in CANDIDATES:
        raise ValueError(f"`candidates` must be one of {CANDIDATES}; received {candidates!r}.")
    objects = list(benchmark.class_names[1:])
    extra = list(background_names) if background == "prompts" else []
    if background == "prompts" and not extra:
        raise ValueError("`background_names` must name at least one prompt for `background='prompts'`.")
    classifier = zero_shot_classifier(model, objects + extra, templates, verbose=verbose)
    names = objects if background == "ignore" else list(benchmark.class_names)
    offset = 0 if background == "ignore" else 1  # label value -> class index: l - 1 for VOC20
    scale = float(ops.convert_to_numpy(model.logit_scale_value())) if isinstance(background, float) else None
    reference = model.preprocessor
    resize = ImagePreprocessor(reference.image_size, reference.mean, reference.std, reference.interpolation,
                               crop="none")
    images = ImageFiles(benchmark.images, resize)
    metrics = SegmentationMetrics(len(names), benchmark.ignore_index)
    for start, stop in batches(len(benchmark.images), batch_size, verbose):
        patch_scores = finite_numpy(_patch_class_scores(patch_embeddings(model, images[start:stop]),
                                                        classifier.classes), "patch scores")
        for index, scores in zip(range(start, stop), patch_scores):
            label = _read_label(benchmark.masks[index], benchmark.images[index], len(benchmark.class_names),
                                benchmark.ignore_index)
            if offset == 0:
                label = np.where(label == 0, benchmark.ignore_index, label - 1)
                label[label == benchmark.ignore_index - 1] = benchmark.ignore_index
            allowed = np.ones(len(objects), bool)
            if candidates == "present":
                allowed = np.isin(np.arange(offset, len(objects) + offset), label)
            pixels = _pixel_scores(scores, label.shape, len(objects), background, scale, allowed)
            metrics.update(np.argmax(pixels, axis=-1), label, source=benchmark.masks[index])
    result = metrics.result(names)
    groups = result.pop("per_class")
    dataset = f"{benchmark.name}/{'voc20' if offset == 0 else 'voc21'}"
    dataset += "/present" if candidates == "present" else ""
    return {"dataset": dataset, "task": "zeroshot_segmentation", "metrics": result, "groups": groups}
