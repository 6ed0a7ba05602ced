"""vlzoo.convert <-> open_clip: parity of converted models, exact round trips, named errors, tools/convert.py.

Peers are built offline with random weights (`open_clip.CLIP(...)`, `CustomTextCLIP`
with a tiny timm SigLIP tower registered here, `create_model("ViT-B-32", pretrained=None)`).
"""

import copy
import json
import time

import keras
import numpy as np
import pytest

import vlzoo
import vlzoo.convert as vc
from backend_utils import run_once

try:
    import peers
except ImportError:  # tests/ imported as a package
    from tests import peers

pytestmark = pytest.mark.peer

TIMM_TINY = "vit_vlzoo_tiny_siglip_32"

SMALL_VISION = dict(image_size=32, patch_size=8, width=32, layers=2, head_width=8)
SMALL_TEXT = dict(context_length=12, vocab_size=64, width=32, heads=4, layers=2)
CLIP_CONFIGS = {
    "openai_quickgelu": dict(embed_dim=16, quick_gelu=True, vision_cfg=SMALL_VISION, text_cfg=SMALL_TEXT),
    "gelu_avgpool_noln_projbias": dict(
        embed_dim=24,
        vision_cfg=dict(SMALL_VISION, pool_type="avg", no_ln_pre=True, mlp_ratio=2.0),
        text_cfg=dict(SMALL_TEXT, proj_bias=True),
    ),
    "tanh_bidirectional_last": dict(
        embed_dim=16,
        vision_cfg=dict(SMALL_VISION, act_kwargs={"approximate": "tanh"}, norm_kwargs={"eps": 1e-6}),
        text_cfg=dict(
            SMALL_TEXT, act_kwargs={"approximate": "tanh"}, norm_kwargs={"eps": 1e-6},
            no_causal_mask=True, pool_type="last",
        ),
    ),
}
SIGLIP_CONFIG = dict(
    embed_dim=32, init_logit_bias=-10, custom_text=True,
    vision_cfg=dict(image_size=32, timm_model_name=TIMM_TINY, timm_model_pretrained=False, timm_pool="map", timm_proj="none"),
    text_cfg=dict(
        context_length=12, vocab_size=64, width=32, heads=4, layers=2, mlp_ratio=2.0, no_causal_mask=True,
        proj_bias=True, pool_type="last", norm_kwargs={"eps": 1e-6},
    ),
)


# ----------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def open_clip():
    return peers.open_clip_or_skip()


@pytest.fixture(scope="module")
def torch(open_clip):
    import torch

    return torch


@pytest.fixture(scope="module")
def tiny_timm(open_clip):
    """Registers a tiny timm SigLIP ViT (MAP head, no class token) that open_clip can build by name."""
    import timm
    from timm.models import register_model
    from timm.models.vision_transformer import _create_vision_transformer

    if TIMM_TINY not in timm.list_models(TIMM_TINY):
        def vit_vlzoo_tiny_siglip_32(pretrained=False, **kwargs):
            args = dict(
                img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0,
                class_token=False, global_pool="map",
            )
            return _create_vision_transformer(TIMM_TINY, pretrained=pretrained, **dict(args, **kwargs))

        register_model(vit_vlzoo_tiny_siglip_32)
    return TIMM_TINY


def build_clip(open_clip, torch, config, seed=0):
    torch.manual_seed(seed)
    kwargs = {k: v for k, v in config.items() if k != "custom_text"}
    cls = open_clip.CustomTextCLIP if config.get("custom_text") else open_clip.CLIP
    return cls(**copy.deepcopy(kwargs)).eval()


def randomize_scale_bias(torch, peer, scale=2.9, bias=-4.0):
    with torch.no_grad():
        peer.logit_scale.fill_(scale)
        if getattr(peer, "logit_bias", None) is not None:
            peer.logit_bias.fill_(bias)


def open_clip_outputs(torch, peer, images, ids):
    with torch.no_grad():
        pixels = torch.from_numpy(images.transpose(0, 3, 1, 2).copy())
        image = peer.encode_image(pixels, normalize=True)
        text = peer.encode_text(torch.from_numpy(ids).long(), normalize=True)
        logits = peer.logit_scale.exp() * image @ text.T
        if getattr(peer, "logit_bias", None) is not None:
            logits = logits + peer.logit_bias
    return image.numpy(), text.numpy(), logits.numpy()


def assert_parity(torch, model, peer, label, batch=3):
    """`peers.assert_parity` against an open_clip model on `batch` random inputs."""
    images, texts = peers.parity_inputs(model, batch)
    outputs = open_clip_outputs(torch, peer, images, texts["token_ids"])
    return peers.assert_parity(model, images, texts, *outputs, f"open_clip {label}")


