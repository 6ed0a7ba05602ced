"""SPARO's slot metrics: each slot's own zero-shot accuracy, and the paper's post-hoc slot selection.

The paper (Sec. 5.1) scores each of the `L` slots by its own zero-shot accuracy and keeps the best
32; the model then scores on those slots only (`model.similarity(..., slots=...)`).

Example:
>>> best = select_slots(model, images, labels, model.tokenizer(prompts_per_class),
...                     top_k=32)  # doctest: +SKIP
>>> zero_shot_accuracy(model, test_images, test_labels, names, slots=best)  # doctest: +SKIP
{'top1': ..., 'top5': ...}
"""

import numpy as np
from keras import ops

from vlzoo.losses import l2_normalize
from vlzoo.losses._utils import check_embeds, to_float32

__all__ = ["per_slot_zero_shot_accuracy", "rank_slots", "select_slots", "slot_zero_shot_accuracy"]


def per_slot_zero_shot_accuracy(image_embeds, class_embeds, labels, slot_dim):
    """Zero-shot accuracy of every slot on its own (the paper's post-hoc concept selection, Sec. 5.1).

    Slot `l`'s classifier: `w_{c,l} = normalise(mean_k normalise(y^t_{c,k,l}))`
    over the K prompt templates of class c; an image's prediction is
    `argmax_c cos(y^i_l, w_{c,l})`. (The paper gives the per-slot accuracy,
    not the classifier; this one is CLIP's prompt ensembling applied to one
    slot.) Accuracies are means over the images given: to accumulate over
    batches, weight each batch's result by its size.

    Args:
        image_embeds: `(N, L * V)` image encodings (raw or normalised).
        class_embeds: `(C, K, L * V)` text encodings of K templates per
            class, or `(C, L * V)` for one template.
        labels: int `(N,)` class of every image, in `[0, C)`.
        slot_dim: slot width `V`.

    Returns:
        float32 `(L,)`.

    Raises:
        ValueError: `class_embeds` not `(C, K, L * V)` or `(C, L * V)` matching `image_embeds` with
            `L * V` a multiple of `slot_dim`, `image_embeds` not 2-D, or `labels` not `(N,)`.

    Example:
    >>> acc = per_slot_zero_shot_accuracy(image_embeds, class_embeds, labels, slot_dim=64)  # doctest: +SKIP
    >>> rank_slots(acc, top_k=32)  # doctest: +SKIP
    """
    image_embeds = check_embeds(image_embeds, "image_embeds")
    class_embeds = to_float32(class_embeds)
    if len(class_embeds.shape) == 2:
        class_embeds = class_embeds[:, None]
    total = image_embeds.shape[-1]
    if len(class_embeds.shape) != 3 or class_embeds.shape[-1] != total or total % slot_dim:
        raise ValueError(
            f"`class_embeds` must have shape (C, K, {total}) or (C, {total}) matching `image_embeds` "
            f"{tuple(image_embeds.shape)} (slots of width {slot_dim}); received shape {tuple(class_embeds.shape)}."
        )
    labels = ops.convert_to_tensor(labels)
    if tuple(labels.shape) != tuple(image_embeds.shape[:1]):
        raise ValueError(
            f"`labels` must have shape (N,) = {tuple(image_embeds.shape[:1])}; received {tuple(labels.shape)}."
        )
    num_classes, templates, num_slots = class_embeds.shape[0], class_embeds.shape[1], total // slot_dim
    images = l2_normalize(ops.reshape(image_embeds, (-1, num_slots, slot_dim)))
    texts = l2_normalize(ops.reshape(class_embeds, (num_classes, templates, num_slots, slot_dim)))
    weights = l2_normalize(ops.mean(texts, axis=1))  # (C, L, V)
    predictions = ops.argmax(ops.einsum("nlv,clv->nlc", images, weights), axis=-1)
    correct = ops.equal(predictions, ops.cast(labels, predictions.dtype)[:, None])
    return ops.mean(ops.cast(correct, "float32"), axis=0)


def rank_slots(slot_scores, top_k=None):
    """Slot indices by decreasing score (ties: lower index first).

    Args:
        slot_scores: `(L,)`, e.g. `per_slot_zero_shot_accuracy`.
        top_k: keep the `top_k` best (the paper keeps 32); None keeps all.

    Returns:
        numpy int32 `(top_k or L,)`, best first; pass it as `slots=` to
        `SPARO.similarity` / `score`.

    Raises:
        ValueError: `slot_scores` not 1-D, or `top_k` outside `[1, L]`.

    Example:
    >>> rank_slots(np.array([0.2, 0.9, 0.5]), top_k=2)
    array([1, 2], dtype=int32)
    """
    scores = np.asarray(ops.convert_to_numpy(slot_scores), dtype="float64")
    if scores.ndim != 1:
        raise ValueError(f"`slot_scores` must have shape (L,); received shape {scores.shape}.")
    if top_k is not None and not 1 <= top_k <= scores.size:
        raise ValueError(f"`top_k` must lie in [1, {scores.size}]; received {top_k!r}.")
    return np.argsort(-scores, kind="stable")[:top_k].astype("int32")


def slot_zero_shot_accuracy(model, images, labels, class_texts):
    """Zero-shot accuracy of every slot of a SPARO `model` alone on labelled images, float32 `(L,)`.

    Args:
        model: a SPARO model.
        images: float `(N, H, W, 3)`.
        labels: int `(N,)`.
        class_texts: tokenizer dict whose `token_ids` / `padding_mask`
            have shape `(C, K, T)` (K prompt templates per class) or `(C, T)`.

    Returns:
        float32 `(L,)`; see `per_slot_zero_shot_accuracy` for the classifier.

    Raises:
        TypeError: `model` is not a SPARO model.
        ValueError: `per_slot_zero_shot_accuracy`'s checks.

    Example:
    >>> slot_zero_shot_accuracy(sparo, images, labels, sparo.tokenizer(prompts)).shape  # doctest: +SKIP
    (L,)
    """
    if model.family != "sparo":
        raise TypeError(f"`model` must be a SPARO model (slots); received {type(model).__name__}.")
    ids = ops.convert_to_tensor(class_texts["token_ids"])
    mask = class_texts.get("padding_mask")
    mask = ops.ones_like(ids, dtype="bool") if mask is None else ops.convert_to_tensor(mask)
    flat = {"token_ids": ops.reshape(ids, (-1, ids.shape[-1])), "padding_mask": ops.reshape(mask, (-1, ids.shape[-1]))}
    text = ops.reshape(model.encode_text(flat)["embeds"], tuple(ids.shape[:-1]) + (model.embed_dim,))
    return per_slot_zero_shot_accuracy(model.encode_image(images)["embeds"], text, labels, model.slot_dim)


def select_slots(model, images, labels, class_texts, top_k=None):
    """Slot indices of a SPARO `model` by decreasing per-slot zero-shot accuracy (`slot_zero_shot_accuracy`).

    The paper keeps the top 32 (ImageNet validation set) and evaluates with
    `model.similarity(..., slots=select_slots(...))`.

    Returns:
        numpy int32 `(top_k or L,)`, best first.

    Raises:
        as `slot_zero_shot_accuracy` and `rank_slots`.

    Example:
    >>> select_slots(sparo, images, labels, sparo.tokenizer(prompts), top_k=4)  # doctest: +SKIP
    array([...], dtype=int32)
    """
    return rank_slots(slot_zero_shot_accuracy(model, images, labels, class_texts), top_k)
