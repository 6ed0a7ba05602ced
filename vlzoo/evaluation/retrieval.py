"""Image-text retrieval recall@K in both directions, with several captions per image.

Definitions (`N_I` images, `N_T` captions, `image_ids[j]` the image of caption `j`):

* image -> text (`i2t_r@K`): for each image, the rank of its best-ranked
  caption among all captions; a hit when that rank is `<= K` (the usual
  COCO / Flickr30k protocol: one of its captions is in the top K).
* text -> image (`t2i_r@K`): for each caption, the rank of its image among
  all images; a hit when `<= K`.

Ranks, exactly: rank = 1 + the number of *negatives* (captions of other
images, or other images) ranked above the best positive; the other
captions of the same image never count. With `ties="pessimistic"`
(default) a negative whose score equals the positive's counts as ranked
above it, so a constant-score model gets `R@K = 0` (unless there are fewer
than K negatives); `"optimistic"` counts only strictly higher negatives;
`"expected"` counts a query's hit probability when the tied scores are put
in a uniformly random order: with `a` negatives strictly above the best
positive, `t` tied with it and `p` positives at that score, the hit at K
has probability `1 - C(t, m) / C(t + p, m)` for `m = K - a` (0 when `m <= 0`,
1 when `m > t`). A constant-score model then scores the chance level
exactly: `R@K = K / N_images` for text -> image, and the chance that one
of an image's captions is among K random ones for image -> text. Without
ties the three agree. Recall@K is the fraction of queries that hit (or
their mean hit probability).

Scores come from the family's own `model.score` (`model.similarity`'s
scoring of cached embeddings); a family whose `score` takes `direction`
(FILIP) ranks captions with `direction="i2t"` and images with `"t2i"`.
`retrieval_recall` encodes the captions once, then scores `batch_size`
images at a time, keeping per caption only its positive score, its
`max(ks)` best negative scores and how many dropped negatives tie the last
of them: memory is `O(batch_size * N_T + N_T * max(ks))` besides the caption
embeddings.

Example:
>>> recall_at_k(np.array([[0.9, 0.1], [0.2, 0.3]]), ks=(1,))
{'i2t_r@1': 1.0, 't2i_r@1': 1.0}
>>> retrieval_recall(model, images, captions, image_ids=caption_image_ids)  # doctest: +SKIP
{'i2t_r@1': ..., 'i2t_r@5': ..., 'i2t_r@10': ..., 't2i_r@1': ..., ...}
"""


import numpy as np
from keras import ops

from vlzoo.evaluation._common import (
    ALL_TIES, batches, check_ks, check_ties, concatenate, finite_numpy, num_rows, take, tokenize,
)

__all__ = ["recall_at_k", "retrieval_recall"]


def _hit_rates(ahead, tied, positives, ks, ties):
    """`{k: mean hit}` of queries with `ahead` negatives above the best positive, `tied` negatives and
    `positives` positives at its score (int arrays `(R,)`), under the tie rule `ties`."""
    rates = {}
    for k in ks:
        if ties == "pessimistic":
            hits = (ahead + tied < k).astype(np.float64)
        elif ties == "optimistic":
            hits = (ahead < k).astype(np.float64)
        else:  # 1 - C(t, m) / C(t + p, m): no positive among the first m of the tied group, at random
            m = k - ahead
            miss = np.ones(ahead.shape, np.float64)
            for i in range(k):
                step = np.where(i < m, (tied - i) / np.maximum(tied + positives - i, 1), 1.0)
                miss = miss * np.clip(step, 0.0, 1.0)
            hits = 1.0 - miss
        rates[k] = float(np.mean(hits))
    return rates


