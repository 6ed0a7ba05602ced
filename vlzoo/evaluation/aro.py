"""ARO (Yuksekgonul et al., ICLR 2023): VG-Relation, VG-Attribution, COCO-Order, Flickr30k-Order.

Read from the layouts of the authors' repository (mertyg/vision-language-models-are-bows,
`dataset_zoo/aro_datasets.py`); nothing is downloaded. Every item is one image and its
captions, the true one first, scored by `evaluate_aro` with the `"caption"` rule of
`vlzoo.evaluation.selection` (the true caption must score above every other).

* `vg_relation(directory)` / `vg_attribution(directory)`: `visual_genome_relation.json` /
  `visual_genome_attribution.json`, a JSON list of `{"image_path", "bbox_x", "bbox_y",
  "bbox_w", "bbox_h", "true_caption", "false_caption"}` plus `relation_name` (VG-R) or
  `attributes` (VG-A, two strings), over `images/<image_path>`; each image is cropped to its
  box (x, y = top-left, w, h in pixels) when its batch is read. Groups: the relation, or
  `"<attribute 0>_<attribute 1>"` (a box past the image border reads black, as PIL crops; one
  that misses the image raises). `macro_acc` is the authors' macro accuracy: the mean
  group accuracy without the 157 relations of `SYMMETRIC_RELATIONS` (VG-R), or over the
  groups of at least `ATTRIBUTE_MIN_COUNT` = 25 items (VG-A); `acc` is over all items.
* `coco_order(directory)` / `flickr30k_order(directory)`: BLIP's `coco_karpathy_test.json` /
  `flickr30k_test.json` (a JSON list of `{"image", "caption": [str, ...]}`, `image` relative
  to the directory or to `images`), one item per caption: `pre_caption` of the caption and of its four
  `PERTURBATIONS`, seeded as the authors' `main_aro.py` seeds them (`seed=1`). `acc` is their
  Precision@1; the groups give the original against each perturbation alone.

Ties: the authors take an `argmax`, whose first index wins a tie: a tied VG item counts as
wrong (the false caption comes first there), a tied Order item as right. `ties="pessimistic"`
reproduces VG, `"optimistic"` Order, and the default `"expected"` (as `evaluate_selection`)
counts the expected value under a random order of tied scores. An Order perturbation can
leave the caption unchanged (one noun, one adjective, ...): its score then ties the
original's, so the paper's Precision@1 is the `"optimistic"` one.

The two noun/adjective perturbations need a part-of-speech tagger: spaCy's
`en_core_web_sm` when spaCy is installed (`spacy_tagger`), or any `tagger` callable from a
caption to `(token, Penn Treebank tag)` pairs. The trigram perturbations split words with
`split_words`, a Treebank-style tokenizer close to `nltk.word_tokenize` (pass
`word_tokenize=nltk.word_tokenize` for the authors' exact split).

`evaluate_aro` = `aro_metrics(benchmark, *aro_scores(model, benchmark))`, the scores kept
for reuse with another tie rule.

Example:
>>> benchmark = vg_relation("prerelease_bow")      # visual_genome_relation.json, images/  # doctest: +SKIP
>>> evaluate_aro(model, benchmark)["metrics"]  # doctest: +SKIP
{'acc': ..., 'macro_acc': ...}
"""

import dataclasses
import math
import os
import random
import re

import numpy as np

from vlzoo.data.labels import ImageFiles
from vlzoo.evaluation._common import entry_fields, entry_image
from vlzoo.evaluation.benchmarks import SelectionItem
from vlzoo.evaluation.selection import selection_metrics, selection_scores
from vlzoo.presets.files import read_json

try:  # optional: the authors' tagger for the noun/adjective perturbations
    import spacy
except ImportError:
    spacy = None

