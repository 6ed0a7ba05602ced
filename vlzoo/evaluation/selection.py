"""Image-caption selection: the right caption for an image, the right image for a caption.

The compositionality benchmarks (SugarCrepe, Winoground, MMVP-VLM) are sets of
small items: a few images and a few captions whose matches are known. Every item
of a benchmark has the same shape, `n_images x n_captions`, and the model's own
`score` gives two matrices per item, both `(n_images, n_captions)`:

* `i2t[a, c]`: caption `c` ranked for image `a` (`direction="i2t"` for FILIP);
* `t2i[a, c]`: image `a` ranked for caption `c` (`"t2i"`); the same matrix for
  the families whose score is symmetric.

Each benchmark kind is a conjunction of strict comparisons (the benchmarks' own
code compares with `>`):

* `"caption"` (SugarCrepe, one image, the true caption first): `acc` =
  `i2t[0, 0] > i2t[0, c]` for every other caption `c`.
* `"winoground"` (two images, two captions, caption `k` describes image `k`):
  `text` = `i2t[0, 0] > i2t[0, 1]` and `i2t[1, 1] > i2t[1, 0]`; `image` =
  `t2i[0, 0] > t2i[1, 0]` and `t2i[1, 1] > t2i[0, 1]`; `group` = both.
* `"mmvp"` (two images, two statements, statement `k` describes image `k`):
  `pair` = each statement picks its own image, Winoground's image test.

Ties: `"pessimistic"` counts a tied comparison as failed (the benchmarks' own
scripts), `"optimistic"` as passed, and `"expected"` (the default) gives the
expected value when tied scores are put in a uniformly random order: equal to
the pessimistic value whenever no compared scores tie (any real model), and
exactly the benchmark's chance level for a model that scores everything alike
(SugarCrepe 1/2; Winoground text and image 1/4, group 1/6; MMVP 1/4).

Example:
>>> i2t = np.array([[[0.9, 0.2]], [[0.1, 0.4]]])      # 2 SugarCrepe items
>>> selection_metrics("caption", i2t, i2t)
{'acc': 0.5}
"""

import itertools

import numpy as np

from vlzoo.evaluation._common import ALL_TIES, batches, check_ties, finite_numpy

KINDS = ("caption", "winoground", "mmvp")
SELECTION_TIES = ALL_TIES

__all__ = ["KINDS", "SELECTION_TIES", "selection_metrics", "selection_scores"]


def _conditions(kind, num_captions):
    """`{metric: [(matrix, (a, c), (a', c')), ...]}`: each metric is the conjunction of
    `matrix[a, c] > matrix[a', c']` (matrix 0: `i2t`, 1: `t2i`)."""
    image_test = [(1, (0, 0), (1, 0)), (1, (1, 1), (0, 1))]
    if kind == "caption":
        return {"acc": [(0, (0, 0), (0, c)) for c in range(1, num_captions)]}
    if kind == "winoground":
        text_test = [(0, (0, 0), (0, 1)), (0, (1, 1), (1, 0))]
        return {"text": text_test, "image": image_test, "group": text_test + image_test}
    if kind == "mmvp":
        return {"pair": image_test}
    raise ValueError(f"`kind` must be one of {KINDS}; received {kind!r}.")


def _holds(conditions, matrices, strict=True):
    for matrix, first, second in conditions:
        a, b = matrices[matrix][first], matrices[matrix][second]
        if not (a > b if strict else a >= b):
            return False
    return True


def _orderings(matrix):
    """Every way to break the ties of `matrix`: integer matrices of its ranks, one per ordering
    of each group of equal values (all orderings equally likely)."""
    flat = matrix.ravel()
    values, inverse = np.unique(flat, return_inverse=True)
    groups = [np.flatnonzero(inverse == v) for v in range(len(values))]
    for orders in itertools.product(*(itertools.permutations(group) for group in groups)):
        ranks = np.empty(flat.shape, np.int64)
        start = 0
        for order in orders:
            ranks[list(order)] = np.arange(start, start + len(order))
            start += len(order)
        yield ranks.reshape(matrix.shape)


def _expected(conditions, i2t, t2i, symmetric):
    """Mean of the conjunction over every tie-breaking of the two matrices (independently, or the
    same one when the score is symmetric)."""
    if symmetric:
        pairs = [(ranks, ranks) for ranks in _orderings(i2t)]
    else:
        pairs = list(itertools.product(list(_orderings(i2t)), list(_orderings(t2i))))
    return sum(_holds(conditions, pair) for pair in pairs) / len(pairs)


