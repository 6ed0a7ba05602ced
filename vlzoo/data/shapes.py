"""Synthetic, deterministic images of coloured shapes with captions, for training and probing.

Every image is drawn in numpy from a seed (nothing is downloaded): the same call gives the same
bytes on every machine and backend.

- `generate`: scenes of one object or of two objects with a spatial relation, with captions.
- `binding_pairs`: two-object scenes with a true and an attribute-swapped caption.
- `retrieval_scenes`: one image of each distinct two-object scene of a split.
- `classification`: balanced one-object images per colour-shape class.
- `object_masks`, `class_names`, `vocabulary`, `parse_caption`, `composition_split`,
  `model_inputs`: masks, class names, the WordPiece vocabulary, the grammar read back, the split
  rule, and the dict `model.fit` takes.

Hard negatives of SugarCrepe's and ARO's types: `vlzoo.data.shapes_negatives`; the held-out
benchmark of the `*_shapes` presets: `vlzoo.evaluation.shapes_benchmark.evaluate(model)`.

Vocabulary: 6 colours (`COLORS`), 4 shapes (`SHAPES`), 4 relations (`RELATIONS`); every colour
and shape word takes the article "a". Grammar:

    a COLOR SHAPE
    a COLOR SHAPE RELATION a COLOR SHAPE        (style="relation")
    a COLOR SHAPE and a COLOR SHAPE             (style="and")

The two objects of a scene always differ in colour and in shape.

Splits: a two-object scene's *composition* is its unordered colour pair with its unordered shape
pair. With the pairs of `COLORS` and of `SHAPES` numbered in `itertools.combinations` order, the
k-th of the 15 colour pairs holds out the `(k % 6)`-th of the 6 shape pairs for `test`: 15 of the
90 compositions (`composition_split`). No two-object `test` caption, nor its swapped caption,
occurs in `train`; every colour-shape binding, colour pair, shape pair and word does. One-object
scenes of every class occur in both splits, from different random streams. Why the split is
built this way: docs/evaluation.md, *The shapes dataset's split*.

Example:
>>> from vlzoo.data import shapes
>>> train = shapes.generate("train", 1000, image_size=32, seed=0)
>>> train["images"].shape, train["captions"][:2]
((1000, 32, 32, 3), ['a yellow circle to the left of a cyan cross', 'a yellow triangle above a green cross'])
>>> x = shapes.model_inputs(train["images"], train["captions"], model.tokenizer,
...                         model.preprocessor)  # doctest: +SKIP
>>> model.fit(x, batch_size=32, epochs=5)  # doctest: +SKIP
"""

import itertools
import re

import numpy as np

__all__ = [
    "BACKGROUND",
    "COLORS",
    "RELATIONS",
    "PROMPT_WORDS",
    "SHAPES",
    "SPLITS",
    "SWAPS",
    "WORDPIECE_SPECIALS",
    "binding_accuracy",
    "binding_pairs",
    "class_names",
    "classification",
    "composition_split",
    "vocabulary",
    "evaluate",
    "generate",
    "model_inputs",
    "object_masks",
    "parse_caption",
    "retrieval_scenes",
    "zero_shot_metrics",
]

COLORS = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (40, 70, 220),
    "yellow": (235, 210, 40),
    "purple": (140, 60, 190),
    "cyan": (40, 200, 210),
}
SHAPES = ("circle", "square", "triangle", "cross")
RELATIONS = ("above", "below", "to the left of", "to the right of")
SPLITS = ("train", "test")
SWAPS = ("color", "shape", "relation")
# Words of prompt wordings beyond the captions' own ("a photo of a red circle.").
PROMPT_WORDS = ("an", "the", "photo", "picture", "image", "drawing", "rendering", "of", "this", "is", "there",
                "with", "one", "two", "small", "large", "big", "shape", "object", "colored", "coloured", ".", ",")
WORDPIECE_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
BACKGROUND = (245, 245, 245)  # `classification`'s background; `generate` jitters around it

_COLOR_NAMES = tuple(COLORS)
_COLOR_PAIRS = tuple(itertools.combinations(range(len(COLORS)), 2))
_SHAPE_PAIRS = tuple(itertools.combinations(range(len(SHAPES)), 2))
_SUPERSAMPLE = 4  # `generate`: 4 x 4 samples per pixel give anti-aliased edges
_MIN_IMAGE_SIZE = 16


