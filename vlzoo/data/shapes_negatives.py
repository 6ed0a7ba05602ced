"""Hard negative captions of `vlzoo.data.shapes` scenes, after SugarCrepe and ARO.

Each example is an image, a caption true of it and a *negative* caption false of it
by construction, built from the scene's own ground truth (its colours, shapes and
relation), never by editing free text. The ten types:

SugarCrepe (Hsieh et al., NeurIPS 2023), on two-object scenes captioned
"a COLOR SHAPE RELATION a COLOR SHAPE":
- `replace_obj`: one object's shape replaced by a shape absent from the scene;
- `replace_att`: one object's colour replaced by a colour absent from the scene;
- `replace_rel`: the relation replaced by one of the three others (the relation of
  a scene is the axis of the objects' larger offset and its sign, which the
  generator keeps unambiguous: the other offset is at most half as large);
- `swap_obj`: the two shapes exchanged, the colours left in place;
- `swap_att`: the two colours exchanged, the shapes left in place;
- `add_obj`: on one-object scenes ("a red circle"), a second object with a random
  relation added before or after it ("a red circle below a blue cross"); the
  added object differs in colour and shape, and the pair is a composition of the
  split, so on `test` the negative is a held-out composition;
- `add_att`: the true caption leaves one object's colour out ("a circle above a blue
  square"), the negative gives that object a colour absent from the scene.

ARO (Yuksekgonul et al., ICLR 2023):
- `vg_relation`: the objects' roles in the relation exchanged ("a blue square
  above a red circle");
- `vg_attribution`: "a COLOR SHAPE and a COLOR SHAPE" captions, colours exchanged;
- `order`: the caption's words rearranged by one of ARO's four perturbations, in
  turn (example `i` uses perturbation `i % 4`): the colour words among themselves
  and the shape words among themselves; every other word; the words inside each
  consecutive trigram; the order of the trigrams. An arrangement equal to the
  caption is drawn again. ARO ranks the four shuffles together; here each example
  has one, so every type has the same chance level.

A swap never gives back the caption (the two objects differ in colour and shape).
The scenes are `generate(split, N, image_size, seed, num_objects=2)` (one object for
`add_obj`), the same for every type with the same arguments; the negatives' choices
come from their own random stream per `(seed, split, type)`, so the scenes are
exactly those of `generate` and `binding_pairs`.

Example:
>>> data = negatives("replace_att", 2, seed=0)
>>> data["captions"][0], data["negative_captions"][0]
('a yellow cross to the right of a red circle', 'a yellow cross to the right of a cyan circle')
"""

import numpy as np

from vlzoo.data.shapes import (
    COLORS,
    RELATIONS,
    SHAPES,
    SPLITS,
    _caption,
    _check_choice,
    _check_int,
    _composition_split,
    binding_pairs,
    generate,
)

__all__ = ["NEGATIVE_TYPES", "ORDER_PERTURBATIONS", "negatives", "shuffled_caption"]

NEGATIVE_TYPES = ("replace_obj", "replace_att", "replace_rel", "swap_obj", "swap_att", "add_obj", "add_att",
                  "vg_relation", "vg_attribution", "order")
ORDER_PERTURBATIONS = ("nouns_and_adjectives", "all_but_nouns_and_adjectives", "within_trigrams", "trigrams")

# The types that are `binding_pairs` swaps: (swap, style).
_SWAPS = {"swap_obj": ("shape", "relation"), "swap_att": ("color", "relation"),
          "vg_relation": ("relation", "relation"), "vg_attribution": ("color", "and")}


def _permuted(rng, items):
    return [items[j] for j in rng.permutation(len(items))]


def shuffled_caption(caption, perturbation, rng):
    """`caption` with its words rearranged by one of ARO's perturbations (`ORDER_PERTURBATIONS`).

    Words are split on spaces. Colour words count as ARO's adjectives and shape
    words as its nouns; they are permuted among their own positions, separately.

    Args:
        caption: str, e.g. a caption of `generate`.
        perturbation: a name from `ORDER_PERTURBATIONS`.
        rng: a `numpy.random.Generator`.

    Returns:
        str with the same words (it may equal `caption`; `negatives` draws again then).

    Example:
    >>> shuffled_caption("a red circle above a blue square", "trigrams", np.random.default_rng(0))
    'square a red circle above a blue'
    """
    _check_choice(perturbation, "perturbation", ORDER_PERTURBATIONS)
    words = caption.split(" ")
    if perturbation in ORDER_PERTURBATIONS[2:]:
        trigrams = [words[i:i + 3] for i in range(0, len(words), 3)]
        if perturbation == "within_trigrams":
            trigrams = [_permuted(rng, trigram) for trigram in trigrams]
        else:
            trigrams = _permuted(rng, trigrams)
        return " ".join(word for trigram in trigrams for word in trigram)
    if perturbation == "nouns_and_adjectives":
        groups = [[i for i, w in enumerate(words) if w in COLORS], [i for i, w in enumerate(words) if w in SHAPES]]
    else:
        groups = [[i for i, w in enumerate(words) if w not in COLORS and w not in SHAPES]]
    out = list(words)
    for positions in groups:
        for position, word in zip(positions, _permuted(rng, [words[i] for i in positions])):
            out[position] = word
    return " ".join(out)


