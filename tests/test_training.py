"""Training defaults: warm-up + cosine schedule, AdamW defaults and exclusions, accumulation, remat, mixed precision."""

import math

import keras
import numpy as np
import pytest

import vlzoo
from vlzoo import training
from vlzoo.layers import TextTransformer, VisionTransformer
from vlzoo.models.base import LOGIT_SCALE_MAX

from backend_utils import EAGER_REFERENCE
from conftest import TINY_TEXT, TINY_VISION, tiny_batch, tiny_model, to_numpy
from margins import shallow_towers


def numpy_warmup_cosine(step, peak, total, warmup, alpha):
    """open_clip's `cosine_lr` (plus the `alpha` floor), float64."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / (total - warmup))
    return peak * (alpha + (1 - alpha) * 0.5 * (1 + math.cos(math.pi * progress)))


def weights(model):
    return [to_numpy(v).copy() for v in model.trainable_variables]


def sgd_gradients(model, *batches, run_eagerly=False):
    """Per batch, the gradients of one `fit` step at the current weights (restored after each):
    SGD(1) moves w by -g. Build the model with `logit_scale_max=None` (the clamp would cut the step)."""
    before = weights(model)
    model.compile(optimizer=keras.optimizers.SGD(1.0), run_eagerly=run_eagerly)
    grads = []
    for batch in batches:
        model.train_on_batch(batch)
        grads.append([w0 - w1 for w0, w1 in zip(before, weights(model))])
        for v, w in zip(model.trainable_variables, before):
            v.assign(w)
    return grads


# ----------------------------------------------------------------- schedule


@pytest.mark.parametrize("total,warmup,alpha", [(100, 10, 0.0), (50, 0, 0.0), (80, 20, 0.1), (7, 6, 0.5)])
def test_warmup_cosine_matches_numpy(total, warmup, alpha):
    peak = 3e-4
    schedule = training.WarmupCosine(peak, total, warmup_steps=warmup, alpha=alpha)
    steps = sorted({0, 1, max(warmup - 1, 0), warmup, warmup + 1, (warmup + total) // 2, total - 1, total, total + 9})
    got = np.array([float(to_numpy(schedule(keras.ops.convert_to_tensor(s, "int32")))) for s in steps])
    want = np.array([numpy_warmup_cosine(s, peak, total, warmup, alpha) for s in steps])
    # float32 arithmetic: 1 + cos(pi p) near p = 1 cancels, so the tolerance is relative to the peak.
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * peak)


def test_warmup_cosine_counts_updates_under_accumulation():
    # Keras calls the schedule with its batch count; with N = 3 the k-th update sees batch 3k + 2.
    plain = training.WarmupCosine(1e-3, 40, warmup_steps=5)
    accumulated = training.WarmupCosine(1e-3, 40, warmup_steps=5, gradient_accumulation_steps=3)
    for update in range(0, 45, 4):
        want = float(to_numpy(plain(update)))
        assert [float(to_numpy(accumulated(3 * update + i))) for i in range(3)] == [want] * 3


def test_warmup_cosine_end_points():
    schedule = training.WarmupCosine(1.0, 100, warmup_steps=10, alpha=0.25)
    value = lambda s: float(to_numpy(schedule(s)))  # noqa: E731
    assert value(0) == pytest.approx(0.1)  # the first update already moves the weights
    assert value(9) == pytest.approx(1.0) and value(10) == pytest.approx(1.0)
    assert value(100) == pytest.approx(0.25) and value(10_000) == pytest.approx(0.25)


def test_warmup_cosine_config_round_trip():
    schedule = training.WarmupCosine(2e-4, np.int64(500), warmup_steps=50, alpha=0.1)
    clone = training.WarmupCosine.from_config(schedule.get_config())
    assert clone.get_config() == schedule.get_config() == {
        "peak_learning_rate": 2e-4, "total_steps": 500, "warmup_steps": 50, "alpha": 0.1,
        "gradient_accumulation_steps": 1, "name": "warmup_cosine",
    }
    optimizer = training.training_optimizer(2e-4, total_steps=500, warmup_steps=50, alpha=0.1)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert restored.get_config()["learning_rate"]["config"] == schedule.get_config()
    assert float(to_numpy(restored.learning_rate)) == pytest.approx(2e-4 / 50)


@pytest.mark.parametrize("kwargs,match", [
    (dict(peak_learning_rate=0.0, total_steps=10), "peak_learning_rate"),
    (dict(peak_learning_rate=1e-3, total_steps=10, warmup_steps=10), "total_steps"),
    (dict(peak_learning_rate=1e-3, total_steps=10.5), "total_steps"),
    (dict(peak_learning_rate=1e-3, total_steps=10, warmup_steps=-1), "warmup_steps"),
    (dict(peak_learning_rate=1e-3, total_steps=10, alpha=1.5), "alpha"),
    (dict(peak_learning_rate=1e-3, total_steps=10, gradient_accumulation_steps=0), "gradient_accumulation_steps"),
])
def test_warmup_cosine_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        training.WarmupCosine(**kwargs)


# ---------------------------------------------------------------- optimizer


def test_training_optimizer_defaults_are_clips():
    optimizer = training.training_optimizer(1e-3, total_steps=100, warmup_steps=10)
    assert isinstance(optimizer, keras.optimizers.AdamW)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon, optimizer.weight_decay) == (0.9, 0.98, 1e-6, 0.2)
    assert optimizer.gradient_accumulation_steps is None and optimizer.clipnorm is None
    assert float(to_numpy(optimizer.learning_rate)) == pytest.approx(1e-4)
    constant = training.training_optimizer(1e-3, gradient_accumulation_steps=1)
    assert float(to_numpy(constant.learning_rate)) == pytest.approx(1e-3)
    assert constant.gradient_accumulation_steps is None


@pytest.mark.parametrize("kwargs,match", [
    (dict(warmup_steps=10), "total_steps"),
    (dict(alpha=0.1), "total_steps"),
    (dict(learning_rate=keras.optimizers.schedules.ExponentialDecay(1e-3, 10, 0.5), total_steps=10),
     "learning_rate"),
    (dict(gradient_accumulation_steps=0), "gradient_accumulation_steps"),
    (dict(gradient_accumulation_steps=2.0), "gradient_accumulation_steps"),
])
def test_training_optimizer_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        training.training_optimizer(**kwargs)


def test_configure_keeps_the_weight_decay_exclusions():
    model = tiny_model("siglip")
    lr, wd = 0.1, 0.5
    optimizer = training.configure(model, learning_rate=lr, weight_decay=wd)
    assert optimizer is model.optimizer
    before = weights(model)
    # Zero gradients: AdamW then only applies its decoupled decay w <- w (1 - lr wd).
    optimizer.apply([keras.ops.zeros(v.shape) for v in model.trainable_variables], model.trainable_variables)
    excluded = {v.path for v in model.no_weight_decay_variables()}
    assert {"logit_scale", "logit_bias", "bias", "gamma", "beta", "embeddings"} <= {
        p.split("/")[-1] for p in excluded
    }
    for v, old in zip(model.trainable_variables, before):
        if v.path in excluded:
            np.testing.assert_array_equal(to_numpy(v), old, err_msg=v.path)
        else:
            np.testing.assert_allclose(to_numpy(v), old * (1 - lr * wd), rtol=1e-5, err_msg=v.path)


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_configure_applies_the_logit_scale_clamp(family):
    model = tiny_model(family)
    training.configure(model, learning_rate=1e-3, total_steps=10, warmup_steps=2)
    model.logit_scale.assign(8.0)
    model.train_on_batch(tiny_batch())
    assert abs(float(to_numpy(model.logit_scale)) - LOGIT_SCALE_MAX) < 1e-6


def test_configure_sets_jit_compile_and_remat_and_checks_its_model():
    model = tiny_model("clip")
    training.configure(model, learning_rate=1e-3, jit_compile=False, remat=True)
    assert model.jit_compile is False and model.vision.remat and model.text.remat
    training.configure(model, learning_rate=1e-3)  # remat=None keeps the towers' setting
    assert model.vision.remat and model.text.remat
    training.configure(model, learning_rate=1e-3, remat=False)
    assert not model.vision.remat and not model.text.remat
    with pytest.raises(TypeError, match="remat"):
        training.configure(model, remat="yes")
    with pytest.raises(TypeError, match="model"):
        training.configure(keras.Sequential([keras.layers.Dense(1)]))
    with pytest.raises(TypeError, match="unexpected keyword"):
        training.configure(model, learning_rat=1e-3)


def _twin_clips():
    """Two tiny CLIPs with the same weights, compiled with AdamW, and a batch of 4."""
    model, reference = tiny_model("clip"), tiny_model("clip")
    reference.set_weights(model.get_weights())
    for m in (model, reference):
        m.compile(optimizer=keras.optimizers.AdamW(1e-3))
    return model, reference, tiny_batch(4, seed=3)


def _assert_same_weights(model, reference):
    for got, want in zip(model.trainable_variables, reference.trainable_variables, strict=True):
        np.testing.assert_array_equal(to_numpy(got), to_numpy(want), err_msg=got.path)


@pytest.mark.skipif(keras.backend.backend() != "torch", reason="PyTorch keeps gradients on its tensors (`.grad`)")
def test_torch_step_releases_its_gradients():
    # Keras' torch trainer clears the last step's gradients only after the next forward pass; vlzoo's
    # train step releases them when the update is done, and trains the same (the update just happened).
    model, reference, batch = _twin_clips()
    model.train_on_batch(batch)
    assert all(v.value.grad is None for v in model.trainable_variables)
    # The reference runs Keras' own step (the method the override wraps): the same weights after it.
    reference.train_step = lambda data: keras.Model.train_step(reference, data)
    reference.make_train_function(force=True)
    reference.train_on_batch(batch)
    assert any(v.value.grad is not None for v in reference.trainable_variables)
    _assert_same_weights(model, reference)


@pytest.fixture(scope="module")
def keras_trained_clip():
    """A tiny CLIP's initial weights, a batch of 4, and the weights after two steps on it of Keras' own `fit`
    (the method vlzoo's wraps, with AdamW): the reference both methods of the test below train to, traced once for
    the module (tracing a tiny model's step costs seconds on TensorFlow)."""
    model, reference, batch = _twin_clips()
    keras.Model.fit(reference, batch, batch_size=4, epochs=2, verbose=0, shuffle=False)  # built in the trace
    return model.get_weights(), batch, [to_numpy(v) for v in reference.trainable_variables]


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="Keras defers the optimizer's build on TensorFlow")
@pytest.mark.parametrize("method", ["fit", "train_on_batch"])
def test_tensorflow_training_traces_its_step_once_and_trains_as_keras(method, keras_trained_clip):
    # Keras' TensorFlow trainer would create the optimizer's variables inside the first traced step, which
    # `tf.function` then traces a second time; vlzoo builds them first. `train_step` runs once per trace.
    initial, batch, want = keras_trained_clip
    model = tiny_model("clip")
    model.set_weights(initial)
    model.compile(optimizer=keras.optimizers.AdamW(1e-3))
    traces = []
    step = model.train_step
    model.train_step = lambda data: (traces.append(1), step(data))[1]
    if method == "fit":  # two steps on the whole batch, as Keras' reference took
        model.fit(batch, batch_size=4, epochs=2, verbose=0, shuffle=False)
    else:
        for _ in range(2):
            model.train_on_batch(batch)
    assert len(traces) == 1
    for got, expected in zip(model.trainable_variables, want, strict=True):
        np.testing.assert_array_equal(to_numpy(got), expected, err_msg=got.path)


# ----------------------------------------------------- gradient accumulation


@pytest.fixture(scope="module")
def micro_gradients():
    """A tiny CLIP's initial weights (`get_weights`), two micro-batches of 4 and the SGD gradient of each at those
    weights (`sgd_gradients`): the reference both accumulation tests compare with, computed once."""
    keras.utils.set_random_seed(1234)
    model = tiny_model("clip", logit_scale_max=None)
    micro = [tiny_batch(4, seed=1), tiny_batch(4, seed=2)]
    return model.get_weights(), micro, sgd_gradients(model, *micro)


def test_accumulation_updates_every_n_steps_with_the_mean_gradient(micro_gradients):
    hyper = dict(learning_rate=1e-3, total_steps=20, warmup_steps=3, weight_decay=0.2)
    initial, micro, grads = micro_gradients
    model = tiny_model("clip", logit_scale_max=None)
    model.set_weights(initial)
    start = weights(model)

    reference = tiny_model("clip", logit_scale_max=None)
    reference.set_weights(initial)
    training.configure(reference, **hyper)
    mean = [keras.ops.convert_to_tensor((a + b) / 2) for a, b in zip(*grads)]
    reference.optimizer.apply(mean, reference.trainable_variables)

    training.configure(model, gradient_accumulation_steps=2, **hyper)
    model.train_on_batch(micro[0])
    for v, w in zip(model.trainable_variables, start):
        np.testing.assert_array_equal(to_numpy(v), w, err_msg=v.path)  # no update on the first micro-batch
    model.train_on_batch(micro[1])
    # The reference's gradients are recovered from SGD steps, each known to an ulp of its weight: Adam's first
    # update `lr g / (|g| + e)`, with `e = epsilon / sqrt(1 - beta_2)`, moves by up to `lr e dg / (|g| - dg + e)^2`
    # for an error `dg` of `g`, which is 6e-5 where `g` is near 0. That slack, 0 where `|g|` is large, is added.
    # A gradient that is 0 in exact arithmetic (the attention key biases: softmax ignores a shift common to all
    # keys) is float32's rounding noise of its terms, which the accumulating step and the SGD step round apart
    # (up to 2.9e-8 on JAX with XLA's elemental emitter, where the model's largest gradient is 8.5, and Adam
    # makes 1.7e-6 of it): each gradient's error is taken as at least float32's unit roundoff of the largest.
    e = model.optimizer.epsilon / np.sqrt(1 - model.optimizer.beta_2)
    noise = 2.0**-23 * max(float(np.abs((a + b) / 2).max()) for a, b in zip(*grads))
    moved = 0
    for v, want, w, a, b in zip(model.trainable_variables, weights(reference), start, *grads):
        g = np.abs((a + b) / 2)
        dg = np.spacing(np.abs(w) + g) * 2 + noise  # both recoveries: w0 - fl(w0 - g); the step's own rounding
        slack = hyper["learning_rate"] * e * dg / (np.maximum(g - dg, 0.0) + e) ** 2  # the peak rate bounds it
        bad = np.abs(to_numpy(v) - want) > 1e-6 + slack
        assert not bad.any(), (v.path, np.argwhere(bad)[:5].tolist())
        moved += not np.array_equal(to_numpy(v), w)
    assert moved == len(start)
    # The schedule and Adam's step count advance once per update, not per micro-batch.
    assert int(to_numpy(model.optimizer.iterations)) == 1
    assert float(to_numpy(model.optimizer.learning_rate)) == pytest.approx(numpy_warmup_cosine(1, 1e-3, 20, 3, 0.0))


def test_accumulated_micro_batches_are_not_one_big_contrastive_batch(micro_gradients):
    # Documented limitation: the contrastive loss couples the samples of a batch, so the
    # mean of micro-batch gradients is not the big batch's gradient.
    initial, micro, grads = micro_gradients
    model = tiny_model("clip", logit_scale_max=None)
    model.set_weights(initial)
    big = {k: np.concatenate([micro[0][k], micro[1][k]]) for k in micro[0]}
    mean = [(a + b) / 2 for a, b in zip(*grads)]
    (full,) = sgd_gradients(model, big)
    assert max(np.abs(a - b).max() for a, b in zip(mean, full)) > 1e-3


# --------------------------------------------------------------------- remat


def test_towers_serialise_remat():
    vision = VisionTransformer(**TINY_VISION, remat=True)
    text = TextTransformer(**TINY_TEXT)
    assert vision.get_config()["remat"] is True and text.get_config()["remat"] is False
    assert VisionTransformer.from_config(vision.get_config()).remat is True
    # A model built without remat keeps its config (and the presets) unchanged.
    assert "remat" not in tiny_model("clip").get_config()["vision"]


def test_remat_wraps_every_block_only_when_training(monkeypatch):
    calls = []
    remat = keras.remat
    monkeypatch.setattr(keras, "remat", lambda f: calls.append(f) or remat(f))
    model = tiny_model("clip", vision={"remat": True, "num_layers": 2}, text={"remat": True, "num_layers": 2})
    model(tiny_batch())
    assert calls == []
    model(tiny_batch(), training=True)
    # Each block is wrapped; on JAX training scans the stacked blocks, and the scanned step is wrapped once a tower.
    scanned = keras.backend.backend() == "jax"
    expected = 2 if scanned else model.vision.num_layers + model.text.num_layers
    assert len(calls) == expected
    # fit's train step too (on JAX a stateless call: `training` must be passed down to the towers explicitly).
    calls.clear()
    model.compile(optimizer="sgd", jit_compile=False)
    model.train_on_batch(tiny_batch())
    assert len(calls) == expected


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_remat_gives_the_same_outputs_and_gradients(family):
    plain = tiny_model(family, logit_scale_max=None)
    remat = tiny_model(family, vision={"remat": True}, text={"remat": True}, logit_scale_max=None)
    remat.set_weights(plain.get_weights())
    batch = tiny_batch()
    out_plain, out_remat = plain(batch, training=True), remat(batch, training=True)
    for key in out_plain:
        np.testing.assert_allclose(to_numpy(out_remat[key]), to_numpy(out_plain[key]), rtol=0, atol=1e-6, err_msg=key)
    # The plain step is the reference: eager on TensorFlow (`EAGER_REFERENCE`), where tracing a second step costs
    # seconds; it is the same float32 arithmetic to rounding, far inside the bound below. The remat step is traced.
    (grads_plain,) = sgd_gradients(plain, batch, run_eagerly=EAGER_REFERENCE)
    (grads_remat,) = sgd_gradients(remat, batch)
    for v, a, b in zip(plain.trainable_variables, grads_plain, grads_remat):
        # SGD(1) steps; a gradient entry of size g carries ~ulp(g) of rounding.
        assert np.abs(a - b).max() <= 1e-6 * max(1.0, np.abs(a).max()), v.path


# ------------------------------------------------------------ mixed precision


@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_logit_scale_and_bias_stay_float32_under_mixed_precision(family):
    model = tiny_model(family, dtype="mixed_bfloat16")
    model.logit_scale.assign(4.6)  # 4.59375 in bfloat16
    for training_flag in (False, True):
        outputs = model(tiny_batch(), training=training_flag)
        assert keras.backend.standardize_dtype(outputs["image_embeds"].dtype) == "bfloat16"
        scale = outputs["logit_scale"]
        assert keras.backend.standardize_dtype(scale.dtype) == "float32"
        want = to_numpy(keras.ops.exp(keras.ops.convert_to_tensor(np.float32(4.6))))
        assert to_numpy(scale) == want
        if family == "siglip":
            assert keras.backend.standardize_dtype(outputs["logit_bias"].dtype) == "float32"
            assert to_numpy(outputs["logit_bias"]) == np.float32(-10.0)
        loss = model.compute_loss(y_pred=outputs, training=training_flag)
        assert keras.backend.standardize_dtype(loss.dtype) == "float32"


@pytest.mark.parametrize("preset", ["clip_tiny", "siglip_tiny"])
def test_fit_step_under_mixed_bfloat16(preset):
    # One block per tower (`shallow_towers`): the dtypes of the step do not depend on the depth, its tracing does.
    model = vlzoo.from_preset(preset, dtype="mixed_bfloat16", **shallow_towers(preset.split("_")[0]))
    training.configure(model, learning_rate=1e-3, total_steps=10, warmup_steps=2, remat=True)
    batch = tiny_batch(4, image_size=32, sequence_length=16, vocabulary_size=model.text.vocabulary_size)
    before = weights(model)
    history = model.fit(batch, batch_size=4, epochs=2, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"]).all()
    assert all(keras.backend.standardize_dtype(v.dtype) == "float32" for v in model.trainable_variables)
    assert any(not np.array_equal(to_numpy(v), w) for v, w in zip(model.trainable_variables, before))
    loss = model.compute_loss(y_pred=model(batch, training=True))
    assert keras.backend.standardize_dtype(loss.dtype) == "float32" and np.isfinite(to_numpy(loss))