def _check_image_ids(image_ids, num_images, num_texts):
    if image_ids is None:
        if num_images != num_texts:
            raise ValueError(
                "Without `image_ids` caption j belongs to image j, so the counts must match; received "
                f"{num_images} images and {num_texts} captions. Pass `image_ids` (N_texts,) for several "
                "captions per image."
            )
        return np.arange(num_texts)
    ids = np.asarray(ops.convert_to_numpy(image_ids))
    if ids.shape != (num_texts,) or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"`image_ids` must be ints of shape (N_texts,) = ({num_texts},), the image index of every "
            f"caption; received dtype {ids.dtype}, shape {ids.shape}."
        )
    if num_texts and (ids.min() < 0 or ids.max() >= num_images):
        raise ValueError(
            f"`image_ids` must lie in [0, {num_images}) (N_images = {num_images}); "
            f"received values in [{ids.min()}, {ids.max()}]."
        )
    missing = np.setdiff1d(np.arange(num_images), ids)
    if missing.size:
        raise ValueError(
            f"Every image needs at least one caption; {missing.size} of the {num_images} images have none "
            f"in `image_ids`: {missing[:10].tolist()}{' ...' if missing.size > 10 else ''}."
        )
    return ids


def _tie_counts(scores, positive):
    """Per row: negatives above the best positive, negatives tied with it, positives at its score."""
    best = np.max(np.where(positive, scores, -np.inf), axis=1, keepdims=True)
    return (np.sum((scores > best) & ~positive, axis=1), np.sum((scores == best) & ~positive, axis=1),
            np.sum((scores == best) & positive, axis=1))


class _RecallCounter:
    """Streams rows of the score matrix (blocks of images) into both directions' rank counts."""

    def __init__(self, image_ids, num_images, ks, ties):
        self.image_ids, self.ks, self.ties = image_ids, ks, ties
        self.i2t_counts = np.zeros((3, num_images), np.int64)  # ahead, tied, positives at the best's score
        self.t2i_positive = np.zeros((image_ids.size,), np.float64)
        # The max(ks) highest negative scores of every caption seen so far, and how many negatives were
        # dropped with a score equal to the last of them (ties of the positive past the kept ones).
        self.t2i_negatives = np.full((image_ids.size, max(ks)), -np.inf, np.float64)
        self.t2i_dropped_ties = np.zeros((image_ids.size,), np.int64)

    def update(self, start, i2t, t2i):
        """`i2t`, `t2i`: finite numpy `(b, N_T)` scores of images `start:start + b`."""
        stop = start + i2t.shape[0]
        positive = self.image_ids[None, :] == np.arange(start, stop)[:, None]
        self.i2t_counts[:, start:stop] = _tie_counts(i2t, positive)
        rows, cols = np.nonzero(positive)
        self.t2i_positive[cols] = t2i[rows, cols]
        kept = self.t2i_negatives.shape[1]
        last = self.t2i_negatives[:, -1]
        merged = -np.sort(-np.concatenate([self.t2i_negatives, np.where(positive, -np.inf, t2i).T], axis=1), axis=1)
        self.t2i_negatives = merged[:, :kept]
        dropped = np.sum(merged[:, kept:] == self.t2i_negatives[:, -1:], axis=1)
        same = self.t2i_negatives[:, -1] == last
        self.t2i_dropped_ties = np.where(same, self.t2i_dropped_ties + dropped, dropped)

    def result(self):
        positive_scores = self.t2i_positive[:, None]
        ahead = np.sum(self.t2i_negatives > positive_scores, axis=1)
        tied = np.sum(self.t2i_negatives == positive_scores, axis=1)
        tied = tied + np.where(self.t2i_negatives[:, -1] == self.t2i_positive, self.t2i_dropped_ties, 0)
        metrics = {f"i2t_r@{k}": rate for k, rate in _hit_rates(*self.i2t_counts, self.ks, self.ties).items()}
        metrics.update({f"t2i_r@{k}": rate
                        for k, rate in _hit_rates(ahead, tied, np.ones_like(ahead), self.ks, self.ties).items()})
        return metrics


