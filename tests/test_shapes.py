"""`vlzoo.data.shapes`: the synthetic coloured-shapes dataset, its splits, binding pairs and metrics."""

import collections
import functools
import itertools
import warnings

import keras
import numpy as np
import pytest
from backend_utils import run_once

from vlzoo.data import shapes
from vlzoo.evaluation import shapes_benchmark

COLOR_NAMES = tuple(shapes.COLORS)


def _arrays_equal(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], np.ndarray):
            assert a[key].dtype == b[key].dtype and a[key].tobytes() == b[key].tobytes(), key
        else:
            assert a[key] == b[key], key


def _objects(data, i):
    """(color, shape) names of example i's objects, in caption order."""
    n = data["num_objects"][i]
    return [(COLOR_NAMES[c], shapes.SHAPES[s]) for c, s in zip(data["colors"][i, :n], data["shapes"][i, :n])]


# ------------------------------------------------------------------------- determinism


@run_once  # numpy only: the dataset and the metrics on known scores
def test_generate_is_deterministic():
    a = shapes.generate("train", 40, seed=5)
    b = shapes.generate("train", 40, seed=5)
    _arrays_equal(a, b)  # same arguments: identical bytes
    assert a["images"].shape == (40, 32, 32, 3) and a["images"].dtype == np.uint8
    assert len(a["captions"]) == 40
    assert not np.array_equal(a["images"], shapes.generate("train", 40, seed=6)["images"])
    assert not np.array_equal(a["images"], shapes.generate("test", 40, seed=5)["images"])
    # A longer call extends a shorter one; the caption style changes captions only.
    longer = shapes.generate("train", 60, seed=5)
    _arrays_equal({key: value[:40] for key, value in longer.items()}, a)
    joined = shapes.generate("train", 40, seed=5, style="and")
    assert np.array_equal(joined["images"], a["images"])
    for caption, other, n in zip(joined["captions"], a["captions"], a["num_objects"]):
        assert (" and a " in caption) == (n == 2) and (caption == other) == (n == 1)


@run_once  # numpy only: the dataset and the metrics on known scores
def test_generate_mixes_one_and_two_objects_and_honours_num_objects():
    mixed = shapes.generate("train", 200, seed=0)
    assert set(mixed["num_objects"]) == {1, 2}
    assert 0.35 < np.mean(mixed["num_objects"] == 1) < 0.65
    for count in (1, 2):
        data = shapes.generate("test", 20, seed=0, num_objects=count)
        assert np.all(data["num_objects"] == count)
        assert np.all((data["labels"] >= 0) == (count == 1))
        assert np.all((data["relations"] >= 0) == (count == 2))


@run_once  # numpy only: the dataset and the metrics on known scores
def test_classification_is_deterministic_and_hard_edged():
    demo = dict(colors=["red", "green", "blue", "yellow"], shapes=["circle", "square", "triangle"])
    a = shapes.classification(2, seed=3, **demo)
    b = shapes.classification(2, seed=3, **demo)
    c = shapes.classification(2, seed=4, **demo)
    assert a["images"].shape == (24, 32, 32, 3) and a["images"].dtype == np.uint8
    _arrays_equal(a, b)
    assert not np.array_equal(a["images"], c["images"])
    assert a["class_names"] == shapes.class_names(demo["colors"], demo["shapes"])
    assert np.bincount(a["labels"]).tolist() == [2] * 12  # balanced
    for image, label, caption in zip(a["images"], a["labels"], a["captions"]):
        assert caption == f"a {a['class_names'][label]}"
        pixels = image.reshape(-1, 3)
        foreground = pixels[np.any(pixels != shapes.BACKGROUND, axis=1)]
        assert len(foreground) > 30
        assert len(np.unique(foreground, axis=0)) == 1  # one flat colour: hard edges
        color = shapes.COLORS[a["class_names"][label].split()[0]]
        assert np.abs(foreground[0].astype(int) - color).max() <= 15
    assert shapes.classification(1)["class_names"] == shapes.class_names()  # default: all 24 classes


# ------------------------------------------------------------------- captions vs pixels


