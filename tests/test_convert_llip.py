"""vlzoo.convert.from_llip_checkpoint against golden outputs of the Llip authors' code.

`tests/fixtures/llip/<variant>/` holds a small random `CMP` model of the
authors (facebookresearch/Llip @ d5649c3), its inputs and its outputs, written
by `tests/fixtures/llip/make_fixture.py` (see the fixtures' README). Every compared
number comes from their code; nothing here imports torch except the file
test, which skips without it.
"""

import json
import pathlib
import re

import keras
import numpy as np
import pytest
from backend_utils import run_once

import vlzoo
from vlzoo._backends.keras_internals import without_weights
from vlzoo.convert import _common as C
from vlzoo.convert.llip import _check_geometry, _rules, from_llip_checkpoint

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "llip"
VARIANTS = ("qkv_norm_off", "qkv_norm_on")
ATOL = 1e-5  # float32, values up to ~12 (logits, loss); rtol 0

# The authors' configs of their released checkpoints (model_configs/*.json at d5649c3) and the
# trainable parameter counts of their `CMP` built from them.
RELEASED = {
    "llip_vit_b16": (
        dict(
            embed_dim=512, num_heads=8, use_norm=False,
            vision_cfg=dict(image_size=224, layers=12, width=768, patch_size=16, ncls=32),
            text_cfg=dict(context_length=77, vocab_size=49408, width=512, heads=8, layers=12),
        ),
        174_965_250,
    ),
    "llip_vit_g14": (
        dict(
            embed_dim=1280, num_heads=8, use_norm=True,
            vision_cfg=dict(image_size=224, layers=48, width=1664, head_width=104, mlp_ratio=4.9231,
                            patch_size=14, ncls=64),
            text_cfg=dict(context_length=77, vocab_size=49408, width=1280, heads=20, layers=32),
        ),
        2_813_561_090,
    ),
}


# ----------------------------------------------------------------------------- helpers


def load(variant):
    """(authors' CMP arguments, state dict, inputs, outputs) of a fixture variant."""
    directory = FIXTURES / variant
    config = json.loads((directory / "config.json").read_text())
    arrays = [dict(np.load(directory / f"{name}.npz")) for name in ("state_dict", "inputs", "outputs")]
    return (config, *arrays)


def overrides(config):
    """`from_preset("llip_tiny", **overrides)` arguments giving the authors' fixture architecture."""
    cmp = config["cmp_arguments"]
    v, t = cmp["vision_cfg"], cmp["text_cfg"]
    return dict(
        vision=dict(
            image_size=v["image_size"], patch_size=v["patch_size"], hidden_dim=v["width"],
            num_layers=v["layers"], num_heads=v["width"] // v["head_width"],
            intermediate_dim=int(v["width"] * v["mlp_ratio"]), num_prefix_tokens=v["ncls"],
        ),
        text=dict(
            vocabulary_size=t["vocab_size"], sequence_length=t["context_length"], hidden_dim=t["width"],
            num_layers=t["layers"], num_heads=t["heads"], intermediate_dim=4 * t["width"],
        ),
        embed_dim=cmp["embed_dim"], num_heads=cmp["num_heads"], use_qkv_norm=cmp["use_norm"],
        temperature=config["temperature"],
    )


def vlzoo_inputs(inputs):
    """The fixture's inputs in vlzoo's layout: images NCHW -> NHWC, token ids with their padding mask."""
    images = np.transpose(inputs["images_nchw"], (0, 2, 3, 1))
    token_ids = inputs["token_ids"]
    return images, {"token_ids": token_ids, "padding_mask": token_ids != 0}


def numpy(x):
    return keras.ops.convert_to_numpy(x)


def assert_logits_match(model, inputs, outputs):
    images, texts = vlzoo_inputs(inputs)
    np.testing.assert_allclose(numpy(model.similarity(images, texts)), outputs["logits"], rtol=0, atol=ATOL)


