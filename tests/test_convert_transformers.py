"""vlzoo.convert <-> Hugging Face transformers: CLIPModel and SiglipModel built offline from configs.

Text inputs end with the end token, which is also the largest id (`eos_token_id =
vocab_size - 1`), so transformers' CLIP pooling (first end token) and vlzoo's (argmax) agree.
"""

import json
import math
import warnings

import pytest

import vlzoo
import vlzoo.convert as vc
from vlzoo.convert.checkpoints import import_transformers

from backend_utils import run_once

try:
    import peers
except ImportError:  # tests/ imported as a package
    from tests import peers

pytestmark = pytest.mark.peer

VOCAB, LENGTH, SIZE = 64, 12, 32


@pytest.fixture(scope="module")
def hf():
    try:
        transformers = import_transformers()  # torchvision (which transformers imports) made importable first
        from transformers import CLIPModel  # noqa: F401  (fails if the torch side cannot load)
    except (ImportError, RuntimeError) as error:
        pytest.skip(f"transformers is not importable here: {error}")
    transformers.logging.set_verbosity_error()
    return transformers


@pytest.fixture(scope="module")
def torch(hf):
    import torch

    return torch


def _text(act, **extra):
    return dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=LENGTH, hidden_act=act, eos_token_id=VOCAB - 1, bos_token_id=VOCAB - 2,
        pad_token_id=0, **extra,
    )


def _vision(act, **extra):
    return dict(
        image_size=SIZE, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, hidden_act=act, **extra,
    )


def build_clip(hf, torch, act="quick_gelu", seed=0, **config):
    torch.manual_seed(seed)
    cfg = hf.CLIPConfig(text_config=_text(act), vision_config=_vision(act), projection_dim=16, **config)
    model = hf.CLIPModel(cfg).eval()
    with torch.no_grad():
        model.logit_scale.fill_(math.log(20.0))
    return model


def build_siglip(hf, torch, seed=0, vision_act="gelu_pytorch_tanh", text_act="gelu_pytorch_tanh"):
    torch.manual_seed(seed)
    cfg = hf.SiglipConfig(
        text_config=_text(text_act, projection_size=32, layer_norm_eps=1e-6),
        vision_config=_vision(vision_act, layer_norm_eps=1e-6),
    )
    model = hf.SiglipModel(cfg).eval()
    with torch.no_grad():  # transformers initialises both to 0
        model.logit_scale.fill_(math.log(10.0))
        model.logit_bias.fill_(-3.0)
    return model


def assert_parity(torch, model, peer, label):
    """`peers.assert_parity` against a transformers CLIPModel/SiglipModel (ids below eos: see above)."""
    images, texts = peers.parity_inputs(model)
    with torch.no_grad():
        out = peer(
            input_ids=torch.from_numpy(texts["token_ids"]).long(),
            pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2).copy()),
        )
    return peers.assert_parity(
        model, images, texts, out.image_embeds.numpy(), out.text_embeds.numpy(), out.logits_per_image.numpy(),
        f"transformers {label}",
    )


# ----------------------------------------------------------------------------- CLIP


@pytest.mark.parametrize("act, ours", [("quick_gelu", "quick_gelu"), ("gelu", "gelu"), ("gelu_pytorch_tanh", "gelu_tanh")])
def test_clip_parity(hf, torch, act, ours):
    peer = build_clip(hf, torch, act)
    model = vc.from_transformers(peer)
    assert isinstance(model, vlzoo.CLIP)
    assert model.vision.activation == model.text.activation == ours
    assert_parity(torch, model, peer, f"CLIPModel hidden_act={act}")


def test_clip_from_config_json_dict(hf, torch):
    """The state dict + config.json path (what tools/convert.py reads from disk)."""
    peer = build_clip(hf, torch, "quick_gelu")
    config = json.loads(peer.config.to_json_string())
    model = vc.from_transformers_state_dict(peer.state_dict(), config)
    assert_parity(torch, model, peer, "CLIPModel (state dict + config.json)")
    assert model.preprocessor.image_size == SIZE


def test_clip_legacy_eos_and_warning(hf, torch):
    peer = build_clip(hf, torch)
    config = peer.config.to_dict()
    config["text_config"]["eos_token_id"] = 2  # legacy configs: transformers pools at argmax, like vlzoo
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        vc.from_transformers_state_dict(peer.state_dict(), config)
    config["text_config"]["eos_token_id"] = 5
    with pytest.warns(UserWarning, match="eos_token_id=5"):
        vc.from_transformers_state_dict(peer.state_dict(), config)


# ----------------------------------------------------------------------------- SigLIP


@pytest.mark.parametrize("vision_act, text_act", [("gelu_pytorch_tanh", "gelu_pytorch_tanh"), ("gelu", "quick_gelu")])
def test_siglip_parity(hf, torch, vision_act, text_act):
    peer = build_siglip(hf, torch, vision_act=vision_act, text_act=text_act)
    model = vc.from_transformers(peer)
    assert isinstance(model, vlzoo.SigLIP)
    assert model.vision.pooling == "map" and model.vision.projection is None
    assert model.text.pooling == "last" and not model.text.causal and model.text.projection_bias
    assert model.vision.layer_norm_epsilon == 1e-6
    assert_parity(torch, model, peer, f"SiglipModel vision={vision_act} text={text_act}")
    assert model.preprocessor.crop == "none" and model.preprocessor.mean == (0.5, 0.5, 0.5)
    with pytest.raises(FileNotFoundError, match="SentencePiece"):
        model.tokenizer(["a cat"])