def recall_at_k(scores, image_ids=None, ks=(1, 5, 10), ties="pessimistic", t2i_scores=None):
    """Recall@K of both directions from a full score matrix.

    Args:
        scores: float `(N_images, N_texts)`, higher = better match (numpy or
            any backend tensor); ranks captions for each image, and images
            for each caption unless `t2i_scores` is given.
        image_ids: int `(N_texts,)`, the image index of every caption; None:
            caption `j` belongs to image `j` (`N_images == N_texts`).
        ks: an int or a sequence of ints.
        ties: "pessimistic" (default), "optimistic" or "expected"; see the module docstring.
        t2i_scores: optional `(N_images, N_texts)` scores for ranking images
            (FILIP's `S_T`).

    Returns:
        `{"i2t_r@1": float, ..., "t2i_r@1": float, ...}`.

    Raises:
        ValueError: `scores` not `(N_images, N_texts)`, `t2i_scores` of another shape, non-finite
            scores, bad `image_ids`, `ks` or `ties`.

    Example:
    >>> scores = np.array([[0.9, 0.8, 0.1], [0.9, 0.2, 0.5]])  # 2 images, 3 captions
    >>> recall_at_k(scores, image_ids=[0, 0, 1], ks=(1, 2))
    {'i2t_r@1': 0.5, 'i2t_r@2': 1.0, 't2i_r@1': 0.666..., 't2i_r@2': 1.0}
    """
    ks, ties = check_ks(ks, "ks"), check_ties(ties, ALL_TIES)
    i2t = finite_numpy(scores, "scores")
    if i2t.ndim != 2:
        raise ValueError(f"`scores` must have shape (N_images, N_texts); received shape {i2t.shape}.")
    t2i = i2t if t2i_scores is None else finite_numpy(t2i_scores, "t2i_scores")
    if t2i.shape != i2t.shape:
        raise ValueError(f"`t2i_scores` must have the shape of `scores` {i2t.shape}; received {t2i.shape}.")
    counter = _RecallCounter(_check_image_ids(image_ids, *i2t.shape), i2t.shape[0], ks, ties)
    counter.update(0, i2t, t2i)
    return counter.result()


def _pair_scorer(model, text_embeds, score_kwargs):
    """`image_embeds -> (i2t, t2i)` scores with the family's `score`."""
    if not model.symmetric_score:
        return lambda image_embeds: tuple(
            model.score(image_embeds, text_embeds, direction=direction, **score_kwargs)
            for direction in ("i2t", "t2i")
        )

    def scorer(image_embeds):
        scores = model.score(image_embeds, text_embeds, **score_kwargs)
        return scores, scores

    return scorer


def retrieval_recall(model, images, texts, image_ids=None, ks=(1, 5, 10), batch_size=64, ties="pessimistic",
                     verbose=False, **score_kwargs):
    """Recall@K of image -> text and text -> image retrieval with `model`'s own scores.

    Args:
        model: a `ContrastiveModel`.
        images: float `(N_images, H, W, 3)` preprocessed pixels.
        texts: `N_texts` caption strings (tokenised with `model.tokenizer`)
            or the tokenizer's dict (`token_ids`, `padding_mask`, `(N_texts, T)`).
        image_ids: int `(N_texts,)`, the image of every caption (several
            captions per image: repeat the index); None: caption `j`
            belongs to image `j`. Every image needs at least one caption.
        ks: an int or a sequence of ints, `(1, 5, 10)` by default.
        batch_size: images (and captions) per forward pass.
        ties: "pessimistic" (default), "optimistic" or "expected"; see the module docstring.
        verbose: show progress bars (captions, then images).
        **score_kwargs: passed to `model.score` (`slots=` for SPARO, `temperature=` for Llip).

    Returns:
        `{"i2t_r@1": float, ..., "t2i_r@10": float}`.

    Example:
    >>> retrieval_recall(model, images, ["a dog", "a puppy", "a cat"], image_ids=[0, 0, 1], ks=(1, 5))  # doctest: +SKIP
    """
    ks, ties = check_ks(ks, "ks"), check_ties(ties, ALL_TIES)
    num_images = num_rows(images)
    tokens = tokenize(model, texts)
    num_texts = tuple(tokens["token_ids"].shape)[0]
    counter = _RecallCounter(_check_image_ids(image_ids, num_images, num_texts), num_images, ks, ties)
    text_embeds = concatenate([
        model.encode_text(take(tokens, start, stop)) for start, stop in batches(num_texts, batch_size, verbose)
    ])
    scorer = _pair_scorer(model, text_embeds, score_kwargs)
    for start, stop in batches(num_images, batch_size, verbose):
        i2t, t2i = scorer(model.encode_image(images[start:stop]))
        counter.update(start, finite_numpy(i2t, "i2t scores"), finite_numpy(t2i, "t2i scores"))
    return counter.result()
