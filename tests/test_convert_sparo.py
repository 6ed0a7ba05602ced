"""vlzoo.convert.from_sparo_checkpoint against the SPARO authors' own outputs (golden fixtures).

`tests/fixtures/sparo/` holds a small random-init model of the authors' fork
(github.com/ankitkv/sparo-clip), its inputs and what their code returned for
them (written by `make_fixture.py` there; see its README). Only numpy is
needed, so this runs on every backend; torch only for the `.pt` file test.
"""

import json
import pathlib

import keras
import numpy as np
import pytest

from vlzoo.convert.sparo import from_sparo_checkpoint

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "sparo"
CONFIG = json.loads((FIXTURES / "config.json").read_text())
AUTHORS = dict(np.load(FIXTURES / "outputs.npz"))

# sparo_tiny already has the fixture's towers (32 px, patch 8, width 32, 3 - 1 = 2 blocks, 4 heads, so
# D = 8, context 16); these give it the fixture's MLP width (the authors' mlp_ratio 4), vocabulary and L, V.
OVERRIDES = dict(
    vision=dict(intermediate_dim=128), text=dict(vocabulary_size=512, intermediate_dim=128), num_slots=8, slot_dim=4,
)
# Max abs difference to the authors' outputs (their float32 CPU run; no rtol: the largest outputs are the
# logits, |x| < 16, where float32 rounding stays below 3e-6).
ATOL = 1e-5


def state_dict():
    return dict(np.load(FIXTURES / "state_dict.npz"))


def inputs():
    """`(images, texts)` as vlzoo takes them; the authors' model got `images_nchw` (channels first)."""
    arrays = np.load(FIXTURES / "inputs.npz")
    ids = arrays["token_ids"]
    return arrays["images_nchw"].transpose(0, 2, 3, 1), {"token_ids": ids, "padding_mask": ids != 0}


def vlzoo_outputs(model):
    """The fixture's outputs (`outputs.npz` names) as vlzoo computes them."""
    to_numpy = keras.ops.convert_to_numpy
    images, texts = inputs()
    pairs = CONFIG["loss_pairs"]
    slots = (-1, model.num_slots, model.slot_dim)
    return dict(
        image_slots=to_numpy(model.encode_image(images)["embeds"]).reshape(slots),
        text_slots=to_numpy(model.encode_text(texts)["embeds"]).reshape(slots),
        image_embeds=to_numpy(model.encode_image(images, normalize=True)["embeds"]),
        text_embeds=to_numpy(model.encode_text(texts, normalize=True)["embeds"]),
        image_attention=to_numpy(model.image_attention(images)),
        text_attention=to_numpy(model.text_attention(texts)),
        logit_scale=to_numpy(model.logit_scale_value()),
        logits_per_image=to_numpy(model.similarity(images, texts)),
        loss=to_numpy(model.compute_loss(x={"images": images[:pairs], **{k: v[:pairs] for k, v in texts.items()}},
                                         training=False)),
    )


def max_diffs(model):
    ours = vlzoo_outputs(model)
    return {name: float(np.abs(ours[name] - AUTHORS[name]).max()) for name in AUTHORS}


@pytest.fixture(scope="module")
def converted():
    model = from_sparo_checkpoint(state_dict(), "sparo_tiny", **OVERRIDES)
    return model, vlzoo_outputs(model)


# ----------------------------------------------------------------------------- parity