@run_once  # numpy only: the dataset and the metrics on known scores
@pytest.mark.parametrize("image_size", [32, 48])
def test_captions_describe_the_pixels(image_size):
    data = shapes.generate("train", 150, image_size=image_size, seed=2)
    palette = np.array(list(shapes.COLORS.values()))
    for i, caption in enumerate(data["captions"]):
        parsed = shapes.parse_caption(caption)
        assert parsed["objects"] == _objects(data, i), caption
        n = data["num_objects"][i]
        centers, radii = data["centers"][i, :n], data["radii"][i, :n]
        assert np.all(np.isnan(data["centers"][i, n:])) and np.all(data["colors"][i, n:] == -1)
        for (color, shape), (cy, cx), r in zip(parsed["objects"], centers, radii):
            # The pixel under the object's centre has the named colour (up to the +-12 jitter)
            # and is nearer to it than to any other colour of the palette.
            pixel = data["images"][i, int(cy), int(cx)].astype(int)
            assert np.abs(pixel - shapes.COLORS[color]).max() <= 12, (caption, pixel)
            assert COLOR_NAMES[np.argmin(np.abs(palette - pixel).sum(1))] == color
            assert r - 1e-4 <= min(cy, cx) and max(cy, cx) <= image_size - r + 1e-4  # inside the image
        corner = data["images"][i, 0, 0].astype(int)
        assert corner.min() >= 215 and corner.max() - corner.min() <= 8  # light grey background
        if n == 1:
            assert data["labels"][i] == shapes.class_names().index(" ".join(parsed["objects"][0]))
            assert parsed["relation"] is None
            continue
        relation = shapes.RELATIONS[data["relations"][i]]
        assert parsed["relation"] == relation
        (y0, x0), (y1, x1) = centers
        primary, cross = {
            "above": (y1 - y0, x1 - x0), "below": (y0 - y1, x1 - x0),
            "to the left of": (x1 - x0, y1 - y0), "to the right of": (x0 - x1, y1 - y0),
        }[relation]
        assert primary >= radii.sum() and abs(cross) <= primary / 2, caption  # unambiguous, no overlap
        assert parsed["objects"][0][0] != parsed["objects"][1][0]
        assert parsed["objects"][0][1] != parsed["objects"][1][1]


def _ideal_coverage(shape, size, cy, cx, r, supersample=16):
    """Fraction of each pixel inside the shape, per the documented geometry (16 x 16 samples)."""
    grid = (np.arange(size * supersample) + 0.5) / supersample
    yy, xx = grid[:, None], grid[None, :]
    dy, dx = np.abs(yy - cy), np.abs(xx - cx)
    inside = {
        "circle": dy**2 + dx**2 <= r**2,
        "square": np.maximum(dy, dx) <= 0.85 * r,
        "triangle": (dy <= r) & (dx <= (yy - (cy - r)) / 2),  # apex at the box's top, base at its bottom
        "cross": ((dy <= 0.3 * r) & (dx <= 0.9 * r)) | ((dx <= 0.3 * r) & (dy <= 0.9 * r)),
    }[shape]
    inside = np.broadcast_to(inside, (size * supersample,) * 2)
    return inside.reshape(size, supersample, size, supersample).mean((1, 3))


@run_once  # numpy only: the dataset and the metrics on known scores
@pytest.mark.parametrize("image_size", [32, 64])
def test_the_named_shape_is_the_one_drawn(image_size):
    """Each object's anti-aliased coverage, read back from the pixels, matches its named shape
    (mean error under 0.04 per pixel of its box) and no other shape (error at least 0.05 more)."""
    data = shapes.generate("test", 60, image_size=image_size, seed=3)
    grid = np.mgrid[0:image_size, 0:image_size] + 0.5
    for i, caption in enumerate(data["captions"]):
        image = data["images"][i].astype(float)
        background = image[0, 0]
        for k, (_, shape) in enumerate(_objects(data, i)):
            (cy, cx), r = data["centers"][i, k], data["radii"][i, k]
            # This object's box (the other object lies outside it) and its coverage per pixel.
            box = (np.abs(grid - np.array([cy, cx])[:, None, None]) <= r + 1).all(0)
            color = image[int(cy), int(cx)] - background  # the centre pixel is fully covered
            alpha = np.clip((image - background) @ color / np.sum(color**2), 0, 1)
            errors = {name: np.abs(alpha - _ideal_coverage(name, image_size, cy, cx, r))[box].mean()
                      for name in shapes.SHAPES}
            others = min(error for name, error in errors.items() if name != shape)
            assert errors[shape] < 0.04 and others > errors[shape] + 0.05, (caption, shape, errors)