ATTRIBUTE_MIN_COUNT = 25
VG_KEYS = ("image_path", "bbox_x", "bbox_y", "bbox_w", "bbox_h", "true_caption", "false_caption")
PERTURBATIONS = ("shuffle_nouns_and_adj", "shuffle_allbut_nouns_and_adj", "shuffle_within_trigrams",
                 "shuffle_trigrams")
NOUN_TAGS = ("NN", "NNS", "NNP", "NNPS")
ADJECTIVE_TAGS = ("JJ", "JJR", "JJS")
ORDER_FILES = {"coco_order": "coco_karpathy_{}.json", "flickr30k_order": "flickr30k_{}.json"}
SPACY_HINT = "pip install spacy && python -m spacy download en_core_web_sm"

# The relations the authors leave out of VG-Relation's macro accuracy: the `symmetric` list of
# `notebooks/Replicate ARO! VG-Relation, VG-Attribution.ipynb` in mertyg/vision-language-models-are-bows
# (commit 81fdd20), in its order.
SYMMETRIC_RELATIONS = (
    "adjusting", "attached to", "between", "bigger than", "biting", "boarding", "brushing", "chewing",
    "cleaning", "climbing", "close to", "coming from", "coming out of", "contain", "crossing", "dragging",
    "draped over", "drinking", "drinking from", "driving", "driving down", "driving on", "eating from",
    "eating in", "enclosing", "exiting", "facing", "filled with", "floating in", "floating on", "flying",
    "flying above", "flying in", "flying over", "flying through", "full of", "going down", "going into",
    "going through", "grazing in", "growing in", "growing on", "guiding", "hanging from", "hanging in",
    "hanging off", "hanging over", "higher than", "holding onto", "hugging", "in between", "jumping off",
    "jumping on", "jumping over", "kept in", "larger than", "leading", "leaning over", "leaving", "licking",
    "longer than", "looking in", "looking into", "looking out", "looking over", "looking through",
    "lying next to", "lying on top of", "making", "mixed with", "mounted on", "moving", "on the back of",
    "on the edge of", "on the front of", "on the other side of", "opening", "painted on", "parked at",
    "parked beside", "parked by", "parked in", "parked in front of", "parked near", "parked next to",
    "perched on", "petting", "piled on", "playing", "playing in", "playing on", "playing with", "pouring",
    "reaching for", "reading", "reflected on", "riding on", "running in", "running on", "running through",
    "seen through", "sitting behind", "sitting beside", "sitting by", "sitting in front of", "sitting near",
    "sitting next to", "sitting under", "skiing down", "skiing on", "sleeping in", "sleeping on", "smiling at",
    "sniffing", "splashing", "sprinkled on", "stacked on", "standing against", "standing around",
    "standing behind", "standing beside", "standing in front of", "standing near", "standing next to",
    "staring at", "stuck in", "surrounding", "swimming in", "swinging", "talking to", "topped with", "touching",
    "traveling down", "traveling on", "tying", "typing on", "underneath", "wading in", "waiting for",
    "walking across", "walking by", "walking down", "walking next to", "walking through", "working in",
    "working on", "worn on", "wrapped around", "wrapped in", "by", "of", "near", "next to", "with", "beside",
    "on the side of", "around",
)

__all__ = [
    "ADJECTIVE_TAGS", "ATTRIBUTE_MIN_COUNT", "AROBenchmark", "CroppedImageFiles", "NOUN_TAGS", "PERTURBATIONS",
    "SYMMETRIC_RELATIONS", "TextShuffler", "aro_metrics", "aro_scores", "coco_order", "evaluate_aro",
    "flickr30k_order", "pre_caption", "spacy_tagger", "split_words", "vg_attribution", "vg_relation",
]


@dataclasses.dataclass(frozen=True)
class AROBenchmark:
    """An ARO benchmark: `SelectionItem`s (one image, the true caption first), the crop box
    `(x, y, w, h)` of each item's image (`boxes`, None: whole images), the groups left out of
    `macro_acc` (`excluded`), the fewest items a group needs to enter it (`min_count`; None:
    no macro accuracy), and the file read (`source`)."""

    name: str
    items: tuple
    boxes: tuple
    excluded: frozenset
    min_count: object
    source: str