def authors_shapes(cmp):
    """`{key: shape}` of the authors' `CMP(**cmp).state_dict()` (their model.py at d5649c3)."""
    v, t, d = cmp["vision_cfg"], cmp["text_cfg"], cmp["embed_dim"]
    width, patch, k = v["width"], v["patch_size"], v["ncls"]
    positions = (v["image_size"] // patch) ** 2 + k

    def blocks(prefix, width, layers, mlp):
        out = {}
        for i in range(layers):
            b = f"{prefix}transformer.resblocks.{i}."
            out.update({
                b + "attn.in_proj_weight": (3 * width, width), b + "attn.in_proj_bias": (3 * width,),
                b + "attn.out_proj.weight": (width, width), b + "attn.out_proj.bias": (width,),
                b + "ln_1.weight": (width,), b + "ln_1.bias": (width,),
                b + "mlp.c_fc.weight": (mlp, width), b + "mlp.c_fc.bias": (mlp,),
                b + "mlp.c_proj.weight": (width, mlp), b + "mlp.c_proj.bias": (width,),
                b + "ln_2.weight": (width,), b + "ln_2.bias": (width,),
            })
        return out

    shapes = {
        "visual.class_embedding": (k, width), "visual.positional_embedding": (positions, width),
        "visual.conv1.weight": (width, 3, patch, patch),
        "visual.ln_pre.weight": (width,), "visual.ln_pre.bias": (width,),
        "visual.ln_post.weight": (width,), "visual.ln_post.bias": (width,),
        **blocks("visual.", width, v["layers"], int(width * v.get("mlp_ratio", 4.0))),
        "token_embedding.weight": (t["vocab_size"], t["width"]),
        "positional_embedding": (t["context_length"], t["width"]),
        **blocks("", t["width"], t["layers"], 4 * t["width"]),
        "ln_final.weight": (t["width"],), "ln_final.bias": (t["width"],),
        "text_projection": (t["width"], d), "logit_scale": (), "logit_bias": (),
        "q_proj": (t["width"], d), "k_proj": (k, width, d), "v_proj": (k, width, d), "pred.out_proj": (d, d),
    }
    if cmp["use_norm"]:
        shapes.update({f"{n}_norm.{p}": (d,) for n in "QKV" for p in ("weight", "bias")})
    return shapes


@pytest.fixture(scope="module", params=VARIANTS)
def fixture(request):
    return load(request.param)


@pytest.fixture(scope="module")
def converted(fixture):
    config, state_dict, _, _ = fixture
    return from_llip_checkpoint(state_dict, "llip_tiny", **overrides(config))


# ----------------------------------------------------------------------------- parity with the authors


def test_fixture_layout_is_the_authors(fixture):
    config, state_dict, _, _ = fixture
    assert {k: v.shape for k, v in state_dict.items()} == authors_shapes(config["cmp_arguments"])


def test_image_side_matches_the_authors(fixture, converted):
    config, state_dict, inputs, outputs = fixture
    images, _ = vlzoo_inputs(inputs)
    image = converted.encode_image(images)
    np.testing.assert_allclose(numpy(image["mixture_tokens"]), outputs["image_tokens"], rtol=0, atol=ATOL)
    # theirs (N_I, M, K, d_h); vlzoo's (N_I, K, M, d_h)
    np.testing.assert_allclose(numpy(image["keys"]), outputs["image_keys"].transpose(0, 2, 1, 3), rtol=0, atol=ATOL)
    # vlzoo's values are folded through W_O per head: U[i, k, m] = V[i, m, k] @ W_O[m * d_h:(m + 1) * d_h]
    heads, head_dim = outputs["image_values"].shape[1], outputs["image_values"].shape[3]
    out_proj = state_dict["pred.out_proj"].reshape(heads, head_dim, -1)
    folded = np.einsum("imkd,mde->ikme", outputs["image_values"], out_proj)
    np.testing.assert_allclose(numpy(image["values"]), folded, rtol=0, atol=ATOL)


def test_text_side_matches_the_authors(fixture, converted):
    _, _, inputs, outputs = fixture
    _, texts = vlzoo_inputs(inputs)
    text = converted.encode_text(texts)
    np.testing.assert_allclose(numpy(text["queries"]), outputs["text_queries"], rtol=0, atol=ATOL)
    np.testing.assert_allclose(numpy(text["embeds"]), outputs["text_embeds"], rtol=0, atol=ATOL)


def test_scores_match_the_authors(fixture, converted):
    _, _, inputs, outputs = fixture
    images, texts = vlzoo_inputs(inputs)
    np.testing.assert_allclose(
        numpy(converted.contextualize(images, texts)), outputs["contextualized"], rtol=0, atol=ATOL)
    assert_logits_match(converted, inputs, outputs)


def test_loss_matches_the_authors(fixture, converted):
    _, _, inputs, outputs = fixture
    images, texts = vlzoo_inputs(inputs)
    n = len(images)  # their CMPLoss needs a square batch: the first N_I captions
    batch = {"images": images, **{key: value[:n] for key, value in texts.items()}}
    loss = converted.contrastive_loss(converted(batch))
    np.testing.assert_allclose(float(numpy(loss)), float(outputs["loss"]), rtol=0, atol=ATOL)


def test_logit_scale_is_the_log_multiplier(fixture, converted):
    _, state_dict, _, _ = fixture
    assert float(numpy(converted.logit_scale)) == float(state_dict["logit_scale"])
    assert float(numpy(converted.logit_bias)) == float(state_dict["logit_bias"])


def test_keeps_the_presets_tokenizer_and_preprocessor(converted):
    preset = vlzoo.from_preset("llip_tiny", load_weights=False)
    assert type(converted.tokenizer) is type(preset.tokenizer)
    assert type(converted.preprocessor) is type(preset.preprocessor)
    assert converted.preprocessor.image_size == converted.vision.image_size


# ----------------------------------------------------------------------------- accepted forms

# How a checkpoint is read (files, key prefixes) is numpy; the converted model's numbers are checked
# on every backend above, so these run once.


@run_once
@pytest.mark.parametrize("prefix", ["_orig_mod.module.", "module._orig_mod.", "module.", ""])
def test_training_checkpoint_with_prefixes_and_alias(prefix):
    """As the authors' `save_checkpoint` writes it (their training compiles the DDP-wrapped model)."""
    config, state_dict, inputs, outputs = load("qkv_norm_off")
    renamed = {("out_proj" if key == "pred.out_proj" else key): value for key, value in state_dict.items()}
    checkpoint = {
        "epoch": 7, "epoch_step": 99, "name": "ViT-B-16", "optimizer": {"state": {}, "param_groups": []},
        "scaler": {"scale": 65536.0}, "state_dict": {prefix + key: value for key, value in renamed.items()},
    }
    assert_logits_match(from_llip_checkpoint(checkpoint, "llip_tiny", **overrides(config)), inputs, outputs)


@run_once
def test_torch_checkpoint_file(tmp_path):
    torch = pytest.importorskip("torch")
    config, state_dict, inputs, outputs = load("qkv_norm_on")
    path = tmp_path / "llip.pt"
    torch.save({"epoch": 1, "state_dict": {f"module.{k}": torch.from_numpy(v) for k, v in state_dict.items()}}, path)
    assert_logits_match(from_llip_checkpoint(path, "llip_tiny", **overrides(config)), inputs, outputs)
    assert_logits_match(from_llip_checkpoint(str(path), "llip_tiny", **overrides(config)), inputs, outputs)


@run_once
def test_safetensors_file(tmp_path):
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    config, state_dict, inputs, outputs = load("qkv_norm_off")
    path = tmp_path / "llip.safetensors"
    safetensors_numpy.save_file({k: np.ascontiguousarray(v) for k, v in state_dict.items()}, str(path))
    assert_logits_match(from_llip_checkpoint(path, "llip_tiny", **overrides(config)), inputs, outputs)


@run_once  # the command's wiring; the converted model is checked against the fixture on every backend above
def test_vlzoo_convert_command_writes_a_preset_with_the_authors_scores(tmp_path, capsys):
    """`vlzoo convert --from llip --preset DIR`: the saved preset scores as the authors' model."""
    from vlzoo import cli

    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    config, state_dict, inputs, outputs = load("qkv_norm_on")
    architecture = tmp_path / "architecture"
    vlzoo.from_preset("llip_tiny", load_weights=False, **overrides(config)).save_to_preset(str(architecture))
    checkpoint = tmp_path / "llip.safetensors"
    safetensors_numpy.save_file({k: np.ascontiguousarray(v) for k, v in state_dict.items()}, str(checkpoint))
    argv = ["convert", "--from", "llip", "--checkpoint", checkpoint, "--out", tmp_path / "converted", "--quiet"]
    assert cli.main([str(a) for a in argv]) == 2
    assert "--preset" in capsys.readouterr().err
    assert cli.main([str(a) for a in [*argv, "--preset", architecture]]) == 0
    assert "preset reload: identical similarities" in capsys.readouterr().out
    assert_logits_match(vlzoo.from_preset(str(tmp_path / "converted")), inputs, outputs)


@pytest.mark.parametrize("stored_shape", ["vector", "matrix"])
def test_single_mixture_token(stored_shape):
    """K = 1 (CLIP's layout; the authors' class cannot run it): `(W_v,)` and `(1, W_v)` class embeddings."""
    config, state_dict, _, _ = load("qkv_norm_off")
    k = config["cmp_arguments"]["vision_cfg"]["ncls"]
    single = dict(state_dict)
    token = state_dict["visual.class_embedding"][0]
    single["visual.class_embedding"] = token if stored_shape == "vector" else token[None]
    single["visual.positional_embedding"] = np.concatenate(
        [state_dict["visual.positional_embedding"][:1], state_dict["visual.positional_embedding"][k:]])
    single["k_proj"], single["v_proj"] = state_dict["k_proj"][:1], state_dict["v_proj"][:1]
    args = overrides(config)
    args["vision"]["num_prefix_tokens"] = 1
    model = from_llip_checkpoint(single, "llip_tiny", **args)
    np.testing.assert_array_equal(numpy(model.vision.prefix_tokens), token[None])
    np.testing.assert_array_equal(numpy(model.cross_attention.v_proj), state_dict["v_proj"][:1])


# ----------------------------------------------------------------------------- refusals


def convert(state_dict, variant="qkv_norm_off", **changes):
    config = load(variant)[0]
    args = overrides(config)
    for key, value in changes.items():
        args[key] = {**args[key], **value} if isinstance(value, dict) else value
    return from_llip_checkpoint(state_dict, "llip_tiny", **args)


def test_unknown_key_is_named():
    _, state_dict, _, _ = load("qkv_norm_off")
    with pytest.raises(KeyError, match="visual.proj"):
        convert({**state_dict, "visual.proj": np.zeros((32, 32), np.float32)})


@pytest.mark.parametrize("key", ["q_proj", "pred.out_proj", "visual.ln_pre.bias", "logit_bias"])
def test_missing_key_is_named(key):
    _, state_dict, _, _ = load("qkv_norm_off")
    with pytest.raises(KeyError, match=re.escape(key)):
        convert({k: v for k, v in state_dict.items() if k != key})


@pytest.mark.parametrize(
    "key, shape, expected",
    [("q_proj", (32, 16), (32, 32)), ("k_proj", (4, 32, 16), (4, 32, 32)), ("visual.ln_post.weight", (31,), (32,))],
)
def test_wrong_shape_names_key_and_shapes(key, shape, expected):
    _, state_dict, _, _ = load("qkv_norm_off")
    with pytest.raises(ValueError, match="(?s)" + ".*".join(re.escape(str(x)) for x in (key, expected, shape))):
        convert({**state_dict, key: np.zeros(shape, np.float32)})


def test_mixture_token_count_mismatch_names_key_shapes_and_preset():
    _, state_dict, _, _ = load("qkv_norm_off")
    with pytest.raises(ValueError, match=r"(?s)'llip_tiny'.*mixture tokens K: checkpoint 4 "
                                         r"\('visual\.class_embedding' \(4, 32\)\), preset 8"):
        convert(state_dict, vision=dict(num_prefix_tokens=8))


def test_layer_and_width_mismatches_are_all_named():
    _, state_dict, _, _ = load("qkv_norm_off")
    with pytest.raises(ValueError) as error:
        convert(state_dict, vision=dict(num_layers=3), text=dict(hidden_dim=64), embed_dim=16, num_heads=2)
    message = str(error.value)
    assert "vision layers: checkpoint 2" in message and "preset 3" in message
    assert "text width: checkpoint 32 ('token_embedding.weight' (512, 32)), preset 64" in message
    assert "embed dim D: checkpoint 32 ('text_projection' (32, 32)), preset 16" in message


@pytest.mark.parametrize(
    "variant, use_qkv_norm, found", [("qkv_norm_on", False, "present"), ("qkv_norm_off", True, "absent")])
def test_qkv_norm_mismatch_is_named(variant, use_qkv_norm, found):
    _, state_dict, _, _ = load(variant)
    with pytest.raises(ValueError, match=f"qkv_norm: checkpoint {not use_qkv_norm} \\('Q_norm.weight' {found}\\), "
                                         f"preset {use_qkv_norm}"):
        convert(state_dict, variant, use_qkv_norm=use_qkv_norm)


def test_both_names_of_the_output_matrix_are_refused():
    _, state_dict, _, _ = load("qkv_norm_off")
    with pytest.raises(KeyError, match="'out_proj' and 'pred.out_proj'"):
        convert({**state_dict, "out_proj": state_dict["pred.out_proj"]})


def test_non_llip_preset_is_refused():
    _, state_dict, _, _ = load("qkv_norm_off")
    with pytest.raises(ValueError, match="'clip_tiny' is a CLIP preset"):
        from_llip_checkpoint(state_dict, "clip_tiny")


def test_argument_type_is_checked():
    with pytest.raises(TypeError, match="path_or_state_dict"):
        from_llip_checkpoint(42, "llip_tiny")


# ----------------------------------------------------------------------------- released geometries


@pytest.mark.parametrize("preset", sorted(RELEASED))
def test_released_layouts_cover_the_presets_exactly(preset):
    """The authors' released layouts map onto the presets: every key, every variable, their parameter counts.

    Nothing is allocated: the model is built with deferred initialisation and
    the checkpoint is broadcast zeros of the authors' shapes (planned, not assigned).
    """
    cmp, count = RELEASED[preset]
    state_dict = {key: np.broadcast_to(np.float32(0), shape) for key, shape in authors_shapes(cmp).items()}
    assert sum(a.size for a in state_dict.values()) == count
    with without_weights():
        model = vlzoo.from_preset(preset, load_weights=False)
    _check_geometry(state_dict, model, preset)
    plan = C.plan_rules(_rules(model), state_dict, model)
    assert sorted(id(v) for v, *_ in plan) == sorted(id(v) for v in model.weights)
    assert sum(int(np.prod(v.shape)) for v in model.weights) == count


@pytest.mark.parametrize("preset, checkpoint", [("llip_vit_b16", "llip_b16_k32.pt"), ("llip_vit_g14", "llip_G14_k64.pt")])
def test_released_presets_say_where_the_weights_are_and_how_to_convert_them(preset, checkpoint):
    info = vlzoo.preset_info(preset)
    upstream = info["upstream_weights"]
    assert upstream["repository"] == "https://github.com/facebookresearch/Llip"
    assert upstream["checkpoint"] == checkpoint and not info["weights_available"]
    command = upstream["convert"].split()
    assert command[:2] == ["vlzoo", "convert"] and command[command.index("--preset") + 1] == preset
    assert command[command.index("--from") + 1] == "llip" and upstream["convert"] in info["weights_note"]
