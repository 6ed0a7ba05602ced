"""Grounding: does a word's map over the image's patches land on the object it names?

`word_maps` gives each caption word a map over its image's patches from the family's own
alignment (`grounding_method`: `"token_alignment"` for FILIP and SPARC, the mean of the word's
tokens' weights; `"text_attention"` for FLAIR, its pooling's attention with the word alone as the
query; `"patch_text_cosine"` for CLIP and FLAIR, a softmax over the patches of each projected
patch token's cosine with the word at the model's temperature). SigLIP, Llip, SPARO and STAIR put
no patch in the joint space and are refused.

Each map is scored against the object's coverage of each patch (`patch_coverage`):
`pointing_game` (the coverage of the highest-weighted patch, tied maxima averaged) and
`mass_inside` (the share of the map's weight on the object). For both, a constant map scores the
object's share of the image, the chance level. The methods in full: docs/evaluation.md,
*Grounding*.

Example:
>>> maps, method = word_maps(model, pixels, ["a red circle above a blue square"])  # doctest: +SKIP
>>> maps.shape  # (N, W, P)  # doctest: +SKIP
(1, 7, 64)
>>> pointing_game(maps[0, 2], patch_coverage(circle_mask, model.vision.patch_size))  # doctest: +SKIP
0.5
"""

import numpy as np
from keras import ops

from vlzoo.evaluation._common import batches, check_positive_int, num_rows

__all__ = ["grounding_method", "mass_inside", "patch_coverage", "pointing_game", "word_maps", "word_token_positions"]


def patch_coverage(masks, patch_size):
    """Each patch's share inside a region: float32 `(..., P)`, patches in the towers' row-major order.

    Args:
        masks: float `(..., S, S)` per-pixel coverage in [0, 1] (1: inside).
        patch_size: the side of a patch in pixels; `S` must be a multiple of it.

    Returns:
        float32 `(..., P)`, `P = (S / patch_size) ** 2`.

    Raises:
        ValueError: `masks` not `(..., S, S)` with `S` a multiple of `patch_size`, or a bad
            `patch_size`.

    Example:
    >>> patch_coverage(np.eye(4)[None], 2)  # two patches on the diagonal, half covered each
    array([[0.5, 0. , 0. , 0.5]], dtype=float32)
    """
    masks = np.asarray(masks, np.float32)
    patch_size = check_positive_int(patch_size, "patch_size")
    if masks.ndim < 2 or masks.shape[-1] != masks.shape[-2] or masks.shape[-1] % patch_size:
        raise ValueError(f"`masks` must be (..., S, S) with S a multiple of `patch_size` {patch_size}; received "
                         f"shape {masks.shape}.")
    grid = masks.shape[-1] // patch_size
    cells = masks.reshape(masks.shape[:-2] + (grid, patch_size, grid, patch_size)).mean(axis=(-3, -1))
    return cells.reshape(masks.shape[:-2] + (grid * grid,))


def _check_maps(maps, coverage):
    maps, coverage = np.asarray(maps, np.float64), np.asarray(coverage, np.float64)
    if maps.shape != coverage.shape or maps.ndim < 1:
        raise ValueError(f"`maps` and `coverage` must have the same shape (..., P); received {maps.shape} and "
                         f"{coverage.shape}.")
    if not np.all(np.isfinite(maps)) or np.any(maps < 0):
        raise ValueError("`maps` must be finite and non-negative (weights over the patches).")
    if np.any((coverage < 0) | (coverage > 1)):
        raise ValueError("`coverage` must be in [0, 1] (each patch's share inside the object).")
    return maps, coverage


def pointing_game(maps, coverage):
    """The pointing game per map: the coverage of its highest-weighted patch, tied patches averaged.

    Args:
        maps: non-negative weights `(..., P)` over the patches.
        coverage: the object's share of each patch `(..., P)` (`patch_coverage`).

    Returns:
        float64 `(...)` in [0, 1]; a constant map scores `coverage.mean(-1)`, the chance level.

    Raises:
        ValueError: `maps` and `coverage` of different shapes, `maps` negative or not finite, or
            `coverage` outside [0, 1].

    Example:
    >>> float(pointing_game([0.1, 0.7, 0.7, 0.0], [0.0, 1.0, 0.5, 1.0]))  # two tied maxima: (1.0 + 0.5) / 2
    0.75
    """
    maps, coverage = _check_maps(maps, coverage)
    top = maps == maps.max(axis=-1, keepdims=True)
    return (coverage * top).sum(axis=-1) / top.sum(axis=-1)


