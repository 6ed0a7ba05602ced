"""Grounding: the pointing game and mass inside (hand-checked), the word maps' wiring (token positions, patch
order, word kinds) through models whose answer is known, and `vlzoo eval --benchmark shapes_grounding`."""

import functools
import json

import keras
import numpy as np
import pytest
from backend_utils import run_once
from margins import tiny_family_model

import vlzoo
from vlzoo import cli
from vlzoo.data import shapes
from vlzoo.evaluation import grounding, shapes_grounding
from vlzoo.evaluation.grounding import mass_inside, patch_coverage, pointing_game, word_token_positions


def to_numpy(x):
    return np.asarray(keras.ops.convert_to_numpy(x))


# ----------------------------------------------------------------------------- the scores, by hand


def test_pointing_game_scores_the_top_patch_and_shares_ties():
    coverage = np.array([0.0, 1.0, 0.5, 0.25])
    assert pointing_game([0.1, 0.9, 0.2, 0.0], coverage) == 1.0
    assert pointing_game([0.9, 0.1, 0.2, 0.0], coverage) == 0.0
    assert pointing_game([0.1, 0.7, 0.7, 0.0], coverage) == pytest.approx(0.75)  # two tied: (1 + 0.5) / 2
    # A map that says nothing (constant, or zeros) scores the object's share of the image: chance.
    for flat in (np.zeros(4), np.full(4, 0.3)):
        assert pointing_game(flat, coverage) == pytest.approx(coverage.mean())
    batched = pointing_game(np.eye(4), np.tile(coverage, (4, 1)))
    np.testing.assert_allclose(batched, coverage)


def test_mass_inside_is_the_weighted_share_and_a_zero_map_is_uniform():
    coverage = np.array([0.0, 1.0, 0.5, 0.25])
    assert mass_inside([0.0, 3.0, 1.0, 0.0], coverage) == pytest.approx((3 * 1.0 + 1 * 0.5) / 4)
    assert mass_inside(np.zeros(4), coverage) == pytest.approx(coverage.mean())
    assert mass_inside(np.full(4, 2.0), coverage) == pytest.approx(coverage.mean())


@pytest.mark.parametrize("maps, coverage, match", [
    ([0.1, -0.1], [0.0, 1.0], "non-negative"),
    ([0.1, np.nan], [0.0, 1.0], "finite"),
    ([0.1, 0.2], [0.0, 1.5], r"\[0, 1\]"),
    ([0.1, 0.2, 0.3], [0.0, 1.0], "same shape"),
])
def test_bad_maps_are_named(maps, coverage, match):
    for score in (pointing_game, mass_inside):
        with pytest.raises(ValueError, match=match):
            score(maps, coverage)


def test_patch_coverage_averages_each_patch_in_the_towers_order():
    masks = np.zeros((4, 4), np.float32)
    masks[0, 2:] = 1.0  # the top-right patch's upper row
    masks[3, 0] = 1.0  # one pixel of the bottom-left patch
    np.testing.assert_allclose(patch_coverage(masks, 2), [0.0, 0.5, 0.25, 0.0])
    with pytest.raises(ValueError, match="multiple of `patch_size`"):
        patch_coverage(np.zeros((5, 5)), 2)
    # The towers flatten patches row by row, as patch_coverage does: a change confined to patch (row 1,
    # column 2) of an image moves that patch's embedding only.
    model = vlzoo.from_preset("clip_tiny", load_weights=False)
    size, patch = model.vision.image_size, model.vision.patch_size
    grid = size // patch
    images = np.zeros((2, size, size, 3), np.float32)
    images[1, patch:2 * patch, 2 * patch:3 * patch] = 1.0
    region = np.zeros((size, size), np.float32)
    region[patch:2 * patch, 2 * patch:3 * patch] = 1.0
    embedded = to_numpy(model.vision.patch_embedding(images))
    moved = np.abs(embedded[1] - embedded[0]).max(axis=-1) > 0
    np.testing.assert_array_equal(moved, patch_coverage(region, patch) > 0)
    assert moved.shape == (grid * grid,) and moved.sum() == 1