# ----------------------------------------------------------------------------- CLIP


@pytest.mark.parametrize("name", sorted(CLIP_CONFIGS))
def test_clip_small_parity(open_clip, torch, name):
    config = CLIP_CONFIGS[name]
    peer = build_clip(open_clip, torch, config)
    randomize_scale_bias(torch, peer)
    model = vc.from_open_clip(peer)
    assert isinstance(model, vlzoo.CLIP)
    assert_parity(torch, model, peer, f"CLIP {name} (module)")
    # The bare state dict + config path builds the same model.
    again = vc.from_open_clip_state_dict(peer.state_dict(), config)
    assert again.get_config()["vision"] == model.get_config()["vision"]
    assert again.get_config()["text"] == model.get_config()["text"]
    assert_parity(torch, again, peer, f"CLIP {name} (state dict)")


def test_clip_activation_and_pooling_mapping(open_clip, torch):
    quick = vc.from_open_clip(build_clip(open_clip, torch, CLIP_CONFIGS["openai_quickgelu"]))
    assert quick.vision.activation == quick.text.activation == "quick_gelu"
    tanh = vc.from_open_clip(build_clip(open_clip, torch, CLIP_CONFIGS["tanh_bidirectional_last"]))
    assert tanh.vision.activation == "gelu_tanh" and tanh.vision.layer_norm_epsilon == 1e-6
    assert tanh.text.causal is False and tanh.text.pooling == "last"
    avg = vc.from_open_clip(build_clip(open_clip, torch, CLIP_CONFIGS["gelu_avgpool_noln_projbias"]))
    assert avg.vision.pooling == "mean" and avg.vision.pre_norm is None and avg.text.projection_bias
    assert avg.vision.activation == "gelu"


def test_clip_vocabulary_gets_bundled_tokenizer_and_preprocessor(open_clip, torch):
    """A CLIP with CLIP's BPE vocabulary converts with vlzoo's tokenizer; ids agree with open_clip's."""
    config = dict(embed_dim=16, vision_cfg=SMALL_VISION, text_cfg=dict(SMALL_TEXT, vocab_size=49408, context_length=16))
    peer = build_clip(open_clip, torch, config)
    model = vc.from_open_clip(peer)
    captions = ["a photo of a cat", "a diagram of two red squares"]
    tokens = model.tokenizer(captions)
    assert tokens["token_ids"].shape == (2, 16)
    reference = open_clip.tokenize(captions, context_length=16).numpy()
    np.testing.assert_array_equal(tokens["token_ids"], reference)
    with torch.no_grad():
        expected = peer.encode_text(torch.from_numpy(reference).long(), normalize=True).numpy()
    got = keras.ops.convert_to_numpy(model.encode_text(captions, normalize=True)["embeds"])
    assert np.abs(got - expected).max() < peers.EMBED_TOL
    assert model.preprocessor.image_size == 32 and model.preprocessor.crop == "center"


def test_small_vocabulary_has_no_tokenizer(open_clip, torch):
    model = vc.from_open_clip(build_clip(open_clip, torch, CLIP_CONFIGS["openai_quickgelu"]))
    with pytest.raises(FileNotFoundError, match="not CLIP's BPE"):
        model.tokenizer(["a cat"])


# ----------------------------------------------------------------------------- SigLIP (timm tower)


@pytest.mark.parametrize("proj", ["none", "linear"])
def test_siglip_small_parity(open_clip, torch, tiny_timm, proj):
    config = copy.deepcopy(SIGLIP_CONFIG)
    config["vision_cfg"]["timm_proj"] = proj
    config["vision_cfg"]["timm_proj_bias"] = proj == "linear"
    peer = build_clip(open_clip, torch, config)
    randomize_scale_bias(torch, peer, scale=2.3, bias=-3.0)
    model = vc.from_open_clip(peer)
    assert isinstance(model, vlzoo.SigLIP)
    assert model.vision.pooling == "map" and model.vision.num_prefix_tokens == 0
    assert (model.vision.projection is not None) == (proj == "linear")
    assert model.text.causal is False and model.text.pooling == "last"
    assert model.preprocessor.mean == (0.5, 0.5, 0.5) and model.preprocessor.crop == "none"
    assert_parity(torch, model, peer, f"SigLIP timm_proj={proj} (module)")
    # A state dict does not show the timm tower's head count and activation: name them.
    again = vc.from_open_clip_state_dict(
        peer.state_dict(), config, vision_overrides=dict(num_heads=4, activation="gelu"),
    )
    assert_parity(torch, again, peer, f"SigLIP timm_proj={proj} (state dict)")


