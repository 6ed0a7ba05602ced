"""Phrase grounding on real data in its published layouts: Flickr30k Entities and RefCOCO/+/g.

Each item is a phrase of a caption with the boxes of what it names; its map is the
mean of its words' maps (`vlzoo.evaluation.grounding.word_maps`, the family's own
alignment, the caption given whole), scored by the pointing game and the mass
inside against the boxes' coverage of the patches (`ImagePreprocessor.region_mask`:
the boxes after the same resize and centre crop as the pixels), with chance, the
boxes' share of the crop, beside them.

* `flickr30k_entities(root, split="test")`: Plummer et al. (2015)'s
  `Sentences/<id>.txt` (phrases marked `[/EN#<phrase id>/<type> words]`),
  `Annotations/<id>.xml` (PASCAL VOC boxes named by phrase id) and `<split>.txt`;
  images `flickr30k-images/<id>.jpg` (or `images=`). A phrase's boxes are all the
  boxes of its id (the pointing game as its papers report it: a hit inside any);
  phrases without a box (scene, not visual) are left out. Groups: the phrase types.
* `refcoco(root, dataset="refcoco", split="val")`: the `refer` layout of Yu et al.
  (2016) / Mao et al. (2016): `<dataset>/refs(<split_by>).p` (unc for RefCOCO and
  RefCOCO+, umd for RefCOCOg) and `<dataset>/instances.json` (COCO boxes
  `[x, y, w, h]`); images `images/mscoco/images/train2014/` (or `images=`). Each
  expression is one phrase, all its words, with its referent's box. Groups: the
  referents' COCO categories.

`evaluate_phrase_grounding(model, benchmark)` returns a record with `pointing`,
`mass` and `chance` and the same per group.

Example:
>>> benchmark = flickr30k_entities("/data/flickr30k_entities")  # doctest: +SKIP
>>> evaluate_phrase_grounding(vlzoo.from_preset("sparc_shapes"), benchmark)["metrics"]  # doctest: +SKIP
"""

import dataclasses
import json
import os
import pickle
import re
import xml.etree.ElementTree as ElementTree

import numpy as np
from PIL import Image

from vlzoo.evaluation._common import batches
from vlzoo.evaluation.grounding import mass_inside, patch_coverage, pointing_game, word_maps

__all__ = ["GroundingBenchmark", "evaluate_phrase_grounding", "flickr30k_entities", "refcoco"]

SPLITS_BY = {"refcoco": "unc", "refcoco+": "unc", "refcocog": "umd"}
_PHRASE = re.compile(r"\[/EN#(\d+)((?:/[^\s\]]+)+) ([^\]]*)\]")


@dataclasses.dataclass
class GroundingBenchmark:
    """Phrases to ground: `images[i]` with `captions[i]`, and its `phrases[i]`, a list of
    `(first word, end word, boxes (K, 4) as (x0, y0, x1, y1), group)`."""

    name: str
    images: list
    captions: list
    phrases: list

    def __len__(self):
        return sum(len(p) for p in self.phrases)


def _check_dir(path, what):
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: not found; expected {what}.")
    return path


def _sentence_phrases(line):
    """`(caption, [(phrase id, first word, end word, type)])` of a marked Flickr30k Entities sentence."""
    words, phrases, position = [], [], 0
    for match in _PHRASE.finditer(line):
        words += line[position:match.start()].split()
        phrase_words = match.group(3).split()
        phrases.append((match.group(1), len(words), len(words) + len(phrase_words), match.group(2).split("/")[1]))
        words += phrase_words
        position = match.end()
    words += line[position:].split()
    return " ".join(words), phrases


def _annotation_boxes(path):
    """`{phrase id: [(x0, y0, x1, y1), ...]}` and `(height, width)` of a Flickr30k Entities annotation file."""
    root = ElementTree.parse(path).getroot()
    boxes = {}
    for item in root.iter("object"):
        box = item.find("bndbox")
        if box is None:
            continue
        corners = tuple(float(box.find(tag).text) for tag in ("xmin", "ymin", "xmax", "ymax"))
        for name in item.findall("name"):
            boxes.setdefault(name.text.strip(), []).append(corners)
    size = root.find("size")
    return boxes, (int(size.find("height").text), int(size.find("width").text))


def flickr30k_entities(root, split="test", images=None):
    """Flickr30k Entities' phrases with boxes, read from its published layout (see the module docstring).

    Args:
        root: the folder of `Annotations/`, `Sentences/` and `train.txt` / `val.txt` / `test.txt`.
        split: `"train"`, `"val"` or `"test"`.
        images: the folder of `<id>.jpg`; default `root/flickr30k-images`.

    Returns:
        a `GroundingBenchmark`, one caption per sentence.

    Raises:
        ValueError: `split` not `"train"`, `"val"` or `"test"`; FileNotFoundError: a missing folder
            or file (named).

    Example:
    >>> len(flickr30k_entities("flickr30k_entities", split="test").captions)  # doctest: +SKIP
    """
    if split not in ("train", "val", "test"):
        raise ValueError(f"`split` must be 'train', 'val' or 'test'; received {split!r}.")
    _check_dir(root, "Flickr30k Entities' folder of Annotations/, Sentences/ and <split>.txt")
    images = _check_dir(images or os.path.join(root, "flickr30k-images"), "the folder of the Flickr30k images")
    with open(os.path.join(root, f"{split}.txt")) as f:
        ids = [line.strip() for line in f if line.strip()]
    benchmark = GroundingBenchmark(f"flickr30k_entities/{split}", [], [], [])
    for image_id in ids:
        boxes, _ = _annotation_boxes(os.path.join(root, "Annotations", f"{image_id}.xml"))
        with open(os.path.join(root, "Sentences", f"{image_id}.txt"), encoding="utf-8") as f:
            for line in f:
                caption, phrases = _sentence_phrases(line.strip())
                kept = [(first, end, np.asarray(boxes[pid], np.float64), kind)
                        for pid, first, end, kind in phrases if pid in boxes and end > first]
                if kept:
                    benchmark.images.append(os.path.join(images, f"{image_id}.jpg"))
                    benchmark.captions.append(caption)
                    benchmark.phrases.append(kept)
    return benchmark