@pytest.mark.parametrize("name", ["clip_tiny", "sparc_shapes"])
def test_word_token_positions_hold_each_words_own_tokens(name):
    """Each word's positions in the caption hold the ids the word has alone (start and end tokens stripped)."""
    tokenizer = vlzoo.from_preset(name, load_weights=False).tokenizer
    caption = "a yellow cross to the right of a red circle"
    positions = word_token_positions(tokenizer, caption)
    ids = to_numpy(tokenizer([caption])["token_ids"])[0]
    alone = tokenizer(caption.split())
    alone_ids, alone_mask = to_numpy(alone["token_ids"]), to_numpy(alone["padding_mask"])
    specials = int(to_numpy(tokenizer([""])["padding_mask"]).sum())  # start and end tokens
    start = positions[0][0]  # the start tokens before the first word
    for k, word in enumerate(caption.split()):
        own = alone_ids[k][alone_mask[k]][start:int(alone_mask[k].sum()) - specials + start]
        assert len(own) > 0 and list(ids[positions[k]]) == list(own), word
    flat = [p for word in positions for p in word]
    assert flat == list(range(flat[0], flat[0] + len(flat)))  # contiguous, in order


def test_word_targets_name_each_words_object():
    assert shapes_grounding.word_targets("a red circle") == [(1, "color", (0,)), (2, "noun", (0,))]
    assert shapes_grounding.word_targets("a red circle to the left of a blue square") == [
        (1, "color", (0,)), (2, "noun", (0,)), (5, "relation", (0, 1)), (8, "color", (1,)), (9, "noun", (1,))]


def test_object_masks_are_the_drawn_objects():
    scenes = shapes.generate("test", 6, image_size=32, seed=3, num_objects=2)
    masks = shapes.object_masks(scenes)
    assert masks.shape == (6, 2, 32, 32) and masks.min() >= 0 and masks.max() <= 1
    # A pixel wholly inside object k has object k's colour (+-12 per channel jitter).
    for i in range(6):
        for k in range(2):
            inside = masks[i, k] == 1.0
            color = np.asarray(shapes.COLORS[list(shapes.COLORS)[scenes["colors"][i, k]]], np.float32)
            assert inside.any() and np.abs(scenes["images"][i][inside] - color).max() <= 12
    assert not (masks[:, 0] * masks[:, 1]).any()  # never overlapping


# ----------------------------------------------------------------------------- models whose answer is known


@pytest.fixture(scope="module")
def bundled():
    """`bundled(name)`: `vlzoo.from_preset(name)`, loaded once per module (the tests below only read the models;
    `_Oracle` wraps one without changing it)."""
    return functools.cache(vlzoo.from_preset)


class _Oracle:
    """Wraps a SPARC model: its token maps are, for each grounded word's tokens, the word's target coverage
    (`"truth"`) or constant (`"blind"`), read from the same scenes `evaluate` draws."""

    def __init__(self, model, scenes, kind):
        self.model, self.kind, self.seen = model, kind, 0
        patch = model.vision.patch_size
        self.coverage = patch_coverage(shapes.object_masks(scenes), patch)
        self.captions = scenes["captions"]

    def __getattr__(self, name):
        return getattr(self.model, name)

    def token_patch_alignment(self, images, texts):
        count, length = tuple(texts["token_ids"].shape)
        maps = np.full((count, length, self.coverage.shape[-1]), 0.5, np.float32)
        if self.kind == "truth":
            for row in range(count):
                i = self.seen + row
                positions = word_token_positions(self.model.tokenizer, self.captions[i])
                for word, _, objects in shapes_grounding.word_targets(self.captions[i]):
                    maps[row, positions[word]] = self.coverage[i, list(objects)].sum(axis=0)
        self.seen += count
        return maps


