"""Zero-shot classification with prompt templates, ensembled the way each family does it.

Every class name is written into `K` prompt templates; the model's
`prompt_ensembling` (see `vlzoo.models.ensembling`: CLIP's embedding mean by
default, FILIP's token-similarity mean, Llip's mean queries and targets)
turns the `K` prompts of each class into a class representation once, then
scores images against it.

Scores are on each family's scale (`model.score`'s logits: scaled cosines,
plus SigLIP's and Llip's bias), so `softmax` over classes gives CLIP-style
probabilities.

Example:
>>> model = vlzoo.from_preset("clip_tiny")  # doctest: +SKIP
>>> classifier = zero_shot_classifier(model, ["circle", "square"], SIMPLE_TEMPLATES)  # doctest: +SKIP
>>> tuple(classifier(images).shape)  # (B, C) scores  # doctest: +SKIP
(8, 2)
>>> zero_shot_accuracy(model, images, labels, ["circle", "square"], top_k=(1,))  # doctest: +SKIP
{'top1': 0.75}
"""

import numpy as np
from keras import ops

from vlzoo.evaluation._common import (
    batches, check_ks, check_positive_int, check_ties, concatenate, count_ahead, finite_numpy, hit_rates, num_rows,
    take,
)
from vlzoo.evaluation.templates import DEFAULT_TEMPLATES, build_prompts
from vlzoo.models.ensembling import (
    ClassTextsMethod, EmbeddingMean, EnsembleScoresMethod, Ensembling, TokenSimilarityMean,
)

__all__ = [
    "ClassTextsMethod", "EmbeddingMean", "EnsembleScoresMethod", "Ensembling", "TokenSimilarityMean",
    "ZeroShotClassifier", "classification_metrics", "zero_shot_accuracy", "zero_shot_classifier",
]


class ZeroShotClassifier:
    """Class representations built by `zero_shot_classifier`, and the scoring of images against them.

    Attributes:
        model: the model.
        class_names: the `C` class names.
        templates: the `K` templates.
        ensembling: the `Ensembling` used.
        classes: the class representation (leading axis `C`).
        score_kwargs: extra arguments of every score (e.g. SPARO's `slots`).
    """

    def __init__(self, model, class_names, templates, ensembling, classes, score_kwargs):
        self.model = model
        self.class_names = list(class_names)
        self.templates = tuple(templates)
        self.ensembling = ensembling
        self.classes = classes
        self.score_kwargs = score_kwargs

    @property
    def num_classes(self):
        return len(self.class_names)

    def __call__(self, images):
        """Scores of one batch, `(B, C)` float32 tensor; `images`: float `(B, H, W, 3)`."""
        return self.ensembling.score(self.model, images, self.classes, **self.score_kwargs)

    def _batch_scores(self, images, batch_size, verbose):
        for start, stop in batches(num_rows(images), batch_size, verbose):
            yield start, stop, finite_numpy(self(images[start:stop]), "zero-shot scores")

    def scores(self, images, batch_size=64, verbose=False):
        """Scores of every image, numpy float32 `(N, C)`, computed `batch_size` images at a time."""
        parts = [scores for _, _, scores in self._batch_scores(images, batch_size, verbose)]
        return np.concatenate(parts, axis=0) if parts else np.zeros((0, self.num_classes), np.float32)

    def accuracy(self, images, labels, top_k=(1, 5), batch_size=64, ties="pessimistic", verbose=False):
        """Top-k accuracies on labelled images.

        An image counts as correct at `k` when fewer than `k` other classes
        are ranked above its true class. `ties="pessimistic"` (default)
        ranks a class whose score equals the true class's above it, so an
        exact tie never counts as a hit at `k=1`; `"optimistic"` ranks it
        below. `k >= C` is always correct.

        Args:
            images: float `(N, H, W, 3)` preprocessed pixels.
            labels: int `(N,)` class indices in `[0, C)`.
            top_k: an int or a sequence of ints.
            batch_size: images per forward pass.
            ties: "pessimistic" or "optimistic".
            verbose: show a progress bar.

        Returns:
            `{"top1": float, "top5": float, ...}`, one entry per `k`.

        Raises:
            ValueError: `labels` not ints of shape `(N,)` in `[0, C)`, no images, a bad `top_k`
                or `ties`, or non-finite scores.

        Example:
        >>> classifier.accuracy(images, labels, top_k=(1,))  # doctest: +SKIP
        {'top1': 0.75}
        """
        ks, ties = check_ks(top_k, "top_k"), check_ties(ties)
        n = num_rows(images)
        labels = np.asarray(ops.convert_to_numpy(labels))
        if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(
                f"`labels` must be ints of shape (N,) = ({n},) matching `images`; "
                f"received dtype {labels.dtype}, shape {labels.shape}."
            )
        if n == 0:
            raise ValueError("`images` is empty; accuracy needs at least one image.")
        if labels.min() < 0 or labels.max() >= self.num_classes:
            raise ValueError(
                f"`labels` must lie in [0, {self.num_classes}) (C = {self.num_classes} class names); "
                f"received values in [{labels.min()}, {labels.max()}]."
            )
        ahead = np.empty((n,), np.int64)
        classes = np.arange(self.num_classes)
        for start, stop, scores in self._batch_scores(images, batch_size, verbose):
            ahead[start:stop] = count_ahead(scores, labels[start:stop, None] == classes, ties)
        return {f"top{k}": rate for k, rate in hit_rates(ahead, ks).items()}