# ----------------------------------------------------------------------------- checks


def _check_int(value, name, minimum):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}; received {value!r}.")
    return int(value)


def _check_choice(value, name, choices):
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {choices}; received {value!r}.")
    return value


def _check_names(values, name, vocabulary):
    """Validates a subset of `vocabulary` (None: all of it); returns it as a tuple."""
    if values is None:
        return tuple(vocabulary)
    if isinstance(values, str) or len(values) == 0:
        raise ValueError(f"`{name}` must be a non-empty list of names from {tuple(vocabulary)}; "
                         f"received {values!r}.")
    values = tuple(values)
    for value in values:
        if value not in vocabulary:
            raise ValueError(f"`{name}` has an unknown entry {value!r}; expected names from "
                             f"{tuple(vocabulary)}.")
    if len(set(values)) != len(values):
        raise ValueError(f"`{name}` has repeated entries: {values!r}.")
    return values


# -------------------------------------------------------------------------- rendering


def _coverage(shape, size, cy, cx, radius, supersample):
    """Fraction of each pixel of a `(size, size)` image covered by the shape, float32.

    The shape fits the box of half-side `radius` centred on `(cy, cx)` (pixel units,
    pixel `(i, j)` spans `[i, i + 1) x [j, j + 1)`). Each pixel is sampled at
    `supersample x supersample` points; `supersample=1` samples its centre only.
    """
    grid = (np.arange(size * supersample, dtype=np.float32) + 0.5) / supersample
    yy, xx = grid[:, None], grid[None, :]
    dy, dx = np.abs(yy - cy), np.abs(xx - cx)
    if shape == "circle":
        inside = dy**2 + dx**2 <= radius**2
    elif shape == "square":
        inside = (dy <= radius * 0.85) & (dx <= radius * 0.85)
    elif shape == "triangle":  # apex up, base at cy + radius
        top, bottom = cy - radius, cy + radius
        t = np.clip((yy - top) / (bottom - top), 0.0, None)
        inside = (yy >= top) & (yy <= bottom) & (dx <= t * radius)
    elif shape == "cross":
        arm, half_width = radius * 0.9, radius * 0.3
        inside = ((dy <= half_width) & (dx <= arm)) | ((dx <= half_width) & (dy <= arm))
    else:
        raise ValueError(f"Unknown `shape` {shape!r}; expected one of {SHAPES}.")
    inside = np.broadcast_to(inside, (size * supersample, size * supersample))
    return inside.reshape(size, supersample, size, supersample).mean(axis=(1, 3), dtype=np.float32)


def _draw(size, background, objects, supersample):
    """uint8 `(size, size, 3)` image: `objects` = [(shape, cy, cx, radius, rgb), ...]."""
    canvas = np.empty((size, size, 3), np.float32)
    canvas[...] = background
    for shape, cy, cx, radius, rgb in objects:
        alpha = _coverage(shape, size, cy, cx, radius, supersample)[..., None]
        canvas = canvas * (1.0 - alpha) + np.asarray(rgb, np.float32) * alpha
    return np.rint(canvas).astype(np.uint8)


def _place_pair(rng, size, radii, relation):
    """Centres `(2, 2)` (y, x) of two non-overlapping objects with object 0 `relation` object 1.

    Along the relation's axis the centres are at least `r0 + r1` plus a margin apart,
    and across it at most half that distance apart, so the relation is unambiguous.
    """
    axis = 0 if relation in ("above", "below") else 1
    first = 0 if relation in ("above", "to the left of") else 1  # the object nearer the origin
    r_first, r_second = radii[first], radii[1 - first]
    gap = rng.uniform(r_first + r_second + 0.04 * size, size - r_first - r_second)
    p_first = rng.uniform(r_first, size - r_second - gap)
    q_first = rng.uniform(r_first, size - r_first)
    q_second = rng.uniform(max(r_second, q_first - gap / 2), min(size - r_second, q_first + gap / 2))
    centers = np.empty((2, 2), np.float32)
    centers[first, axis], centers[first, 1 - axis] = p_first, q_first
    centers[1 - first, axis], centers[1 - first, 1 - axis] = p_first + gap, q_second
    return centers


