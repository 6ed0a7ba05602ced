"""Eager `encode_image` / `encode_text` run as one compiled program on JAX and TensorFlow (`vlzoo.compiled`)."""

import keras
import numpy as np
import pytest
from backend_utils import value_and_grad
from conftest import TINY_TEXT, TINY_VISION, tiny_batch, to_numpy

import vlzoo
from vlzoo.compiled import inference_function

COMPILES = keras.backend.backend() in ("jax", "tensorflow")


def _clip():
    return vlzoo.CLIP(vision=TINY_VISION, text=TINY_TEXT, embed_dim=16)


@pytest.fixture(scope="module")
def model():
    return _clip()


def _images(n, seed=0):
    return tiny_batch(n, seed)["images"]


def _counted(fn, calls):
    def counted(*args):
        calls.append(1)
        return fn(*args)

    return counted


def test_eager_encoders_equal_the_uncompiled_computation(model):
    images = _images(3)
    texts = {k: v for k, v in tiny_batch(3, seed=1).items() if k != "images"}
    pairs = ((model.encode_image(images, normalize=True), model.normalize_embeds(model._image_features(images))),
             (model.encode_text(texts), model._text_features(texts)))
    for got, want in pairs:
        assert list(got) == list(want)  # the same keys, in the same order
        for key in want:
            np.testing.assert_allclose(to_numpy(got[key]), to_numpy(want[key]), rtol=1e-5, atol=1e-6)


def test_a_program_is_traced_once_per_input_shape():
    # Python runs at tracing only when the call is compiled: three calls on one shape trace once, a new batch
    # size traces again (JAX) or reuses a graph for unknown sizes (TensorFlow); PyTorch runs Python every call.
    calls = []
    variable = keras.Variable(np.ones((3,), "float32"))
    call = inference_function(_counted(lambda x: x * variable, calls), lambda: [variable])
    for _ in range(3):
        call(np.ones((2, 3), "float32"))
    assert len(calls) == (1 if COMPILES else 3)
    np.testing.assert_array_equal(to_numpy(call(np.full((5, 3), 2.0, "float32"))), np.full((5, 3), 2.0))


def test_a_program_reads_the_variables_current_values_and_set():
    calls = []
    variable = keras.Variable(np.ones((3,), "float32"))
    variables = [variable]
    call = inference_function(_counted(lambda x: x * variables[-1], calls), lambda: variables)
    x = np.ones((2, 3), "float32")
    call(x)
    variable.assign(np.full((3,), 4.0, "float32"))  # an update `fit` or `assign` makes is seen
    np.testing.assert_array_equal(to_numpy(call(x)), np.full((2, 3), 4.0))
    variables.append(keras.Variable(np.full((3,), 7.0, "float32")))  # as `quantize` and `enable_lora` do
    np.testing.assert_array_equal(to_numpy(call(x)), np.full((2, 3), 7.0))


def test_symbolic_inputs_are_traced_not_run(model):
    out = model.encode_image(keras.KerasTensor((2, 32, 32, 3)))
    assert tuple(out["embeds"].shape) == (2, model.embed_dim)


def test_gradient_through_the_compiled_encoder_is_the_eager_one(model):
    images = _images(2, seed=1)

    def loss(encode):
        return lambda x: keras.ops.sum(encode(x)["embeds"] ** 2)

    value, (grad,) = value_and_grad(loss(model.encode_image), images)
    want_value, (want,) = value_and_grad(loss(model._image_features), images)
    np.testing.assert_allclose(value, want_value, rtol=1e-5)
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-6)
    assert np.abs(grad).max() > 0


def test_lora_and_quantization_reach_the_compiled_encoder():
    model = _clip()
    images = _images(2, seed=2)
    before = to_numpy(model.encode_image(images)["embeds"])
    model.vision.blocks[0].mlp.fc1.enable_lora(2)
    model.vision.blocks[0].mlp.fc1.lora_kernel_b.assign(np.ones(model.vision.blocks[0].mlp.fc1.lora_kernel_b.shape))
    after = to_numpy(model.encode_image(images)["embeds"])
    assert np.abs(after - before).max() > 1e-3
    np.testing.assert_allclose(after, to_numpy(model._image_features(images)["embeds"]), rtol=1e-5, atol=1e-6)