def mass_inside(maps, coverage):
    """The share of each map's weight on the object, `sum w c / sum w` (a zero map counts as uniform).

    Takes and returns what `pointing_game` does: float64 `(...)` in [0, 1], a constant map scoring
    `coverage.mean(-1)`, the chance level; raises as `pointing_game`.

    Example:
    >>> float(mass_inside([0.0, 3.0, 1.0, 0.0], [0.0, 1.0, 0.5, 1.0]))  # (3 * 1 + 1 * 0.5) / 4
    0.875
    """
    maps, coverage = _check_maps(maps, coverage)
    total = maps.sum(axis=-1)
    inside = (maps * coverage).sum(axis=-1)
    return np.where(total > 0, inside / np.where(total > 0, total, 1.0), coverage.mean(axis=-1))


def word_token_positions(tokenizer, caption):
    """The token positions of each whitespace-separated word of `caption`, as `tokenizer` encodes it.

    Read from the tokenization of the caption's prefixes: word `k` holds the
    positions the first `k + 1` words' tokens add to the first `k`'s (start
    token included in the count, end token excluded), so it follows any
    tokenizer that encodes words apart (CLIP's BPE, WordPiece, SentencePiece).

    Args:
        tokenizer: a vlzoo tokenizer (`token_ids`, `padding_mask`).
        caption: str.

    Returns:
        a list with one list of int positions per word (empty for a word
        truncated away).

    Raises:
        ValueError: `caption` has no words.

    Example:
    >>> word_token_positions(model.tokenizer, "a red circle")  # doctest: +SKIP
    [[1], [2], [3]]
    """
    words = caption.split()
    if not words:
        raise ValueError("`caption` has no words.")
    encoded = tokenizer([" ".join(words[:k]) for k in range(len(words) + 1)])
    ids = np.asarray(ops.convert_to_numpy(encoded["token_ids"]))
    lengths = np.asarray(ops.convert_to_numpy(encoded["padding_mask"])).sum(axis=1)
    full = ids[-1]
    # The leading positions each prefix shares with the whole caption: its start token and words, not its end.
    shared = [int(np.argmax(np.append(row[:n] != full[:n], True))) for row, n in zip(ids[:-1], lengths[:-1])]
    end_tokens = int(lengths[0]) - shared[0]
    bounds = shared + [int(lengths[-1]) - end_tokens]
    return [list(range(bounds[k], max(bounds[k], bounds[k + 1]))) for k in range(len(words))]


def _token_alignment_maps(model, images, captions, positions):
    """`(N, W, P)`: each word's mean token weights from `token_patch_alignment` (caption `i` on image `i`)."""
    weights = np.asarray(ops.convert_to_numpy(model.token_patch_alignment(images, model.tokenizer(captions))),
                         np.float64)
    maps = np.zeros((len(captions), max(len(p) for p in positions), weights.shape[-1]))
    for i, words in enumerate(positions):
        for w, tokens in enumerate(words):
            if tokens:
                maps[i, w] = weights[i, tokens].mean(axis=0)
    return maps


def _patch_embeddings(model, images):
    """`(B, P, D)` unit patch embeddings in the joint space: the family's own projected patch tokens
    (`encode_image`'s `"tokens"` where the family projects them: FLAIR), else its per-patch embeddings
    where it has them and no projection (TIPSv2's patch tokens, in the text space as they are), else the
    image tower's final patch tokens through the tower's projection (CLIP's, which projects the CLS token so)."""
    if getattr(model, "image_projection", None) is not None:
        tokens = model.encode_image(images)["tokens"]
    elif model.has_dense_embeddings and model.vision.projection is None:
        tokens = model.dense_image_embeddings(images)
    else:
        vision = model.vision
        tokens = vision.projection(vision(images)["tokens"][:, vision.num_prefix_tokens:])
    return ops.normalize(ops.cast(tokens, "float32"), axis=-1)


def _cosine_weights(model, images, texts):
    """`(N, V, P)`: softmax over the patches of `exp(logit_scale) *` each patch's cosine with each text."""
    texts = ops.normalize(ops.cast(model.encode_text(texts)["embeds"], "float32"), axis=-1)
    scale = ops.exp(ops.cast(model.logit_scale, "float32"))
    cosines = ops.einsum("bpd,wd->bwp", _patch_embeddings(model, images), texts)
    return ops.softmax(scale * cosines, axis=-1)


def _attention_weights(model, images, texts):
    """`(N, V, P)`: FLAIR's pooling attention of each text over each image's patches."""
    return model.text_attention_maps(images, texts)