# ----------------------------------------------------------------------- binding pairs


@run_once  # numpy only: the dataset and the metrics on known scores
@pytest.mark.parametrize("swap,style", [("color", "relation"), ("shape", "relation"),
                                        ("relation", "relation"), ("color", "and"), ("shape", "and")])
def test_binding_pairs_differ_only_by_the_swap(swap, style):
    pairs = shapes.binding_pairs("test", 60, swap=swap, style=style, seed=4)
    scenes = shapes.generate("test", 60, seed=4, num_objects=2, style=style)
    assert np.array_equal(pairs["images"], scenes["images"]) and pairs["captions"] == scenes["captions"]
    for true, swapped in zip(pairs["captions"], pairs["swapped_captions"]):
        assert true != swapped and sorted(true.split()) == sorted(swapped.split())  # same words
        t, s = shapes.parse_caption(true), shapes.parse_caption(swapped)
        assert s["relation"] == t["relation"]
        assert (t["relation"] is None) == (style == "and")
        (c0, s0), (c1, s1) = t["objects"]
        expected = {"color": [(c1, s0), (c0, s1)], "shape": [(c0, s1), (c1, s0)],
                    "relation": [(c1, s1), (c0, s0)]}[swap]
        assert s["objects"] == expected
        if swap != "relation":  # a different set of bound objects: false of the image
            assert set(s["objects"]).isdisjoint(t["objects"])


@run_once  # numpy only: the dataset and the metrics on known scores
def test_relation_swap_needs_relation_captions():
    with pytest.raises(ValueError, match="style"):
        shapes.binding_pairs("test", 4, swap="relation", style="and")
    with pytest.raises(ValueError, match="`swap`"):
        shapes.binding_pairs("test", 4, swap="size")


# ------------------------------------------------------------------------------ splits


@run_once  # numpy only: the dataset and the metrics on known scores
def test_splits_hold_out_compositions():
    all_compositions = [(frozenset(c), frozenset(s))
                        for c in itertools.combinations(COLOR_NAMES, 2)
                        for s in itertools.combinations(shapes.SHAPES, 2)]
    held_out = {k for k in all_compositions if shapes.composition_split(list(k[0]), list(k[1])) == "test"}
    assert len(all_compositions) == 90 and len(held_out) == 15
    # Every colour pair holds out exactly one shape pair; every shape pair stays in train with
    # most colour pairs, so every colour pair, shape pair and binding occurs in train.
    assert collections.Counter(colors for colors, _ in held_out) == collections.Counter(
        {c: 1 for c, _ in all_compositions})
    train_compositions = set(all_compositions) - held_out
    assert {s for _, s in train_compositions} == {s for _, s in all_compositions}
    assert {c for c, _ in train_compositions} == {c for c, _ in all_compositions}

    train = shapes.generate("train", 1500, seed=0)
    test = shapes.binding_pairs("test", 300, swap="color", seed=0)

    def compositions(data):
        return {(frozenset(c for c, _ in _objects(data, i)), frozenset(s for _, s in _objects(data, i)))
                for i in range(len(data["captions"])) if data["num_objects"][i] == 2}

    assert compositions(test) == held_out  # 300 samples cover all 15
    assert compositions(train) == train_compositions
    train_captions = set(train["captions"])
    assert train_captions.isdisjoint(test["captions"])
    assert train_captions.isdisjoint(test["swapped_captions"])
    # Every binding, and every one-object class, seen in test also occurs in train.
    train_bindings = {o for i in range(1500) for o in _objects(train, i)}
    assert train_bindings == {o for i in range(300) for o in _objects(test, i)} == set(
        itertools.product(COLOR_NAMES, shapes.SHAPES))
    singles = shapes.generate("test", 300, seed=0, num_objects=1)
    assert set(singles["labels"]) == set(train["labels"][train["labels"] >= 0]) == set(range(24))


@run_once  # numpy only: the dataset and the metrics on known scores
def test_composition_split_ignores_order():
    assert shapes.composition_split(("red", "green"), ("circle", "square")) == "test"
    assert shapes.composition_split(("green", "red"), ("square", "circle")) == "test"
    assert shapes.composition_split(("red", "green"), ("circle", "triangle")) == "train"
    with pytest.raises(ValueError, match="`colors`"):
        shapes.composition_split(("red", "red"), ("circle", "square"))
    with pytest.raises(ValueError, match="`shapes`"):
        shapes.composition_split(("red", "blue"), ("circle", "hexagon"))


