"""ImageNet-1k validation and its distribution-shift variants, read from their folder layouts.

Each reader returns a `vlzoo.evaluation.benchmarks.ClassificationBenchmark`
(image paths, int labels, class names, the directory), scored by
`evaluate_classification(model, benchmark, IMAGENET_TEMPLATES)`; the names are
clip_benchmark's dataset names.

* `imagenet(directory)` (`imagenet1k`): the ILSVRC-2012 validation images
  sorted into one folder per synset, `<wnid>/*.JPEG` (as torchvision's
  `ImageNet(split="val")` and the usual `valprep.sh` leave them).
* `imagenet_v2(directory)` (`imagenetv2`): ImageNetV2 (Recht et al., 2019), e.g.
  `imagenetv2-matched-frequency-format-val/`, one folder per class named by the
  class index, `0/` ... `999/`, holding `*.jpeg`. The label is the folder's
  number, not its position in a string sort (`10/` is class 10).
* `imagenet_sketch(directory)` (`imagenet_sketch`): ImageNet-Sketch (Wang et al.,
  2019), the `sketch/` folder of `ImageNet-Sketch.zip`, `<wnid>/*.JPEG`.
* `imagenet_a(directory)` / `imagenet_r(directory)` (`imagenet-a`, `imagenet-r`):
  ImageNet-A and ImageNet-R (Hendrycks et al., 2021), the `imagenet-a/` and
  `imagenet-r/` folders of their tar files, `<wnid>/*.jpg` and the archives'
  `README.txt`. They cover 200 classes each: label `j` is the `j`-th of
  `IMAGENET_A_WNIDS` / `IMAGENET_R_WNIDS` (sorted, so in 1k order) and the class
  names are the CLIP names of those 200 classes, as clip_benchmark scores them.

Labels come from the folder names, never from the folders found: the class
names are always the whole label set (1000, or the 200 of A and R), and a
missing or empty class folder leaves that class without images (the metrics
cover the images read, ranked against every class). A folder that is no
class of the set, a file that is not an image (`IMAGE_EXTENSIONS`, any case)
or a folder inside a class folder is an error naming it, as is a directory
without any image.

The class lists ship in `imagenet_classes.json` next to this module:
`IMAGENET_WNIDS`, the 1000 ILSVRC-2012 WordNet ids in index order (sorted);
`IMAGENET_CLASSNAMES`, the 1000 names of CLIP's prompt-engineering notebook
(also open_clip's and clip_benchmark's); and the 200-wnid subsets
`IMAGENET_A_WNIDS`, `IMAGENET_R_WNIDS` of the benchmarks' own repositories.

Example:
>>> benchmark = imagenet_v2("imagenetv2-matched-frequency-format-val")  # doctest: +SKIP
>>> len(benchmark.images), len(benchmark.class_names)  # doctest: +SKIP
(10000, 1000)
>>> evaluate_classification(model, benchmark, IMAGENET_TEMPLATES)["metrics"]  # doctest: +SKIP
{'acc1': ..., 'acc5': ..., 'mean_per_class_recall': ...}
"""

import os

import numpy as np

from vlzoo._paths import PACKAGE_ROOT
from vlzoo.evaluation.benchmarks import ClassificationBenchmark
from vlzoo.presets.files import read_json

CLASSES_FILE = PACKAGE_ROOT / "evaluation" / "imagenet_classes.json"
IMAGE_EXTENSIONS = (".jpeg", ".jpg", ".png")
README = "README.txt"  # at the top of the ImageNet-A and ImageNet-R archives

__all__ = [
    "IMAGENET_A_WNIDS", "IMAGENET_BENCHMARKS", "IMAGENET_CLASSNAMES", "IMAGENET_R_WNIDS", "IMAGENET_WNIDS",
    "IMAGE_EXTENSIONS", "imagenet", "imagenet_a", "imagenet_r", "imagenet_sketch", "imagenet_v2",
]


def _read_classes(path):
    document = read_json(path, "ImageNet class list")
    sizes = {"wnids": 1000, "class_names": 1000, "imagenet_a": 200, "imagenet_r": 200}
    lists = {key: tuple(document.get(key, ())) if isinstance(document, dict) else () for key in sizes}
    wrong = {key: len(value) for key, value in lists.items() if len(value) != sizes[key]}
    if wrong:
        raise ValueError(f"{path}: expected the list sizes {sizes}; received {wrong}.")
    return lists