def _word_alone_maps(model, images, captions, weights):
    """`(N, W, P)`: each caption word's map, `weights(model, images, texts)` `(N, V, P)` of the captions'
    words each tokenized alone as a text."""
    words = [caption.split() for caption in captions]
    vocabulary = sorted({word for caption in words for word in caption})
    maps_of_vocabulary = np.asarray(ops.convert_to_numpy(weights(model, images, model.tokenizer(vocabulary))),
                                    np.float64)
    index = {word: k for k, word in enumerate(vocabulary)}
    maps = np.zeros((len(captions), max(len(w) for w in words), maps_of_vocabulary.shape[-1]))
    for i, caption in enumerate(words):
        maps[i, :len(caption)] = maps_of_vocabulary[i, [index[word] for word in caption]]
    return maps


def _supported_methods(model):
    """The word maps `model` has, its own first."""
    methods = []
    if getattr(model, "has_token_alignment", False):
        methods.append("token_alignment")
    if callable(getattr(model, "text_attention_maps", None)):
        methods.append("text_attention")
    if (getattr(model, "image_projection", None) is not None or getattr(model.vision, "projection", None) is not None
            or (model.has_dense_embeddings and getattr(model.vision, "projection", None) is None)):
        methods.append("patch_text_cosine")
    return methods


def grounding_method(model, method=None):
    """How `word_maps` maps `model`'s words: by default the family's own map, `"token_alignment"` (FILIP,
    SPARC), `"text_attention"` (FLAIR) or `"patch_text_cosine"` (CLIP: patch tokens projected into the joint
    space; TIPSv2: its patch tokens, already in it); `method` picks one the model has (FLAIR's
    `"patch_text_cosine"`, the baseline).

    Returns:
        str, the method's name.

    Raises:
        NotImplementedError: for a model with none, naming why (SigLIP pools with an attention head and
            projects nothing; Llip's image side is its mixture tokens, SPARO's its slots, STAIR's a sparse
            vocabulary).
        ValueError: for a `method` the model does not have, naming those it has.

    Example:
    >>> grounding_method(vlzoo.from_preset("sparc_shapes"))  # doctest: +SKIP
    'token_alignment'
    """
    methods = _supported_methods(model)
    if not methods:
        raise NotImplementedError(
            f"{type(model).__name__} has no word-to-patch map: no token-to-patch alignment, and no projection of "
            "its patch tokens into the joint space to take a patch-text cosine with (SigLIP pools with an "
            "attention head; Llip's image side is its mixture tokens, SPARO's its slots, STAIR's a sparse "
            "vocabulary).")
    if method is None:
        return methods[0]
    if method not in methods:
        raise ValueError(f"`method` must be one of {methods} for {type(model).__name__}; received {method!r}.")
    return method


def word_maps(model, images, captions, batch_size=32, verbose=False, method=None):
    """Each caption word's map over its own image's patches, from the family's alignment.

    Args:
        model: a vlzoo model (see the module docstring for which families and how).
        images: float `(N, H, W, 3)` preprocessed pixels, image `i` described by caption `i`.
        captions: `N` strings; words are whitespace-separated.
        batch_size: pairs per forward pass.
        verbose: a progress bar over the batches.
        method: None (the family's own map) or one of the model's, see `grounding_method`.

    Returns:
        `(maps, method)`: float64 `(N, W, P)` non-negative, `W` the most words of a caption (rows past a
        caption's words are zeros), and the method that made them (`grounding_method`).

    Raises:
        ValueError: not one caption per image, a bad `batch_size`, or `grounding_method`'s errors
            (NotImplementedError for a family without word maps).

    Example:
    >>> maps, method = word_maps(vlzoo.from_preset("sparc_shapes"), pixels,
    ...                          ["a red circle"])  # doctest: +SKIP
    """
    method = grounding_method(model, method)
    count = num_rows(images)
    captions = list(captions)
    if len(captions) != count:
        raise ValueError(f"`captions` must hold one caption per image ({count}); received {len(captions)}.")
    parts = []
    for start, stop in batches(count, batch_size, verbose):
        chunk, pixels = captions[start:stop], images[start:stop]
        if method == "token_alignment":
            positions = [word_token_positions(model.tokenizer, caption) for caption in chunk]
            parts.append(_token_alignment_maps(model, pixels, chunk, positions))
        elif method == "text_attention":
            parts.append(_word_alone_maps(model, pixels, chunk, _attention_weights))
        else:
            parts.append(_word_alone_maps(model, pixels, chunk, _cosine_weights))
    width = max(part.shape[1] for part in parts)
    maps = np.concatenate([np.pad(p, ((0, 0), (0, width - p.shape[1]), (0, 0))) for p in parts])
    return maps, method
