"""Benchmarks read from their published on-disk layouts (nothing is downloaded).

Compositionality readers (`sugarcrepe`, `winoground`, `mmvp`) return `SelectionBenchmark`s,
scored by `evaluate_selection` with any family (`vlzoo.evaluation.selection`); `karpathy`
returns a `RetrievalBenchmark` for `evaluate_retrieval`; `cifar` and `image_folder` return a
`ClassificationBenchmark` for `evaluate_classification`. Each reader's docstring gives the
layout it reads. A malformed file (a missing key or image, a wrong row count) raises an error
naming the file and the entry: `FileNotFoundError` for a missing file or image, `ValueError`
otherwise.

Example:
>>> for benchmark in sugarcrepe("sugar-crepe/data", "coco/val2017"):  # doctest: +SKIP
...     print(benchmark.name, evaluate_selection(model, benchmark)["metrics"])
"""

import csv
import dataclasses
import json
import os
import pickle

import numpy as np

from vlzoo.data.labels import ImageFiles, folder_labels, read_classes_file
from vlzoo.evaluation._common import entry_fields, entry_image
from vlzoo.evaluation.retrieval import retrieval_recall
from vlzoo.evaluation.zeroshot import classification_metrics, zero_shot_classifier
from vlzoo.evaluation.selection import selection_metrics, selection_scores
from vlzoo.presets.files import read_json

