"""The shapes benchmark the bundled `*_shapes` presets report, on `vlzoo.data.shapes` scenes.

`binding_accuracy` (true against attribute-swapped captions), `zero_shot_metrics` (zero-shot
accuracy and text-to-image R@1 over classes) and `evaluate` (the fixed held-out benchmark).

Example:
>>> model = vlzoo.from_preset("sparc_shapes")  # doctest: +SKIP
>>> shapes_benchmark.evaluate(model)["binding_mean"]  # a float in [0, 1]  # doctest: +SKIP
"""

import keras
import numpy as np

from vlzoo.data.shapes import SWAPS, binding_pairs, classification, retrieval_scenes
from vlzoo.evaluation._common import check_positive_int
from vlzoo.evaluation.retrieval import retrieval_recall


def _scores(model, pixels, texts):
    """`model.similarity(pixels, model.tokenizer(texts))` as a numpy array."""
    return keras.ops.convert_to_numpy(model.similarity(pixels, model.tokenizer(list(texts))))


def binding_accuracy(model, pixels, true_texts, swapped_texts, batch_size=64):
    """Fraction of images whose model score is higher for the true caption than the swapped one.

    Image `i` is scored against `true_texts[i]` and `swapped_texts[i]` with
    `model.similarity` (the family's own score; any vlzoo model), `batch_size` images
    (and their `2 * batch_size` captions) at a time. Ties count as failures, so a model
    that cannot tell the captions apart scores 0; chance for one that can is 0.5.

    Args:
        model: a vlzoo model, or any object with `tokenizer(list_of_str)` and
            `similarity(pixels, tokens) -> (N_images, N_texts)` scores.
        pixels: `N` preprocessed images, `model.preprocessor(images)`.
        true_texts, swapped_texts: `N` str each, e.g. `binding_pairs(...)["captions"]`
            and `["swapped_captions"]`.
        batch_size: images scored per `similarity` call (>= 1).

    Returns:
        float in [0, 1].

    Raises:
        ValueError: no images, texts of another length than `pixels`, or a bad `batch_size`.

    Example:
    >>> pairs = binding_pairs("test", 200, swap="color")
    >>> binding_accuracy(model, model.preprocessor(pairs["images"]),
    ...                  pairs["captions"], pairs["swapped_captions"])  # in [0, 1]  # doctest: +SKIP
    """
    pixels = keras.ops.convert_to_numpy(pixels)
    true_texts, swapped_texts = list(true_texts), list(swapped_texts)
    n = len(pixels)
    if n == 0 or len(true_texts) != n or len(swapped_texts) != n:
        raise ValueError(f"`pixels`, `true_texts` and `swapped_texts` must have the same, non-zero "
                         f"length; received {n}, {len(true_texts)} and {len(swapped_texts)}.")
    b = min(check_positive_int(batch_size, "batch_size"), n)
    diagonal = np.arange(b)
    wins = 0
    for start in range(0, n, b):
        # The last batch repeats the last example up to `b` rows, so that every call has the
        # same shapes (one compilation on JAX); the repeats are not counted.
        rows = np.minimum(start + diagonal, n - 1)
        texts = [true_texts[r] for r in rows] + [swapped_texts[r] for r in rows]
        scores = _scores(model, pixels[rows], texts)
        right = scores[diagonal, diagonal] > scores[diagonal, b + diagonal]
        wins += int(np.sum(right[: n - start]))
    return wins / n