def selection_metrics(kind, i2t, t2i, ties="expected", symmetric=None):
    """The benchmark's metrics from per-item score matrices.

    Args:
        kind: `"caption"`, `"winoground"` or `"mmvp"` (see the module docstring).
        i2t: float `(N, n_images, n_captions)`: caption scores per image.
        t2i: float `(N, n_images, n_captions)`: image scores per caption (the same
            array for a symmetric score).
        ties: `"expected"` (default), `"pessimistic"` or `"optimistic"`.
        symmetric: whether `t2i` is `i2t` (one tie-breaking for both); None:
            when the arrays are equal.

    Returns:
        `{metric: fraction of items}` (`acc`; `text`, `image`, `group`; `pair`).

    Raises:
        ValueError: `i2t` and `t2i` not both `(N, n_images, n_captions)`, an unknown `kind`, a
            shape that does not fit `kind`, or a bad `ties`.

    Example:
    >>> i2t = np.array([[[0.9, 0.1]], [[0.2, 0.3]]])  # two items, one image, two captions
    >>> selection_metrics("caption", i2t, i2t)
    {'acc': 0.5}
    """
    check_ties(ties, SELECTION_TIES)
    i2t, t2i = finite_numpy(i2t, "i2t"), finite_numpy(t2i, "t2i")
    if i2t.ndim != 3 or t2i.shape != i2t.shape:
        raise ValueError(
            f"`i2t` and `t2i` must both have shape (N, n_images, n_captions); received {i2t.shape} and {t2i.shape}."
        )
    need = {"caption": (1, None), "winoground": (2, 2), "mmvp": (2, 2)}.get(kind)
    if need is None:
        raise ValueError(f"`kind` must be one of {KINDS}; received {kind!r}.")
    if i2t.shape[1] != need[0] or (need[1] is not None and i2t.shape[2] != need[1]) or i2t.shape[2] < 2:
        raise ValueError(
            f"A {kind!r} item has {need[0]} image(s) and {need[1] or '2 or more'} captions; "
            f"received scores of shape {i2t.shape}."
        )
    if symmetric is None:
        symmetric = bool(np.array_equal(i2t, t2i))
    metrics = {}
    for name, conditions in _conditions(kind, i2t.shape[2]).items():
        passed = []
        for item_i2t, item_t2i in zip(i2t, t2i):
            strict = _holds(conditions, (item_i2t, item_t2i))
            if ties == "pessimistic" or strict:
                passed.append(float(strict))
            elif ties == "optimistic":
                passed.append(float(_holds(conditions, (item_i2t, item_t2i), strict=False)))
            else:
                passed.append(_expected(conditions, item_i2t, item_t2i, symmetric))
        metrics[name] = sum(passed) / len(passed) if passed else float("nan")
    return metrics


def selection_scores(model, images, captions, batch_size=16, verbose=False, **score_kwargs):
    """Per-item `(i2t, t2i)` score matrices with the family's own `score`.

    Args:
        model: a `ContrastiveModel`.
        images: `N * n_images` preprocessed images, item by item (a float
            `(N * n_images, H, W, 3)` array or `vlzoo.data.labels.ImageFiles`).
        captions: `N` sequences of `n_captions` strings.
        batch_size: items per forward pass.
        verbose: a progress bar.
        **score_kwargs: passed to `model.score` (`slots=` for SPARO, ...).

    Returns:
        `(i2t, t2i)`, float32 numpy `(N, n_images, n_captions)` each.

    Raises:
        ValueError: items with different numbers of captions, or `images` not holding the same
            number of images for every item.

    Example:
    >>> i2t, t2i = selection_scores(model, pixels, [("a red circle", "a blue circle")])  # doctest: +SKIP
    >>> i2t.shape  # (items, images per item, captions per item)  # doctest: +SKIP
    (1, 1, 2)
    """
    captions = [list(item) for item in captions]
    counts = {len(item) for item in captions}
    if len(counts) != 1:
        raise ValueError(f"Every item must have the same number of captions; received {sorted(counts)}.")
    n_items, n_captions = len(captions), counts.pop()
    total = images.shape[0] if hasattr(images, "shape") else len(images)
    if n_items == 0 or total % n_items:
        raise ValueError(f"`images` must hold the same number of images for each of the {n_items} items; "
                         f"received {total} images.")
    n_images = total // n_items
    directions = ({"i2t": {}} if model.symmetric_score
                  else {"i2t": {"direction": "i2t"}, "t2i": {"direction": "t2i"}})
    parts = {name: [] for name in directions}
    for start, stop in batches(n_items, batch_size, verbose):
        image_embeds = model.encode_image(images[start * n_images:stop * n_images])
        text_embeds = model.encode_text([c for item in captions[start:stop] for c in item])
        b = stop - start
        for name, direction in directions.items():
            scores = finite_numpy(model.score(image_embeds, text_embeds, **direction, **score_kwargs), "scores")
            blocks = scores.reshape(b, n_images, b, n_captions)
            parts[name].append(blocks[np.arange(b), :, np.arange(b), :])
    i2t = np.concatenate(parts["i2t"]).astype(np.float32)
    return i2t, (np.concatenate(parts["t2i"]).astype(np.float32) if "t2i" in parts else i2t)