class CroppedImageFiles(ImageFiles):
    """`ImageFiles` whose image `i` is cropped to `boxes[i]` = `(x, y, w, h)` pixels when read.

    As the authors' `PIL.Image.crop`, the part of a box past the image border reads black; a
    box that misses the image altogether raises a `ValueError` naming `sources[i]`.

    Example:
    >>> crops = CroppedImageFiles(["a.jpg"], [(10, 20, 64, 48)], model.preprocessor)  # doctest: +SKIP
    >>> crops[0:1].shape   # (1, H, W, 3): the preprocessed 64 x 48 crop  # doctest: +SKIP
    """

    def __init__(self, items, boxes, preprocessor, sources=None):
        super().__init__(items, preprocessor, sources)
        self.boxes = [tuple(box) for box in boxes]
        if len(self.boxes) != len(self.items):
            raise ValueError(f"`boxes` must hold one box per image; received {len(self.boxes)} boxes for "
                             f"{len(self.items)} images.")

    def _decode(self, index):
        image = super()._decode(index)
        x, y, w, h = self.boxes[index]
        if x >= image.width or y >= image.height or x + w <= 0 or y + h <= 0:
            raise ValueError(f"{self.sources[index]}: the box (x={x}, y={y}, w={w}, h={h}) lies outside the "
                             f"{image.width} x {image.height} image.")
        return image.crop((x, y, x + w, y + h))


# ------------------------------------------------------------------ Visual Genome


def _box(record, source, key):
    box = tuple(record[name] for name in ("bbox_x", "bbox_y", "bbox_w", "bbox_h"))
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box):
        raise ValueError(f"{source}, entry {key}: the box (bbox_x, bbox_y, bbox_w, bbox_h) must be finite "
                         f"numbers; received {box}.")
    if box[2] <= 0 or box[3] <= 0:
        raise ValueError(f"{source}, entry {key}: the box needs a positive width and height; received "
                         f"bbox_w={box[2]}, bbox_h={box[3]}.")
    return box


def _visual_genome(directory, filename, name, group_of, excluded, min_count):
    source = os.path.join(directory, filename)
    records = read_json(source, "Benchmark file")
    if not isinstance(records, list):
        raise ValueError(f"{source}: expected a list of entries; received {type(records).__name__}.")
    items, boxes = [], []
    for key, record in enumerate(records):
        path, *_, true_caption, false_caption = entry_fields(record, VG_KEYS, source, key)
        group = group_of(record, source, key)
        items.append(SelectionItem((entry_image(os.path.join(directory, "images", path), source, key),),
                                   (true_caption, false_caption), str(key), group))
        boxes.append(_box(record, source, key))
    return AROBenchmark(name, tuple(items), tuple(boxes), frozenset(excluded), min_count, source)


def _relation(record, source, key):
    return str(entry_fields(record, ("relation_name",), source, key)[0])


def _attributes(record, source, key):
    attributes = entry_fields(record, ("attributes",), source, key)[0]
    if not isinstance(attributes, (list, tuple)) or len(attributes) != 2:
        raise ValueError(f"{source}, entry {key}: `attributes` must be a list of 2 attributes; "
                         f"received {attributes!r}.")
    return f"{attributes[0]}_{attributes[1]}"


def vg_relation(directory):
    """VG-Relation (23,937 items in the release), from the directory holding
    `visual_genome_relation.json` and `images/`; grouped by `relation_name`."""
    return _visual_genome(directory, "visual_genome_relation.json", "vg_relation", _relation,
                          SYMMETRIC_RELATIONS, 1)


