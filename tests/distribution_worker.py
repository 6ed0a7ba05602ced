"""Runs vlzoo on 8 simulated CPU devices (JAX) and prints what `test_distribution.py` checks, as JSON.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 KERAS_BACKEND=jax python tests/distribution_worker.py

For every family's tiny preset, one SGD step (`train_on_batch`) on a global batch of
16 pairs under `keras.distribution.DataParallel` over the 8 devices, and the same
step without a distribution: the losses and the updated weights (so the gradients), and
the margins of the family's discrete choices on that batch (`tests/margins.py`).
Also the mean of the losses of the 8 per-device shards alone, i.e. what a loss with
device-local negatives would give. Then a Llip model of G/14's layout at reduced width
and depth, built under `ModelParallel` with `vlzoo.distribution.layout_map` on a
(2 batch x 4 model) mesh: which weights are sharded, and one training step against
the unsharded model.
"""

import json
import os
import sys
import warnings

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ["KERAS_BACKEND"] = "jax"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

import vlzoo  # noqa: E402
from vlzoo import distribution  # noqa: E402

from margins import decision_margins, stair_restricted_to  # noqa: E402

FAMILY_PRESETS = {
    "clip": ("clip_tiny", {}), "siglip": ("siglip_tiny", {}), "filip": ("filip_tiny", {"keep_ratio": 1.0}),
    "sparc": ("sparc_tiny", {}), "sparo": ("sparo_tiny", {}), "llip": ("llip_tiny", {}),
    "stair": ("stair_tiny", {}), "flair": ("flair_tiny", {}),
}
# The global batch's captions (from the shapes' words) and STAIR's embeddings restricted to their words and 32
# more ids: with these, every discrete choice of FILIP's, SPARC's and STAIR's losses keeps at least 4.8e-5 of its
# scale from a tie (tests/margins.py), so the sharded and the single-device step decide them alike. Over all
# 30,522 entries, STAIR's pooled maxima held a tie 2.3e-8 of their scale apart.
DATA_SEED = 5
STAIR_EXTRA_IDS = range(2032, 2064)
# G/14's layout (K = 64 mixture tokens, patch 14, q/k/v norms, M heads) at a width and depth that fit a test.
G14_REDUCED = dict(
    vision=dict(image_size=28, hidden_dim=64, num_layers=2, num_heads=4, intermediate_dim=128),
    text=dict(sequence_length=8, hidden_dim=32, num_layers=2, num_heads=4, intermediate_dim=64),
    embed_dim=32, num_heads=8,
)


def batch(model, size, seed):
    rng = np.random.default_rng(seed)
    side = model.vision.image_size
    captions = [" ".join(rng.choice(["red", "blue", "circle", "square", "above", "a"], 5)) for _ in range(size)]
    return {"images": rng.uniform(-1, 1, (size, side, side, 3)).astype("float32"), **model.tokenizer(captions)}


def one_step(model, weights, inputs):
    model.set_weights(weights)
    model.compile(optimizer=keras.optimizers.SGD(0.1))
    loss = float(model.train_on_batch(inputs, return_dict=True)["loss"])
    return loss, [np.asarray(keras.ops.convert_to_numpy(v)) for v in model.weights]


def max_diff(a, b):
    return max(float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) if np.size(x) else 0.0
               for x, y in zip(a, b))


def data_parallel(family, name, overrides):
    print(f"data parallel: {name}", file=sys.stderr, flush=True)
    keras.utils.set_random_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = vlzoo.from_preset(name, **overrides)
        inputs = batch(reference, 16, seed=DATA_SEED)
        if family == "stair":
            overrides = {**overrides, **stair_restricted_to(inputs["token_ids"], STAIR_EXTRA_IDS)}
            keras.utils.set_random_seed(0)
            reference = vlzoo.from_preset(name, **overrides)
        weights = reference.get_weights()
        margins = decision_margins(reference, inputs)
        reference.compile(optimizer=keras.optimizers.SGD(0.1))
        shard_losses = [
            reference.test_on_batch({key: value[2 * k:2 * k + 2] for key, value in inputs.items()},
                                    return_dict=True)["loss"]
            for k in range(8)
        ]
        single_loss, single_weights = one_step(reference, weights, inputs)
        with keras.distribution.DataParallel(devices=jax.devices()).scope():
            model = vlzoo.from_preset(name, **overrides)
            placed = min(len(v.value.sharding.device_set) for v in model.weights)
            dp_loss, dp_weights = one_step(model, weights, inputs)
    return {
        "family": family, "devices_per_weight": placed, "margins": margins,
        "loss_single": single_loss, "loss_data_parallel": dp_loss,
        "loss_device_local_negatives": float(np.mean(shard_losses)),
        "weights_after_step_max_diff": max_diff(single_weights, dp_weights),
        "step_changed_weights": max_diff(weights, single_weights),
    }


def model_parallel():
    keras.utils.set_random_seed(0)
    mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), jax.devices())
    reference = vlzoo.from_preset("llip_vit_g14", load_weights=False, **G14_REDUCED)
    layouts = distribution.layout_map(reference, mesh)
    weights = reference.get_weights()
    inputs = batch(reference, 8, seed=2)
    single_loss, single_weights = one_step(reference, weights, inputs)
    with keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch").scope():
        model = vlzoo.from_preset("llip_vit_g14", load_weights=False, **G14_REDUCED)
        sharded = distribution.sharded_dimensions(model)
        mp_loss, mp_weights = one_step(model, weights, inputs)
        sharded_after = distribution.sharded_dimensions(model)
    return {
        "num_weights": len(model.weights), "layout_entries": sorted(layouts),
        "sharded": {path: list(axes) for path, axes in sharded.items()},
        "still_sharded_after_step": sorted(sharded_after) == sorted(sharded),
        "num_prefix_tokens": model.vision.num_prefix_tokens,
        "loss_single": single_loss, "loss_model_parallel": mp_loss,
        "weights_after_step_max_diff": max_diff(single_weights, mp_weights),
    }


def main():
    result = {"num_devices": jax.device_count(),
              "data_parallel": [data_parallel(f, name, o) for f, (name, o) in FAMILY_PRESETS.items()],
              "model_parallel": model_parallel()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