def test_siglip_unknown_timm_tower_needs_overrides(open_clip, torch, tiny_timm):
    peer = build_clip(open_clip, torch, SIGLIP_CONFIG)
    with pytest.raises(NotImplementedError, match="vision_overrides"):
        vc.from_open_clip_state_dict(peer.state_dict(), SIGLIP_CONFIG)


# ----------------------------------------------------------------------------- reverse direction


def _assert_same_state(torch, fresh, reference):
    ours, theirs = fresh.state_dict(), reference.state_dict()
    assert set(ours) == set(theirs)
    for key in theirs:
        assert torch.equal(ours[key], theirs[key]), key


@pytest.mark.parametrize("name", ["openai_quickgelu", "gelu_avgpool_noln_projbias"])
def test_clip_round_trip_is_exact(open_clip, torch, name):
    config = CLIP_CONFIGS[name]
    peer = build_clip(open_clip, torch, config, seed=0)
    model = vc.from_open_clip(peer)
    state = vc.to_open_clip_state_dict(model)
    assert all(isinstance(v, np.ndarray) for v in state.values())
    fresh = build_clip(open_clip, torch, vc.open_clip_config(model), seed=1)
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    _assert_same_state(torch, fresh, peer)
    images, texts = peers.parity_inputs(model)
    ids = texts["token_ids"]
    for a, b in zip(open_clip_outputs(torch, fresh, images, ids), open_clip_outputs(torch, peer, images, ids)):
        np.testing.assert_array_equal(a, b)


def test_siglip_round_trip_is_exact(open_clip, torch, tiny_timm):
    peer = build_clip(open_clip, torch, SIGLIP_CONFIG, seed=0)
    model = vc.from_open_clip(peer)
    state = vc.to_open_clip_state_dict(model)  # SigLIP: CustomTextCLIP layout (text.*)
    fresh = build_clip(open_clip, torch, SIGLIP_CONFIG, seed=1)
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    _assert_same_state(torch, fresh, peer)


def test_fine_tuned_weights_go_back_to_open_clip(open_clip, torch):
    """Change every vlzoo weight, export, load into open_clip: the two agree again."""
    model = vc.from_open_clip(build_clip(open_clip, torch, CLIP_CONFIGS["openai_quickgelu"]))
    rng = np.random.default_rng(3)
    for variable in model.weights:
        value = keras.ops.convert_to_numpy(variable)
        variable.assign(value + 0.01 * rng.normal(size=value.shape).astype(value.dtype))
    fresh = build_clip(open_clip, torch, vc.open_clip_config(model), seed=5)
    state = vc.to_open_clip_state_dict(model)
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True)
    assert_parity(torch, model, fresh, "fine-tuned vlzoo -> open_clip")
    # Custom-text layout of the same CLIP.
    custom = vc.to_open_clip_state_dict(model, custom_text=True)
    assert "text.token_embedding.weight" in custom and "token_embedding.weight" not in custom


# ----------------------------------------------------------------------------- named errors


def _state(open_clip, torch):
    config = CLIP_CONFIGS["openai_quickgelu"]
    return dict(build_clip(open_clip, torch, config).state_dict()), config


def test_unknown_key_is_named(open_clip, torch):
    state, config = _state(open_clip, torch)
    state["visual.extra_adapter.weight"] = torch.zeros(3)
    with pytest.raises(KeyError, match="visual.extra_adapter.weight"):
        vc.from_open_clip_state_dict(state, config)


def test_missing_key_is_named(open_clip, torch):
    state, config = _state(open_clip, torch)
    del state["transformer.resblocks.1.mlp.c_fc.bias"]
    with pytest.raises(KeyError, match=r"transformer\.resblocks\.1\.mlp\.c_fc\.bias"):
        vc.from_open_clip_state_dict(state, config)


def test_wrong_shape_is_named(open_clip, torch):
    state, config = _state(open_clip, torch)
    state["visual.conv1.weight"] = torch.zeros(32, 3, 4, 4)
    with pytest.raises(ValueError, match=r"visual\.conv1\.weight.*expected \(8, 8, 3, 32\), received \(4, 4, 3, 32\)"):
        vc.from_open_clip_state_dict(state, config)
    state, config = _state(open_clip, torch)
    state["text_projection"] = torch.zeros(32, 17)
    with pytest.raises(ValueError, match=r"text_projection.*expected \(32, 16\), received \(32, 17\)"):
        vc.from_open_clip_state_dict(state, config)


def test_config_mismatch_fails_without_partial_load(open_clip, torch):
    state, config = _state(open_clip, torch)
    config = copy.deepcopy(config)
    config["text_cfg"]["layers"] = 3  # the checkpoint has 2 text blocks
    with pytest.raises(KeyError, match=r"transformer\.resblocks\.2\.ln_1\.weight"):
        vc.from_open_clip_state_dict(state, config)


