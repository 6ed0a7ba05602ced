"""Alignment maps render real content."""

import numpy as np
import pytest
from keras import ops
from PIL import Image

from vlzoo import losses, viz
from vlzoo.models.filip import filip_match_weights


def _render(tmp_path, weights, name):
    image = np.zeros((32, 32, 3), np.uint8)
    image[8:24, 8:24] = (220, 40, 40)
    return np.asarray(Image.open(viz.alignment_maps(image, ["a", "red", "square"], weights, tmp_path / name,
                                                    title="a red square")).convert("RGB"), np.float32)


def test_sparc_weights_render_a_non_blank_grid(tmp_path):
    rng = np.random.default_rng(0)
    weights = losses.sparc_alignment_weights(rng.normal(size=(1, 16, 8)), rng.normal(size=(1, 3, 8)))[0]
    picture = _render(tmp_path, weights, "sparc.png")
    assert picture.shape[0] > 100 and picture.shape[1] > 300
    assert picture.std() > 20  # not a blank canvas
    # Moving a token's weight to another patch changes the picture.
    other = np.zeros((3, 16), np.float32)
    other[:, 0] = 1.0
    assert np.abs(_render(tmp_path, other, "other.png") - picture).mean() > 1.0


def test_filip_matches_become_one_hot_rows(tmp_path):
    rng = np.random.default_rng(1)
    _, token_to_patch = losses.filip_token_alignment(
        rng.normal(size=(1, 16, 8)), rng.normal(size=(1, 3, 8)), np.ones((1, 3), bool)
    )
    weights = np.asarray(ops.convert_to_numpy(filip_match_weights(np.asarray(token_to_patch)[0, 0], 16)))
    assert weights.shape == (3, 16) and (weights.sum(1) == 1).all()
    assert _render(tmp_path, weights, "filip.png").std() > 20


def test_bad_weights_are_named(tmp_path):
    with pytest.raises(ValueError, match="weights"):
        viz.alignment_maps(np.zeros((8, 8, 3)), ["a"], np.zeros((2, 4)), tmp_path / "x.png")
    with pytest.raises(ValueError, match="grid_size"):
        viz.alignment_maps(np.zeros((8, 8, 3)), ["a"], np.zeros((1, 5)), tmp_path / "x.png")


@pytest.mark.parametrize("preset", ["sparc_tiny", "filip_tiny"])
def test_caption_alignment_from_a_model(tmp_path, preset):
    import vlzoo

    model = vlzoo.from_preset(preset)
    image = np.random.default_rng(0).normal(size=(32, 32, 3)).astype("float32")
    tokens, weights = viz.caption_alignment(model, image, "a red square")
    assert tokens == ["<|startoftext|>", "a", "red", "square", "<|endoftext|>"]
    assert weights.shape == (5, 16) and np.isfinite(weights).all()
    if preset == "filip_tiny":  # one-hot best-patch rows (a CLS match would give a zero row)
        assert set(np.unique(weights)) <= {0.0, 1.0} and (weights.sum(1) <= 1).all()
    else:  # SPARC's rows are normalised sparse weights
        np.testing.assert_allclose(weights.sum(1), 1.0, rtol=1e-5)
    path = viz.draw_caption_alignment(model, image, "a red square", tmp_path / "align.png")
    assert np.asarray(Image.open(path).convert("RGB"), np.float32).std() > 20


def test_caption_alignment_needs_a_token_level_model():
    import vlzoo

    with pytest.raises(TypeError, match="model"):
        viz.caption_alignment(vlzoo.from_preset("clip_tiny"), np.zeros((32, 32, 3)), "a")


def test_filip_prefix_matches_give_zero_rows():
    weights = ops.convert_to_numpy(filip_match_weights(np.array([0, 3, 1]), 4, offset=1))
    np.testing.assert_array_equal(weights, [[0, 0, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0]])


def test_word_maps_are_drawn_from_the_method_asked(tmp_path):
    """`draw_word_maps` draws `grounding.word_maps`: the same image and caption drawn from FLAIR's own map (its
    text-conditioned attention) and from the patch-text cosine give different pictures; a family without a
    word map is refused."""
    import vlzoo
    from vlzoo.data import shapes

    model = vlzoo.from_preset("flair_shapes")
    scenes = shapes.generate("test", 1, image_size=32, seed=3, num_objects=2)
    pixel = model.preprocessor(scenes["images"])[0]
    pictures = [np.asarray(Image.open(viz.draw_word_maps(model, pixel, scenes["captions"][0], tmp_path / f"{m}.png",
                                                         method=m)).convert("RGB"), np.float32)
                for m in ("text_attention", "patch_text_cosine")]
    assert pictures[0].std() > 20 and pictures[0].shape == pictures[1].shape
    assert np.abs(pictures[0] - pictures[1]).mean() > 1.0
    with pytest.raises(NotImplementedError, match="no word-to-patch map"):
        viz.draw_word_maps(vlzoo.from_preset("siglip_tiny", load_weights=False), np.zeros((32, 32, 3)),
                           "a red square", tmp_path / "x.png")
