"""Grounding on synthetic shapes scenes, whose objects' pixels are known exactly (offline).

`evaluate` draws held-out scenes (`vlzoo.data.shapes.generate("test", ...)`, one or two objects),
maps each caption word over the patches (`vlzoo.evaluation.grounding.word_maps`) and scores the
maps against the drawn objects (`vlzoo.data.shapes.object_masks`) by kind of word (`KINDS`):
`noun` (the shape word) and `color` against the object they name, `relation` against both
objects together. On two-object scenes nouns and colours are also scored against their own
object (`pair_<kind>`) and the other one (`distractor_<kind>`), which tells a map that finds the
named object from one that only finds objects. How to read the scores: docs/evaluation.md,
*Grounding*.

Example:
>>> record = evaluate(vlzoo.from_preset("sparc_shapes"))  # doctest: +SKIP
>>> record["metrics"]["pointing_noun"], record["metrics"]["chance_noun"]  # doctest: +SKIP
(..., ...)
"""

import numpy as np

from vlzoo.data.shapes import RELATIONS, generate, object_masks
from vlzoo.evaluation._common import check_positive_int
from vlzoo.evaluation.grounding import mass_inside, patch_coverage, pointing_game, word_maps

__all__ = ["KINDS", "evaluate", "word_targets"]

KINDS = ("noun", "color", "relation")
DATASET = "shapes/grounding"
# The content word of each relation: the one a relation's map is read from.
_RELATION_WORDS = {relation: relation.split()[-2] if relation.startswith("to ") else relation
                   for relation in RELATIONS}


def word_targets(caption):
    """`[(word index, kind, objects)]` of a shapes caption's grounded words; `objects` the indices of the
    objects (0: the caption's first) the word is about.

    Example:
    >>> word_targets("a red circle above a blue square")
    [(1, 'color', (0,)), (2, 'noun', (0,)), (3, 'relation', (0, 1)), (5, 'color', (1,)), (6, 'noun', (1,))]
    """
    words = caption.split()
    targets = [(1, "color", (0,)), (2, "noun", (0,))]
    if len(words) > 3:
        relation = " ".join(words[3:-3])
        if relation in _RELATION_WORDS:
            targets.append((3 + relation.split().index(_RELATION_WORDS[relation]), "relation", (0, 1)))
        targets += [(len(words) - 2, "color", (1,)), (len(words) - 1, "noun", (1,))]
    return targets


def evaluate(model, num_scenes=400, seed=0, image_size=None, batch_size=32, verbose=False, method=None):
    """The pointing game and mass inside, per kind of word, on held-out shapes scenes.

    Args:
        model: a vlzoo model with a word-to-patch map (`grounding.grounding_method`).
        num_scenes: scenes of the test split (one and two objects, half and half on average).
        seed: the scenes' seed.
        image_size: the scenes' side; default the model's image size (a multiple of its patch size).
        batch_size: scenes per forward pass.
        verbose: a progress bar over the batches.
        method: the word maps, None for the family's own (`grounding.grounding_method`).

    Returns:
        `{"dataset": "shapes/grounding", "task": "word_grounding", "method": ..., "metrics": {...}}` with
        `pointing_<kind>`, `mass_<kind>`, `chance_<kind>` for each kind of `KINDS` and `words_<kind>`, how
        many words were scored; `pair_<kind>` and `distractor_<kind>` for nouns and colours. The
        scores are `grounding.pointing_game` and `grounding.mass_inside` averaged over the words
        of a kind; `chance_<kind>` is the mean share of the image the targets cover.

    Raises:
        ValueError: `num_scenes` not a positive int, or an image side not a multiple of the
            patch size; `grounding.word_maps`' errors (NotImplementedError for a family without
            word maps).

    Example:
    >>> sorted(evaluate(vlzoo.from_preset("sparc_shapes"), num_scenes=40)["metrics"])[:3]  # doctest: +SKIP
    ['chance_color', 'chance_noun', 'chance_relation']
    """
    num_scenes = check_positive_int(num_scenes, "num_scenes")
    size = image_size or model.vision.image_size
    patch = model.vision.patch_size
    if size % patch:
        raise ValueError(f"`image_size` {size} is not a multiple of the model's patch size {patch}.")
    scenes = generate("test", num_scenes, image_size=size, seed=seed)
    coverage = patch_coverage(object_masks(scenes), patch)  # (N, 2, P)
    maps, method = word_maps(model, model.preprocessor(scenes["images"]), scenes["captions"],
                             batch_size=batch_size, verbose=verbose, method=method)
    scores = {kind: {"pointing": [], "mass": [], "chance": [], "pair": [], "distractor": []} for kind in KINDS}
    for i, caption in enumerate(scenes["captions"]):
        for word, kind, objects in word_targets(caption):
            target = coverage[i, list(objects)].sum(axis=0)
            scores[kind]["pointing"].append(pointing_game(maps[i, word], target))
            scores[kind]["mass"].append(mass_inside(maps[i, word], target))
            scores[kind]["chance"].append(target.mean())
            if len(objects) == 1 and scenes["num_objects"][i] == 2:
                scores[kind]["pair"].append(scores[kind]["pointing"][-1])
                scores[kind]["distractor"].append(pointing_game(maps[i, word], coverage[i, 1 - objects[0]]))
    metrics = {}
    for name in ("pointing", "mass", "chance"):
        metrics.update({f"{name}_{kind}": float(np.mean(scores[kind][name])) for kind in KINDS})
    for name in ("pair", "distractor"):
        metrics.update({f"{name}_{kind}": float(np.mean(scores[kind][name])) for kind in KINDS[:2]})
    metrics.update({f"words_{kind}": float(len(scores[kind]["chance"])) for kind in KINDS})
    return {"dataset": DATASET, "task": "word_grounding", "method": method, "metrics": metrics}