def test_fixture_is_the_authors_layout():
    """The stored state dict has the authors' keys, tied aliases included, and the released SPARO options."""
    keys = state_dict()
    args = CONFIG["clip_arguments"]
    assert args["share_kv"] and args["sparo_type"] == "cont:const" and args["sparo_attn_dim"] is None
    text = args["text_cfg"]
    head_widths = {"visual.sparo.": args["vision_cfg"]["head_width"], "text_sparo.": text["width"] // text["heads"]}
    for prefix, head_width in head_widths.items():  # D = the tower's head width (`sparo_attn_dim=None`)
        assert keys[f"{prefix}q_emb"].shape == (1, args["L"], 1, 1, head_width)
        np.testing.assert_array_equal(keys[f"{prefix}v.weight"], keys[f"{prefix}k.weight"])
    assert "visual.proj" not in keys and "text_projection" not in keys


@pytest.mark.parametrize("name", sorted(AUTHORS))
def test_outputs_match_authors(converted, name):
    _, ours = converted
    assert ours[name].shape == AUTHORS[name].shape
    diff = float(np.abs(ours[name] - AUTHORS[name]).max())
    print(f"[{keras.backend.backend()}] SPARO {name}: max abs diff {diff:.3g}")
    assert diff < ATOL, (name, diff)


def test_text_attention_is_exactly_zero_where_the_authors_mask(converted):
    """Positions after the end token get exactly 0; the row filling the context (EOT last) attends all."""
    _, ours = converted
    masked = AUTHORS["text_attention"] == 0
    full = inputs()[1]["token_ids"][:, -1] != 0
    assert masked.any() and full.any() and not masked[full].any()
    assert (ours["text_attention"][masked] == 0).all()


def test_logit_scale_is_the_checkpoints_log_scale(converted):
    model, _ = converted
    scale = float(keras.ops.convert_to_numpy(model.logit_scale))
    assert scale == float(state_dict()["logit_scale"])
    assert scale != pytest.approx(model.init_logit_scale)  # the fixture moved it off the default


def test_keeps_the_presets_tokenizer_and_preprocessor(converted):
    model, _ = converted
    assert type(model).__name__ == "SPARO" and model.preprocessor.image_size == 32
    assert model.tokenizer(["a photo of a cat"])["token_ids"].shape == (1, 16)


@pytest.mark.parametrize("prefix", ["module.", "_orig_mod.module."])  # DDP; DDP + --torchcompile
def test_training_checkpoint_with_wrapper_prefix(prefix):
    checkpoint = {"epoch": 3, "name": "sparo", "state_dict": {prefix + k: v for k, v in state_dict().items()}}
    diffs = max_diffs(from_sparo_checkpoint(checkpoint, "sparo_tiny", **OVERRIDES))
    assert max(diffs.values()) < ATOL, diffs


def test_tied_aliases_are_optional():
    """A state dict without the duplicate `v.*` names (safetensors' `save_model` keeps one name per shared
    tensor) loads too."""
    aliases = [f"{prefix}v.{part}" for prefix in ("visual.sparo.", "text_sparo.") for part in ("weight", "bias")]
    weights = state_dict()
    for key in aliases:
        del weights[key]
    diffs = max_diffs(from_sparo_checkpoint(weights, "sparo_tiny", **OVERRIDES))
    assert max(diffs.values()) < ATOL, diffs


def test_pt_file(tmp_path):
    torch = pytest.importorskip("torch")
    path = tmp_path / "epoch_1.pt"
    torch.save({"epoch": 1, "state_dict": {k: torch.from_numpy(v) for k, v in state_dict().items()}}, path)
    diffs = max_diffs(from_sparo_checkpoint(str(path), "sparo_tiny", **OVERRIDES))
    assert max(diffs.values()) < ATOL, diffs


# ----------------------------------------------------------------------------- errors


def test_unknown_key():
    weights = dict(state_dict(), **{"visual.sparo.extra": np.zeros(3, "float32")})
    with pytest.raises(KeyError, match=r"visual\.sparo\.extra.*preset 'sparo_tiny'"):
        from_sparo_checkpoint(weights, "sparo_tiny", **OVERRIDES)


def test_missing_key():
    weights = state_dict()
    del weights["text_sparo.proj.bias"]
    with pytest.raises(KeyError, match=r"text_sparo\.proj\.bias.*text_readout/output/bias"):
        from_sparo_checkpoint(weights, "sparo_tiny", **OVERRIDES)


@pytest.mark.parametrize(
    "key, shape, message",
    [
        ("visual.ln_post.weight", (31,), r"visual\.ln_post\.weight' \(31,\).*expected \(32,\), received \(31,\)"),
        ("visual.sparo.proj.bias", (5,), r"visual\.sparo\.proj\.bias' \(5,\).*expected \(4,\), received \(5,\)"),
    ],
)
def test_wrong_shape(key, shape, message):
    weights = dict(state_dict(), **{key: np.zeros(shape, "float32")})
    with pytest.raises(ValueError, match=message):
        from_sparo_checkpoint(weights, "sparo_tiny", **OVERRIDES)


def test_tied_alias_that_differs_from_its_key():
    weights = state_dict()
    weights["text_sparo.v.weight"] = weights["text_sparo.v.weight"] + 1
    with pytest.raises(ValueError, match=r"'text_sparo\.v\.weight' \(64, 32\) differs from 'text_sparo\.k\.weight'"):
        from_sparo_checkpoint(weights, "sparo_tiny", **OVERRIDES)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(num_slots=4), r"'visual\.sparo\.q_emb' \(1, 8, 1, 1, 8\): L = 8, but the model has num_slots=4; "
                            r"override num_slots=8"),
        (dict(slot_dim=8), r"'text_sparo\.proj\.weight' \(4, 8\): V = 4, but the model has slot_dim=8"),
        (dict(key_dim=16), r"'visual\.sparo\.q_emb' \(1, 8, 1, 1, 8\): D = 8, but the model has vision read-out "
                           r"key_dim=16"),
        (dict(vision=dict(num_layers=2)), r"'visual\.transformer\.resblocks\.\*': blocks = 2, but the model has "
                                          r"vision blocks=1; override vision=\{'num_layers': 3\}"),
    ],
)
def test_geometry_mismatch_names_key_shape_and_preset(overrides, message):
    config = {**OVERRIDES, **overrides}
    for tower in ("vision", "text"):
        config[tower] = {**OVERRIDES[tower], **overrides.get(tower, {})}
    with pytest.raises(ValueError, match=r"(?s)does not match preset 'sparo_tiny' with overrides.*" + message):
        from_sparo_checkpoint(state_dict(), "sparo_tiny", **config)


def test_refuses_a_preset_of_another_family():
    with pytest.raises(ValueError, match="builds a CLIP, not a SPARO model"):
        from_sparo_checkpoint(state_dict(), "clip_tiny")