def vg_attribution(directory):
    """VG-Attribution (28,748 items in the release), from the directory holding
    `visual_genome_attribution.json` and `images/`; grouped by the attribute pair."""
    return _visual_genome(directory, "visual_genome_attribution.json", "vg_attribution", _attributes, (),
                          ATTRIBUTE_MIN_COUNT)


# ------------------------------------------------------------------ captions and their perturbations


def pre_caption(caption, max_words=30):
    """BLIP's caption cleaning, as ARO applies it: lowercase, `.!"()*#:;~` read as spaces,
    runs of whitespace collapsed, at most `max_words` words.

    >>> pre_caption('A "big" dog:  running!')
    'a big dog running'
    """
    caption = re.sub(r"\s{2,}", " ", re.sub(r"[.!\"()*#:;~]", " ", caption.lower()))
    words = caption.rstrip("\n").strip(" ").split(" ")
    return " ".join(words[:max_words])


_WORD = re.compile(r"\w+(?=n't\b)|n't\b|'(?:s|re|ve|ll|d|m)\b|\d+(?:[.,]\d+)+|\.\.\.|\w+(?:-\w+)*|[^\w\s]", re.I)


def split_words(text):
    """Words and punctuation marks, split Treebank style as `nltk.word_tokenize` splits a
    caption: punctuation apart, `n't` and `'s 're 've 'll 'd 'm` apart, numbers and hyphenated
    words kept whole. (nltk also rewrites `"` as two backquotes or two quotes, and keeps the
    period of an abbreviation its sentence splitter knows, such as `St.`, on its word.)

    >>> split_words("A man's dog isn't running, (really).")
    ['A', 'man', "'s", 'dog', 'is', "n't", 'running', ',', '(', 'really', ')', '.']
    """
    return _WORD.findall(text)


def spacy_tagger(name="en_core_web_sm"):
    """The authors' tagger: a callable from a caption to its spaCy `(token.text, token.tag_)` pairs.

    Raises:
        ImportError: spaCy or its `en_core_web_sm` model is not installed (naming the install
            command).

    Example:
    >>> spacy_tagger()("a red car")  # doctest: +SKIP
    [('a', 'DT'), ('red', 'JJ'), ('car', 'NN')]
    """
    if spacy is None:
        raise ImportError(f"The noun/adjective perturbations need a part-of-speech tagger: pass `tagger=` "
                          f"(a callable from a caption to (token, Penn Treebank tag) pairs) or install "
                          f"spaCy's: `{SPACY_HINT}`.")
    try:
        nlp = spacy.load(name)
    except OSError as error:
        raise ImportError(f"spaCy cannot load {name!r} ({error}); install it: `{SPACY_HINT}`.") from None
    return lambda caption: [(token.text, token.tag_) for token in nlp(caption)]


def _trigrams(words):
    return [list(words[start:start + 3]) for start in range(0, len(words), 3)]