def _jittered(rng, rgb, amount):
    return np.clip(np.asarray(rgb) + rng.integers(-amount, amount + 1, size=3), 0, 255)


# --------------------------------------------------------------------------- captions


def class_names(colors=None, shapes=None, template="{}"):
    """The colour-shape classes ("red circle", ...), colour-major, each put in `template`.

    Args:
        colors: colour names to use, a subset of `COLORS` (default: all, in order).
        shapes: shape names to use, a subset of `SHAPES` (default: all, in order).
        template: format string with one `{}`, e.g. `"a photo of a {}."` for prompts.

    Returns:
        list of `len(colors) * len(shapes)` str; class `i` is colour
        `i // len(shapes)` with shape `i % len(shapes)`.

    Raises:
        ValueError: unknown, repeated or no colours or shapes; a `template` without exactly one `{}`.

    Example:
    >>> class_names(["red", "blue"], ["circle"], template="a photo of a {}.")
    ['a photo of a red circle.', 'a photo of a blue circle.']
    """
    colors = _check_names(colors, "colors", COLORS)
    shapes = _check_names(shapes, "shapes", SHAPES)
    if not isinstance(template, str) or template.count("{}") != 1:
        raise ValueError(f"`template` must be a str with exactly one '{{}}'; received {template!r}.")
    return [template.format(f"{color} {shape}") for color in colors for shape in shapes]


def vocabulary():
    """The WordPiece vocabulary of the dataset: specials, caption words, prompt words.

    Ids 0-4 are `WORDPIECE_SPECIALS` (`[PAD]`, `[UNK]`, `[CLS]`, `[SEP]`, `[MASK]`),
    then "a", the colours, the shapes, the words of the relations and "and" in the
    order they first occur, then the other `PROMPT_WORDS`; 45 tokens. Any other word tokenises
    to `[UNK]`. `presets/_assets/shapes_words/vocab.txt` holds it (written by
    tools/build_presets.py) for the `stair_shapes` preset, whose sparse embeddings
    are weights over exactly these words.

    Returns:
        list of str, line `i` of `vocab.txt` = id `i`.

    Example:
    >>> vocabulary()[5:8]
    ['a', 'red', 'green']
    """
    words = ["a", *COLORS, *SHAPES]
    for relation in RELATIONS + ("and",):
        words += relation.split()
    words += PROMPT_WORDS
    return list(WORDPIECE_SPECIALS) + list(dict.fromkeys(words))


def _caption(colors, shapes, relation, style):
    """Caption of a scene: colour/shape indices of its 1 or 2 objects, a relation index."""
    phrases = [f"a {_COLOR_NAMES[c]} {SHAPES[s]}" for c, s in zip(colors, shapes)]
    if len(phrases) == 1:
        return phrases[0]
    link = RELATIONS[relation] if style == "relation" else "and"
    return f"{phrases[0]} {link} {phrases[1]}"


_CAPTION_PATTERN = re.compile(
    r"a (\w+) (\w+)(?: (" + "|".join(RELATIONS + ("and",)) + r") a (\w+) (\w+))?"
)


def parse_caption(caption):
    """Reads a caption of this dataset back into its objects and relation.

    Args:
        caption: str following the grammar in the module docstring.

    Returns:
        dict with `"objects"`: list of `(color, shape)` name pairs (1 or 2, in caption
        order) and `"relation"`: a name from `RELATIONS`, or None for one object or the
        "and" style.

    Raises:
        ValueError: `caption` does not follow the grammar or names an unknown colour or shape.

    Example:
    >>> parse_caption("a red circle to the left of a blue square")
    {'objects': [('red', 'circle'), ('blue', 'square')], 'relation': 'to the left of'}
    """
    match = _CAPTION_PATTERN.fullmatch(caption) if isinstance(caption, str) else None
    if match is None:
        raise ValueError(f"`caption` {caption!r} does not follow the shapes grammar "
                         "'a COLOR SHAPE [RELATION|and a COLOR SHAPE]'.")
    color_a, shape_a, link, color_b, shape_b = match.groups()
    objects = [(color_a, shape_a)] + ([(color_b, shape_b)] if link else [])
    for color, shape in objects:
        if color not in COLORS or shape not in SHAPES:
            raise ValueError(f"`caption` {caption!r} names an unknown colour or shape "
                             f"({color!r}, {shape!r}); colours {_COLOR_NAMES}, shapes {SHAPES}.")
    return {"objects": objects, "relation": link if link in RELATIONS else None}