def test_siglip_logit_scale_above_the_training_bound_scores_exactly(hf, torch):
    peer = build_siglip(hf, torch)
    with torch.no_grad():
        peer.logit_scale.fill_(math.log(117.0))  # trained SigLIP checkpoints exceed open_clip's ln(100) bound
    with pytest.warns(UserWarning, match="training bound"):
        model = vc.from_transformers(peer)
    # The forward pass never clamps, so the logits (scale 117) still match the peer.
    assert_parity(torch, model, peer, "SiglipModel, logit scale 117")


# ----------------------------------------------------------------------------- named errors


def test_unknown_missing_and_misshaped_keys_are_named(hf, torch):
    peer = build_clip(hf, torch)
    config = peer.config
    state = dict(peer.state_dict())
    state["vision_model.adapter.weight"] = torch.zeros(2)
    with pytest.raises(KeyError, match=r"vision_model\.adapter\.weight"):
        vc.from_transformers_state_dict(state, config)
    state = dict(peer.state_dict())
    del state["text_model.encoder.layers.1.self_attn.v_proj.bias"]
    with pytest.raises(KeyError, match=r"text_model\.encoder\.layers\.1\.self_attn\.v_proj\.bias"):
        vc.from_transformers_state_dict(state, config)
    state = dict(peer.state_dict())
    state["visual_projection.weight"] = torch.zeros(8, 32)
    with pytest.raises(ValueError, match=r"visual_projection\.weight.*expected \(32, 16\), received \(32, 8\)"):
        vc.from_transformers_state_dict(state, config)


def test_unsupported_models_are_named(hf, torch):
    peer = build_siglip(hf, torch)
    config = peer.config.to_dict()
    config["vision_config"]["vision_use_head"] = False
    with pytest.raises(NotImplementedError, match="vision_use_head"):
        vc.from_transformers_state_dict(peer.state_dict(), config)
    with pytest.raises(NotImplementedError, match="'blip'.*'siglip2'"):
        vc.from_transformers_state_dict({}, {"model_type": "blip"})
    with pytest.raises(NotImplementedError, match="CLIPVisionModel"):
        vc.from_transformers(hf.CLIPVisionModel(hf.CLIPVisionConfig(**_vision("quick_gelu"))))
    bad = build_clip(hf, torch).config.to_dict()
    bad["vision_config"]["hidden_act"] = "silu"
    with pytest.raises(NotImplementedError, match="silu"):
        vc.from_transformers_state_dict(build_clip(hf, torch).state_dict(), bad)


def test_a_registered_model_type_converts_as_its_spec_says(hf, torch):
    # A family published for transformers registers its `model_type` beside its model, as a third party
    # would (MetaCLIP 2's `MetaClip2Model` is CLIP's geometry under its own type): here CLIP's spec under a
    # new type and class name, which must convert to the peer's numbers and be accepted by class name.
    from vlzoo.convert import converters, repository_tokenizers
    from vlzoo.convert.transformers import register_model_type

    clip = converters.architecture("transformers", "clip")
    register_model_type("clip_under_another_name", clip.spec, ("AnotherCLIPModel",),
                        repository_tokenizers.clip_bpe_tokenizer)
    assert converters.architectures("transformers")[-1] == "clip_under_another_name"
    peer = build_clip(hf, torch, seed=3)
    config = {**peer.config.to_dict(), "model_type": "clip_under_another_name"}
    assert_parity(torch, vc.from_transformers_state_dict(peer.state_dict(), config), peer, "registered model type")
    renamed = type("AnotherCLIPModel", (), {"state_dict": peer.state_dict, "config": config})()
    assert_parity(torch, vc.from_transformers(renamed), peer, "registered model class")
    with pytest.raises(ValueError, match="carry their configuration"):
        converters.register_architecture("llip", "x", clip.spec)


# ----------------------------------------------------------------------------- tools/convert.py


@run_once  # the tool's wiring; the conversions' parity with transformers is checked on every backend above
@pytest.mark.parametrize("family", ["clip", "siglip"])
def test_tool_converts_a_local_transformers_directory(hf, torch, tmp_path, capsys, family):
    peer = build_clip(hf, torch) if family == "clip" else build_siglip(hf, torch)
    directory = tmp_path / "hf_model"
    peer.save_pretrained(str(directory))  # config.json + model.safetensors, offline
    out = tmp_path / "preset"
    status = peers.load_convert_tool().main(["--from", "transformers", "--checkpoint", str(directory), "--out", str(out)])
    printed = capsys.readouterr().out
    print(printed)
    assert status == 0
    assert "parity vs transformers" in printed and "-> OK" in printed
    assert_parity(torch, vlzoo.from_preset(str(out)), peer, f"tools/convert.py {family} preset")
