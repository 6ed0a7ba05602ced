"""vlzoo.convert <-> keras-hub: CLIPBackbone and SigLIPBackbone built from constructor arguments.

The peer runs on the same Keras backend as vlzoo.
"""

import keras
import numpy as np
import pytest

import vlzoo
import vlzoo.convert as vc

pytestmark = pytest.mark.peer

EMBED_TOL, LOGIT_TOL = 1e-4, 1e-3
VOCAB, LENGTH, SIZE = 64, 12, 32


@pytest.fixture(scope="module")
def keras_hub():
    return pytest.importorskip("keras_hub")


def build_clip(keras_hub, activation="quick_gelu", arange_positions=True):
    keras.utils.set_random_seed(0)
    vision = keras_hub.models.CLIPVisionEncoder(
        patch_size=8, hidden_dim=32, num_layers=2, num_heads=4, intermediate_dim=64,
        intermediate_activation=activation, image_shape=(SIZE, SIZE, 3),
    )
    text = keras_hub.models.CLIPTextEncoder(
        vocabulary_size=VOCAB, embedding_dim=32, hidden_dim=32, num_layers=2, num_heads=4,
        intermediate_dim=64, intermediate_activation=activation, max_sequence_length=LENGTH,
    )
    backbone = keras_hub.models.CLIPBackbone(vision, text, projection_dim=16)
    if arange_positions:  # what keras-hub's presets hold; a fresh CLIPVisionEncoder holds zeros
        ids = vision.embedding.position_ids
        ids.assign(np.arange(ids.shape[1])[None].astype(keras.backend.standardize_dtype(ids.dtype)))
    return backbone


def build_siglip(keras_hub, activation="gelu_approximate"):
    keras.utils.set_random_seed(0)
    vision = keras_hub.models.SigLIPVisionEncoder(
        patch_size=8, hidden_dim=32, num_layers=2, num_heads=4, intermediate_dim=64,
        intermediate_activation=activation, image_shape=(SIZE, SIZE, 3),
    )
    text = keras_hub.models.SigLIPTextEncoder(
        vocabulary_size=VOCAB, embedding_dim=32, hidden_dim=32, num_layers=2, num_heads=4,
        intermediate_dim=64, intermediate_activation=activation, max_sequence_length=LENGTH, projection_dim=32,
    )
    backbone = keras_hub.models.SigLIPBackbone(vision, text)
    backbone.siglip_head.logit_scale.assign(np.log(10.0))
    backbone.siglip_head.logit_bias.assign(-3.0)
    return backbone


def inputs(batch=3, seed=0):
    rng = np.random.default_rng(seed)
    images = rng.normal(size=(batch, SIZE, SIZE, 3)).astype("float32")
    ids = np.zeros((batch, LENGTH), "int32")
    mask = np.zeros((batch, LENGTH), bool)
    for i in range(batch):
        n = int(rng.integers(2, LENGTH + 1))
        ids[i, :n] = rng.integers(1, VOCAB - 1, size=n)
        ids[i, n - 1] = VOCAB - 1
        mask[i, :n] = True
    return images, ids, mask


def _normalize(x):
    x = keras.ops.convert_to_numpy(x).astype("float64")
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def assert_parity(model, backbone, label):
    images, ids, mask = inputs()
    p_image = _normalize(backbone.get_vision_embeddings(images))
    p_text = _normalize(backbone.get_text_embeddings(ids))
    p_logits = keras.ops.convert_to_numpy(backbone({"images": images, "token_ids": ids})["vision_logits"])
    texts = {"token_ids": ids, "padding_mask": mask}
    image = keras.ops.convert_to_numpy(model.encode_image(images, normalize=True))
    text = keras.ops.convert_to_numpy(model.encode_text(texts, normalize=True))
    logits = keras.ops.convert_to_numpy(model.similarity(images, texts))
    diffs = {
        "image": float(np.abs(image - p_image).max()),
        "text": float(np.abs(text - p_text).max()),
        "logits": float(np.abs(logits - p_logits).max()),
    }
    print(f"[{keras.backend.backend()}] keras-hub {label}: max abs diff {diffs}")
    assert diffs["image"] < EMBED_TOL and diffs["text"] < EMBED_TOL, diffs
    assert diffs["logits"] < LOGIT_TOL, diffs
    return diffs


