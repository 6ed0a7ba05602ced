"""int8 weights through Keras' own `model.quantize("int8")`: the quantized model saves and loads as a preset,
and stays close to the float32 model (embeddings, zero-shot decisions) on the bundled shapes models."""

import json
import warnings

import keras
import numpy as np
import pytest

import vlzoo
from vlzoo.data import shapes

from backend_utils import run_once
from families import FAMILIES
from families import SHAPES_FAMILIES



def _numpy(tree):
    return {key: keras.ops.convert_to_numpy(value) for key, value in tree.items()}


def test_an_int8_model_round_trips_through_a_preset(tmp_path):
    model = vlzoo.from_preset("clip_shapes")
    data = shapes.classification(2, seed=1)
    pixels, prompts = model.preprocessor(data["images"][:6]), model.tokenizer(["a red circle", "a blue square"])
    float_images = _numpy(model.encode_image(pixels))
    model.quantize("int8")
    assert model.weight_quantization == "int8"
    assert any(keras.backend.standardize_dtype(v.dtype) == "int8" for v in model.weights)
    want_images, want_texts = _numpy(model.encode_image(pixels)), _numpy(model.encode_text(prompts))
    assert not np.array_equal(want_images["embeds"], float_images["embeds"])  # it did change the model
    model.save_to_preset(str(tmp_path))
    assert json.loads((tmp_path / "metadata.json").read_text())["quantization"] == "int8"
    loaded = vlzoo.from_preset(str(tmp_path))
    assert loaded.weight_quantization == "int8"
    for got, want in ((_numpy(loaded.encode_image(pixels)), want_images), (_numpy(loaded.encode_text(prompts)),
                                                                           want_texts)):
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    with pytest.raises(ValueError, match="already quantized"):
        loaded.quantize("int8")


def test_int8_warns_where_it_is_slower_than_float32():
    # Keras' int8 products run below float32 speed on the CPU on PyTorch and TensorFlow (docs/serving.md):
    # the user is told so, with the fast route (ONNX Runtime's int8), when quantizing; JAX's int8 is faster.
    model = vlzoo.from_preset("clip_tiny")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.quantize("int8")
    slow = [w for w in caught if "slower than float32" in str(w.message)]
    assert len(slow) == (1 if keras.backend.backend() in ("torch", "tensorflow") else 0)
    assert all("quantize_onnx" in str(w.message) for w in slow)


@run_once  # seven models' scores twice; the int8 kernels of each backend round-trip above
@pytest.mark.parametrize("family", SHAPES_FAMILIES)
def test_int8_stays_close_to_float32_on_the_shapes_models(family):
    """Shapes images against the 24 class prompts. int8 rounds each kernel to 1/254 of its channel's range and
    each input row to 1/254 of its own. Measured on an AVX-512 EPYC (PyTorch, 240 images; this test draws
    5 per class, 120): embeddings at
    cosine >= 0.9972 (SPARC's text; 0.9997 or more for every image), scores moved at most 0.88 (3.5% of
    their range), 92% to 99.6% of the decisions kept, and none changed where float32's margin was 0.21 or
    more. The bounds leave 2x or more of that room, for other CPUs' kernels."""
    data = shapes.classification(5, seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference, quantized = vlzoo.from_preset(f"{family}_shapes"), vlzoo.from_preset(f"{family}_shapes")
    quantized.quantize("int8")
    pixels = reference.preprocessor(data["images"])
    prompts = reference.tokenizer(["a " + name for name in data["class_names"]])
    for encode, inputs in (("encode_image", pixels), ("encode_text", prompts)):
        want = _numpy(getattr(reference, encode)(inputs, normalize=True))["embeds"]
        got = _numpy(getattr(quantized, encode)(inputs, normalize=True))["embeds"]
        want, got = want.reshape(len(want), -1), got.reshape(len(got), -1)
        cosine = (want * got).sum(-1) / (np.linalg.norm(want, axis=-1) * np.linalg.norm(got, axis=-1))
        assert cosine.min() >= 0.99, (encode, cosine.min())
    want = keras.ops.convert_to_numpy(reference.similarity(pixels, prompts))
    got = keras.ops.convert_to_numpy(quantized.similarity(pixels, prompts))
    assert np.abs(got - want).max() <= 0.1 * np.abs(want).max()
    assert np.mean(got.argmax(1) == want.argmax(1)) >= 0.85
    ranked = np.sort(want, axis=1)
    clear = ranked[:, -1] - ranked[:, -2] >= 0.5
    np.testing.assert_array_equal(got[clear].argmax(1), want[clear].argmax(1))
