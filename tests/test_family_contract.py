"""The contract every registered family keeps: the structure its encoders return and what `score` and
`predict` make of it; inference calls that hold no autograd graph (PyTorch) unless an input asks for a
gradient; a saved preset that reloads exactly; `fit` on the family's own loss (the replica
shares that average to the whole loss are test_parallel's, for every family too). Families come from the
registry (`families.py`), the one defined in the tests included: a new family is covered by registering
it."""

import functools
import inspect

import extension_family
import keras
import numpy as np
import pytest
from backend_utils import run_once
from backend_utils import to_numpy
from backend_utils import value_and_grad
from conftest import tiny_batch
from families import EXTENSION_FAMILY
from families import FAMILIES
from families import SHAPES_FAMILIES
from families import SHAPES_PRESETS
from margins import assert_decision_margin
from margins import margin_batch
from margins import tiny_family_model

import vlzoo
from vlzoo import presets
from vlzoo.presets import catalogue
from vlzoo.losses.llip import llip_contextualize
from vlzoo.models import Family
from vlzoo.models import register_family
from vlzoo.models import registered_families

# Each family's trained shapes preset, else its tiny one.
PRESETS = list(SHAPES_PRESETS) + [f"{family}_tiny" for family in FAMILIES if family not in SHAPES_FAMILIES]


@functools.lru_cache(maxsize=None)
def _preset(name):
    """Each bundled model loaded once per worker (the tests only read it)."""
    return vlzoo.from_preset(name)


def _inputs(model, batch_size=4):  # 4 rows: the class prompts below are 4, so the text programs are shared
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
        assert keys[0] == "embeds" and tuple(embeds["embeds"].shape) == (4, model.embed_dim), side


@pytest.mark.parametrize("preset", PRESETS)
def test_normalized_global_embeddings_are_unit_vectors(preset):
    # Every family's normalisation leaves the global embedding with norm 1: L2 for most; SPARO's
    # L slots of norm 1 / sqrt(L) each; STAIR's guard only matters for an all-zero vector.
    # `encode_*(normalize=True)` is the family's `normalize_embeds` applied to the encoders' outputs (in the base
    # class's one program per side and `normalize`; SPARO's after its encoders). On PyTorch, whose calls are cheap,
    # every family goes through `normalize=True`. On JAX and TensorFlow a `normalize=True` program compiles or traces
    # both towers again (1.5 to 2.5 CPU seconds per family on the AVX2 EPYC, ten times the rest of this test): there
    # every family's `normalize_embeds` is applied to the encoders' outputs, whose programs the test above made, and
    # `normalize=True` itself is called for the first preset and SPARO (whose encoders normalise outside them).
    model = _preset(preset)
    images, texts = _inputs(model)
    if keras.backend.backend() == "torch" or preset in (PRESETS[0], "sparo_shapes"):
        encoded = (model.encode_image(images, normalize=True), model.encode_text(texts, normalize=True))
    else:
        encoded = (model.normalize_embeds(model.encode_image(images)), model.normalize_embeds(model.encode_text(texts)))
    for embeds in encoded:
        norms = np.linalg.norm(to_numpy(embeds["embeds"]).astype("float64"), axis=-1)
        np.testing.assert_allclose(norms, 1.0, atol=1e-5)


@pytest.mark.parametrize("preset", PRESETS)
def test_predict_and_call_name_the_encoders_entries_alike(preset):
    # `predict` is the compiled inference path: per input kind, what encode_image / encode_text give.
    model = _preset(preset)
    images, texts = _inputs(model)
    expected = {f"image_{key}" for key in model.image_embedding_keys}
    expected |= {f"text_{key}" for key in model.text_embedding_keys}
    inputs = {"images": images, **texts}
    got = model.predict_on_batch(inputs)
    assert set(got) == expected
    # The call's entries. On JAX from the symbolic call (the same `call`, traced by `jax.eval_shape`, 0.1-0.2 s): its
    # eager call compiles op by op (1-6 s a preset on the AVX2-only EPYC), and test_fit_trains_on_the_familys_own_loss
    # makes every family's eager call there.
    if keras.backend.backend() == "jax":
        called = model.compute_output_spec({key: keras.KerasTensor(value.shape, value.dtype.name)
                                            for key, value in inputs.items()})
    else:
        called = model(inputs)
    assert expected <= set(called)
    for side, embeds in (("image", model.encode_image(images)), ("text", model.encode_text(texts))):
        for key, value in embeds.items():
            for a, b in zip(keras.tree.flatten(got[f"{side}_{key}"]), keras.tree.flatten(value)):
                np.testing.assert_allclose(np.asarray(a, "float32"), to_numpy(b).astype("float32"), atol=2e-5,
                                           err_msg=f"{preset} {side}_{key}")


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
    assert scores.shape == (4, 2) and np.all(np.isfinite(scores))


