"""PE-Core (`vlzoo.PECore`) against open_clip's `PE-Core-*` models, whose image towers are timm's rotary `Eva`.

Every public geometry is built in open_clip with random weights and two blocks per tower (the blocks of a tower
are alike, so the other 10 to 48 add nothing the parity could catch, only minutes), converted with
`vlzoo.convert.from_open_clip`, and compared on the active backend; the presets' full geometry is checked by
building open_clip's full models on PyTorch's meta device (no memory) and comparing their parameter counts.
"""

import copy
import re
import importlib

import keras
import numpy as np
import pytest

import vlzoo
import vlzoo.convert as vc
from backend_utils import run_once
from hub_server import HubServer
from test_convert_open_clip import open_clip, torch  # noqa: F401  (the peer's fixtures)
from test_hub import BPE, TEXTS, _directory_files, load_in_fresh_process
from vlzoo._backends.keras_internals import without_weights
from vlzoo.convert.checkpoints import import_transformers
from vlzoo.layers.rotary import rotary_angles_2d

try:
    import peers
except ImportError:  # tests/ imported as a package
    from tests import peers

pytestmark = pytest.mark.peer

# preset -> (open_clip model, timm image tower)
GEOMETRIES = {
    "pe_core_t16_384": ("PE-Core-T-16-384", "vit_pe_core_tiny_patch16_384"),
    "pe_core_s16_384": ("PE-Core-S-16-384", "vit_pe_core_small_patch16_384"),
    "pe_core_b16_224": ("PE-Core-B-16", "vit_pe_core_base_patch16_224"),
    "pe_core_l14_336": ("PE-Core-L-14-336", "vit_pe_core_large_patch14_336"),
    "pe_core_g14_448": ("PE-Core-bigG-14-448", "vit_pe_core_gigantic_patch14_448"),
}
DEPTH = 2  # blocks per tower in the parity models
LOGIT_SCALE = 2.9


def _shallow_tower(tower, image_size=None):
    """Registers (once) `tower` with `DEPTH` blocks under a new timm name, and returns that name; with
    `image_size`, for images of that size, its rotary positions those of their native grid."""
    import timm
    from timm.models import eva

    sizes = {}
    if image_size is not None:
        grid = image_size // int(re.search(r"patch(\d+)", tower).group(1))
        sizes = dict(img_size=image_size, ref_feat_shape=(grid, grid))
    name = f"{tower}_vlzoo_depth{DEPTH}" + (f"_{image_size}px" if sizes else "")
    if name not in timm.list_models(name):
        def build(pretrained=False, **kwargs):
            return getattr(eva, tower)(pretrained=False, depth=DEPTH, **sizes, **kwargs)

        build.__name__ = name
        timm.models.register_model(build)
    return name


def _config(open_clip, preset, image_size=None):
    """open_clip's config of `preset`'s model with `DEPTH` blocks per tower (and images of `image_size`)."""
    model_name, tower = GEOMETRIES[preset]
    config = copy.deepcopy(open_clip.get_model_config(model_name))
    config["vision_cfg"]["timm_model_name"] = _shallow_tower(tower, image_size)
    config["vision_cfg"]["image_size"] = image_size or config["vision_cfg"]["image_size"]
    config["text_cfg"]["layers"] = DEPTH
    return config


def _build(open_clip, torch, config, seed=0):
    """open_clip's `CustomTextCLIP` of `config`, every weight moved off its initial value (LayerNorms and biases
    included, which initialise to constants), logit scale 2.9."""
    torch.manual_seed(seed)
    model = open_clip.CustomTextCLIP(**{k: v for k, v in config.items() if k != "custom_text"}).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
        model.logit_scale.fill_(LOGIT_SCALE)
    return model


def _abstract(preset):
    """`preset` built without allocating its weights (G/14 would take 10 GB): for its configuration and counts."""
    with without_weights():
        return vlzoo.from_preset(preset, load_weights=False)


