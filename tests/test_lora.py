"""LoRA through Keras' `enable_lora`: trainable share, merged model = adapter model, adapters saved alone."""

import warnings

import keras
import numpy as np
import pytest

import vlzoo
from vlzoo.presets.files import CONFIG_FILE, read_json
from vlzoo.presets.local import preset_info, resolve_preset
from vlzoo.training import enable_lora, load_lora_weights, merge_lora, save_lora_weights
from vlzoo.training.lora import lora_layers

from backend_utils import run_once
from conftest import TWO_BLOCKS, tiny_batch, tiny_model, to_numpy
from families import FAMILIES
from margins import margin_batch, tiny_family_model


def _trained_lora_model(rank=4, **kwargs):
    """A tiny CLIP with LoRA on its query/value projections, after 3 AdamW steps (B is no longer 0)."""
    model = tiny_model("clip")
    enable_lora(model, rank=rank, **kwargs)
    model.compile(optimizer=keras.optimizers.AdamW(1e-2))
    model.fit(tiny_batch(4), batch_size=4, epochs=3, verbose=0, shuffle=False)
    return model


def _embeddings(model, batch):
    outputs = model.predict_on_batch(batch)
    return {k: np.asarray(outputs[k]) for k in ("image_embeds", "text_embeds")}


def test_only_the_adapters_train():
    model = tiny_model("clip", **TWO_BLOCKS)
    before = {v.path: to_numpy(v).copy() for v in model.weights}
    trainable = enable_lora(model, rank=4)
    layers = lora_layers(model)
    assert len(layers) == 2 * 2 * 2  # query and value, 2 blocks, 2 towers
    want = sum(4 * (layer.lora_kernel_a.shape[0] + layer.lora_kernel_b.shape[1]) for layer in layers)
    assert trainable == want == sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    model.compile(optimizer=keras.optimizers.AdamW(1e-2, weight_decay=0.5))
    model.fit(tiny_batch(4), batch_size=4, epochs=3, verbose=0, shuffle=False)
    for v in model.weights:
        if v.path in before:  # every base variable, kernels, biases, norms and logit scale
            np.testing.assert_array_equal(to_numpy(v), before[v.path])
    assert all(np.any(to_numpy(layer.lora_kernel_b) != 0) for layer in layers)


@run_once  # builds a ViT-B/16 (150M parameters, a few seconds); the count does not depend on the backend
def test_rank_8_on_a_vit_b16_is_under_one_percent():
    # Query and value are (width, width) in every block; rank 8 adds A (width, 8) and B (8, width) to each.
    config = read_json(resolve_preset("clip_vit_b16") / CONFIG_FILE)["config"]
    adapters = sum(tower["num_layers"] * 2 * 8 * 2 * tower["hidden_dim"] for tower in (config["vision"], config["text"]))
    total = preset_info("clip_vit_b16")["params"]
    assert 140e6 < total < 160e6 and adapters / total < 0.01
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no weights: a random initialisation is enough to count
        model = vlzoo.from_preset("clip_vit_b16")
    assert model.count_params() == total
    trainable = enable_lora(model, rank=8)
    assert trainable == adapters == sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    print(f"LoRA rank 8 on clip_vit_b16: {trainable:,} trainable of {total:,} ({trainable / total:.3%})")


def test_merged_model_equals_the_adapter_model():
    model = _trained_lora_model()
    merged = merge_lora(model)
    assert not lora_layers(merged) and len(merged.weights) == len(model.weights) - 2 * len(lora_layers(model))
    batch = tiny_batch(3, seed=5)
    got, want = _embeddings(merged, batch), _embeddings(model, batch)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)


def test_a_saved_preset_is_the_merged_model(tmp_path):
    model = _trained_lora_model()
    model.save_to_preset(tmp_path / "merged")
    reloaded = vlzoo.from_preset(str(tmp_path / "merged"))
    batch = tiny_batch(3, seed=6)
    got, want = _embeddings(reloaded, batch), _embeddings(model, batch)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6)


def test_adapters_saved_alone_load_onto_the_base_model(tmp_path):
    keras.utils.set_random_seed(3)
    model = _trained_lora_model(targets=("query", "fc2"), towers=("text",), alpha=8)
    base = tiny_model("clip")
    base.set_weights([to_numpy(v) for v in model.weights if "lora_kernel" not in v.path])
    path = tmp_path / "adapters.npz"
    save_lora_weights(model, path)
    load_lora_weights(base, path)
    assert [layer.path for layer in lora_layers(base)] == [layer.path for layer in lora_layers(model)]
    batch = tiny_batch(3, seed=7)
    got, want = _embeddings(base, batch), _embeddings(model, batch)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])


# Which projections take adapters depends on the family (its towers' blocks); Keras' LoRA layer itself is
# checked on every backend above. So every registered family runs once, in one pass.
@run_once
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_trains_only_its_adapters_and_merges_to_the_same_model(family):
    keras.utils.set_random_seed(0)
    model = tiny_family_model(family)
    frozen = {v.path: to_numpy(v).copy() for v in model.trainable_weights}  # what LoRA must leave alone
    trainable = enable_lora(model, rank=2)
    layers = lora_layers(model)
    blocks = len(model.vision.blocks) + len(model.text.blocks)
    assert len(layers) == 2 * blocks  # query and value of every block of both towers
    assert trainable == sum(2 * (layer.lora_kernel_a.shape[0] + layer.lora_kernel_b.shape[1]) for layer in layers)
    model.compile(optimizer=keras.optimizers.AdamW(1e-2))
    batch = margin_batch(model)
    model.fit(batch, batch_size=2, epochs=1, verbose=0, shuffle=False)  # 4 steps (STAIR: a step per stage at least)
    for v in model.weights:
        if v.path in frozen:
            np.testing.assert_array_equal(to_numpy(v), frozen[v.path], err_msg=v.path)
    assert all(np.any(to_numpy(layer.lora_kernel_b) != 0) for layer in layers)
    merged = merge_lora(model)
    assert not lora_layers(merged)
    got, want = _embeddings(merged, batch), _embeddings(model, batch)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-6, err_msg=f"{family} {key}")


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="`targets` must name some of"):
        enable_lora(tiny_model("clip"), targets=("qkv",))
    with pytest.raises(ValueError, match="`rank` must be a positive int"):
        enable_lora(tiny_model("clip"), rank=0)
    model = tiny_model("clip")
    enable_lora(model)
    with pytest.raises(ValueError, match="already enabled"):
        enable_lora(model)
    with pytest.raises(ValueError, match="no LoRA adapters"):
        save_lora_weights(tiny_model("clip"), tmp_path / "none.npz")
    with pytest.raises(FileNotFoundError, match="LoRA weights file not found"):
        load_lora_weights(tiny_model("clip"), tmp_path / "missing.npz")