def _without_color(caption, obj):
    """`caption` (two objects) with object `obj`'s colour word left out."""
    words = caption.split(" ")
    del words[1 if obj == 0 else len(words) - 2]
    return " ".join(words)


def _absent(rng, size, present):
    """A random index in `range(size)` not in `present`."""
    return int(rng.choice([k for k in range(size) if k not in set(present)]))


def _negative(kind, rng, i, colors, shapes, relation, split):
    """(true caption, negative caption) of example `i` of a `kind` not in `_SWAPS`."""
    colors, shapes = list(colors), list(shapes)
    caption = _caption(colors, shapes, relation, "relation")
    if kind == "add_obj":
        (color,), (shape,) = colors, shapes
        added = [(c, s) for c in range(len(COLORS)) for s in range(len(SHAPES))
                 if c != color and s != shape and _composition_split((color, c), (shape, s)) == split]
        new_color, new_shape = added[rng.integers(len(added))]
        order = slice(None) if rng.integers(2) == 0 else slice(None, None, -1)
        return caption, _caption([color, new_color][order], [shape, new_shape][order],
                                 int(rng.integers(len(RELATIONS))), "relation")
    if kind == "order":  # terminates: every perturbation can move two different words of these captions
        perturbation = ORDER_PERTURBATIONS[i % len(ORDER_PERTURBATIONS)]
        negative = caption
        while negative == caption:
            negative = shuffled_caption(caption, perturbation, rng)
        return caption, negative
    if kind == "replace_rel":
        return caption, _caption(colors, shapes, _absent(rng, len(RELATIONS), [relation]), "relation")
    obj = int(rng.integers(2))
    if kind == "replace_obj":
        shapes[obj] = _absent(rng, len(SHAPES), shapes)
    else:  # replace_att, add_att
        colors[obj] = _absent(rng, len(COLORS), colors)
    negative = _caption(colors, shapes, relation, "relation")
    if kind == "add_att":
        return _without_color(caption, obj), negative
    return caption, negative


def negatives(kind, num_examples, split="test", image_size=32, seed=0):
    """Scenes of `split`, each with a caption true of it and a hard negative of type `kind`.

    Args:
        kind: a name from `NEGATIVE_TYPES` (see the module docstring).
        num_examples: number of scenes `N` (>= 1).
        split: "test" (held-out compositions, the default) or "train".
        image_size: side `S` of the square images (>= 16).
        seed: int seed; the same arguments give the same bytes and captions.

    Returns:
        `generate`'s dict (`"images"` uint8 `(N, S, S, 3)`, the ground truth
        `"colors"`, `"shapes"`, `"relations"`, `"centers"`, ...), with `"captions"`
        the true captions (for `add_att` without one object's colour) and
        `"negative_captions"`: list of `N` str, each false of its image.

    Example:
    >>> data = negatives("add_obj", 2, seed=0)
    >>> data["captions"][0], data["negative_captions"][0]
    ('a yellow circle', 'a yellow circle above a green square')
    """
    _check_choice(kind, "kind", NEGATIVE_TYPES)
    _check_choice(split, "split", SPLITS)
    n = _check_int(num_examples, "num_examples", 1)
    seed = _check_int(seed, "seed", 0)
    if kind in _SWAPS:
        swap, style = _SWAPS[kind]
        data = binding_pairs(split, n, swap=swap, image_size=image_size, seed=seed, style=style)
        data["negative_captions"] = data.pop("swapped_captions")
        return data
    data = generate(split, n, image_size=image_size, seed=seed, num_objects=1 if kind == "add_obj" else 2)
    rng = np.random.default_rng([seed, SPLITS.index(split), 1 + NEGATIVE_TYPES.index(kind)])
    pairs = [_negative(kind, rng, i, colors[:count], shapes[:count], relation, split)
             for i, (colors, shapes, relation, count)
             in enumerate(zip(data["colors"], data["shapes"], data["relations"], data["num_objects"]))]
    data["captions"] = [true for true, _ in pairs]
    data["negative_captions"] = [negative for _, negative in pairs]
    return data
