"""Shared plumbing of the evaluation modules: batching, progress, text inputs, rank counting and
the entries of benchmark files."""

import os

import keras
import numpy as np
from keras import ops

TIES = ("pessimistic", "optimistic")
# Also "expected": a tie counts its expected value under a random order (selection, retrieval).
ALL_TIES = ("expected", *TIES)


def check_positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"`{name}` must be a positive int; received {value!r}.")
    return int(value)


def check_ks(ks, name):
    """A sorted tuple of distinct positive ints from an int or a sequence of ints."""
    values = (ks,) if isinstance(ks, (int, np.integer)) else tuple(ks)
    if not values:
        raise ValueError(f"`{name}` must be a positive int or a non-empty sequence of them; received {ks!r}.")
    return tuple(sorted({check_positive_int(k, name) for k in values}))


def check_ties(ties, choices=TIES):
    if ties not in choices:
        raise ValueError(f"`ties` must be one of {choices}; received {ties!r}.")
    return ties


def num_rows(images, name="images"):
    """`N` of `(N, H, W, 3)` images (numpy or any backend tensor)."""
    shape = tuple(images.shape) if hasattr(images, "shape") else np.shape(images)
    if len(shape) != 4 or shape[-1] != 3:
        raise ValueError(
            f"`{name}` must be float preprocessed pixels of shape (N, H, W, 3); received shape {shape}."
        )
    return shape[0]


def batches(total, batch_size, verbose=False):
    """`(start, stop)` slices covering `range(total)`, with a `keras.utils.Progbar` when `verbose`."""
    batch_size = check_positive_int(batch_size, "batch_size")
    bar = keras.utils.Progbar(-(-total // batch_size), unit_name="batch") if verbose else None
    for step, start in enumerate(range(0, total, batch_size)):
        yield start, min(start + batch_size, total)
        if bar is not None:
            bar.update(step + 1)


def tokenize(model, texts, name="texts"):
    """Strings -> the model tokenizer's dict; a dict is checked and passed through. Values stay as given."""
    if isinstance(texts, str):
        texts = [texts]
    if isinstance(texts, dict):
        if "token_ids" not in texts:
            raise TypeError(f"`{name}` as a dict must be the tokenizer's (`token_ids`, `padding_mask`); "
                            f"received keys {sorted(texts)}.")
        return texts
    texts = list(texts)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise TypeError(
            f"`{name}` must be a non-empty list of strings or the tokenizer's dict; received {texts!r:.80}."
        )
    return model.tokenizer(texts)


def take(inputs, start, stop):
    """Rows `start:stop` of an array or of every value of a dict."""
    if isinstance(inputs, dict):
        return {key: value[start:stop] for key, value in inputs.items()}
    return inputs[start:stop]


def concatenate(parts):
    """Joins per-batch outputs (tensors, or dicts of tensors) along the first axis."""
    return keras.tree.map_structure(lambda *xs: ops.concatenate(xs, axis=0), *parts)


def finite_numpy(scores, name="scores"):
    """Scores as a float numpy array; raises on NaN or inf (the rank counts assume finite scores)."""
    scores = np.asarray(ops.convert_to_numpy(scores))
    if not np.all(np.isfinite(scores)):
        raise ValueError(f"`{name}` contains non-finite values (NaN or inf); ranks are undefined.")
    return scores


def count_ahead(scores, positive, ties):
    """Per row, the negatives ranked at or above the row's best positive.

    Args:
        scores: float `(R, N)`; higher is better.
        positive: bool `(R, N)`, True where the column is a correct answer
            for the row (at least one per row).
        ties: "pessimistic": a negative whose score equals the best
            positive's is counted as ranked above it; "optimistic": it is not.

    Returns:
        int `(R,)`: the best positive's rank is `1 + count`, so the row is a
        hit at `k` when `count < k`.
    """
    best = np.max(np.where(positive, scores, -np.inf), axis=1, keepdims=True)
    ahead = scores >= best if ties == "pessimistic" else scores > best
    return np.sum(ahead & ~positive, axis=1)


def hit_rates(ahead, ks):
    """`{k: fraction of rows with count < k}` for counts from `count_ahead`."""
    return {k: float(np.mean(ahead < k)) for k in ks}


# ------------------------------------------------------------------ benchmark files


def entry_image(path, source, key):
    """`path` when the image exists; else a `FileNotFoundError` naming the benchmark file and entry."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{source}, entry {key}: image not found: {path}.")
    return path


def entry_fields(record, keys, source, key):
    """The values of `keys` in a benchmark file's entry; a `ValueError` naming the file and entry otherwise."""
    if not isinstance(record, dict):
        raise ValueError(f"{source}, entry {key}: expected an object; received {type(record).__name__}.")
    missing = [k for k in keys if k not in record]
    if missing:
        raise ValueError(f"{source}, entry {key}: missing key(s) {missing}.")
    return [record[k] for k in keys]