# ------------------------------------------------------------------------------ splits


def _composition_split(color_pair, shape_pair):
    """`composition_split` on index pairs."""
    k = _COLOR_PAIRS.index(tuple(sorted(color_pair)))
    held_out = _SHAPE_PAIRS[k % len(_SHAPE_PAIRS)]
    return "test" if tuple(sorted(shape_pair)) == held_out else "train"


def composition_split(colors, shapes):
    """The split, "train" or "test", that a two-object composition belongs to.

    Args:
        colors: the two (different) colour names of the scene, in any order.
        shapes: the two (different) shape names, in any order.

    Returns:
        "test" for the 15 held-out compositions (see *Splits* in the module
        docstring), else "train".

    Raises:
        ValueError: not two different known colours and two different known shapes.

    Example:
    >>> composition_split(("red", "green"), ("circle", "square"))
    'test'
    >>> composition_split(("green", "red"), ("square", "circle"))  # order is irrelevant
    'test'
    """
    colors = _check_names(colors, "colors", COLORS)
    shapes = _check_names(shapes, "shapes", SHAPES)
    if len(colors) != 2 or len(shapes) != 2:
        raise ValueError(f"`colors` and `shapes` must each name 2 different entries; received "
                         f"{colors!r} and {shapes!r}.")
    return _composition_split([_COLOR_NAMES.index(c) for c in colors],
                              [SHAPES.index(s) for s in shapes])


def _compositions(split):
    """Ordered `(color_0, shape_0, color_1, shape_1)` index tuples of two-object scenes in `split`."""
    return [
        (c0, s0, c1, s1)
        for c0, c1 in itertools.permutations(range(len(COLORS)), 2)
        for s0, s1 in itertools.permutations(range(len(SHAPES)), 2)
        if _composition_split((c0, c1), (s0, s1)) == split
    ]


# ---------------------------------------------------------------------------- datasets