def zero_shot_classifier(model, class_names, templates=DEFAULT_TEMPLATES, batch_size=256, verbose=False,
                         **score_kwargs):
    """Builds the zero-shot classifier of `model` with its family's prompt ensembling.

    Args:
        model: a `ContrastiveModel` (any family; see the module docstring for
            the dispatch).
        class_names: `C` class names.
        templates: `K` templates (strings with one `{}`, or callables
            `name -> str`), e.g. `IMAGENET_TEMPLATES`; default
            `("a photo of a {}.",)`.
        batch_size: prompts per text forward pass (rounded down to whole
            classes, at least one class of `K`).
        verbose: show a progress bar over the prompt batches.
        **score_kwargs: passed to every score, e.g. `slots=` for SPARO
            (restrict to chosen slots) or `temperature=` for Llip.

    Returns:
        A `ZeroShotClassifier`; `classifier(images)` gives `(B, C)` scores.

    Raises:
        ValueError, TypeError: `build_prompts`' checks (empty or non-string class names, bad
            templates); ValueError: `batch_size` not a positive int.

    Example:
    >>> classifier = zero_shot_classifier(sparo, names, IMAGENET_TEMPLATES,
    ...                                   slots=select_slots(sparo, ...))  # doctest: +SKIP
    >>> classifier.accuracy(images, labels)  # doctest: +SKIP
    {'top1': ..., 'top5': ...}
    """
    prompts = build_prompts(class_names, templates)
    per_batch = max(1, check_positive_int(batch_size, "batch_size") // len(templates))
    tokens = model.tokenizer(prompts)
    class_texts = {
        key: ops.reshape(value, (len(class_names), len(templates)) + tuple(value.shape[1:]))
        for key, value in tokens.items()
    }
    ensembling = model.prompt_ensembling
    parts = [
        ensembling.encode_classes(model, take(class_texts, start, stop))
        for start, stop in batches(len(class_names), per_batch, verbose)
    ]
    return ZeroShotClassifier(model, class_names, templates, ensembling, concatenate(parts), score_kwargs)


def zero_shot_accuracy(model, images, labels, class_names, templates=DEFAULT_TEMPLATES, top_k=(1, 5),
                       batch_size=64, ties="pessimistic", verbose=False, **score_kwargs):
    """Top-k zero-shot accuracy of `model` on labelled images.

    `zero_shot_classifier(model, class_names, templates, batch_size, verbose, **score_kwargs)`
    followed by its `accuracy(images, labels, top_k, batch_size, ties, verbose)`; the arguments
    are theirs (`images` float `(N, H, W, 3)` preprocessed pixels, `labels` int `(N,)` in
    `[0, C)`, `top_k` an int or ints, `(1, 5)` by default; `batch_size` counts images here and
    prompts when building the classifier).

    Returns:
        `{"top1": float, "top5": float}` (one entry per `k`).

    Raises:
        ValueError: as `zero_shot_classifier` and `ZeroShotClassifier.accuracy`; a bad `top_k` or
            `ties` before any prompt is encoded.

    Example:
    >>> zero_shot_accuracy(model, images, labels, ["cat", "dog"], SIMPLE_TEMPLATES,
    ...                    top_k=1)  # doctest: +SKIP
    {'top1': 0.5}
    """
    top_k, ties = check_ks(top_k, "top_k"), check_ties(ties)  # fail before encoding the prompts
    classifier = zero_shot_classifier(model, class_names, templates, batch_size, verbose, **score_kwargs)
    return classifier.accuracy(images, labels, top_k, batch_size, ties, verbose)


def classification_metrics(scores, labels, ks=(1, 5)):
    """Top-K accuracy (`acc1`, `acc5`, ...) and mean per-class recall from class scores.

    The metrics clip_benchmark reports: an image is a hit at `K` when its class
    is among its `K` best scores; the mean per-class recall is the mean over the
    classes present in `labels` of their images' top-1 hit rate (balanced
    accuracy). A class tied with the true one is put before or after it at
    random, and the expected hit is counted: with `a` classes scored above the
    true class and `t` equal to it, the hit at `K` is `clip((K - a) / (t + 1), 0,
    1)`. Scores without ties give clip_benchmark's values; a constant model gets
    the chance level `K / C` exactly.

    Args:
        scores: float `(N, C)`.
        labels: int `(N,)` in `[0, C)`.
        ks: an int or a sequence of ints.

    Returns:
        `{"acc1": float, ..., "mean_per_class_recall": float}`, one `acc` entry per `K`.

    Raises:
        ValueError: mismatched or empty `scores` and `labels`, labels outside `[0, C)`,
            non-finite scores, or bad `ks`.

    Example:
    >>> classification_metrics(np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4]]), [0, 1, 1], ks=(1,))
    {'acc1': 0.666..., 'mean_per_class_recall': 0.75}
    """
    ks = check_ks(ks, "ks")
    scores = finite_numpy(scores, "scores")
    labels = np.asarray(labels)
    if (scores.ndim != 2 or labels.shape != scores.shape[:1] or not np.issubdtype(labels.dtype, np.integer)
            or (labels.size and (labels.min() < 0 or labels.max() >= scores.shape[1]))):
        raise ValueError(f"`scores` (N, C) and int `labels` (N,) in [0, C) must match; received scores "
                         f"{scores.shape} and labels {labels.shape} {labels.dtype}.")
    if not labels.size:
        raise ValueError("`scores` is empty; the metrics need at least one image.")
    true = scores[np.arange(len(labels)), labels][:, None]
    above = np.sum(scores > true, axis=1)
    tied = np.sum(scores == true, axis=1) - 1

    def hits(k):
        return np.clip((k - above) / (tied + 1), 0.0, 1.0)

    metrics = {f"acc{k}": float(np.mean(hits(k))) for k in ks}
    top1 = hits(1)
    metrics["mean_per_class_recall"] = float(np.mean([top1[labels == c].mean() for c in np.unique(labels)]))
    return metrics