@pytest.mark.parametrize("kind", ["truth", "blind"])
def test_evaluate_scores_a_model_whose_answer_is_known(bundled, kind):
    model = bundled("sparc_shapes")
    size, patch = model.vision.image_size, model.vision.patch_size
    scenes = shapes.generate("test", 24, image_size=size, seed=5)
    record = shapes_grounding.evaluate(_Oracle(model, scenes, kind), num_scenes=24, seed=5, batch_size=10)
    metrics = record["metrics"]
    # The reference, from the masks alone: the truth points at its target's best-covered patch and puts
    # sum(c^2) / sum(c) inside; the blind map scores chance, the target's share.
    # On two-object scenes, a noun or colour is also scored against each object: the truth's best patches
    # (its target's best-covered) against the other object's coverage there, the blind map at the shares.
    coverage = patch_coverage(shapes.object_masks(scenes), patch)
    expected = {name: [] for name in ("pointing", "mass", "chance")}
    pairs = {name: {"noun": [], "color": []} for name in ("pair", "distractor")}
    kinds = []
    for i, caption in enumerate(scenes["captions"]):
        for _, word_kind, objects in shapes_grounding.word_targets(caption):
            target = coverage[i, list(objects)].sum(axis=0)
            kinds.append(word_kind)
            expected["chance"].append(target.mean())
            expected["pointing"].append(target.max() if kind == "truth" else target.mean())
            expected["mass"].append((target**2).sum() / target.sum() if kind == "truth" else target.mean())
            if word_kind != "relation" and scenes["num_objects"][i] == 2:
                other = coverage[i, 1 - objects[0]]
                pairs["pair"][word_kind].append(expected["pointing"][-1])
                pairs["distractor"][word_kind].append(
                    other[target.astype(np.float32) == np.float32(target.max())].mean()  # the oracle's float32 ties
                    if kind == "truth" else other.mean())
    kinds = np.array(kinds)
    assert record["method"] == "token_alignment"
    for word_kind in shapes_grounding.KINDS:
        chosen = kinds == word_kind
        assert metrics[f"words_{word_kind}"] == chosen.sum() > 0
        for name, values in expected.items():
            # The oracle's maps are float32, as a model's: its coverage sums agree to float32 rounding.
            assert metrics[f"{name}_{word_kind}"] == pytest.approx(np.mean(np.array(values)[chosen]), rel=1e-6)
    for name, by_kind in pairs.items():
        for word_kind, values in by_kind.items():
            assert len(values) > 0
            assert metrics[f"{name}_{word_kind}"] == pytest.approx(np.mean(values), rel=1e-6, abs=1e-9)
    if kind == "truth":  # far above chance where the patches resolve the objects, and never the other one
        assert metrics["pointing_noun"] > 3 * metrics["chance_noun"]
        assert metrics["distractor_noun"] < 0.1 * metrics["pair_noun"]


# FLAIR's, PE-Core's and TIPSv2's word maps are held to their own computation on every backend by the two tests
# below (FLAIR's attention and cosine maps against the model's own calls; PE-Core's and TIPSv2's against NumPy from
# their patch features), and `evaluate` scores the maps in NumPy: their whole evaluation runs in one pass only (each
# model's programs cost seconds to compile on JAX and trace on TensorFlow). SPARC's and FILIP's token alignment and
# CLIP's projected patch tokens, which no other test here computes through a model, run on every backend.
@pytest.mark.parametrize("name, method", [("sparc_shapes", "token_alignment"), ("filip_shapes", "token_alignment"),
                                          ("clip_shapes", "patch_text_cosine"),
                                          pytest.param("flair_shapes", "text_attention", marks=run_once),
                                          pytest.param("pe_core_tiny", "patch_text_cosine", marks=run_once),
                                          pytest.param("tipsv2_tiny", "patch_text_cosine", marks=run_once)])
def test_bundled_models_get_scores_in_range_and_the_same_chance(bundled, name, method):
    """The pointing game of every kind of map: the trained shapes presets', and the patch features of the families
    that have them without a shapes preset (PE-Core, TIPSv2: random weights)."""
    model = bundled(name)
    record = shapes_grounding.evaluate(model, num_scenes=32, seed=1)
    metrics = record["metrics"]
    assert record["method"] == method
    assert all(0.0 <= metrics[f"{n}_{k}"] <= 1.0 for n in ("pointing", "mass", "chance")
               for k in shapes_grounding.KINDS), metrics
    scenes = shapes.generate("test", 32, image_size=32, seed=1)
    coverage = patch_coverage(shapes.object_masks(scenes), model.vision.patch_size)
    nouns = [coverage[i, k].mean() for i, c in enumerate(scenes["captions"])
             for _, kind, (k, *_) in shapes_grounding.word_targets(c) if kind == "noun"]
    assert metrics["chance_noun"] == pytest.approx(np.mean(nouns), abs=1e-9)