class TextShuffler:
    """ARO's four caption perturbations, drawing from `np.random.RandomState(seed)` (noun and
    adjective shuffles) and `random.Random(seed)` (trigram shuffles), the generators the
    authors' `seed_all(seed)` seeds, called in the same order.

    Args:
        tagger: a callable from a caption to `(token, tag)` pairs with Penn Treebank tags
            (`NN`, `JJ`, ...); default: `spacy_tagger()`.
        word_tokenize: a callable from a caption to words, for the trigrams; default
            `split_words`.
        seed: the seed of both generators.

    Raises:
        ValueError: an unknown perturbation name, or a `tagger` that does not return
            `(token, tag)` pairs.

    Example:
    >>> shuffler = TextShuffler(tagger=my_tagger, seed=1)  # doctest: +SKIP
    >>> [shuffler.perturb(name, "a red car near a green tree") for name in PERTURBATIONS]  # doctest: +SKIP
    """

    def __init__(self, tagger=None, word_tokenize=None, seed=1):
        self.tagger = tagger if tagger is not None else spacy_tagger()
        self.word_tokenize = word_tokenize or split_words
        self.numpy_random, self.python_random = np.random.RandomState(seed), random.Random(seed)

    def _tagged(self, caption):
        pairs = [tuple(pair) for pair in self.tagger(caption)]
        if not all(len(pair) == 2 for pair in pairs):
            raise ValueError(f"`tagger` must return (token, tag) pairs; received {pairs!r:.120} for {caption!r}.")
        return np.array([token for token, _ in pairs]), [tag for _, tag in pairs]

    def shuffle_nouns_and_adj(self, caption):
        """Nouns permuted among themselves, then adjectives among themselves."""
        words, tags = self._tagged(caption)
        for kind in (NOUN_TAGS, ADJECTIVE_TAGS):
            where = [i for i, tag in enumerate(tags) if tag in kind]
            words[where] = self.numpy_random.permutation(words[where])
        return " ".join(words)

    def shuffle_allbut_nouns_and_adj(self, caption):
        """Every word but the nouns and adjectives permuted among themselves."""
        words, tags = self._tagged(caption)
        rest = np.array([tag not in NOUN_TAGS + ADJECTIVE_TAGS for tag in tags], bool)
        words[rest] = self.numpy_random.permutation(words[rest])
        return " ".join(words)

    def shuffle_within_trigrams(self, caption):
        """The words of each consecutive trigram permuted within it."""
        trigrams = _trigrams(self.word_tokenize(caption))
        for trigram in trigrams:
            self.python_random.shuffle(trigram)
        return " ".join(" ".join(trigram) for trigram in trigrams)

    def shuffle_trigrams(self, caption):
        """The consecutive trigrams permuted, each kept in order."""
        trigrams = _trigrams(self.word_tokenize(caption))
        self.python_random.shuffle(trigrams)
        return " ".join(" ".join(trigram) for trigram in trigrams)

    def perturb(self, name, caption):
        """The perturbation `name` (one of `PERTURBATIONS`) of `caption`.

        Raises:
            ValueError: `name` is not one of `PERTURBATIONS`.
        """
        if name not in PERTURBATIONS:
            raise ValueError(f"`name` must be one of {PERTURBATIONS}; received {name!r}.")
        return getattr(self, name)(caption)


def _order(directory, name, images, split, tagger, word_tokenize, seed, max_words):
    source = os.path.join(directory, ORDER_FILES[name].format(split))
    records = read_json(source, "Benchmark file")
    if not isinstance(records, list):
        raise ValueError(f"{source}: expected a list of entries; received {type(records).__name__}.")
    shuffler = TextShuffler(tagger, word_tokenize, seed)
    root = directory if images is None else images
    items = []
    for key, record in enumerate(records):
        image, captions = entry_fields(record, ("image", "caption"), source, key)
        if isinstance(captions, str) or not isinstance(captions, list) or not captions:
            raise ValueError(f"{source}, entry {key}: `caption` must be a non-empty list of captions; "
                             f"received {captions!r:.80}.")
        path = entry_image(os.path.join(root, image), source, key)
        for number, caption in enumerate(captions):
            if not isinstance(caption, str) or not caption.strip():
                raise ValueError(f"{source}, entry {key}, caption {number}: expected a non-empty string; "
                                 f"received {caption!r}.")
            options = [caption] + [shuffler.perturb(p, caption) for p in PERTURBATIONS]
            items.append(SelectionItem((path,), tuple(pre_caption(c, max_words) for c in options),
                                       f"{key}:{number}", name))
    return AROBenchmark(name, tuple(items), None, frozenset(), None, source)


def coco_order(directory, images=None, split="test", tagger=None, word_tokenize=None, seed=1, max_words=30):
    """COCO-Order from the directory holding `coco_karpathy_{split}.json` and the images it names
    (`val2014/...`; or under `images`). `tagger`, `word_tokenize`, `seed`: see `TextShuffler`."""
    return _order(directory, "coco_order", images, split, tagger, word_tokenize, seed, max_words)