@pytest.mark.parametrize(
    "change, feature",
    [
        (dict(vision_cfg=dict(SMALL_VISION, attentional_pool=True)), "attentional_pool"),
        (dict(vision_cfg=dict(SMALL_VISION, ls_init_value=0.1)), "LayerScale"),
        (dict(text_cfg=dict(SMALL_TEXT, pool_type="eos")), "pool_type='eos'"),
        (dict(vision_cfg=dict(SMALL_VISION, qk_norm=True)), "qk_norm|block type"),
    ],
)
def test_unsupported_features_are_named(open_clip, torch, change, feature):
    config = {**CLIP_CONFIGS["openai_quickgelu"], **change}
    peer = build_clip(open_clip, torch, config)
    with pytest.raises(NotImplementedError, match=feature):
        vc.from_open_clip(peer)
    with pytest.raises(NotImplementedError, match=feature):
        vc.from_open_clip_state_dict(peer.state_dict(), config)


def test_resnet_tower_is_refused(open_clip, torch):
    config = dict(embed_dim=16, vision_cfg=dict(layers=[1, 1, 1, 1], width=8, image_size=64, head_width=8), text_cfg=SMALL_TEXT)
    with pytest.raises(NotImplementedError, match="ResNet"):
        vc.from_open_clip_state_dict({}, config)


# ----------------------------------------------------------------------------- tools/convert.py


@run_once  # the tool's wiring; the conversion's parity with open_clip is checked on every backend above
def test_tool_converts_a_local_checkpoint(open_clip, torch, tmp_path, capsys):
    config = CLIP_CONFIGS["gelu_avgpool_noln_projbias"]
    peer = build_clip(open_clip, torch, config)
    checkpoint = tmp_path / "tiny.pt"
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in peer.state_dict().items()}}, checkpoint)
    (tmp_path / "tiny.json").write_text(json.dumps(config))
    out = tmp_path / "preset"
    status = peers.load_convert_tool().main([
        "--from", "open_clip", "--checkpoint", str(checkpoint), "--config", str(tmp_path / "tiny.json"),
        "--out", str(out),
    ])
    printed = capsys.readouterr().out
    print(printed)
    assert status == 0
    assert "parity vs open_clip" in printed and "-> OK" in printed
    assert "preset reload: identical similarities" in printed
    model = vlzoo.from_preset(str(out))
    assert_parity(torch, model, peer, "tools/convert.py preset")


@run_once
def test_tool_safetensors_and_named_model_config(open_clip, torch, tmp_path, capsys):
    safetensors = pytest.importorskip("safetensors.torch")
    tool = peers.load_convert_tool()
    assert tool.open_clip_model_config("ViT-B-32")["vision_cfg"]["patch_size"] == 32
    with pytest.raises(ValueError, match="ViT-B-32"):
        tool.open_clip_model_config("ViT-B-33")
    config = CLIP_CONFIGS["openai_quickgelu"]
    peer = build_clip(open_clip, torch, config)
    checkpoint = tmp_path / "tiny.safetensors"
    safetensors.save_file({k: v.contiguous() for k, v in peer.state_dict().items()}, str(checkpoint))
    (tmp_path / "tiny.json").write_text(json.dumps(config))
    status = tool.main([
        "--from", "open_clip", "--checkpoint", str(checkpoint), "--config", str(tmp_path / "tiny.json"),
        "--out", str(tmp_path / "preset"), "--no-check",
    ])
    assert status == 0
    assert_parity(torch, vlzoo.from_preset(str(tmp_path / "preset")), peer, "tools/convert.py safetensors")


# ----------------------------------------------------------------------------- full size


@pytest.mark.slow
def test_vit_b32_full(open_clip, torch):
    start = time.time()
    torch.manual_seed(0)
    peer = open_clip.create_model("ViT-B-32", pretrained=None).eval()
    model = vc.from_open_clip(peer)
    assert model.vision.get_config()["hidden_dim"] == 768 and len(model.text.blocks) == 12
    assert model.vision.activation == "gelu"  # "ViT-B-32" is the GELU variant; "-quickgelu" maps to QuickGELU
    diffs = assert_parity(torch, model, peer, "ViT-B-32 (full size)", batch=2)
    tokens = model.tokenizer(["a photo of a dog"])
    np.testing.assert_array_equal(tokens["token_ids"], open_clip.tokenize(["a photo of a dog"]).numpy())
    print(f"[{keras.backend.backend()}] ViT-B-32 conversion + parity: {time.time() - start:.1f} s, {diffs}")