class _PlainData(pickle.Unpickler):
    """The refer pickles hold lists, dicts, strings and numbers only: nothing else is built."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refs file holds a {module}.{name}; expected plain data only.")


def refcoco(root, dataset="refcoco", split="val", images=None):
    """RefCOCO, RefCOCO+ or RefCOCOg expressions with their referent's box (the `refer` layout).

    Args:
        root: the folder holding `<dataset>/refs(<split_by>).p` and `<dataset>/instances.json`.
        dataset: `"refcoco"`, `"refcoco+"` or `"refcocog"` (split by unc, unc and umd).
        split: a split the refs file names: `"val"`, `"test"`, `"testA"`, `"testB"`, `"train"`.
        images: the folder of COCO's train2014 images; default `root/images/mscoco/images/train2014`.

    Returns:
        a `GroundingBenchmark`, one caption (the expression) per sentence.

    Raises:
        ValueError: an unknown `dataset`, or no expression in `split`; FileNotFoundError: a
            missing folder or file (named).

    Example:
    >>> refcoco("refer/data", "refcoco+", split="testA").name  # doctest: +SKIP
    'refcoco+/testA'
    """
    if dataset not in SPLITS_BY:
        raise ValueError(f"`dataset` must be one of {sorted(SPLITS_BY)}; received {dataset!r}.")
    folder = _check_dir(os.path.join(root, dataset), f"{dataset}/ with refs({SPLITS_BY[dataset]}).p")
    images = _check_dir(images or os.path.join(root, "images", "mscoco", "images", "train2014"),
                        "the folder of COCO's train2014 images")
    with open(os.path.join(folder, f"refs({SPLITS_BY[dataset]}).p"), "rb") as f:
        refs = _PlainData(f, encoding="latin1").load()
    with open(os.path.join(folder, "instances.json")) as f:
        instances = json.load(f)
    files = {image["id"]: image["file_name"] for image in instances["images"]}
    annotations = {item["id"]: item for item in instances["annotations"]}
    categories = {item["id"]: item["name"] for item in instances.get("categories", ())}
    chosen = [ref for ref in refs if ref["split"] == split]
    if not chosen:
        raise ValueError(f"{dataset}: no expressions in split {split!r}; its splits are "
                         f"{sorted({ref['split'] for ref in refs})}.")
    benchmark = GroundingBenchmark(f"{dataset}/{split}", [], [], [])
    for ref in chosen:
        x, y, w, h = annotations[ref["ann_id"]]["bbox"]
        box = np.array([[x, y, x + w, y + h]], np.float64)
        group = categories.get(ref.get("category_id"), "expression")
        for sentence in ref["sentences"]:
            caption = " ".join(sentence["sent"].split())
            if caption:
                benchmark.images.append(os.path.join(images, files[ref["image_id"]]))
                benchmark.captions.append(caption)
                benchmark.phrases.append([(0, len(caption.split()), box, group)])
    return benchmark


def evaluate_phrase_grounding(model, benchmark, batch_size=32, verbose=False, method=None):
    """The pointing game, mass inside and chance of every phrase of `benchmark`, overall and per group.

    Args:
        model: a vlzoo model with a word-to-patch map (`grounding.grounding_method`).
        benchmark: a `GroundingBenchmark` (`flickr30k_entities`, `refcoco`).
        batch_size: captions (with their images) per forward pass.
        verbose: a progress bar over the batches.
        method: the word maps, None for the family's own (`grounding.grounding_method`).

    Returns:
        `{"dataset", "task": "phrase_grounding", "method", "metrics": {"pointing", "mass", "chance",
        "phrases"}, "groups": {group: the same}}`.

    Example:
    >>> evaluate_phrase_grounding(model, refcoco("refer/data", "refcoco"))["metrics"]  # doctest: +SKIP
    """
    patch = model.vision.patch_size
    scores = []
    for start, stop in batches(len(benchmark.captions), batch_size, verbose):
        pictures = [np.asarray(Image.open(path).convert("RGB")) for path in benchmark.images[start:stop]]
        maps, method = word_maps(model, model.preprocessor(pictures), benchmark.captions[start:stop],
                                 batch_size=stop - start, method=method)
        for row, (picture, phrases) in enumerate(zip(pictures, benchmark.phrases[start:stop])):
            for first, end, boxes, group in phrases:
                coverage = patch_coverage(model.preprocessor.region_mask(boxes, picture.shape[:2]), patch)
                phrase_map = maps[row, first:end].mean(axis=0)
                scores.append((group, pointing_game(phrase_map, coverage), mass_inside(phrase_map, coverage),
                               coverage.mean()))

    def summary(rows):
        values = np.array([row[1:] for row in rows], np.float64)
        return {"pointing": float(values[:, 0].mean()), "mass": float(values[:, 1].mean()),
                "chance": float(values[:, 2].mean()), "phrases": float(len(rows))}

    groups = {group: summary([row for row in scores if row[0] == group]) for group in sorted({r[0] for r in scores})}
    return {"dataset": benchmark.name, "task": "phrase_grounding", "method": method, "metrics": summary(scores),
            "groups": groups}