# ----------------------------------------------------------------------- vocabulary


@run_once  # numpy only: the dataset and the metrics on known scores
def test_class_names_and_parse_caption():
    names = shapes.class_names()
    assert len(names) == 24 and names[0] == "red circle" and names[1] == "red square"
    assert shapes.class_names(["blue"], ["cross", "circle"], template="a photo of a {}.") == [
        "a photo of a blue cross.", "a photo of a blue circle."]
    assert shapes.parse_caption("a cyan cross to the right of a red triangle") == {
        "objects": [("cyan", "cross"), ("red", "triangle")], "relation": "to the right of"}
    assert shapes.parse_caption("a red circle and a blue square") == {
        "objects": [("red", "circle"), ("blue", "square")], "relation": None}
    for bad in ("a red circle near a blue square", "a pink circle", "red circle", 3):
        with pytest.raises(ValueError, match="`caption`"):
            shapes.parse_caption(bad)
    with pytest.raises(ValueError, match="`template`"):
        shapes.class_names(template="a photo")
    with pytest.raises(ValueError, match="`colors`"):
        shapes.class_names(colors="red")


@run_once  # numpy only: the dataset and the metrics on known scores
@pytest.mark.parametrize("kwargs,name", [
    (dict(split="val"), "`split`"), (dict(num_examples=0), "`num_examples`"),
    (dict(image_size=8), "`image_size`"), (dict(seed=-1), "`seed`"),
    (dict(num_objects=3), "`num_objects`"), (dict(style="or"), "`style`"),
])
def test_generate_argument_errors_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        shapes.generate(**{"split": "train", "num_examples": 2, **kwargs})


# ------------------------------------------------------------------------------ metrics


class FakeModel:
    """Images are `(N, 1)` ids; the tokenizer maps each text to its row in `texts`; scores from `table`."""

    def __init__(self, texts, table):
        self.texts, self.table = list(texts), np.asarray(table, np.float32)
        self.calls = []

    def tokenizer(self, texts):
        return {"token_ids": np.array([self.texts.index(t) for t in texts])}

    def similarity(self, pixels, tokens):
        self.calls.append(len(pixels))
        return self.table[np.asarray(pixels)[:, 0].astype(int)][:, tokens["token_ids"]]