def zero_shot_metrics(model, pixels, labels, class_names, template="a {}"):
    """Zero-shot accuracy and text-to-image R@1 of a model over a set of classes.

    Every class name is put in `template` and scored against every image with
    `model.similarity`. Zero-shot: an image is assigned its best-scoring class.
    Retrieval: each class prompt retrieves its best-scoring image; a hit when that
    image has the class.

    Args:
        model: a vlzoo model (or any object with `tokenizer` and `similarity`).
        pixels: `N` preprocessed images, `model.preprocessor(images)`.
        labels: int `(N,)` indices into `class_names`.
        class_names: the classes, e.g. `classification(...)["class_names"]`.
        template: prompt with one `{}` for the class name.

    Returns:
        dict `{"zero_shot_accuracy": float, "t2i_recall@1": float}`.

    Raises:
        ValueError: `labels` not of shape `(N,)`.

    Example:
    >>> data = classification(8, seed=1)
    >>> zero_shot_metrics(model, model.preprocessor(data["images"]), data["labels"],
    ...                   data["class_names"])  # doctest: +SKIP
    {'zero_shot_accuracy': ..., 't2i_recall@1': ...}
    """
    labels = np.asarray(labels)
    if labels.shape != (len(pixels),):
        raise ValueError(f"`labels` must have shape ({len(pixels)},), one per image in `pixels`; "
                         f"received shape {labels.shape}.")
    prompts = [template.format(name) for name in class_names]
    scores = _scores(model, pixels, prompts)  # (N_images, N_classes)
    zero_shot = float(np.mean(np.argmax(scores, axis=1) == labels))
    top_image = np.argmax(scores, axis=0)  # best image per class prompt
    recall_at_1 = float(np.mean(labels[top_image] == np.arange(len(prompts))))
    return {"zero_shot_accuracy": zero_shot, "t2i_recall@1": recall_at_1}


def evaluate(model, image_size=None, num_pairs=300, num_per_class=10, seed=0, batch_size=64):
    """The held-out shapes benchmark of the bundled `*_shapes` presets.

    On the `test` split (compositions never seen in `train`):
    - retrieval recall@1 and @5 in both directions over `retrieval_scenes("test")`
      (120 distinct scenes; `vlzoo.evaluation.retrieval_recall`);
    - `binding_accuracy` on `num_pairs` scenes per swap ("color", "shape",
      "relation"; chance 0.5) and their mean;
    - `zero_shot_metrics` on `classification(num_per_class)` over the 24 colour-shape
      classes with the prompt "a {}" (chance 1/24).

    Each part has its own fixed seed derived from `seed`, so a model's numbers are
    reproducible on every backend.

    Args:
        model: a vlzoo model with `tokenizer` and `preprocessor`.
        image_size: image side (default: the model's).
        num_pairs: scenes per swap for binding accuracy.
        num_per_class: images per class for zero-shot accuracy.
        seed: base seed of the evaluation data.
        batch_size: images per forward pass.

    Returns:
        dict of floats: `i2t_r@1`, `i2t_r@5`, `t2i_r@1`, `t2i_r@5`, `binding_color`,
        `binding_shape`, `binding_relation`, `binding_mean`, `zero_shot_accuracy`.

    Example:
    >>> evaluate(vlzoo.from_preset("sparc_shapes"))["binding_mean"]  # in [0, 1]  # doctest: +SKIP
    """
    size = image_size or model.vision.image_size
    scenes = retrieval_scenes("test", image_size=size, seed=seed)
    metrics = retrieval_recall(model, model.preprocessor(scenes["images"]), scenes["captions"],
                               ks=(1, 5), batch_size=batch_size)
    for offset, swap in enumerate(SWAPS, start=1):
        pairs = binding_pairs("test", num_pairs, swap=swap, image_size=size, seed=seed + offset)
        metrics[f"binding_{swap}"] = binding_accuracy(
            model, model.preprocessor(pairs["images"]), pairs["captions"], pairs["swapped_captions"],
            batch_size=batch_size)
    metrics["binding_mean"] = float(np.mean([metrics[f"binding_{swap}"] for swap in SWAPS]))
    data = classification(num_per_class, seed=seed + len(SWAPS) + 1, image_size=size)
    zero_shot = zero_shot_metrics(model, model.preprocessor(data["images"]), data["labels"],
                                  data["class_names"])
    metrics["zero_shot_accuracy"] = zero_shot["zero_shot_accuracy"]
    return {key: float(value) for key, value in metrics.items()}
