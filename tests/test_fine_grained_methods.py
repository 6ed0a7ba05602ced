"""FILIP's prompt ensembling and word-patch alignment, SPARC's alignment and dense embeddings,
and an alignment map drawn from a real model."""

import keras
import numpy as np
import pytest
from conftest import to_numpy
from margins import DECISION_MARGIN, top_two_gap
from PIL import Image

import vlzoo
from vlzoo import viz

CAPTIONS = ["a red circle", "a small blue square on the left", "green"]


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")


@pytest.fixture(scope="module")
def filip():
    keras.utils.set_random_seed(0)  # module-scoped: built before the per-test seed, whatever ran first
    return vlzoo.from_preset("filip_tiny", load_weights=False)


@pytest.fixture(scope="module")
def sparc():
    keras.utils.set_random_seed(0)
    return vlzoo.from_preset("sparc_tiny", load_weights=False)


def _i2t_numpy(image_tokens, text_tokens, text_mask):
    """FILIP's image->text score: mean over patches of the max over real tokens of the cosine."""
    img = image_tokens / np.linalg.norm(image_tokens, axis=-1, keepdims=True)
    txt = text_tokens / np.linalg.norm(text_tokens, axis=-1, keepdims=True)
    sim = np.einsum("ipd,jtd->ijpt", img, txt)
    sim = np.where(text_mask[None, :, None, :], sim, -np.inf)
    return sim.max(-1).mean(-1)


def test_filip_ensemble_averages_scores_over_templates(filip, images):
    templates = [["a photo of a {}.", "a drawing of a {}."], ["a {} shape.", "the {}."]]
    classes = ["red circle", "blue square"]
    texts = [[t.format(c) for t in tpl] for c, tpl in zip(classes, templates)]
    flat = filip.tokenizer([t for group in texts for t in group])
    n, k, length = 2, 2, flat["token_ids"].shape[1]
    grouped = {key: value.reshape(n, k, length) for key, value in flat.items()}
    got = to_numpy(filip.ensemble_scores(images, grouped))

    image_tokens = to_numpy(filip.encode_image(images)["tokens"])
    text = filip.encode_text(flat)
    per_template = _i2t_numpy(image_tokens, to_numpy(text["tokens"]), to_numpy(text["mask"]))  # (B, N*K)
    expected = per_template.reshape(2, n, k).mean(-1)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # Averaging embeddings instead of scores (a known-wrong variant, docs/families/filip.md §Hand-checked cases)
    # gives other numbers.
    mean_tokens = to_numpy(text["tokens"]).reshape(n, k, length, -1).mean(1)
    wrong = _i2t_numpy(image_tokens, mean_tokens, to_numpy(text["mask"]).reshape(n, k, length)[:, 0])
    assert np.abs(wrong - expected).max() > 1e-4


def test_filip_similarity_is_scaled_image_to_text_score(filip, images):
    texts = filip.tokenizer(CAPTIONS)
    text = filip.encode_text(texts)
    expected = _i2t_numpy(to_numpy(filip.encode_image(images)["tokens"]), to_numpy(text["tokens"]), to_numpy(text["mask"]))
    scale = float(to_numpy(filip.logit_scale_value()))
    np.testing.assert_allclose(to_numpy(filip.similarity(images, texts)), scale * expected, rtol=1e-5, atol=1e-4)


def test_filip_token_alignment_is_the_argmax_patch(filip, images):
    texts = filip.tokenizer(CAPTIONS)
    _, token_to_patch = filip.token_alignment(images, texts)
    image_tokens = to_numpy(filip.encode_image(images)["tokens"])
    text_tokens = to_numpy(filip.encode_text(texts)["tokens"])
    cos = np.einsum("ipd,jtd->ijtp", image_tokens / np.linalg.norm(image_tokens, axis=-1, keepdims=True),
                    text_tokens / np.linalg.norm(text_tokens, axis=-1, keepdims=True))
    mask = texts["padding_mask"]
    # Each real token's best patch wins by a margin that the two float32 computations cannot reverse.
    assert top_two_gap(cos, axis=-1)[np.broadcast_to(mask[None], cos.shape[:3])].min() >= DECISION_MARGIN
    got = to_numpy(token_to_patch)
    np.testing.assert_array_equal(got[:, :, :][np.broadcast_to(mask[None], got.shape)],
                                  cos.argmax(-1)[np.broadcast_to(mask[None], got.shape)])


def test_sparc_alignment_weights_are_sparse_and_normalised(sparc, images):
    texts = sparc.tokenizer(CAPTIONS[:2])
    weights = to_numpy(sparc.alignment_weights(images, texts))
    assert weights.shape == (2, texts["token_ids"].shape[1], 16)
    assert (weights >= 0).all()
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert (weights == 0).any()  # the 1/P threshold removes patches


def test_sparc_dense_embeddings_average_to_the_global_one_without_h_v(images):
    model = vlzoo.from_preset("sparc_tiny", load_weights=False, global_vision_head=False)
    dense = to_numpy(model.dense_image_embeddings(images))
    np.testing.assert_allclose(dense.mean(1), to_numpy(model.encode_image(images)["embeds"]), atol=1e-5)


def test_alignment_map_from_a_model(sparc, tmp_path):
    image = np.full((32, 32, 3), 240, np.uint8)
    image[8:24, 4:20] = (220, 40, 40)
    pixels = sparc.preprocessor(image)
    texts = sparc.tokenizer(["a red square"])
    weights = to_numpy(sparc.alignment_weights(pixels, texts))[0]
    n = int(texts["padding_mask"][0].sum())
    labels = [sparc.tokenizer.id_to_token(int(i)) for i in texts["token_ids"][0, :n]]
    path = viz.alignment_maps(image, labels, weights[:n], tmp_path / "sparc.png", title="a red square")
    picture = np.asarray(Image.open(path).convert("RGB"), np.float32)
    assert picture.std() > 20
