"""`vlzoo.optimizers.AdamW`: Keras' AdamW, its update through PyTorch's fused Adam kernel on PyTorch."""

import keras
import numpy as np
import pytest
from conftest import TINY_TEXT, TINY_VISION

import vlzoo
from vlzoo.optimizers import AdamW
from vlzoo.training import training_optimizer

SHAPES = [(5, 7), (7,), (3, 4, 2), ()]


def _train(optimizer, steps=6, seed=0):
    """The variables after `steps` updates with gradients from 1e-6 to 1 (so that epsilon matters for some),
    the step count set to 1000 after the third (as a restored checkpoint would): Adam's bias corrections, and
    so its epsilon, differ between steps 4 and 1004."""
    rng = np.random.default_rng(seed)
    variables = [keras.Variable(rng.normal(size=shape).astype("float32")) for shape in SHAPES]
    optimizer.exclude_from_weight_decay(var_list=[variables[1]])
    for step in range(steps):
        if step == 3:
            optimizer.iterations.assign(1000)
        grads = [rng.normal(size=shape).astype("float32") * 10.0 ** rng.integers(-6, 1) for shape in SHAPES]
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    return [keras.ops.convert_to_numpy(v) for v in variables]


@pytest.mark.parametrize("amsgrad,schedule", [(False, False), (True, False), (False, True)])
def test_adamw_updates_as_keras_adamw(amsgrad, schedule):
    # Keras' formula (epsilon added to the uncorrected root, decoupled decay, one variable excluded, the step
    # count reassigned midway, a constant or scheduled learning rate); on PyTorch the fused kernel computes it
    # in one pass, so it rounds differently: a few float32 ulps of the variables (|v| < 5), far below the
    # updates themselves (about 1e-2 a step here). Keras' own update elsewhere.
    rate = keras.optimizers.schedules.PiecewiseConstantDecay([2, 1002], [1e-2, 3e-2, 2e-2]) if schedule else 1e-2
    args = dict(learning_rate=rate, weight_decay=0.1, epsilon=1e-3, amsgrad=amsgrad)
    start = _train(keras.optimizers.AdamW(**args), steps=0)
    want, got = _train(keras.optimizers.AdamW(**args)), _train(AdamW(**args))
    fused = keras.backend.backend() == "torch"
    for g, w, s in zip(got, want, start):
        assert np.abs(w - s).max() > 1e-2  # it trained
        if fused:
            np.testing.assert_allclose(g, w, rtol=0, atol=2e-6)
        else:
            np.testing.assert_array_equal(g, w)


def test_adamw_serialises_and_is_the_default_optimizer():
    optimizer = AdamW(learning_rate=3e-4, weight_decay=0.05, beta_2=0.98)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(restored) is AdamW and restored.get_config() == optimizer.get_config()
    model = vlzoo.CLIP(vision=TINY_VISION, text=TINY_TEXT, embed_dim=16)
    for name in (None, "AdamW"):
        model.compile(**({} if name is None else {"optimizer": name}))
        assert type(model.optimizer) is AdamW
    assert type(training_optimizer()) is AdamW