def _peer_outputs(torch, peer, images, ids):
    """open_clip's normalised embeddings, logits and patch features: timm's final tokens (after `norm`, read by a
    hook during `encode_image`, the tower's one pass) through the trunk's `head`, the linear map the attention
    pool feeds, without the class token."""
    trunk, final_tokens = peer.visual.trunk, []
    hook = trunk.norm.register_forward_hook(lambda module, inputs, output: final_tokens.append(output))
    with torch.no_grad():
        pixels = torch.from_numpy(images.transpose(0, 3, 1, 2).copy())
        try:
            image = peer.encode_image(pixels, normalize=True)
        finally:
            hook.remove()
        text = peer.encode_text(torch.from_numpy(ids).long(), normalize=True)
        (tokens,) = final_tokens
        patches = trunk.head(tokens[:, trunk.num_prefix_tokens:])
        return image.numpy(), text.numpy(), (peer.logit_scale.exp() * image @ text.T).numpy(), patches.numpy()


def test_rotary_angles_are_timms(open_clip, torch):
    """The sines and cosines of PE-T's 24 x 24 grid (head width 64, positions from 1) are timm's table."""
    import timm

    trunk = timm.create_model(_shallow_tower("vit_pe_core_tiny_patch16_384"), pretrained=False)
    sin, cos = trunk.rope.get_embed().double().numpy().reshape(576, 2, 64).transpose(1, 0, 2)
    angles = rotary_angles_2d((24, 24), 64, offset=1.0)
    np.testing.assert_allclose(np.sin(angles), sin, atol=4e-6)
    np.testing.assert_allclose(np.cos(angles), cos, atol=4e-6)
    assert angles[0, :2].tolist() == [1.0, 1.0] and angles[1, 0] == 2.0 and angles[24, 32] == 2.0  # (x, y) of patch 24


# Checked on every backend: the cheapest geometry, and G/14's tower without a class token and with its own
# pooling head's width (`num_prefix_tokens=0`, `map_intermediate_dim`), which no tiny preset sets.
@pytest.mark.parametrize("preset", peers.geometries(sorted(GEOMETRIES), ("pe_core_t16_384", "pe_core_g14_448")))
def test_parity_with_open_clip_at_every_geometry(open_clip, torch, preset):
    reference = _abstract(preset)
    image_size = peers.parity_image_size(reference.vision.image_size, reference.vision.patch_size)
    peer = _build(open_clip, torch, _config(open_clip, preset, image_size))
    model = vc.from_open_clip(peer)
    assert isinstance(model, vlzoo.PECore)
    for ours, theirs, sizes in ((model.vision, reference.vision, {"image_size": image_size}), (model.text, reference.text, {})):
        want = {**theirs.get_config(), "num_layers": DEPTH, **sizes}
        got = ours.get_config()
        assert {k: got[k] for k in want if k not in ("name", "dtype", "trainable")} == \
            {k: want[k] for k in want if k not in ("name", "dtype", "trainable")}
    images, texts = peers.parity_inputs(model, 2)
    want = _peer_outputs(torch, peer, images, texts["token_ids"])
    image, text, logits = peers.model_outputs(model, images, texts)
    got = (model.normalize_embeds(image)["embeds"], model.normalize_embeds(text)["embeds"], logits,
           model.dense_image_embeddings(images))
    assert tuple(got[3].shape) == want[3].shape == (2, (model.vision.image_size // model.vision.patch_size) ** 2,
                                                    model.embed_dim)
    errors = [peers.relative_error(got[0], want[0]), peers.relative_error(got[1], want[1]),
              float(np.max(np.abs(keras.ops.convert_to_numpy(got[2]) - want[2]))) / np.exp(LOGIT_SCALE),
              peers.relative_error(got[3], want[3])]
    print(f"[{keras.backend.backend()}] {preset}: relative errors image {errors[0]:.1e}, text {errors[1]:.1e}, "
          f"logits {errors[2]:.1e}, patches {errors[3]:.1e}")
    assert max(errors) < peers.RELATIVE, errors


@run_once  # counts parameters on PyTorch's meta device: no backend numerics
@pytest.mark.parametrize("preset", sorted(GEOMETRIES))
def test_presets_have_open_clips_full_geometry(open_clip, torch, preset):
    config = copy.deepcopy(open_clip.get_model_config(GEOMETRIES[preset][0]))
    with torch.device("meta"):
        peer = open_clip.CustomTextCLIP(**{k: v for k, v in config.items() if k != "custom_text"})
    info = vlzoo.preset_info(preset)
    assert info["params"] == sum(p.numel() for p in peer.parameters())
    reference = _abstract(preset)
    assert reference.vision.num_layers == len(peer.visual.trunk.blocks)
    assert reference.text.num_layers == len(peer.text.transformer.resblocks)


def test_state_dict_round_trip_is_exact(open_clip, torch):
    config = _config(open_clip, "pe_core_t16_384")
    peer = _build(open_clip, torch, config, seed=1)
    model = vc.from_open_clip(peer)
    state = vc.to_open_clip_state_dict(model)
    fresh = _build(open_clip, torch, config, seed=2)
    fresh.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()}, strict=True)
    theirs = peer.state_dict()
    assert set(fresh.state_dict()) == set(theirs)
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, theirs[key]), key
    again = vc.from_open_clip_state_dict(state, config | {"vision_cfg": {
        **config["vision_cfg"], "timm_model_name": GEOMETRIES["pe_core_t16_384"][1]}})
    for a, b in zip(model.weights, again.weights):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b), err_msg=a.path)