@run_once  # numpy only: the dataset and the metrics on known scores
def test_binding_accuracy_on_known_scores():
    texts = ["t0", "s0", "t1", "s1", "t2", "s2", "t3", "s3"]
    table = np.zeros((4, 8))
    table[0, [0, 1]] = 0.9, 0.1  # true above swapped: right
    table[1, [2, 3]] = 0.2, 0.7  # wrong
    table[2, [4, 5]] = 0.5, 0.5  # tie: counts as wrong
    table[3, [6, 7]] = -1.0, -3.0  # right
    pixels = np.arange(4, dtype=np.float32)[:, None]
    true, swapped = texts[0::2], texts[1::2]
    for batch_size in (1, 3, 64):  # 3: the second batch is padded with a repeat of image 3
        model = FakeModel(texts, table)
        assert shapes_benchmark.binding_accuracy(model, pixels, true, swapped, batch_size=batch_size) == 0.5
        assert model.calls == [min(batch_size, 4)] * -(-4 // batch_size)  # same shapes every call
    assert shapes_benchmark.binding_accuracy(FakeModel(texts, table), pixels, swapped, true) == 0.25
    with pytest.raises(ValueError, match="`true_texts`"):
        shapes_benchmark.binding_accuracy(FakeModel(texts, table), pixels, true[:3], swapped)
    with pytest.raises(ValueError, match="`batch_size`"):
        shapes_benchmark.binding_accuracy(FakeModel(texts, table), pixels, true, swapped, batch_size=0)


@run_once  # numpy only: the dataset and the metrics on known scores
def test_zero_shot_metrics_on_known_scores():
    names = ["red circle", "blue square", "green cross"]
    prompts = [f"a {n}" for n in names]
    labels = np.array([0, 1, 2, 2])
    table = np.array([[5, 1, 0], [0, 2, 9], [0, 0, 3], [0, 0, 4]])  # image 1 misclassified as 2
    metrics = shapes_benchmark.zero_shot_metrics(FakeModel(prompts, table), np.arange(4.0)[:, None], labels, names)
    # Zero-shot 3/4; best image per prompt: 0 (label 0), 1 (label 1), 1 (label 1 != 2): R@1 2/3.
    assert metrics == {"zero_shot_accuracy": 0.75, "t2i_recall@1": pytest.approx(2 / 3)}
    with pytest.raises(ValueError, match="`labels`"):
        shapes_benchmark.zero_shot_metrics(FakeModel(prompts, table), np.arange(4.0)[:, None], labels[:3], names)


@functools.lru_cache(maxsize=None)
def _tiny_preset(name):
    """One model per preset for this module (building and first calls cost seconds on JAX)."""
    import vlzoo

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tiny presets are random-init on purpose
        return vlzoo.from_preset(name)


@pytest.mark.parametrize("preset", ["clip_tiny", "filip_tiny", "llip_tiny"])
def test_binding_accuracy_matches_the_similarity_diagonals(preset):
    """Global (CLIP), token-level (FILIP) and text-conditioned (Llip) scores alike."""
    model = _tiny_preset(preset)
    pairs = shapes.binding_pairs("test", 5, swap="color", seed=0)
    pixels = model.preprocessor(pairs["images"])
    texts = model.tokenizer(pairs["captions"] + pairs["swapped_captions"])
    scores = keras.ops.convert_to_numpy(model.similarity(pixels, texts))
    assert scores.shape == (5, 10)
    expected = np.mean(np.diag(scores[:, :5]) > np.diag(scores[:, 5:]))
    assert shapes_benchmark.binding_accuracy(model, pixels, pairs["captions"], pairs["swapped_captions"]) == expected


def test_model_inputs_feed_fit():
    model = _tiny_preset("clip_tiny")
    data = shapes.generate("train", 16, seed=0)
    inputs = shapes.model_inputs(data["images"], data["captions"], model.tokenizer, model.preprocessor)
    direct = model.tokenizer(data["captions"])
    assert sorted(inputs) == ["images", "padding_mask", "token_ids"]
    np.testing.assert_array_equal(inputs["token_ids"], direct["token_ids"])
    np.testing.assert_array_equal(inputs["padding_mask"], direct["padding_mask"])
    np.testing.assert_array_equal(inputs["images"], model.preprocessor(data["images"]))
    assert inputs["images"].dtype == np.float32 and inputs["images"].shape == (16, 32, 32, 3)
    model.compile(optimizer="adamw")
    history = model.fit(inputs, batch_size=8, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])
    with pytest.raises(ValueError, match="`captions`"):
        shapes.model_inputs(data["images"], data["captions"][:3], model.tokenizer, model.preprocessor)


def test_model_inputs_take_several_captions_per_image():
    """`(N, K, T)` token ids, each image's own captions in order, as FLAIR trains (tools/train_shapes.py)."""
    model = _tiny_preset("clip_tiny")
    data = shapes.generate("train", 4, seed=1, num_objects=2)
    captions = [[caption, *(f"a {c} {s}" for c, s in shapes.parse_caption(caption)["objects"])]
                for caption in data["captions"]]
    inputs = shapes.model_inputs(data["images"], captions, model.tokenizer, model.preprocessor)
    assert inputs["token_ids"].shape == (4, 3, model.text.sequence_length) == inputs["padding_mask"].shape
    for i, texts in enumerate(captions):
        direct = model.tokenizer(texts)
        np.testing.assert_array_equal(inputs["token_ids"][i], direct["token_ids"])
        np.testing.assert_array_equal(inputs["padding_mask"][i], direct["padding_mask"])
    with pytest.raises(ValueError, match=r"`captions` must hold .* received \[2, 3\] captions per image"):
        shapes.model_inputs(data["images"], captions[:3] + [captions[3][:2]], model.tokenizer, model.preprocessor)
    with pytest.raises(ValueError, match=r"received \[1\] captions per image and a mix"):
        shapes.model_inputs(data["images"][:2], [data["captions"][0], [data["captions"][1]]], model.tokenizer,
                            model.preprocessor)