def flickr30k_order(directory, images=None, split="test", tagger=None, word_tokenize=None, seed=1, max_words=30):
    """Flickr30k-Order from the directory holding `flickr30k_{split}.json` and the images it names
    (`flickr30k-images/...`; or under `images`). `tagger`, `word_tokenize`, `seed`: see `TextShuffler`."""
    return _order(directory, "flickr30k_order", images, split, tagger, word_tokenize, seed, max_words)


# ------------------------------------------------------------------ scoring


def aro_scores(model, benchmark, batch_size=16, verbose=False, **score_kwargs):
    """Every item's caption scores, `(i2t, t2i)`, float32 `(N, 1, n_captions)` each (the true
    caption first; `vlzoo.evaluation.selection.selection_scores` on the cropped images)."""
    items = benchmark.items
    paths, sources = [item.images[0] for item in items], [f"{benchmark.source}, entry {item.key}" for item in items]
    images = (ImageFiles(paths, model.preprocessor, sources) if benchmark.boxes is None
              else CroppedImageFiles(paths, benchmark.boxes, model.preprocessor, sources))
    return selection_scores(model, images, [item.captions for item in items], batch_size=batch_size,
                            verbose=verbose, **score_kwargs)


def aro_metrics(benchmark, i2t, t2i, ties="expected", symmetric=None):
    """The metrics and groups of `evaluate_aro` from the scores of `aro_scores`."""
    metric = lambda rows, cols=slice(None): selection_metrics(  # noqa: E731
        "caption", i2t[rows][:, :, cols], t2i[rows][:, :, cols], ties=ties, symmetric=symmetric)["acc"]
    everything = np.ones(len(benchmark.items), bool)
    metrics = {"acc": metric(everything)}
    if benchmark.min_count is None:
        return metrics, {name: {"acc": metric(everything, [0, c])} for c, name in enumerate(PERTURBATIONS, 1)}
    labels = np.array([item.group for item in benchmark.items])
    groups = {}
    for group in sorted(set(labels.tolist())):
        rows = labels == group
        groups[group] = {"acc": metric(rows), "count": int(rows.sum()),
                         "in_macro": group not in benchmark.excluded and int(rows.sum()) >= benchmark.min_count}
    macro = [values["acc"] for values in groups.values() if values["in_macro"]]
    metrics["macro_acc"] = float(np.mean(macro)) if macro else float("nan")
    return metrics, groups


def evaluate_aro(model, benchmark, batch_size=16, ties="expected", verbose=False, **score_kwargs):
    """Scores an `AROBenchmark` with `model`.

    Args:
        model: a `ContrastiveModel` (its `preprocessor` reads the images).
        benchmark: from `vg_relation`, `vg_attribution`, `coco_order` or `flickr30k_order`.
        batch_size: items per forward pass.
        ties: `"expected"`, `"pessimistic"` (the authors' VG rule) or `"optimistic"` (their
            Order rule); see the module docstring.
        verbose: a progress bar.
        **score_kwargs: passed to `model.score`.

    Returns:
        `{"dataset", "task": "image_caption_selection", "metrics": {"acc"[, "macro_acc"]},
        "groups": {...}}`: VG groups `{"acc", "count", "in_macro"}` per relation or attribute
        pair; Order groups `{"acc"}` per perturbation (the original against it alone).

    Example:
    >>> evaluate_aro(model, vg_relation("prerelease_bow"))["metrics"]  # doctest: +SKIP
    """
    i2t, t2i = aro_scores(model, benchmark, batch_size=batch_size, verbose=verbose, **score_kwargs)
    metrics, groups = aro_metrics(benchmark, i2t, t2i, ties=ties, symmetric=model.symmetric_score)
    return {"dataset": benchmark.name, "task": "image_caption_selection", "metrics": metrics, "groups": groups}