def test_rotary_towers_refuse_what_they_cannot_compute():
    from vlzoo.layers.vision import VisionTransformer

    with pytest.raises(ValueError, match="divisible by 4"):
        VisionTransformer(32, 8, 24, 1, 4, 48, rotary_theta=10000.0)  # head width 6
    model = vlzoo.from_preset("pe_core_tiny")
    patches = {"patches": np.zeros((1, 16, 192), "float32"), "patch_mask": np.ones((1, 16), bool),
               "spatial_shapes": np.array([[4, 4]], "int32")}
    with pytest.raises(ValueError, match="patch batch"):
        model.encode_image(patches)


@run_once  # the download and the reading of open_clip's config do not depend on the backend (the parity test's do)
def test_a_repository_written_by_open_clip_loads_by_handle_and_by_name(open_clip, torch, tmp_path):
    """What open_clip's `save_for_hf` writes for PE-Core T/16 (two blocks per tower: the config names timm's tower,
    vlzoo reads the depth from the weights), served as `timm/PE-Core-T-16-384`: the handle and the pretrained name
    that points there load it in a fresh process and give open_clip's embeddings."""
    config = _config(open_clip, "pe_core_t16_384")
    peer = _build(open_clip, torch, config)
    written = copy.deepcopy(config)
    written["vision_cfg"]["timm_model_name"] = GEOMETRIES["pe_core_t16_384"][1]
    # What `create_model(..., pretrained="meta")` sets from open_clip's pretrained config, and the hub config keeps.
    peer.visual.image_mean = peer.visual.image_std = (0.5, 0.5, 0.5)
    peer.visual.preprocess_cfg = {"interpolation": "bilinear", "resize_mode": "squash"}
    tokenizer = import_transformers().CLIPTokenizer(str(BPE / "vocabulary.json"), str(BPE / "merges.txt"))
    importlib.import_module("open_clip.push_to_hf_hub").save_for_hf(
        peer, tokenizer, written, tmp_path / "repo", safe_serialization=True)
    rng = np.random.default_rng(0)
    inputs = {"images": rng.normal(size=(2, 384, 384, 3)).astype("float32"),
              "token_ids": np.full((2, 32), 49407, "int32"), "padding_mask": np.ones((2, 32), bool)}
    np.savez(tmp_path / "inputs.npz", **inputs)
    with HubServer({"timm/PE-Core-T-16-384": _directory_files(tmp_path / "repo")}) as running:
        results = load_in_fresh_process(tmp_path, running.endpoint, "hf://timm/PE-Core-T-16-384",
                                        "pe_core_t16_384_meta", inputs=tmp_path / "inputs.npz")
    for result in results:
        assert result.get("class") == "PECore", result
        image, text, _, _ = _peer_outputs(torch, peer, inputs["images"], np.asarray(result["ids"]))
        assert peers.relative_error(result["images"], image) < peers.RELATIVE
        assert peers.relative_error(result["texts"], text) < peers.RELATIVE
        assert result["preprocessor"]["mean"] == [0.5] * 3 and result["preprocessor"]["crop"] == "none"
    assert results[0]["weights"] == results[1]["weights"]