@pytest.mark.parametrize("method", ["text_attention", "patch_text_cosine"])
def test_flair_word_maps_are_each_word_alone_against_its_own_image(bundled, method):
    """FLAIR's own map (its pooling's attention) and the cosine baseline both read each word encoded alone
    as a text, against the caption's own image."""
    model = bundled("flair_shapes")
    scenes = shapes.generate("test", 3, image_size=32, seed=4)
    pixels = model.preprocessor(scenes["images"])
    maps, used = grounding.word_maps(model, pixels, scenes["captions"], batch_size=2, method=method)
    assert used == method
    for i, caption in enumerate(scenes["captions"]):
        alone = model.tokenizer(caption.split())
        if method == "text_attention":
            expected = to_numpy(model.text_attention_maps(pixels[i:i + 1], alone))[0]
            atol = 1e-6  # the same float32 computation on one image or three: seen 4e-8
        else:
            patches = to_numpy(model.encode_image(pixels[i:i + 1])["tokens"])[0]
            words = to_numpy(model.encode_text(alone)["embeds"])
            cosines = (words / np.linalg.norm(words, axis=-1, keepdims=True)) @ \
                (patches / np.linalg.norm(patches, axis=-1, keepdims=True)).T
            logits = np.exp(to_numpy(model.logit_scale)) * cosines
            expected = np.exp(logits - logits.max(-1, keepdims=True))
            expected /= expected.sum(-1, keepdims=True)
            # A weight moves by itself times its logit's error: the scale times a few float32 ulps of a
            # cosine (numpy's and the backend's sums differ). Seen 1.8e-7 against this 2.9e-6.
            atol = 8 * np.finfo(np.float32).eps * float(np.exp(to_numpy(model.logit_scale))) * expected.max()
        np.testing.assert_allclose(maps[i, :len(caption.split())], expected, atol=atol)
        assert not maps[i, len(caption.split()):].any()
    with pytest.raises(ValueError, match=r"`method` must be one of \['text_attention', 'patch_text_cosine'\]"):
        grounding.grounding_method(model, "token_alignment")


@pytest.mark.parametrize("family", ["pe_core", "tipsv2"])
def test_patch_feature_word_maps_are_the_softmax_of_each_patchs_cosine_with_the_word(family):
    """Grounding's word maps of a family with patch features (PE-Core's projected patch tokens, TIPSv2's patch
    tokens) are those features' cosines with each word's text embedding, times the logit scale, softmaxed over
    the patches (numpy here, from `dense_image_embeddings` and `encode_text`)."""
    keras.utils.set_random_seed(0)
    model = tiny_family_model(family, logit_scale_max=None, init_logit_scale=np.log(20.0))
    images = np.random.default_rng(0).uniform(size=(2, 32, 32, 3)).astype("float32")
    captions = ["a red circle", "two blue squares above"]
    maps, method = grounding.word_maps(model, images, captions)
    assert method == "patch_text_cosine" and maps.shape == (2, 4, 16)  # the longest caption: four words

    def unit(x):
        x = np.asarray(keras.ops.convert_to_numpy(x), np.float64)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    patches = unit(model.dense_image_embeddings(images))
    for i, caption in enumerate(captions):
        words = caption.split()
        texts = unit(model.encode_text(model.tokenizer(words))["embeds"])
        logits = 20.0 * patches[i] @ texts.T  # (P, W)
        want = np.exp(logits - logits.max(0)) / np.exp(logits - logits.max(0)).sum(0)
        np.testing.assert_allclose(maps[i, :len(words)], want.T, atol=1e-5)
        assert not maps[i, len(words):].any()


@pytest.mark.parametrize("name", ["siglip_shapes", "llip_shapes", "sparo_shapes", "stair_shapes"])
def test_families_without_a_word_map_are_refused_with_the_reason(name):
    with pytest.raises(NotImplementedError, match="no word-to-patch map"):
        grounding.grounding_method(vlzoo.from_preset(name, load_weights=False))


@run_once  # the command's wiring; the scores are checked on every backend above
def test_eval_shapes_grounding_prints_and_writes_the_record(bundled, tmp_path, capsys):
    path = tmp_path / "grounding.json"
    assert cli.main(["eval", "--preset", "sparc_shapes", "--benchmark", "shapes_grounding", "--seed", "2",
                     "--json", str(path)]) == 0
    out = capsys.readouterr().out
    (record,) = json.loads(path.read_text())
    expected = shapes_grounding.evaluate(bundled("sparc_shapes"), seed=2)["metrics"]
    assert record["dataset"] == "shapes/grounding" and record["metrics"] == pytest.approx(expected, abs=1e-12)
    assert "words mapped by token_alignment" in out and "pointing_noun" in out
    assert cli.main(["eval", "--preset", "siglip_shapes", "--benchmark", "shapes_grounding"]) == 2
    assert "argument --preset: SigLIP has no word-to-patch map" in capsys.readouterr().err