_CLASSES = _read_classes(CLASSES_FILE)
IMAGENET_WNIDS = _CLASSES["wnids"]
IMAGENET_CLASSNAMES = _CLASSES["class_names"]
IMAGENET_A_WNIDS = _CLASSES["imagenet_a"]
IMAGENET_R_WNIDS = _CLASSES["imagenet_r"]


def _entries(directory):
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"Benchmark directory not found: {directory}.")
    return sorted(os.listdir(directory))


def _class_images(folder):
    """The image paths of one class folder, sorted; anything else in it is an error naming it."""
    paths = []
    for name in _entries(folder):
        path = os.path.join(folder, name)
        if os.path.isdir(path):
            raise ValueError(f"{path}: a folder inside a class folder; expected only images.")
        if not name.lower().endswith(IMAGE_EXTENSIONS):
            raise ValueError(f"{path}: not an image (expected one of {list(IMAGE_EXTENSIONS)}, in any case).")
        paths.append(path)
    return paths


def _read(name, directory, label_of, expected, ignored=()):
    """Reads `directory/<class folder>/<image>`; `label_of(folder)` is the folder's label or None."""
    paths, labels = [], []
    for entry in _entries(directory):
        path = os.path.join(directory, entry)
        if not os.path.isdir(path):
            if entry in ignored:
                continue
            raise ValueError(f"{path}: a file beside the class folders; {name} expects only {expected}.")
        label = label_of(entry)
        if label is None:
            raise ValueError(f"{directory}: folder {entry!r} is not a class of {name}; expected {expected}.")
        images = _class_images(path)
        paths += images
        labels += [label] * len(images)
    if not paths:
        raise ValueError(f"{directory}: no image in any class folder; {name} expects {expected}.")
    return paths, np.array(labels, np.int64)


def _synsets(name, directory, wnids, ignored=()):
    index = {wnid: i for i, wnid in enumerate(wnids)}
    expected = f"one folder per synset of its {len(wnids)} (WordNet ids such as {wnids[0]!r}) holding images"
    paths, labels = _read(name, directory, index.get, expected, ignored)
    names = dict(zip(IMAGENET_WNIDS, IMAGENET_CLASSNAMES))
    return ClassificationBenchmark(name, tuple(paths), labels, tuple(names[w] for w in wnids), str(directory))


def imagenet(directory):
    """ImageNet-1k validation (`imagenet1k`) from its folder-per-synset directory `<wnid>/*.JPEG`."""
    return _synsets("imagenet1k", directory, IMAGENET_WNIDS)


def imagenet_sketch(directory):
    """ImageNet-Sketch (`imagenet_sketch`) from the `sketch/` folder of its zip, `<wnid>/*.JPEG`."""
    return _synsets("imagenet_sketch", directory, IMAGENET_WNIDS)


def imagenet_a(directory):
    """ImageNet-A (`imagenet-a`), `<wnid>/*.jpg` over its 200 classes; labels index `IMAGENET_A_WNIDS`."""
    return _synsets("imagenet-a", directory, IMAGENET_A_WNIDS, ignored=(README,))


def imagenet_r(directory):
    """ImageNet-R (`imagenet-r`), `<wnid>/*.jpg` over its 200 classes; labels index `IMAGENET_R_WNIDS`."""
    return _synsets("imagenet-r", directory, IMAGENET_R_WNIDS, ignored=(README,))


def _class_index(folder):
    """ImageNetV2's folder name `str(index)` -> the index, or None for any other name (`010`, `1000`)."""
    return int(folder) if folder.isdecimal() and str(int(folder)) == folder and int(folder) < 1000 else None


def imagenet_v2(directory):
    """ImageNetV2 (`imagenetv2`), e.g. `imagenetv2-matched-frequency-format-val/`: class `k` in folder `k/`."""
    paths, labels = _read("imagenetv2", directory, _class_index,
                          "one folder per class named by its index, 0 to 999, holding images")
    return ClassificationBenchmark("imagenetv2", tuple(paths), labels, IMAGENET_CLASSNAMES, str(directory))


IMAGENET_BENCHMARKS = {
    "imagenet1k": imagenet, "imagenetv2": imagenet_v2, "imagenet_sketch": imagenet_sketch,
    "imagenet-a": imagenet_a, "imagenet-r": imagenet_r,
}
"""clip_benchmark's dataset name -> the reader of its directory."""
