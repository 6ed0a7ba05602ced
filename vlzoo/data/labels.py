"""Labelled images and image-caption pairs read from disk, for evaluation (what `vlzoo zeroshot` and
`vlzoo retrieve` read).

- `ImageFiles`: image paths (or encoded bytes) that look like a preprocessed `(N, H, W, 3)` array,
  decoded a batch at a time when sliced.
- Class names: `split_classes`, `read_classes_file`.
- Labels: `folder_labels` (`DIR/<class>/*.jpg`, ImageNet style), `caption_file_labels` (a CSV /
  TSV / JSONL label column), `label_indices` (labels -> int indices into the class names).
- Pairs: `data_source`, `retrieval_pairs` and `count_pairs` of a caption file or tar shards.

Bad inputs raise `ValueError` or `FileNotFoundError` with a message naming the file or value.
"""

import csv
import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from vlzoo.data import records, transforms
from vlzoo.data.pipeline import resolve_source

FOLDER_IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif")
LABEL_KEYS = ("label", "class", "class_name", "classname")

__all__ = [
    "FOLDER_IMAGE_EXTENSIONS", "LABEL_KEYS", "ImageFiles", "caption_file_labels", "count_pairs",
    "data_source", "folder_labels", "label_indices", "read_classes_file", "retrieval_pairs",
    "split_classes",
]


class ImageFiles:
    """Preprocessed pixels of image files (or encoded image bytes), decoded only when sliced.

    Looks like a float32 `(N, H, W, 3)` array to `zero_shot_accuracy` and
    `retrieval_recall` (`shape`, `images[start:stop]`), so they read the images a
    batch at a time: memory is one batch, whatever `N`.

    Args:
        items: image paths or encoded image bytes.
        preprocessor: the preset's `ImagePreprocessor` (the evaluation transform).
        sources: names of the items for error messages (default: the paths).

    Raises:
        TypeError: an index that is neither an int nor a slice.
        FileNotFoundError, ValueError: when sliced, an unreadable or undecodable image (named by
            its source).

    Example:
    >>> images = ImageFiles(["a.jpg", "b.jpg"], model.preprocessor)  # doctest: +SKIP
    >>> images[0:2].shape  # doctest: +SKIP
    (2, 224, 224, 3)
    """

    def __init__(self, items, preprocessor, sources=None):
        self.items = list(items)
        self.sources = list(sources) if sources is not None else [str(item) for item in self.items]
        self.preprocessor = preprocessor
        self.shape = (len(self.items),) + tuple(transforms.output_size(preprocessor)) + (3,)
        self.dtype = np.dtype("float32")

    def __len__(self):
        return len(self.items)

    def _decode(self, index):
        item = self.items[index]
        try:
            if isinstance(item, (bytes, bytearray)):
                data = bytes(item)
            else:
                with open(item, "rb") as f:
                    data = f.read()
            return records.decode_image(data)
        except OSError as error:
            raise FileNotFoundError(f"{self.sources[index]}: cannot read image: {error}") from None
        except records.BadRecord as bad:
            raise ValueError(f"{self.sources[index]}: {bad}") from None

    def __getitem__(self, index):
        if isinstance(index, (int, np.integer)):
            return self[int(index):int(index) + 1][0]
        if not isinstance(index, slice):
            raise TypeError(f"ImageFiles supports ints and slices, not {type(index).__name__}.")
        indices = range(*index.indices(len(self.items)))
        if not indices:
            return np.zeros((0,) + self.shape[1:], np.float32)
        with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1, len(indices)))) as pool:
            images = list(pool.map(self._decode, indices))  # PIL releases the GIL while decoding
        return np.asarray(self.preprocessor(images), np.float32)


# ----------------------------------------------------------------------------- class names and templates


def split_classes(text):
    """Class names of a comma-separated list (`"red circle, blue square"`), blanks dropped."""
    return [name.strip() for name in text.split(",") if name.strip()]


def read_classes_file(path):
    """Class names of a text file, one a line (blank lines ignored); `FileNotFoundError` if missing."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"file not found: {path}")
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


# ----------------------------------------------------------------------------- labels


def folder_labels(root):
    """`(image paths, class-folder name of each, sorted folder names)` of `root/<class>/**/*.jpg`;
    ValueError when `root` has no class folder or they hold no image."""
    folders = sorted(name for name in os.listdir(root) if os.path.isdir(os.path.join(root, name)))
    if not folders:
        raise ValueError(f"{root} has no class sub-folders (expected DIR/<class>/*.jpg, or pass a caption file)")
    paths, labels = [], []
    for folder in folders:
        for directory, subdirs, files in os.walk(os.path.join(root, folder)):
            subdirs.sort()
            for name in sorted(files):
                if name.lower().endswith(FOLDER_IMAGE_EXTENSIONS):
                    paths.append(os.path.join(directory, name))
                    labels.append(folder)
    if not paths:
        raise ValueError(f"no images ({', '.join(FOLDER_IMAGE_EXTENSIONS)}) in the class folders of {root}")
    return paths, labels, folders


def _peek_keys(path):
    """Field names of a caption file's header (CSV/TSV) or first object (JSONL)."""
    with open(path, encoding="utf-8", newline="") as f:
        if path.lower().endswith(".jsonl"):
            for line in f:
                if line.strip():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        return []
                    return list(row) if isinstance(row, dict) else []
            return []
        return csv.DictReader(f, delimiter="\t" if path.lower().endswith(".tsv") else ",").fieldnames or []


