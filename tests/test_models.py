"""CLIP and SigLIP models: forward against numpy, training, optimizer wiring, input errors."""

import math

import keras
import numpy as np
import pytest
import reference
import reference_towers as ref
from conftest import fit_and_measure, tiny_batch, tiny_model, to_numpy

import vlzoo
from vlzoo.models.base import LOGIT_SCALE_MAX


def _randomise(model, seed=0):
    rng = np.random.default_rng(seed)
    for v in model.vision.weights + model.text.weights:
        base = 1.0 if v.name == "gamma" else 0.0
        v.assign(base + 0.1 * rng.normal(size=v.shape).astype("float32"))


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_forward_and_loss_match_numpy(family):
    model = tiny_model(family)
    _randomise(model)
    batch = tiny_batch()
    image_ref, _ = ref.vision_forward(batch["images"], model.vision)
    text_ref, _ = ref.text_forward(batch["token_ids"], batch["padding_mask"], model.text)
    np.testing.assert_allclose(to_numpy(model.encode_image(batch["images"])["embeds"]), image_ref, atol=3e-5)
    np.testing.assert_allclose(to_numpy(model.encode_text(batch)["embeds"]), text_ref, atol=3e-5)

    scale = math.exp(float(to_numpy(model.logit_scale)))
    outputs = model(batch)
    loss = float(to_numpy(model.compute_loss(y_pred=outputs)))
    if family == "clip":
        expected = reference.clip_loss(image_ref, text_ref, scale)
    else:
        expected = reference.siglip_loss(image_ref, text_ref, scale, float(to_numpy(model.logit_bias)))
    assert abs(loss - expected) < 1e-4 * max(1.0, abs(expected))

    cos = image_ref / np.linalg.norm(image_ref, axis=1, keepdims=True)
    cos = cos @ (text_ref / np.linalg.norm(text_ref, axis=1, keepdims=True)).T
    expected_sim = scale * cos + (float(to_numpy(model.logit_bias)) if family == "siglip" else 0.0)
    np.testing.assert_allclose(to_numpy(model.similarity(batch["images"], batch)), expected_sim, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_fit_lowers_the_loss(family):
    keras.utils.set_random_seed(0)
    model = tiny_model(family)
    before, after = fit_and_measure(model, tiny_batch(batch_size=8, seed=1), training=True)
    assert after < 0.5 * before, (before, after)


def test_fit_on_a_tf_data_dataset():
    tf = pytest.importorskip("tensorflow")
    model = tiny_model("clip")
    batch = tiny_batch(batch_size=8)
    dataset = tf.data.Dataset.from_tensor_slices(batch).batch(4)
    model.compile(optimizer="adamw")
    history = model.fit(dataset, epochs=2, verbose=0, shuffle=False)
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"]).all()


def test_weight_decay_skips_biases_norms_embeddings_and_scale():
    model = tiny_model("siglip")
    lr, wd = 0.1, 0.5
    model.compile(optimizer=keras.optimizers.AdamW(learning_rate=lr, weight_decay=wd))
    before = [to_numpy(v).copy() for v in model.trainable_variables]
    # Zero gradients: AdamW then only applies its decoupled decay w <- w (1 - lr wd).
    model.optimizer.apply([keras.ops.zeros(v.shape) for v in model.trainable_variables], model.trainable_variables)
    excluded = {v.path for v in model.no_weight_decay_variables()}
    for v, old in zip(model.trainable_variables, before):
        new = to_numpy(v)
        if v.path in excluded:
            np.testing.assert_array_equal(new, old, err_msg=v.path)
        else:
            np.testing.assert_allclose(new, old * (1 - lr * wd), rtol=1e-5, err_msg=v.path)
    names = {v.path.split("/")[-1] for v in model.no_weight_decay_variables()}
    assert {"bias", "gamma", "beta", "embeddings", "logit_scale", "logit_bias", "latent"} <= names
    decayed = {v.path.split("/")[-1] for v in model.trainable_variables if v.path not in excluded}
    assert decayed == {"kernel"}


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_logit_scale_is_clamped_at_ln_100_after_each_update(family):
    model = tiny_model(family)
    model.logit_scale.assign(8.0)
    # The forward pass never clamps: a loaded checkpoint scores as its source.
    assert abs(float(to_numpy(model.logit_scale_value())) - math.exp(8.0)) < 1e-2
    model.compile(optimizer=keras.optimizers.SGD(0.0))
    model.train_on_batch(tiny_batch())
    assert abs(float(to_numpy(model.logit_scale)) - LOGIT_SCALE_MAX) < 1e-6
    model.logit_scale.assign(-1.0)
    model.train_on_batch(tiny_batch())
    assert float(to_numpy(model.logit_scale)) == 0.0


def test_logit_scale_bound_is_configurable():
    model = tiny_model("clip", logit_scale_max=None)
    model.logit_scale.assign(8.0)
    model.compile(optimizer=keras.optimizers.SGD(0.0))
    model.train_on_batch(tiny_batch())
    assert float(to_numpy(model.logit_scale)) == 8.0
    assert type(model).from_config(model.get_config()).logit_scale_max is None


def test_initial_temperatures():
    clip, siglip = tiny_model("clip"), tiny_model("siglip")
    assert abs(float(to_numpy(clip.logit_scale_value())) - 1 / 0.07) < 1e-3
    assert abs(float(to_numpy(siglip.logit_scale_value())) - 10.0) < 1e-4
    assert float(to_numpy(siglip.logit_bias)) == -10.0


def test_mixed_precision_keeps_loss_in_float32():
    model = tiny_model("clip", dtype="mixed_bfloat16")
    outputs = model(tiny_batch())
    assert keras.backend.standardize_dtype(outputs["image_embeds"].dtype) == "bfloat16"
    loss = model.compute_loss(y_pred=outputs)
    assert keras.backend.standardize_dtype(loss.dtype) == "float32"
    assert np.isfinite(float(to_numpy(loss)))
    assert all(keras.backend.standardize_dtype(v.dtype) == "float32" for v in model.weights)


def test_siglip_chunked_loss_equals_unchunked():
    plain = tiny_model("siglip")
    chunked = tiny_model("siglip", num_chunks=3)
    chunked.set_weights(plain.get_weights())
    batch = tiny_batch(batch_size=5)
    a = float(to_numpy(plain.compute_loss(y_pred=plain(batch))))
    b = float(to_numpy(chunked.compute_loss(y_pred=chunked(batch))))
    assert abs(a - b) < 1e-5


def test_siglip_num_chunks_must_be_a_positive_int():
    with pytest.raises(ValueError, match="`num_chunks` must be a python int >= 1"):
        tiny_model("siglip", num_chunks=0)


def test_compile_rejects_a_loss_argument():
    with pytest.raises(ValueError, match="own loss"):
        tiny_model("clip").compile(optimizer="adam", loss="mse")


def test_get_config_round_trip_gives_same_outputs():
    model = tiny_model("siglip", num_chunks=2)
    clone = type(model).from_config(model.get_config())
    clone.set_weights(model.get_weights())
    batch = tiny_batch()
    np.testing.assert_array_equal(to_numpy(clone.encode_image(batch["images"])["embeds"]),
                                  to_numpy(model.encode_image(batch["images"])["embeds"]))
    assert clone.get_config() == model.get_config()


class TestBadInputs:
    model = None

    @pytest.fixture(autouse=True)
    def _model(self):
        if TestBadInputs.model is None:
            TestBadInputs.model = tiny_model("clip")

    def test_images_wrong_rank(self):
        with pytest.raises(ValueError, match=r"`images`.*\(B, H, W, 3\).*\(32, 32, 3\)"):
            self.model.encode_image(np.zeros((32, 32, 3), "float32"))

    def test_images_wrong_channels(self):
        with pytest.raises(ValueError, match=r"`images`.*\(2, 32, 32, 1\)"):
            self.model.encode_image(np.zeros((2, 32, 32, 1), "float32"))

    def test_images_channels_first(self):
        with pytest.raises(ValueError, match="channels last"):
            self.model.encode_image(np.zeros((2, 3, 32, 32), "float32"))

    def test_images_of_another_size(self):
        with pytest.raises(ValueError, match=r"`images` must be 32 x 32 pixels.*\(1, 40, 40, 3\)"):
            self.model.encode_image(np.zeros((1, 40, 40, 3), "float32"))

    def test_images_not_multiple_of_patch(self):
        model = tiny_model("clip", vision=dict(dynamic_image_size=True))
        with pytest.raises(ValueError, match="multiple of the patch size"):
            model.encode_image(np.zeros((1, 30, 30, 3), "float32"))

    def test_images_uint8_rejected_with_hint(self):
        with pytest.raises(TypeError, match="preprocessor"):
            self.model.encode_image(np.zeros((1, 32, 32, 3), "uint8"))

    def test_images_non_finite(self):
        images = np.zeros((1, 32, 32, 3), "float32")
        images[0, 3, 4, 1] = np.nan
        with pytest.raises(ValueError, match="`images` contains non-finite"):
            self.model.encode_image(images)

    def test_token_ids_out_of_vocabulary(self):
        batch = tiny_batch()
        batch["token_ids"][0, 0] = 64
        with pytest.raises(ValueError, match=r"`token_ids` must lie in \[0, 64\)"):
            self.model.encode_text(batch)
        batch["token_ids"][0, 0] = -1
        with pytest.raises(ValueError, match="token_ids"):
            self.model.encode_text(batch)

    def test_token_ids_too_long(self):
        ids = np.zeros((1, 13), "int32")
        with pytest.raises(ValueError, match="context length is 12"):
            self.model.encode_text({"token_ids": ids, "padding_mask": ids >= 0})

    def test_token_ids_wrong_rank(self):
        with pytest.raises(ValueError, match=r"`token_ids` must have shape \(B, T\)"):
            self.model.encode_text({"token_ids": np.zeros((12,), "int32"), "padding_mask": np.ones((12,), bool)})

    def test_float_token_ids(self):
        ids = np.zeros((1, 12), "float32")
        with pytest.raises(TypeError, match="`token_ids` must be integers"):
            self.model.encode_text({"token_ids": ids, "padding_mask": ids == 0})

    def test_padding_mask_shape(self):
        with pytest.raises(ValueError, match="`padding_mask`"):
            self.model.encode_text({"token_ids": np.zeros((2, 12), "int32"), "padding_mask": np.ones((2, 11), bool)})

    def test_text_not_a_dict(self):
        with pytest.raises(TypeError, match="texts"):
            self.model.encode_text(np.zeros((2, 12), "int32"))

    def test_mismatched_batch_sizes(self):
        batch = tiny_batch(batch_size=4)
        batch["images"] = batch["images"][:3]
        with pytest.raises(ValueError, match="same batch size.*3 images and 4 captions"):
            self.model(batch)

    def test_missing_keys(self):
        with pytest.raises(ValueError, match="token_ids"):
            self.model({"images": np.zeros((1, 32, 32, 3), "float32")})

    def test_fit_with_unequal_entries_names_them(self):
        batch = tiny_batch(batch_size=4)
        batch["images"] = np.concatenate([batch["images"]] * 2)
        self.model.compile(optimizer="adam")
        with pytest.raises(ValueError, match="`x` of `fit`.*same number.*`images` 8, `token_ids` 4"):
            self.model.fit(batch, epochs=1, batch_size=2, verbose=0)
        with pytest.raises(ValueError, match="`x` of `evaluate`.*`images` 8"):
            self.model.evaluate(batch, batch_size=2, verbose=0)

    @pytest.mark.parametrize("tower, key, value", [("vision", "hidden_dim", -3), ("text", "num_layers", 0),
                                                   ("vision", "patch_size", 2.5), ("text", "num_heads", True)])
    def test_invalid_tower_override_names_the_argument(self, tower, key, value):
        with pytest.raises(ValueError, match=rf"`{tower}\['{key}'\]` must be a positive integer; received {value}"):
            vlzoo.from_preset("clip_tiny", load_weights=False, **{tower: {key: value}})
        with pytest.raises(ValueError, match="`embed_dim` must be a positive integer"):
            vlzoo.from_preset("clip_tiny", load_weights=False, embed_dim=0)

    def test_empty_batches_are_refused_by_name(self):
        with pytest.raises(ValueError, match=r"`images` is an empty batch \(shape \(0, 32, 32, 3\)\)"):
            self.model.encode_image(np.zeros((0, 32, 32, 3), "float32"))
        ids = np.zeros((0, 12), "int32")
        with pytest.raises(ValueError, match=r"`texts\['token_ids'\]` is an empty batch"):
            self.model.encode_text({"token_ids": ids, "padding_mask": ids == 0})

    def test_strings_are_tokenised(self):
        model = tiny_model("clip", text=dict(vocabulary_size=49408))
        out = model.encode_text(["a red circle", "two dogs"])
        assert set(out) == {"embeds"}
        assert tuple(out["embeds"].shape) == (2, 16)


def _batch_for(model, batch_size):
    return tiny_batch(batch_size=batch_size, image_size=model.vision.image_size,
                      sequence_length=model.text.sequence_length, vocabulary_size=model.text.vocabulary_size)


def _assert_embeddings_equal(got, want, key):
    for a, b in zip(keras.tree.flatten(got), keras.tree.flatten(want)):
        np.testing.assert_allclose(np.asarray(a, "float32"), to_numpy(b).astype("float32"), atol=2e-5, err_msg=key)


def test_predict_batches_one_input_kind():
    model = vlzoo.from_preset("clip_shapes")
    batch = _batch_for(model, 5)
    texts = {k: batch[k] for k in ("token_ids", "padding_mask")}
    images = model.predict({"images": batch["images"]}, batch_size=2, verbose=0)  # 2 + 2 + 1 rows
    text = model.predict(texts, batch_size=2, verbose=0)
    assert set(images) == {"image_embeds"} and set(text) == {"text_embeds"}
    _assert_embeddings_equal(images["image_embeds"], model.encode_image(batch["images"])["embeds"], "image_embeds")
    _assert_embeddings_equal(text["text_embeds"], model.encode_text(texts)["embeds"], "text_embeds")


def test_predict_names_the_inputs_it_takes():
    model = tiny_model("clip")
    with pytest.raises(ValueError, match="`images`.*`token_ids`"):
        model.predict_on_batch({"pixels": np.zeros((2, 32, 32, 3), "float32")})
