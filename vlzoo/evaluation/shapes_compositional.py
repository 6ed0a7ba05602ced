"""Compositionality suite on synthetic shapes: SugarCrepe- and ARO-style hard negatives, offline.

Each type of `vlzoo.data.shapes_negatives.NEGATIVE_TYPES` is a set of held-out scenes, each with
its true caption and a caption false of it by construction. An example passes when the model's
own `score` ranks the true caption above the negative (the `"caption"` kind of
`vlzoo.evaluation.selection`, ties by its rule; chance 0.5 for every type).
`evaluate_negatives` scores one type, `evaluate` every type (records in clip_benchmark's layout),
`table` lays several models' records out in Markdown.

Example:
>>> records = evaluate(vlzoo.from_preset("sparo_shapes"))  # doctest: +SKIP
>>> print(table([benchmark_record(r, "sparo_shapes") for r in records]))  # doctest: +SKIP
| model | replace_obj | ... | mean |
...
"""

import numpy as np

from vlzoo.data.shapes_negatives import NEGATIVE_TYPES, negatives
from vlzoo.evaluation._common import check_positive_int
from vlzoo.evaluation.selection import selection_metrics, selection_scores

__all__ = ["evaluate", "evaluate_negatives", "table"]

DATASET_PREFIX = "shapes/"


def evaluate_negatives(model, data, name, batch_size=64, ties="expected", verbose=False, **score_kwargs):
    """Scores one negative type: how often the true caption outscores the negative.

    Args:
        model: a vlzoo model (`preprocessor`, `encode_image`, `encode_text`, `score`,
            `symmetric_score`).
        data: a dict with uint8 `"images"` `(N, S, S, 3)` and `N` `"captions"` and
            `"negative_captions"`, e.g. `shapes_negatives.negatives(...)`.
        name: the record's dataset name, e.g. `"shapes/replace_att"`.
        batch_size: examples per forward pass.
        ties: `"expected"`, `"pessimistic"` or `"optimistic"` (see
            `vlzoo.evaluation.selection`).
        verbose: a progress bar over the batches.
        **score_kwargs: passed to `model.score`.

    Returns:
        `{"dataset": name, "task": "image_caption_selection", "metrics": {"acc": float}}`.

    Raises:
        ValueError: no images, or `data`'s captions and negatives not one per image; a bad `ties`.

    Example:
    >>> data = negatives("swap_att", 100)
    >>> evaluate_negatives(model, data, "shapes/swap_att")["metrics"]["acc"]  # doctest: +SKIP
    """
    n = len(data["images"])
    if n == 0 or len(data["captions"]) != n or len(data["negative_captions"]) != n:
        raise ValueError(f"`data` must hold the same, non-zero number of images, captions and negative captions; "
                         f"received {n}, {len(data['captions'])} and {len(data['negative_captions'])}.")
    pixels = model.preprocessor(data["images"])
    items = list(zip(data["captions"], data["negative_captions"]))
    i2t, t2i = selection_scores(model, pixels, items, batch_size=batch_size, verbose=verbose, **score_kwargs)
    metrics = selection_metrics("caption", i2t, t2i, ties=ties, symmetric=model.symmetric_score)
    return {"dataset": name, "task": "image_caption_selection", "metrics": metrics}


def evaluate(model, num_examples=200, seed=0, batch_size=64, ties="expected", kinds=None, image_size=None,
             split="test", verbose=False, **score_kwargs):
    """The shapes compositionality suite: one record per negative type.

    Every type draws `num_examples` scenes of `split` with the same `seed` (the
    two-object types share their images, see `shapes_negatives`).

    Args:
        model: a vlzoo model; images are drawn at its `vision.image_size` unless
            `image_size` is given.
        num_examples: examples per type (>= 1).
        seed: seed of the scenes and negatives.
        batch_size: examples per forward pass.
        ties: see `evaluate_negatives`.
        kinds: the types to run, names from `NEGATIVE_TYPES` (default: all, in order).
        image_size: image side `S` (default: the model's).
        split: "test" (held-out compositions) or "train".
        verbose: a progress bar per type.
        **score_kwargs: passed to `model.score`.

    Returns:
        list of `{"dataset": "shapes/<type>", "task": "image_caption_selection",
        "metrics": {"acc": float}}`, one per type.

    Raises:
        ValueError: `num_examples` or `batch_size` not a positive int, an unknown entry of `kinds`,
            or `evaluate_negatives`' checks.

    Example:
    >>> model = vlzoo.from_preset("clip_shapes")  # doctest: +SKIP
    >>> {r["dataset"]: r["metrics"]["acc"] for r in evaluate(model, num_examples=100)}  # doctest: +SKIP
    """
    check_positive_int(num_examples, "num_examples")
    check_positive_int(batch_size, "batch_size")
    kinds = NEGATIVE_TYPES if kinds is None else tuple(kinds)
    for kind in kinds:
        if kind not in NEGATIVE_TYPES:
            raise ValueError(f"`kinds` has an unknown entry {kind!r}; expected names from {NEGATIVE_TYPES}.")
    size = image_size or model.vision.image_size
    return [evaluate_negatives(model, negatives(kind, num_examples, split=split, image_size=size, seed=seed),
                               DATASET_PREFIX + kind, batch_size=batch_size, ties=ties, verbose=verbose,
                               **score_kwargs)
            for kind in kinds]


def table(records, metric="acc", digits=3):
    """Records of several models as one Markdown table: a row per model, a column per type, and the mean.

    Args:
        records: `vlzoo.evaluation.results.benchmark_record` dicts of `evaluate`'s
            results (`"model"`, `"dataset"` `shapes/<type>`, `"metrics"`); every model
            must have the same types, once each.
        metric: the metric shown.
        digits: decimals shown.

    Returns:
        str, a Markdown table with a trailing newline.

    Raises:
        ValueError: no records, a record that is not `shapes/<type>` or repeats a type, or models
            with different types.

    Example:
    >>> print(table([{"model": "clip_shapes", "dataset": "shapes/order", "metrics": {"acc": 0.5}}]))
    | model | order | mean |
    |---|---:|---:|
    | clip_shapes | 0.500 | 0.500 |
    <BLANKLINE>
    """
    if not records:
        raise ValueError("`records` must hold at least one record; received none.")
    rows = {}
    for record in records:
        kind = record["dataset"][len(DATASET_PREFIX):] if record["dataset"].startswith(DATASET_PREFIX) else None
        row = rows.setdefault(record["model"], {})
        if kind is None or kind in row:
            raise ValueError(f"`records` must hold one record per model and shapes type ('{DATASET_PREFIX}<type>'); "
                             f"received {record['dataset']!r} for model {record['model']!r}.")
        row[kind] = float(record["metrics"][metric])
    kinds = list(next(iter(rows.values())))
    for model, row in rows.items():
        if list(row) != kinds:
            raise ValueError(f"Every model must have the same types in the same order; {model!r} has "
                             f"{list(row)}, expected {kinds}.")
    lines = ["| model | " + " | ".join(kinds) + " | mean |", "|---|" + "---:|" * (len(kinds) + 1)]
    for model, row in rows.items():
        values = list(row.values()) + [float(np.mean(list(row.values())))]
        lines.append(f"| {model} | " + " | ".join(f"{v:.{digits}f}" for v in values) + " |")
    return "\n".join(lines) + "\n"