@pytest.mark.parametrize("preset", PRESETS)
def test_dense_embeddings_are_one_per_patch_where_declared(preset):
    # FILIP's are its late interaction's patch tokens (their mean is its global embedding, CLS
    # excluded); SPARC's pass through h_v as its global path does. Others refuse by name.
    model = _preset(preset)
    images, _ = _inputs(model)
    if not model.has_dense_embeddings:
        with pytest.raises(NotImplementedError, match="has no per-patch embeddings"):
            model.dense_image_embeddings(images)
        return
    dense = to_numpy(model.dense_image_embeddings(images))
    patches = (model.vision.image_size // model.vision.patch_size) ** 2
    assert dense.shape == (4, patches, model.embed_dim)
    # The compiled program gives what the family's features give run op by op.
    np.testing.assert_allclose(dense, to_numpy(model._dense_image_features(images)), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="images"):
        model.dense_image_embeddings(images[:, :-1])
    if preset == "filip_shapes" and not model.interaction_include_cls:
        np.testing.assert_allclose(dense.mean(axis=1), to_numpy(model.encode_image(images)["embeds"]), atol=1e-5)


def _untracked_inference_calls(model):
    """`{name: outputs}` of every public method of `model` that takes images, texts, class prompts or encodings
    (found by its arguments' names, so that a family's own inference method is called too), each method once,
    and of its prompt ensembling; the family's encoders three times first (their traced program is made on
    the third call)."""
    images, texts = _inputs(model)
    prompts = model.tokenizer(["a red circle", "a photo of a red circle", "a blue square", "a photo of a blue square"])
    class_texts = {key: keras.ops.reshape(value, (2, 2, -1)) for key, value in prompts.items()}
    outputs = {f"{name} {k}": getattr(model, name)(inputs) for k in range(3)
               for name, inputs in (("encode_image", images), ("encode_text", texts))}
    arguments = {"images": images, "texts": texts, "class_texts": class_texts,
                 "image_embeds": outputs["encode_image 0"], "text_embeds": outputs["encode_text 0"]}
    for name in dir(type(model)):
        method = getattr(type(model), name)
        if name.startswith("_") or not inspect.isfunction(method):
            continue
        required = [p.name for p in list(inspect.signature(method).parameters.values())[1:]
                    if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if required and set(required) <= set(arguments):
            try:
                outputs[name] = getattr(model, name)(**{key: arguments[key] for key in required})
            except NotImplementedError:  # a contract method the family does not provide
                continue
    ensembling = model.prompt_ensembling
    classes = outputs["encode_classes"] = ensembling.encode_classes(model, class_texts)
    outputs["prompt_ensembling.score"] = ensembling.score(model, images, classes)
    return outputs


@pytest.mark.parametrize("preset", PRESETS)
def test_inference_calls_record_no_gradient_graph(preset):
    # PyTorch's autograd records eager calls on weights that require a gradient: an inference call's outputs would
    # hold a graph of its activations (a loop's kept embeddings keep every batch's), and numpy refuses them. On
    # JAX and TensorFlow the outputs are concrete arrays outside a transform or tape: numpy reads them all.
    model = _preset(preset)
    outputs = _untracked_inference_calls(model)
    called = {name.split()[0] for name in outputs}
    assert {"encode_image", "encode_text", "similarity", "score"} <= called, sorted(called)
    assert ("dense_image_embeddings" in called) == model.has_dense_embeddings
    assert ("token_patch_alignment" in called) == model.has_token_alignment
    for name, output in outputs.items():
        for leaf in keras.tree.flatten(output):
            assert getattr(leaf, "grad_fn", None) is None and not getattr(leaf, "requires_grad", False), name
            np.asarray(leaf)  # PyTorch refuses a tensor that requires a gradient


# On PyTorch every family: the inference calls' switch off gradient tracking (`untracked_inference`) must let an
# input that requires a gradient through. On JAX and TensorFlow the switch is no switch and `jax.grad` or a
# `tf.GradientTape` differentiates any Keras computation alike: one family there.
@pytest.mark.parametrize("preset", PRESETS if keras.backend.backend() == "torch" else PRESETS[:1])
def test_inference_calls_differentiate_inputs_that_ask_for_it(preset):
    # The documented way to a gradient through an inference call: inputs that require one (on PyTorch; under
    # `jax.grad` or a `tf.GradientTape` elsewhere). The gradient also reaches the weights on PyTorch.
    model = _preset(preset)
    images, texts = _inputs(model)
    value, (grad,) = value_and_grad(lambda x: keras.ops.sum(keras.ops.square(model.similarity(x, texts))), images)
    assert np.isfinite(value) and np.all(np.isfinite(grad)) and np.abs(grad).max() > 0


def _loaded_weights_and_scores(model, images, texts):
    return [to_numpy(v) for v in model.weights], to_numpy(model.similarity(images, texts))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_saved_preset_reloads_exactly(family, tmp_path):
    keras.utils.set_random_seed(0)
    model = tiny_family_model(family)
    images, texts = _inputs(model)
    model.save_to_preset(tmp_path / family)
    again = vlzoo.from_preset(str(tmp_path / family))
    assert type(again) is type(model) and again.get_config() == model.get_config()
    assert [v.path for v in again.weights] == [v.path for v in model.weights]
    want_weights, want_scores = _loaded_weights_and_scores(model, images, texts)
    got_weights, got_scores = _loaded_weights_and_scores(again, images, texts)
    for want, got in zip(want_weights, got_weights, strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_scores, want_scores)
    assert again.tokenizer(["a red circle"])["token_ids"].tolist() == model.tokenizer(["a red circle"])[
        "token_ids"].tolist()


def _batch_for(family):
    keras.utils.set_random_seed(0)
    model = tiny_family_model(family, logit_scale_max=None)
    batch = margin_batch(model)
    assert_decision_margin(model, batch)  # the two computations below take the same discrete choices
    return model, batch


@pytest.mark.parametrize("family", FAMILIES)
def test_fit_trains_on_the_familys_own_loss(family):
    # fit's loss on its one batch is the family's loss of that batch before the step (`compute_loss`, the
    # regularisers included), and the step moves the weights, every one finite.
    model, batch = _batch_for(family)
    expected = float(to_numpy(model.compute_loss(batch, y_pred=model(batch, training=True))))
    before = [to_numpy(v).copy() for v in model.trainable_variables]
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    history = model.fit(batch, batch_size=8, epochs=1, verbose=0, shuffle=False)
    assert history.history["loss"][0] == pytest.approx(expected, rel=1e-5, abs=1e-6)
    after = [to_numpy(v) for v in model.trainable_variables]
    assert all(np.isfinite(value).all() for value in after)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(after, before, strict=True)) > 1e-6


@run_once
def test_a_preset_defined_in_code_is_listed_counted_and_written_once():
    name = f"{EXTENSION_FAMILY}_tiny"
    assert vlzoo.list_presets(family=EXTENSION_FAMILY) == [name]
    directory = presets.resolve_preset(name)
    assert presets.resolve_preset(name) == directory and (directory / "config.json").is_file()
    model = tiny_family_model(EXTENSION_FAMILY, shallow=False)
    assert vlzoo.preset_info(name)["params"] == model.count_params()
    with pytest.raises(FileNotFoundError, match="defined in code"):
        catalogue.preset_directory(name)  # no Keras there to write it: it says where it is written


@run_once
def test_registration_refuses_what_would_make_the_registry_ambiguous():
    with pytest.raises(ValueError, match="has `family` 'headwise_clip'; set its class attribute"):
        Family("another", extension_family.HeadwiseCLIP)
    with pytest.raises(ValueError, match="already registered with vlzoo.models.clip.CLIP"):
        register_family(Family("clip", type("CLIP2", (vlzoo.CLIP,), {"family": "clip"})))
    with pytest.raises(ValueError, match="already defined in .*registry.json"):
        catalogue.register("clip_tiny", catalogue.definition("clip_tiny"))
    with pytest.raises(ValueError, match="lacks paper"):
        catalogue.register("mine_tiny", {k: v for k, v in catalogue.definition("clip_tiny").items() if k != "paper"})
    with pytest.raises(ValueError, match="`score_loss` must be one of"):
        Family(EXTENSION_FAMILY, extension_family.HeadwiseCLIP, score_loss="hinge")
    assert registered_families() == FAMILIES  # nothing above was registered
