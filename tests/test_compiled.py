"""Eager `encode_image` / `encode_text` run as one compiled program on JAX and TensorFlow (`vlzoo.compiled`)."""

import keras
import numpy as np
import pytest
from backend_utils import value_and_grad
from conftest import TINY_TEXT, TINY_VISION, tiny_batch, to_numpy
from margins import shallow_towers

import vlzoo
from vlzoo.compiled import inference_function

RUNS_PER_PROGRAM = 3 if keras.backend.backend() == "torch" else 1


def _clip():
    return vlzoo.CLIP(vision=TINY_VISION, text=TINY_TEXT, embed_dim=16)


@pytest.fixture(scope="module")
def model():
    return _clip()


def _images(n, seed=0):
    return tiny_batch(n, seed)["images"]


def _counted(fn, calls):
    def counted(*args, **kwargs):
        calls.append(1)
        return fn(*args, **kwargs)

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
    # Python runs only when a program is made: three calls on one shape run it once on JAX and TensorFlow
    # (tracing), three times on PyTorch (the first two calls run eagerly, the first noting the variables
    # read; the third traces); a new batch size makes another program.
    calls = []
    variable = keras.Variable(np.ones((3,), "float32"))
    call = inference_function(_counted(lambda x: x * variable, calls), lambda: [variable])
    for _ in range(3):
        call(np.ones((2, 3), "float32"))
    assert len(calls) == RUNS_PER_PROGRAM
    for value in (2.0, 3.0, 4.0):
        np.testing.assert_array_equal(to_numpy(call(np.full((5, 3), value, "float32"))), np.full((5, 3), value))
    assert len(calls) == RUNS_PER_PROGRAM * 2


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


def test_a_function_the_tracer_cannot_record_still_runs():
    # A Python number among the outputs: PyTorch's tracer refuses to record it, and the calls run eagerly.
    variable = keras.Variable(np.full((3,), 2.0, "float32"))
    call = inference_function(lambda x: {"y": x * variable, "n": 3.0}, lambda: [variable])
    for value in (1.0, 2.0, 3.0):
        out = call(np.full((2, 3), value, "float32"))
        np.testing.assert_array_equal(to_numpy(out["y"]), np.full((2, 3), 2 * value))
        assert float(to_numpy(out["n"])) == 3.0


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


def _batches(model):
    """Four `(images, texts)` batches of three pairs, of one shape, with captions of different lengths."""
    rng = np.random.default_rng(0)
    size = model.vision.image_size
    return [(rng.normal(size=(3, size, size, 3)).astype("float32"), model.tokenizer(captions)) for captions in (
        ["a red circle", "a blue square above a green circle", "a cross"],
        ["a green square", "a red cross to the right of a blue square", "a yellow circle below a cross"],
        ["a blue circle above a green triangle", "a red square", "a cross to the left of a circle"],
        ["a small yellow triangle to the left of a red square", "a circle", "two blue crosses"],
    )]


TINY_PRESETS = ["clip_tiny", "siglip_tiny", "filip_tiny", "sparc_tiny", "sparo_tiny", "llip_tiny", "stair_tiny",
                "flair_tiny"]


def _shallow(name):
    """`name` with the fewest blocks per tower its family accepts (`margins.shallow_towers`): whether a program
    computes from its inputs, and whether a traced forward trains as the eager one, does not depend on the depth,
    and each block adds to what JAX compiles and TensorFlow traces. The presets' own tokenizer and vocabulary are
    kept (the captions below are tokenized by it)."""
    return vlzoo.from_preset(name, **shallow_towers(name.removesuffix("_tiny")))


@pytest.mark.parametrize("name", TINY_PRESETS)
def test_a_program_computes_from_its_inputs_values_in_every_family(name):
    # A program is made on the first batch (PyTorch: on the third); the last has the same shapes but other
    # pixels and other caption lengths (so other end-token positions): the program must compute from the
    # values, as the uncompiled computation does, not replay what it saw when traced.
    model = _shallow(name)
    runs = []
    for side in ("_image_features", "_text_features"):
        setattr(model, side, _counted(getattr(model, side), runs))
    batches = _batches(model)
    for images, texts in batches:
        runs.clear()
        got = model.encode_image(images), model.encode_text(texts)
    assert not runs  # the last batch ran the programs, not the towers' Python
    want = model._image_features(images), model._text_features(texts)
    for got_side, want_side in zip(got, want):
        assert list(got_side) == list(want_side)
        for key in want_side:
            want_values = to_numpy(want_side[key])
            if keras.backend.backend() == "torch":  # the traced program runs the very kernels of the eager call
                np.testing.assert_array_equal(to_numpy(got_side[key]), want_values)
            else:  # XLA and Grappler reorder float32 sums: a few ulps of the largest term (FLAIR: 2.1e-6 of 2)
                atol = 1e-5 * float(np.abs(want_values).max())
                np.testing.assert_allclose(to_numpy(got_side[key]), want_values, rtol=1e-5, atol=atol)


@pytest.mark.skipif(keras.backend.backend() != "torch",
                    reason="JAX's and TensorFlow's training steps are compiled programs; PyTorch's forward is traced")
@pytest.mark.parametrize("name", TINY_PRESETS)
def test_training_through_the_traced_forward_is_the_eager_training(name):
    # Four steps (the forward is traced at the third) on batches of one shape: the losses and every weight
    # after them equal those of the same model trained layer by layer (`run_eagerly=True`), bit for bit,
    # since the program runs the eager call's kernels and autograd differentiates them alike.
    models = []
    for _ in range(2):  # tiny presets have random weights, and FLAIR a random caption sampler: the same seed
        keras.utils.set_random_seed(0)
        models.append(_shallow(name))
    initial = models[0].get_weights()
    for model, run_eagerly in zip(models, (False, True)):
        model.compile(optimizer=keras.optimizers.AdamW(learning_rate=1e-3), run_eagerly=run_eagerly)
    batches = [{"images": images, **texts} for images, texts in _batches(models[0])]
    if name == "flair_tiny":  # two captions per image
        batches = [{**b, **{k: np.stack([b[k], b[k][::-1]], axis=1) for k in ("token_ids", "padding_mask")}}
                   for b in batches]
    runs = []
    models[0]._tower_outputs = _counted(models[0]._tower_outputs, runs)
    losses = [[model.train_on_batch(batch) for batch in batches[:3]] for model in models]
    runs.clear()
    for model, model_losses in zip(models, losses):
        model_losses.append(model.train_on_batch(batches[3]))
    assert not runs  # the fourth step ran the traced program, not the towers' Python
    assert losses[0] == losses[1]
    for got, want in zip(models[0].weights, models[1].weights):
        np.testing.assert_array_equal(to_numpy(got), to_numpy(want), err_msg=got.path)
    assert any(np.abs(to_numpy(w) - v).max() > 0 for w, v in zip(models[0].weights, initial))  # it trained
