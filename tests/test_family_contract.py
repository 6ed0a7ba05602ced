"""The structure every family's encoders return, and what `score` and `predict` make of it."""

import functools

import keras
import numpy as np
import pytest
from backend_utils import to_numpy
from conftest import tiny_batch
from families import SHAPES_PRESETS

import vlzoo
from vlzoo.losses.llip import llip_contextualize

PRESETS = list(SHAPES_PRESETS)


@functools.lru_cache(maxsize=None)
def _preset(name):
    """Each bundled model loaded once per worker (the tests only read it)."""
    return vlzoo.from_preset(name)


def _inputs(model, batch_size=3):
    batch = tiny_batch(batch_size=batch_size, image_size=model.vision.image_size,
                       sequence_length=model.text.sequence_length, vocabulary_size=model.text.vocabulary_size)
    return batch["images"], {k: batch[k] for k in ("token_ids", "padding_mask")}


@pytest.mark.parametrize("preset", PRESETS)
def test_encoders_return_the_declared_keys_with_the_global_embedding_first(preset):
    model = _preset(preset)
    images, texts = _inputs(model)
    for side, embeds, keys in (("image", model.encode_image(images), model.image_embedding_keys),
                               ("text", model.encode_text(texts), model.text_embedding_keys)):
        assert isinstance(embeds, dict) and list(embeds) == list(keys), (side, sorted(embeds))
        assert keys[0] == "embeds" and tuple(embeds["embeds"].shape) == (3, model.embed_dim), side


@pytest.mark.parametrize("preset", PRESETS)
def test_normalized_global_embeddings_are_unit_vectors(preset):
    # Every family's normalisation leaves the global embedding with norm 1: L2 for most; SPARO's
    # L slots of norm 1 / sqrt(L) each; STAIR's guard only matters for an all-zero vector.
    model = _preset(preset)
    images, texts = _inputs(model)
    for embeds in (model.encode_image(images, normalize=True), model.encode_text(texts, normalize=True)):
        norms = np.linalg.norm(to_numpy(embeds["embeds"]).astype("float64"), axis=-1)
        np.testing.assert_allclose(norms, 1.0, atol=1e-5)


@pytest.mark.parametrize("preset", PRESETS)
def test_predict_and_call_name_the_encoders_entries_alike(preset):
    model = _preset(preset)
    images, texts = _inputs(model)
    expected = {f"image_{key}" for key in model.image_embedding_keys}
    expected |= {f"text_{key}" for key in model.text_embedding_keys}
    assert set(model.predict_on_batch({"images": images, **texts})) == expected
    assert expected <= set(model({"images": images, **texts}))


@pytest.mark.parametrize("preset", ["clip_shapes", "filip_shapes", "llip_shapes"])
def test_score_names_the_argument_when_given_a_bare_tensor(preset):
    model = _preset(preset)
    images, texts = _inputs(model)
    image, text = model.encode_image(images), model.encode_text(texts)
    with pytest.raises(TypeError, match=r"`image_embeds` must be the dict returned by `\w+\.encode_image`"):
        model.score(image["embeds"], text)
    with pytest.raises(TypeError, match=r"`text_embeds` must be the dict returned by `\w+\.encode_text`.*keys"):
        model.score(image, {"wrong": text["embeds"]})


def test_llip_image_embeds_is_the_uniform_attention_limit():
    # With a very large temperature the cross-attention weights are uniform (q.k / tau ~ 1e-6), so
    # every text's contextualised embedding of an image tends to the text-independent summary.
    model = _preset("llip_shapes")
    images, texts = _inputs(model)
    image, text = model.encode_image(images), model.encode_text(texts)
    limit = llip_contextualize(text["queries"], image["keys"], image["values"], 1e7)  # (N_I, N_T, D)
    summary = to_numpy(image["embeds"])
    for j in range(limit.shape[1]):
        np.testing.assert_allclose(to_numpy(limit)[:, j], summary, rtol=1e-4, atol=1e-5)
    # ... and an ordinary temperature does depend on the text.
    near = to_numpy(llip_contextualize(text["queries"], image["keys"], image["values"], model.temperature))
    assert np.max(np.abs(near - summary[:, None])) > 1e-3


def test_prompt_ensembling_averages_the_global_embedding_of_every_family():
    # SPARC's zero-shot classes: the renormalised mean of the normalised global text embeddings,
    # computed here with numpy from encode_text.
    model = _preset("sparc_shapes")
    prompts = [["a red circle", "a photo of a red circle"], ["a blue square", "a photo of a blue square"]]
    tokens = model.tokenizer([p for group in prompts for p in group])
    classes = model.prompt_ensembling.encode_classes(
        model, {k: keras.ops.reshape(v, (2, 2, -1)) for k, v in tokens.items()})
    embeds = to_numpy(model.encode_text(tokens)["embeds"]).astype("float64").reshape(2, 2, -1)
    embeds /= np.linalg.norm(embeds, axis=-1, keepdims=True)
    mean = embeds.mean(axis=1)
    np.testing.assert_allclose(to_numpy(classes["embeds"]), mean / np.linalg.norm(mean, axis=-1, keepdims=True),
                               atol=1e-5)


@pytest.mark.parametrize("preset", PRESETS)
def test_every_family_scores_images_against_its_class_representation(preset):
    # The class representation of `prompt_ensembling` goes through the family's own `score`
    # (SPARC's reads only the global embedding, so `{"embeds": (C, D)}` is enough).
    model = _preset(preset)
    images, _ = _inputs(model)
    prompts = model.tokenizer(["a red circle", "a photo of a red circle", "a blue square", "a photo of a blue square"])
    ensembling = model.prompt_ensembling
    classes = ensembling.encode_classes(model, {k: keras.ops.reshape(v, (2, 2, -1)) for k, v in prompts.items()})
    scores = to_numpy(ensembling.score(model, images, classes))
    assert scores.shape == (3, 2) and np.all(np.isfinite(scores))


@pytest.mark.parametrize("preset", PRESETS)
def test_dense_embeddings_are_one_per_patch_where_declared(preset):
    # FILIP's are its late interaction's patch tokens (their mean is its global embedding, CLS
    # excluded); SPARC's pass through h_v as its global path does. Others refuse by name.
    model = _preset(preset)
    images, _ = _inputs(model)
    if not model.has_dense_embeddings:
        with pytest.raises(NotImplementedError, match="SPARC and FILIP"):
            model.dense_image_embeddings(images)
        return
    dense = to_numpy(model.dense_image_embeddings(images))
    patches = (model.vision.image_size // model.vision.patch_size) ** 2
    assert dense.shape == (3, patches, model.embed_dim)
    if preset == "filip_shapes" and not model.interaction_include_cls:
        np.testing.assert_allclose(dense.mean(axis=1), to_numpy(model.encode_image(images)["embeds"]), atol=1e-5)