SUGARCREPE_FILES = ("add_att", "add_obj", "replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
WINOGROUND_KEYS = ("id", "image_0", "image_1", "caption_0", "caption_1", "collapsed_tag")
MMVP_COLUMNS = ("Question ID", "Type", "Statement")
MMVP_IMAGES = "MLLM_VLM Images"

__all__ = [
    "ClassificationBenchmark", "RetrievalBenchmark", "SelectionBenchmark", "SelectionItem", "cifar",
    "evaluate_classification", "evaluate_retrieval", "evaluate_selection", "image_folder", "karpathy", "mmvp",
    "sugarcrepe",
    "winoground",
]


@dataclasses.dataclass(frozen=True)
class SelectionItem:
    """One item: its images (paths), its captions (the matching ones first, see the kind), its key in
    the source file and its group (a SugarCrepe file, a Winoground tag, an MMVP pattern)."""

    images: tuple
    captions: tuple
    key: str
    group: str


@dataclasses.dataclass(frozen=True)
class SelectionBenchmark:
    """A named list of items of one `kind` (`vlzoo.evaluation.selection.KINDS`), read from `source`."""

    name: str
    kind: str
    items: tuple
    source: str


@dataclasses.dataclass(frozen=True)
class RetrievalBenchmark:
    """Image paths, captions and `image_ids[j]`, the index of caption `j`'s image, read from `source`."""

    name: str
    images: tuple
    captions: tuple
    image_ids: tuple
    source: str


@dataclasses.dataclass(frozen=True)
class ClassificationBenchmark:
    """Images (uint8 `(N, H, W, 3)` or image paths), int `labels` `(N,)` and the class names, from `source`."""

    name: str
    images: object
    labels: np.ndarray
    class_names: tuple
    source: str


def sugarcrepe(data, images, files=SUGARCREPE_FILES):
    """SugarCrepe's seven benchmarks (or `files`), from its `data/` directory and COCO val2017 `images`.

    SugarCrepe (Hsieh et al., NeurIPS 2023 D&B): `data/` of the RAIVNLab/sugar-crepe repository,
    `<stem>.json` for each stem of `files` (`add_att`, `add_obj`, `replace_att`, `replace_obj`,
    `replace_rel`, `swap_att`, `swap_obj`), each `{"<index>": {"filename", "caption",
    "negative_caption"}}` (indices need not be contiguous), over `images/<filename>`.

    Returns:
        list of `SelectionBenchmark`, one per file, named `sugar_crepe/<stem>`, kind `"caption"`.

    Raises:
        FileNotFoundError: a missing file or image. ValueError: a malformed file or entry.

    Example:
    >>> [b.name for b in sugarcrepe("sugar-crepe/data", "coco/val2017", files=("swap_att",))]  # doctest: +SKIP
    ['sugar_crepe/swap_att']
    """
    benchmarks = []
    for stem in files:
        source = os.path.join(data, f"{stem}.json")
        records = read_json(source, "Benchmark file")
        if not isinstance(records, dict):
            raise ValueError(f"{source}: expected an object of entries; received {type(records).__name__}.")
        items = []
        for key, record in records.items():
            filename, caption, negative = entry_fields(record, ("filename", "caption", "negative_caption"), source, key)
            items.append(SelectionItem((entry_image(os.path.join(images, filename), source, key),),
                                       (caption, negative), str(key), stem))
        benchmarks.append(SelectionBenchmark(f"sugar_crepe/{stem}", "caption", tuple(items), source))
    return benchmarks


def winoground(data):
    """Winoground's 400 items, from the directory holding `examples.jsonl` and `images/`.

    Winoground (Thrush et al., CVPR 2022), the `facebook/winoground` dataset's `data/`:
    `examples.jsonl`, one object per line with `id`, `image_0`, `image_1`, `caption_0`,
    `caption_1` and `collapsed_tag` (others ignored), and `images/<image_k>.png`.

    Returns:
        a `SelectionBenchmark` named `winoground`, kind `"winoground"`, grouped by `collapsed_tag`.

    Raises:
        FileNotFoundError: a missing file or image. ValueError: a line that is not JSON, or an
            entry without those keys.

    Example:
    >>> len(winoground("winoground/data").items)  # doctest: +SKIP
    400
    """
    source = os.path.join(data, "examples.jsonl")
    if not os.path.isfile(source):
        raise FileNotFoundError(f"Benchmark file not found: {source}.")
    items = []
    with open(source, encoding="utf-8") as f:
        for line_number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{source}, line {line_number}: not valid JSON: {error}.") from None
            key = record.get("id", f"line {line_number}") if isinstance(record, dict) else f"line {line_number}"
            example, image_0, image_1, caption_0, caption_1, tag = entry_fields(record, WINOGROUND_KEYS, source, key)
            paths = tuple(entry_image(os.path.join(data, "images", f"{stem}.png"), source, key)
                          for stem in (image_0, image_1))
            items.append(SelectionItem(paths, (caption_0, caption_1), str(example), str(tag)))
    return SelectionBenchmark("winoground", "winoground", tuple(items), source)


def mmvp(data):
    """MMVP-VLM's pairs, from the directory holding `Questions.csv` and `MLLM_VLM Images/`.

    MMVP-VLM (Tong et al., CVPR 2024), the `MMVP/MMVP_VLM` dataset: `Questions.csv` (columns
    `Question ID`, `Type`, `Statement`; rows taken two at a time, the odd id describing the first
    image) and `MLLM_VLM Images/<Type>/<Question ID>.jpg`. Each statement is prompted as
    `"a photo of <statement>"`, as the benchmark's own script does.

    Returns:
        a `SelectionBenchmark` named `mmvp_vlm`, kind `"mmvp"`, grouped by `Type`.

    Raises:
        FileNotFoundError: a missing file or image. ValueError: missing columns, an odd row
            count, or a pair that is not an odd id and the next one.

    Example:
    >>> mmvp("MMVP_VLM").items[0].captions[0].startswith("a photo of ")  # doctest: +SKIP
    True
    """
    source = os.path.join(data, "Questions.csv")
    if not os.path.isfile(source):
        raise FileNotFoundError(f"Benchmark file not found: {source}.")
    with open(source, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if rows and not set(MMVP_COLUMNS) <= set(rows[0]):
        raise ValueError(f"{source}: expected the columns {list(MMVP_COLUMNS)}; received {list(rows[0])}.")
    if len(rows) % 2:
        raise ValueError(f"{source}: statements come in pairs; received {len(rows)} rows (an odd count).")
    items = []
    for first, second in zip(rows[::2], rows[1::2]):
        ids = []
        for row in (first, second):
            try:
                ids.append(int(row["Question ID"]))
            except ValueError:
                raise ValueError(f"{source}, entry {row['Question ID']!r}: `Question ID` is not an integer.") from None
        key = f"{ids[0]}-{ids[1]}"
        if ids[0] % 2 != 1 or ids[1] != ids[0] + 1:
            raise ValueError(f"{source}, entry {key}: a pair is an odd id and the next one; received {ids}.")
        folder = os.path.join(data, MMVP_IMAGES, first["Type"])  # both images under the first row's type
        paths = tuple(entry_image(os.path.join(folder, f"{i}.jpg"), source, key) for i in ids)
        items.append(SelectionItem(paths, tuple(f"a photo of {row['Statement']}" for row in (first, second)),
                                   key, first["Type"]))
    return SelectionBenchmark("mmvp_vlm", "mmvp", tuple(items), source)


def evaluate_selection(model, benchmark, batch_size=16, ties="expected", verbose=False, **score_kwargs):
    """Scores `benchmark` with `model`: its metrics overall and per group.

    Args:
        model: a `ContrastiveModel` (its `preprocessor` reads the images).
        benchmark: a `SelectionBenchmark`.
        batch_size: items per forward pass.
        ties: see `vlzoo.evaluation.selection`.
        verbose: a progress bar.
        **score_kwargs: passed to `model.score`.

    Returns:
        `{"dataset": name, "task": "image_caption_selection", "metrics": {...},
        "groups": {group: {...}}}`.

    Raises:
        ValueError: a bad `ties` or `batch_size`; FileNotFoundError for an unreadable image.

    Example:
    >>> evaluate_selection(model, winoground("winoground/data"))["metrics"]  # doctest: +SKIP
    {'text': ..., 'image': ..., 'group': ...}
    """
    items = benchmark.items
    images = ImageFiles([path for item in items for path in item.images], model.preprocessor)
    i2t, t2i = selection_scores(model, images, [item.captions for item in items], batch_size=batch_size,
                                verbose=verbose, **score_kwargs)
    symmetric = model.symmetric_score
    groups = {}
    for group in dict.fromkeys(item.group for item in items):
        rows = np.array([item.group == group for item in items])
        groups[group] = selection_metrics(benchmark.kind, i2t[rows], t2i[rows], ties=ties, symmetric=symmetric)
    return {"dataset": benchmark.name, "task": "image_caption_selection",
            "metrics": selection_metrics(benchmark.kind, i2t, t2i, ties=ties, symmetric=symmetric),
            "groups": groups}


def karpathy(path, images, split="test", name=None):
    """The `split` of a Karpathy split file (`dataset_coco.json` / `dataset_flickr30k.json`), every caption
    of every image; `name` defaults to the file's `dataset` entry (`coco`, `flickr30k`).

    The file is `{"images": [{"filename", "split", "sentences": [{"raw"}, ...]}]}`, COCO's entries
    also with `filepath` (e.g. `val2014`); images are `images/<filepath>/<filename>` (COCO) or
    `images/<filename>` (Flickr30k).

    Returns:
        a `RetrievalBenchmark`: image paths, captions, and the image index of each caption.

    Raises:
        FileNotFoundError: a missing file or image. ValueError: a malformed file or entry, an
            image without sentences, or no image in `split`.

    Example:
    >>> evaluate_retrieval(model, karpathy("dataset_flickr30k.json", "flickr30k-images"))  # doctest: +SKIP
    """
    document = read_json(path, "Benchmark file")
    if not isinstance(document, dict) or not isinstance(document.get("images"), list):
        raise ValueError(f"{path}: expected an object with an `images` list (Karpathy's split file).")
    paths, captions, image_ids = [], [], []
    for index, entry in enumerate(document["images"]):
        key = entry.get("imgid", index) if isinstance(entry, dict) else index
        filename, entry_split, sentences = entry_fields(entry, ("filename", "split", "sentences"), path, key)
        if entry_split != split:
            continue
        if not sentences:
            raise ValueError(f"{path}, entry {key}: no sentences.")
        paths.append(entry_image(os.path.join(images, entry.get("filepath", ""), filename), path, key))
        for number, sentence in enumerate(sentences):
            captions.append(entry_fields(sentence, ("raw",), path, f"{key}, sentence {number}")[0].strip())
            image_ids.append(len(paths) - 1)
    if not paths:
        raise ValueError(f"{path}: no image in split {split!r}.")
    return RetrievalBenchmark(name or f"{document.get('dataset', 'retrieval')}", tuple(paths), tuple(captions),
                              tuple(image_ids), path)


def evaluate_retrieval(model, benchmark, ks=(1, 5, 10), batch_size=64, ties="expected", verbose=False,
                       **score_kwargs):
    """Recall@K of `benchmark` in both directions, named as clip_benchmark names them.

    `image_retrieval_recall@K` is text -> image (over captions), `text_retrieval_recall@K` image ->
    text (over images: one of its captions in the top K); see `retrieval_recall`. Tied scores count
    their expected value under a random order by default (a constant model scores chance exactly);
    without ties every rule gives clip_benchmark's recall.

    Args:
        model, ks, batch_size, ties, verbose, **score_kwargs: as `retrieval_recall`.
        benchmark: a `RetrievalBenchmark`.

    Returns:
        `{"dataset": name, "task": "zeroshot_retrieval", "metrics": {...}}`.

    Raises:
        ValueError: `retrieval_recall`'s checks; FileNotFoundError for an unreadable image.

    Example:
    >>> evaluate_retrieval(model, benchmark, ks=(1,))["metrics"]  # doctest: +SKIP
    {'image_retrieval_recall@1': ..., 'text_retrieval_recall@1': ...}
    """
    images = ImageFiles(benchmark.images, model.preprocessor)
    recall = retrieval_recall(model, images, list(benchmark.captions), image_ids=list(benchmark.image_ids), ks=ks,
                              batch_size=batch_size, ties=ties, verbose=verbose, **score_kwargs)
    metrics = {}
    for name, value in recall.items():
        direction, k = name.split("_r@")
        metrics[f"{'image' if direction == 't2i' else 'text'}_retrieval_recall@{k}"] = value
    return {"dataset": benchmark.name, "task": "zeroshot_retrieval", "metrics": metrics}


def _unpickle(path):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Benchmark file not found: {path}.")
    with open(path, "rb") as f:
        try:
            return pickle.load(f, encoding="bytes")
        except (pickle.UnpicklingError, EOFError, ValueError) as error:
            raise ValueError(f"{path} is not a CIFAR python pickle: {error}.") from None


def _entry(batch, key, path):
    for name in (key, key.decode()):
        if name in batch:
            return batch[name]
    raise ValueError(f"{path}: missing key {key.decode()!r}.")


def cifar(directory, split="test"):
    """CIFAR-10 (`cifar-10-batches-py/`) or CIFAR-100 (`cifar-100-python/`) from its python pickles.

    CIFAR-10: `test_batch`, `data_batch_1..5` and `batches.meta`; CIFAR-100 (told apart by its
    `meta` file): `test`, `train` and `meta`. Each batch holds `data` uint8 `(N, 3072)`
    channel-major and `labels` / `fine_labels`; the meta file the class names `label_names` /
    `fine_label_names`, whose underscores are read as spaces (as CLIP's prompts write them).

    Returns:
        a `ClassificationBenchmark` of uint8 images `(N, 32, 32, 3)`, int64 labels and class names.

    Raises:
        FileNotFoundError: a missing pickle. ValueError: a file that is not a CIFAR pickle, a
            missing key, `data` not `(N, 3072)` with `N` labels, or labels outside the classes.

    Example:
    >>> cifar("cifar-10-batches-py").images.shape  # doctest: +SKIP
    (10000, 32, 32, 3)
    """
    hundred = os.path.isfile(os.path.join(directory, "meta"))
    if hundred:
        files, label_key, names_key = [split], b"fine_labels", b"fine_label_names"
        meta = os.path.join(directory, "meta")
    else:
        files = ["test_batch"] if split == "test" else [f"data_batch_{i}" for i in range(1, 6)]
        label_key, names_key, meta = b"labels", b"label_names", os.path.join(directory, "batches.meta")
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in _entry(_unpickle(meta), names_key, meta)]
    images, labels = [], []
    for name in files:
        path = os.path.join(directory, name)
        batch = _unpickle(path)
        data, batch_labels = np.asarray(_entry(batch, b"data", path)), np.asarray(_entry(batch, label_key, path))
        if data.ndim != 2 or data.shape[1] != 3072 or len(batch_labels) != len(data):
            raise ValueError(f"{path}: expected `data` (N, 3072) and N labels; received {data.shape} and "
                             f"{len(batch_labels)} labels.")
        if len(batch_labels) and (batch_labels.min() < 0 or batch_labels.max() >= len(names)):
            raise ValueError(f"{path}: labels must lie in [0, {len(names)}) ({meta} names {len(names)} classes).")
        images.append(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        labels.append(batch_labels)
    return ClassificationBenchmark("cifar100" if hundred else "cifar10", np.concatenate(images),
                                   np.concatenate(labels).astype(np.int64),
                                   tuple(n.replace("_", " ") for n in names), directory)


def image_folder(directory, classes=None, name="image_folder"):
    """Any image folder `<class>/**/<image>`: labels index the sorted class folders.

    Args:
        directory: the folder of class folders.
        classes: optional text file of the class names, one per line in the
            folders' sorted order (blank lines ignored); by default the folder
            names with underscores read as spaces.
        name: the dataset name the records carry.

    Returns:
        A `ClassificationBenchmark` of image paths.

    Raises:
        FileNotFoundError: `directory` or `classes` is missing. ValueError: no class folders, no
            images in them, or `classes` naming another number of classes than there are folders.

    Example:
    >>> benchmark = image_folder("flowers/test", classes="flowers/classnames.txt")  # doctest: +SKIP
    >>> evaluate_classification(model, benchmark, ["a photo of a {}, a type of flower."])  # doctest: +SKIP
    """
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"Benchmark directory not found: {directory}.")
    paths, folder_of, folders = folder_labels(directory)
    names = [folder.replace("_", " ") for folder in folders]
    if classes is not None:
        names = read_classes_file(classes)
        if len(names) != len(folders):
            raise ValueError(f"{classes}: {len(names)} class names for the {len(folders)} class folders of "
                             f"{directory} ({folders[0]!r} ... {folders[-1]!r}); expected one name per folder.")
    index = {folder: j for j, folder in enumerate(folders)}
    labels = np.array([index[folder] for folder in folder_of], np.int64)
    return ClassificationBenchmark(name, tuple(paths), labels, tuple(names), str(directory))


class _Pixels:
    """uint8 `(N, H, W, 3)` images preprocessed by `preprocessor` a slice at a time (as `ImageFiles`)."""

    def __init__(self, images, preprocessor):
        self.images, self.preprocessor = images, preprocessor
        self.shape = (len(images),) + tuple(preprocessor(images[:1]).shape[1:])

    def __getitem__(self, index):
        return self.preprocessor(self.images[index])


def evaluate_classification(model, benchmark, templates, ks=(1, 5), batch_size=64, verbose=False, **score_kwargs):
    """Zero-shot top-K accuracy and mean per-class recall, named as clip_benchmark names them.

    Args:
        model: a `ContrastiveModel`.
        benchmark: a `ClassificationBenchmark`.
        templates: prompt templates, e.g. `vlzoo.evaluation.IMAGENET_TEMPLATES`.
        ks: top-K accuracies to report.
        batch_size: images per forward pass.
        verbose: progress bars.
        **score_kwargs: passed to `model.score`.

    Returns:
        `{"dataset": name, "task": "zeroshot_classification", "metrics": {"acc1", "acc5",
        "mean_per_class_recall"}}` (`vlzoo.evaluation.zeroshot.classification_metrics`).

    Raises:
        ValueError, TypeError: `zero_shot_classifier`'s and `classification_metrics`' checks.

    Example:
    >>> evaluate_classification(model, cifar("cifar-10-batches-py"), SIMPLE_TEMPLATES)["metrics"]  # doctest: +SKIP
    {'acc1': ..., 'acc5': ..., 'mean_per_class_recall': ...}
    """
    images = benchmark.images
    images = (_Pixels(images, model.preprocessor) if isinstance(images, np.ndarray)
              else ImageFiles(images, model.preprocessor))
    classifier = zero_shot_classifier(model, benchmark.class_names, templates, verbose=verbose, **score_kwargs)
    scores = classifier.scores(images, batch_size=batch_size, verbose=verbose)
    return {"dataset": benchmark.name, "task": "zeroshot_classification",
            "metrics": classification_metrics(scores, benchmark.labels, ks)}