def caption_file_labels(path, image_key=None, label_key=None, on_error="raise"):
    """`(image paths, label of each)` of a caption file whose `label_key` column is the class.

    `label_key` defaults to the first of `LABEL_KEYS` in the file, else its caption column. Raises
    as `read_caption_file`, and ValueError when no row is usable."""
    if label_key is None:
        keys = _peek_keys(path)
        label_key = next((k for k in LABEL_KEYS if k in keys), None)
    rows = records.read_caption_file(path, image_key=image_key, caption_key=label_key, on_error=on_error)
    if not rows:
        raise ValueError(f"{path} has no usable rows")
    return [r.image for r in rows], [r.caption.strip() for r in rows]


def label_indices(labels, class_names, folder_names, from_folders):
    """`(int labels (N,) in [0, C), note or None)`: labels matched by name, else by sorted folder order
    (`from_folders`, ImageNet convention) or read as integer indices (caption files); ValueError
    naming the labels that match no class name otherwise."""
    index = {name: i for i, name in enumerate(class_names)}
    if all(label in index for label in set(labels)):
        return np.array([index[label] for label in labels], np.int64), None
    if from_folders and len(folder_names) == len(class_names):
        order = {folder: i for i, folder in enumerate(folder_names)}
        note = (f"class folders matched to the class names by sorted order (ImageNet convention): "
                f"{folder_names[0]} -> {class_names[0]!r}, ...")
        return np.array([order[label] for label in labels], np.int64), note
    if not from_folders and all(label.isdigit() for label in set(labels)):
        ints = np.array([int(label) for label in labels], np.int64)
        if ints.max() < len(class_names):
            return ints, "integer labels read as indices into the class names"
    missing = sorted(set(labels) - set(index))
    where = "class folders" if from_folders else "labels"
    raise ValueError(f"{len(missing)} {where} are not among the {len(class_names)} class names: "
                     f"{', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}")


# ----------------------------------------------------------------------------- image-caption pairs


def data_source(data):
    """`("captions" | "shards", location)` of a caption file, a directory or tar shards
    (`vlzoo.data.resolve_source`); a bad `data` raises `ValueError` or `FileNotFoundError`."""
    try:
        return resolve_source(data)
    except TypeError as error:
        raise ValueError(str(error)) from None


def retrieval_pairs(data, image_key=None, caption_key=None, on_error="raise"):
    """`(image items, their sources, captions, image id of every caption (N,), DatasetStats)` of a
    caption file (rows naming the same image are captions of that image) or tar shards. ValueError
    when `data` holds no usable pair, or for an `image_key` with tar shards; else as
    `data_source` and the readers."""
    kind, location = data_source(data)
    stats = records.DatasetStats()
    if kind == "captions":
        rows = records.read_caption_file(location, image_key=image_key, caption_key=caption_key,
                                         on_error=on_error, stats=stats)
        first = {}
        items, sources, captions, image_ids = [], [], [], []
        for record in rows:
            if record.image not in first:
                first[record.image] = len(items)
                items.append(record.image)
                sources.append(f"{record.source} ({record.image})")
            captions.append(record.caption)
            image_ids.append(first[record.image])
    else:
        if image_key is not None:
            raise ValueError("an image key applies to caption files, not tar shards")
        items, sources, captions = [], [], []
        for shard in location:
            for record in records.read_tar_samples(shard, caption_key=caption_key, on_error=on_error, stats=stats):
                items.append(record.image)
                sources.append(record.source)
                captions.append(record.caption)
        image_ids = list(range(len(items)))
    if not items:
        raise ValueError(f"{data} holds no usable image-caption pairs ({stats.summary()})")
    return items, sources, captions, np.array(image_ids, np.int64), stats


def count_pairs(data, image_key=None, caption_key=None, on_error="raise"):
    """Records of a caption file (None for tar shards, whose length is only known by reading them)."""
    kind, location = data_source(data)
    if kind != "captions":
        return None
    return len(records.read_caption_file(location, image_key=image_key, caption_key=caption_key,
                                         on_error=on_error))