@pytest.mark.parametrize("activation, ours", [("quick_gelu", "quick_gelu"), ("gelu", "gelu")])
def test_clip_parity(keras_hub, activation, ours):
    backbone = build_clip(keras_hub, activation)
    model = vc.from_keras_hub(backbone)
    assert isinstance(model, vlzoo.CLIP)
    assert model.vision.activation == ours and model.text.activation == ours
    # keras-hub's CLIP text encoder ends with LayerNorm epsilon 1e-6, its blocks use 1e-5;
    # vlzoo uses the blocks' value throughout (the difference is measured here).
    assert model.text.layer_norm_epsilon == 1e-5
    assert_parity(model, backbone, f"CLIPBackbone {activation}")


def test_clip_position_ids_are_honoured(keras_hub):
    """A freshly built keras-hub CLIPVisionEncoder looks every patch up at position 0: converted as is."""
    backbone = build_clip(keras_hub, arange_positions=False)
    model = vc.from_keras_hub(backbone)
    table = keras.ops.convert_to_numpy(model.vision.position_embedding.embeddings)
    np.testing.assert_array_equal(table, np.broadcast_to(table[:1], table.shape))
    assert_parity(model, backbone, "CLIPBackbone (position_ids all zero)")


@pytest.mark.parametrize("activation, ours", [("gelu_approximate", "gelu_tanh"), ("gelu", "gelu")])
def test_siglip_parity(keras_hub, activation, ours):
    backbone = build_siglip(keras_hub, activation)
    model = vc.from_keras_hub(backbone)
    assert isinstance(model, vlzoo.SigLIP)
    assert model.vision.activation == ours and model.vision.pooling == "map"
    assert model.text.pooling == "last" and not model.text.causal
    assert_parity(model, backbone, f"SigLIPBackbone {activation}")


def test_unknown_variable_is_named(keras_hub):
    backbone = build_siglip(keras_hub)
    layer = backbone.vision_encoder.post_layer_norm
    layer._tracker.unlock()  # graft an extra weight onto the built backbone
    layer.add_weight(shape=(3,), name="adapter_scale")
    layer._tracker.lock()
    assert any("adapter_scale" in v.path for v in backbone.weights)
    with pytest.raises(KeyError, match="adapter_scale"):
        vc.from_keras_hub(backbone)


def test_unsupported_backbone_and_activation_are_named(keras_hub):
    with pytest.raises(NotImplementedError, match="CLIPVisionEncoder"):
        vc.from_keras_hub(
            keras_hub.models.CLIPVisionEncoder(
                patch_size=8, hidden_dim=32, num_layers=1, num_heads=4, intermediate_dim=64, image_shape=(SIZE, SIZE, 3),
            )
        )
    backbone = build_clip(keras_hub, activation="relu")
    with pytest.raises(NotImplementedError, match="relu"):
        vc.from_keras_hub(backbone)


def test_round_trip_through_preset(keras_hub, tmp_path):
    model = vc.from_keras_hub(build_clip(keras_hub))
    model.save_to_preset(str(tmp_path / "preset"))
    again = vlzoo.from_preset(str(tmp_path / "preset"))
    images, ids, mask = inputs()
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(again.encode_image(images)), keras.ops.convert_to_numpy(model.encode_image(images))
    )


def test_tool_converts_a_local_keras_hub_preset(keras_hub, tmp_path, capsys):
    import importlib.util
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("vlzoo_tools_convert", os.path.join(root, "tools", "convert.py"))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    backbone = build_siglip(keras_hub)
    backbone.save_to_preset(str(tmp_path / "keras_hub_preset"))  # a local keras-hub preset, offline
    out = tmp_path / "preset"
    status = tool.main(["--source", "keras_hub", "--checkpoint", str(tmp_path / "keras_hub_preset"), "--out", str(out)])
    printed = capsys.readouterr().out
    print(printed)
    assert status == 0 and "parity vs keras-hub" in printed and "-> OK" in printed
    assert_parity(vlzoo.from_preset(str(out)), backbone, "tools/convert.py SigLIP preset")