def generate(split, num_examples, image_size=32, seed=0, num_objects=None, style="relation"):
    """Deterministic images of one or two coloured shapes with their captions.

    One-object scenes draw a class uniformly (every colour-shape class, both splits);
    two-object scenes draw a composition of `split` uniformly (see *Splits* in the
    module docstring) and a relation uniformly from `RELATIONS`. Sizes, positions, the
    colour of each object (+-12 per channel) and the background (a light grey, slightly
    tinted) are random; edges are anti-aliased (4 x 4 samples per pixel). Example `i` depends
    only on `(split, seed, image_size, num_objects, i)`: a longer call extends a shorter one.

    Args:
        split: "train" or "test".
        num_examples: number of scenes `N` (>= 1).
        image_size: side `S` of the square images (>= 16; 32-64 suits small models).
        seed: int seed; the same arguments give the same bytes.
        num_objects: 1 or 2 for only those scenes; None for each half and half at random.
        style: "relation" ("a red circle above a blue square") or "and" ("a red circle
            and a blue square") for two-object captions.

    Returns:
        dict of
        - `"images"`: uint8 `(N, S, S, 3)`;
        - `"captions"`: list of `N` str, caption `i` describing image `i` (captions may
          repeat; compare them as strings to find every image a caption matches);
        - `"num_objects"`: int `(N,)`, 1 or 2;
        - `"colors"`, `"shapes"`: int `(N, 2)` indices into `COLORS` (in order) and
          `SHAPES` of object 0 (the caption's first) and object 1; -1 where absent;
        - `"relations"`: int `(N,)` index into `RELATIONS` (object 0 `relation` object 1,
          also for the "and" style); -1 for one object;
        - `"centers"`: float32 `(N, 2, 2)` (y, x) centres in pixels; NaN where absent;
        - `"radii"`: float32 `(N, 2)` half-sides of the objects' boxes; NaN where absent;
        - `"labels"`: int `(N,)` index into `class_names()` of one-object scenes; -1 for two.

    Raises:
        ValueError: an argument outside the values above.

    Example:
    >>> data = generate("test", 4, image_size=48, seed=1, num_objects=2, style="and")
    >>> data["images"].shape
    (4, 48, 48, 3)
    >>> data["captions"][0]
    'a yellow cross and a red circle'
    """
    _check_choice(split, "split", SPLITS)
    n = _check_int(num_examples, "num_examples", 1)
    size = _check_int(image_size, "image_size", _MIN_IMAGE_SIZE)
    seed = _check_int(seed, "seed", 0)
    _check_choice(num_objects, "num_objects", (None, 1, 2))
    _check_choice(style, "style", ("relation", "and"))

    rng = np.random.default_rng([seed, SPLITS.index(split)])
    compositions = _compositions(split)
    out = {
        "images": np.empty((n, size, size, 3), np.uint8),
        "captions": [],
        "num_objects": np.empty((n,), np.int64),
        "colors": np.full((n, 2), -1, np.int64),
        "shapes": np.full((n, 2), -1, np.int64),
        "relations": np.full((n,), -1, np.int64),
        "centers": np.full((n, 2, 2), np.nan, np.float32),
        "radii": np.full((n, 2), np.nan, np.float32),
        "labels": np.full((n,), -1, np.int64),
    }
    for i in range(n):
        count = num_objects if num_objects is not None else int(rng.integers(1, 3))
        if count == 1:
            label = int(rng.integers(len(COLORS) * len(SHAPES)))
            colors, shapes = [label // len(SHAPES)], [label % len(SHAPES)]
            relation = -1
            radii = [rng.uniform(0.18, 0.32) * size]
            centers = rng.uniform(radii[0], size - radii[0], size=(1, 2))
            out["labels"][i] = label
        else:
            c0, s0, c1, s1 = compositions[rng.integers(len(compositions))]
            colors, shapes = [c0, c1], [s0, s1]
            relation = int(rng.integers(len(RELATIONS)))
            radii = list(rng.uniform(0.12, 0.19, size=2) * size)
            centers = _place_pair(rng, size, radii, RELATIONS[relation])
        rgbs = [_jittered(rng, COLORS[_COLOR_NAMES[c]], 12) for c in colors]
        background = _jittered(rng, (rng.integers(225, 251),) * 3, 4)
        objects = [(SHAPES[s], cy, cx, r, rgb)
                   for s, (cy, cx), r, rgb in zip(shapes, centers, radii, rgbs)]
        out["images"][i] = _draw(size, background, objects, _SUPERSAMPLE)
        out["captions"].append(_caption(colors, shapes, relation, style))
        out["num_objects"][i] = count
        out["colors"][i, :count], out["shapes"][i, :count] = colors, shapes
        out["relations"][i] = relation
        out["centers"][i, :count], out["radii"][i, :count] = centers, radii
    return out


def binding_pairs(split, num_examples, swap="color", image_size=32, seed=0, style="relation"):
    """Two-object scenes, each with its true caption and an attribute-swapped caption.

    The scenes are `generate(split, num_examples, image_size, seed, num_objects=2,
    style)`. The swapped caption uses the same words as the true one, rearranged:
    - `swap="color"`: the two objects' colours exchanged ("a red circle above a blue
      square" -> "a blue circle above a red square");
    - `swap="shape"`: their shapes exchanged (-> "a red square above a blue circle");
    - `swap="relation"`: the objects' roles exchanged (-> "a blue square above a red
      circle"); only for `style="relation"`.
    Each swapped caption is false of its image (the two objects differ in colour and in
    shape), and on `test` neither caption occurs in `train` (see *Splits*).

    Args:
        split, num_examples, image_size, seed, style: as in `generate`.
        swap: "color", "shape" or "relation".

    Returns:
        `generate`'s dict plus `"swapped_captions"`: list of `N` str.

    Raises:
        ValueError: an unknown `swap`, `swap="relation"` without `style="relation"`, or
            `generate`'s checks.

    Example:
    >>> pairs = binding_pairs("test", 2, swap="color", style="and", seed=0)
    >>> pairs["captions"][0], pairs["swapped_captions"][0]
    ('a yellow cross and a red circle', 'a red cross and a yellow circle')
    """
    _check_choice(swap, "swap", SWAPS)
    if swap == "relation" and style != "relation":
        raise ValueError(f"`swap='relation'` needs `style='relation'`; received style={style!r}.")
    data = generate(split, num_examples, image_size=image_size, seed=seed, num_objects=2, style=style)
    data["swapped_captions"] = []
    for colors, shapes, relation in zip(data["colors"], data["shapes"], data["relations"]):
        if swap == "color":
            colors = colors[::-1]
        elif swap == "shape":
            shapes = shapes[::-1]
        else:
            colors, shapes = colors[::-1], shapes[::-1]
        data["swapped_captions"].append(_caption(colors, shapes, relation, style))
    return data


def object_masks(data):
    """Each object's share of each pixel, as drawn: float32 `(N, 2, S, S)` in [0, 1].

    Args:
        data: a dict returned by `generate` (its `"images"`, `"shapes"`, `"centers"`,
            `"radii"`).

    Returns:
        Object `k` of scene `i` (the caption's `k`-th) covers pixel `(y, x)` by
        `masks[i, k, y, x]`, the anti-aliased coverage `generate` drew it with (its
        4 x 4 samples per pixel); zeros where scene `i` has one object. The objects of a
        scene never overlap.

    Example:
    >>> scenes = generate("test", 2, image_size=32, num_objects=2)
    >>> object_masks(scenes).shape
    (2, 2, 32, 32)
    """
    size = data["images"].shape[1]
    masks = np.zeros((len(data["images"]), 2, size, size), np.float32)
    for i, k in zip(*np.nonzero(data["shapes"] >= 0)):
        (cy, cx), radius = data["centers"][i, k], data["radii"][i, k]
        masks[i, k] = _coverage(SHAPES[data["shapes"][i, k]], size, cy, cx, radius, _SUPERSAMPLE)
    return masks


def _scene_key(colors, shapes, relation):
    """The scene a two-object caption describes, whatever its wording: the objects in
    top-to-bottom or left-to-right order with the axis ("A below B" is "B above A")."""
    objects = list(zip(colors, shapes))
    if RELATIONS[relation] in ("below", "to the right of"):
        objects.reverse()
    return (RELATIONS[relation] in ("above", "below"),) + tuple(objects)


def retrieval_scenes(split, image_size=32, seed=0):
    """One image of each distinct two-object scene of `split`, for retrieval recall.

    A scene is its two coloured shapes and their arrangement; "a red circle above a
    blue square" and "a blue square below a red circle" are the same scene, so only
    the first of them is kept. No caption of the set is true of another image of it,
    so recall@K is well posed. `test` has 120 scenes
    (15 held-out compositions x 2 bindings x 2 axes x 2 orders), `train` 600.

    Args:
        split, image_size, seed: as in `generate` (scenes are taken in `generate`'s
            order, two-object scenes only, until every scene of the split is found).

    Returns:
        `generate`'s dict restricted to the kept scenes (`N` = 120 or 600), caption `i`
        describing image `i` and no other.

    Raises:
        ValueError: `generate`'s checks.

    Example:
    >>> scenes = retrieval_scenes("test")
    >>> len(scenes["captions"])
    120
    >>> retrieval_recall(model, model.preprocessor(scenes["images"]), scenes["captions"],
    ...                  ks=(1, 5))  # doctest: +SKIP
    """
    # Per composition: 4 ordered object pairs x 4 relations = 8 scenes x 2 wordings.
    total = 2 * len(_compositions(split))
    chunk, start, kept, parts = 4 * total, 0, set(), []
    while len(kept) < total:
        data = generate(split, start + chunk, image_size=image_size, seed=seed, num_objects=2)
        for i in range(start, start + chunk):
            key = _scene_key(data["colors"][i], data["shapes"][i], data["relations"][i])
            if key not in kept:
                kept.add(key)
                parts.append(i)
        start += chunk
    rows = np.array(parts)
    return {key: (np.asarray(value)[rows] if key != "captions" else [value[r] for r in rows])
            for key, value in data.items()}


def classification(num_per_class, seed=0, image_size=32, colors=None, shapes=None):
    """Balanced one-object images for zero-shot classification, as `vlzoo demo` draws them.

    Every class of `class_names(colors, shapes)` gets `num_per_class` images: one shape
    of random size and position, its colour jittered by up to 15 per channel, with hard
    edges on the plain `BACKGROUND`, in shuffled order. There is no train/test rule
    beyond the seed: use different seeds for training and held-out images.

    Args:
        num_per_class: images per class (>= 1).
        seed: int seed; the same arguments give the same bytes.
        image_size: side `S` of the square images (>= 16).
        colors, shapes: the classes' colours and shapes, subsets of `COLORS` and
            `SHAPES` (default: all).

    Returns:
        dict of `"images"`: uint8 `(N, S, S, 3)` with `N = num_per_class *
        len(class_names)`; `"labels"`: int `(N,)` indices into `"class_names"`;
        `"captions"`: `N` str ("a red circle"); `"class_names"`: the list of classes.

    Raises:
        ValueError: an argument outside the values above, or `class_names`' checks.

    Example:
    >>> data = classification(2, seed=3, colors=["red", "blue"], shapes=["circle", "square"])
    >>> data["images"].shape, data["class_names"]
    ((8, 32, 32, 3), ['red circle', 'red square', 'blue circle', 'blue square'])
    """
    per_class = _check_int(num_per_class, "num_per_class", 1)
    seed = _check_int(seed, "seed", 0)
    size = _check_int(image_size, "image_size", _MIN_IMAGE_SIZE)
    names = class_names(colors, shapes)
    rng = np.random.default_rng(seed)
    n = per_class * len(names)
    labels = np.repeat(np.arange(len(names)), per_class)[rng.permutation(n)]
    images = np.empty((n, size, size, 3), np.uint8)
    for i, label in enumerate(labels):
        color, shape = names[label].split()
        radius = rng.uniform(0.22, 0.36) * size
        cy, cx = rng.uniform(radius, size - radius, size=2)
        rgb = _jittered(rng, COLORS[color], 15)
        images[i] = _draw(size, BACKGROUND, [(shape, cy, cx, radius, rgb)], supersample=1)
    return {"images": images, "labels": labels, "captions": [f"a {names[label]}" for label in labels],
            "class_names": names}


def model_inputs(images, captions, tokenizer, preprocessor):
    """The dict `model.fit(x=...)` takes, from images and their captions.

    Each distinct caption is tokenised once (captions here repeat a lot).

    Args:
        images: uint8 `(N, H, W, 3)` images, e.g. `generate(...)["images"]`.
        captions: `N` str, caption `i` paired with image `i`; or `N` lists of `K`
            str, several captions of each image (FLAIR's training input).
        tokenizer: a vlzoo tokenizer, e.g. `model.tokenizer`.
        preprocessor: an image preprocessor, e.g. `model.preprocessor`.

    Returns:
        dict of numpy arrays: `"images"` float32 `(N, S, S, 3)` preprocessed pixels,
        `"token_ids"` int32 `(N, T)`, `"padding_mask"` bool `(N, T)` (`(N, K, T)`
        with `K` captions per image).

    Raises:
        ValueError: `images` and `captions` of different lengths, no captions, or captions mixing
            strings and lists or lists of different lengths.

    Example:
    >>> data = generate("train", 256)
    >>> model.fit(model_inputs(data["images"], data["captions"], model.tokenizer,
    ...                        model.preprocessor), batch_size=32, epochs=2)  # doctest: +SKIP
    """
    captions = list(captions)
    if len(captions) != len(images):
        raise ValueError(f"`images` and `captions` must have the same length; received "
                         f"{len(images)} images and {len(captions)} captions.")
    if not captions:
        raise ValueError("`captions` is empty: give at least one image and its caption.")
    several = {isinstance(caption, (list, tuple)) for caption in captions}
    per_image = [caption if isinstance(caption, (list, tuple)) else [caption] for caption in captions]
    counts = {len(texts) for texts in per_image}
    if len(several) > 1 or len(counts) > 1 or 0 in counts or \
            any(not isinstance(text, str) for texts in per_image for text in texts):
        raise ValueError(f"`captions` must hold one string per image, or for every image a list of the same number "
                         f"of strings, not a mix; received {sorted(counts)} captions per image"
                         f"{' and a mix' if len(several) > 1 else ''}.")
    distinct = sorted({text for texts in per_image for text in texts})
    tokens = tokenizer(distinct)
    index = {caption: row for row, caption in enumerate(distinct)}
    rows = np.array([[index[text] for text in texts] for texts in per_image], np.int64)
    if several != {True}:  # one string per image: (N, T)
        rows = rows[:, 0]
    inputs = {key: np.asarray(value)[rows] for key, value in tokens.items()}
    inputs["images"] = preprocessor(images)
    return inputs
