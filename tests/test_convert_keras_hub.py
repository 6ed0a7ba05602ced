"""vlzoo.convert <-> keras-hub: CLIPBackbone and SigLIPBackbone built from constructor arguments.

The peer runs on the same Keras backend as vlzoo.
"""

import keras
import numpy as np
import pytest
from backend_utils import run_once

import vlzoo
import vlzoo.convert as vc

try:
    import peers
except ImportError:  # tests/ imported as a package
    from tests import peers

pytestmark = pytest.mark.peer

VOCAB, LENGTH, SIZE = 64, 12, 32
TOWER = dict(hidden_dim=32, num_layers=2, num_heads=4, intermediate_dim=64)


@pytest.fixture(scope="module")
def keras_hub():
    return pytest.importorskip("keras_hub")


def build_towers(vision_cls, text_cls, activation, **text_args):
    """A tiny vision and text encoder of one keras-hub family, seeded."""
    keras.utils.set_random_seed(0)
    vision = vision_cls(patch_size=8, intermediate_activation=activation, image_shape=(SIZE, SIZE, 3), **TOWER)
    text = text_cls(
        vocabulary_size=VOCAB, embedding_dim=32, intermediate_activation=activation, max_sequence_length=LENGTH,
        **TOWER, **text_args,
    )
    return vision, text


def build_clip(keras_hub, activation="quick_gelu", arange_positions=True):
    models = keras_hub.models
    vision, text = build_towers(models.CLIPVisionEncoder, models.CLIPTextEncoder, activation)
    backbone = models.CLIPBackbone(vision, text, projection_dim=16)
    if arange_positions:  # what keras-hub's presets hold; a fresh CLIPVisionEncoder holds zeros
        ids = vision.embedding.position_ids
        ids.assign(np.arange(ids.shape[1])[None].astype(keras.backend.standardize_dtype(ids.dtype)))
    return backbone


def build_siglip(keras_hub, activation="gelu_approximate"):
    models = keras_hub.models
    vision, text = build_towers(models.SigLIPVisionEncoder, models.SigLIPTextEncoder, activation, projection_dim=32)
    backbone = models.SigLIPBackbone(vision, text)
    backbone.siglip_head.logit_scale.assign(np.log(10.0))
    backbone.siglip_head.logit_bias.assign(-3.0)
    return backbone


def assert_parity(model, backbone, label):
    """`peers.assert_parity` against a keras-hub backbone (unnormalised embeddings, normalised there)."""
    images, texts = peers.parity_inputs(model)
    ids = texts["token_ids"]
    return peers.assert_parity(
        model, images, texts,
        backbone.get_vision_embeddings(images), backbone.get_text_embeddings(ids),
        backbone({"images": images, "token_ids": ids})["vision_logits"],
        f"keras-hub {label}",
    )


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


def test_a_size_that_is_no_multiple_of_the_patch_is_trimmed_to_the_pixels_read(keras_hub):
    # keras-hub's SigLIP 2 So400m/14 at 384 px reads 27 patches of 14 (378 px) per side: the converted tower
    # is built at 378 px and gives keras-hub's embeddings of the full images from the pixels they read.
    models = keras_hub.models
    keras.utils.set_random_seed(0)
    vision = models.SigLIPVisionEncoder(patch_size=8, intermediate_activation="gelu_approximate",
                                        image_shape=(SIZE + 5, SIZE + 5, 3), **TOWER)
    _, text = build_towers(models.SigLIPVisionEncoder, models.SigLIPTextEncoder, "gelu_approximate",
                           projection_dim=32)
    backbone = models.SigLIPBackbone(vision, text)
    model = vc.from_keras_hub(backbone)
    assert model.vision.image_size == SIZE
    images = np.random.default_rng(0).normal(size=(2, SIZE + 5, SIZE + 5, 3)).astype("float32")
    want = keras.ops.convert_to_numpy(backbone.get_vision_embeddings(images))
    got = keras.ops.convert_to_numpy(model.encode_image(images[:, :SIZE, :SIZE])["embeds"])
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


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
            keras_hub.models.CLIPVisionEncoder(patch_size=8, image_shape=(SIZE, SIZE, 3), **dict(TOWER, num_layers=1))
        )
    backbone = build_clip(keras_hub, activation="relu")
    with pytest.raises(NotImplementedError, match="relu"):
        vc.from_keras_hub(backbone)


def test_round_trip_through_preset(keras_hub, tmp_path):
    model = vc.from_keras_hub(build_clip(keras_hub))
    model.save_to_preset(str(tmp_path / "preset"))
    again = vlzoo.from_preset(str(tmp_path / "preset"))
    images, _ = peers.parity_inputs(model)
    np.testing.assert_array_equal(
        keras.ops.convert_to_numpy(again.encode_image(images)["embeds"]),
        keras.ops.convert_to_numpy(model.encode_image(images)["embeds"]),
    )


@run_once  # the tool's wiring; the conversion's parity with keras-hub is checked on every backend above
def test_tool_converts_a_local_keras_hub_preset(keras_hub, tmp_path, capsys):
    tool = peers.load_convert_tool()
    backbone = build_siglip(keras_hub)
    backbone.save_to_preset(str(tmp_path / "keras_hub_preset"))  # a local keras-hub preset, offline
    out = tmp_path / "preset"
    status = tool.main(["--from", "keras_hub", "--checkpoint", str(tmp_path / "keras_hub_preset"), "--out", str(out)])
    printed = capsys.readouterr().out
    print(printed)
    assert status == 0 and "parity vs keras-hub" in printed and "-> OK" in printed
    assert_parity(vlzoo.from_preset(str(out)), backbone, "tools/convert.py SigLIP preset")


@run_once
def test_siglip2_presets_tokenize_with_their_gemma_vocabulary(keras_hub, tmp_path):
    """A keras-hub SigLIP 2 preset names a `GemmaTokenizer` (`<eos>` 1 ends, `<pad>` 0 pads) and, as keras-hub's
    published presets, saves no `preprocessor.json`: vlzoo's tokenizer from its files gives the ids of keras-hub's
    `SigLIPPreprocessor` on the same vocabulary (its defaults: lowercased, punctuation removed, no start
    token, sequence length 64, here 12)."""
    sentencepiece = pytest.importorskip("sentencepiece")
    from vlzoo.convert.repository import keras_hub_tokenizer

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"a photo of a {c} {s} next to two dogs and a cat"
                                for c in ("red", "blue", "green") for s in ("circle", "square", "bird")) * 20)
    sentencepiece.SentencePieceTrainer.train(  # Gemma's special pieces and ids
        input=str(corpus), model_prefix=str(tmp_path / "gemma"), vocab_size=64, pad_id=0, eos_id=1, bos_id=2,
        unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
        hard_vocab_limit=False, minloglevel=2)
    preset = tmp_path / "siglip2"
    keras_hub.models.GemmaTokenizer(proto=str(tmp_path / "gemma.model")).save_to_preset(str(preset))
    texts = ["A photo of a RED circle!", "two dogs, and a cat next to a blue bird", "", "green " * 20]
    ours = keras_hub_tokenizer(preset, 12)
    theirs = keras_hub.models.SigLIPPreprocessor(
        keras_hub.models.GemmaTokenizer(proto=str(tmp_path / "gemma.model")), sequence_length=12,
        image_converter=keras_hub.layers.SigLIPImageConverter(image_size=(8, 8)))
    out = theirs({"prompts": texts, "images": np.zeros((len(texts), 8, 8, 3), "float32")})
    want = {key: keras.ops.convert_to_numpy(out[key]) for key in ("token_ids", "padding_mask")}
    got = ours(texts)
    np.testing.assert_array_equal(np.asarray(got["token_ids"]), want["token_ids"])
    np.testing.assert_array_equal(np.asarray(got["padding_mask"]), want["padding_mask"])
    assert (ours.end_token_id, ours.pad_token_id) == (1, 0)
    assert np.asarray(got["token_ids"])[2, :2].tolist() == [1, 0]  # the empty caption: `<eos>`, then padding
    # The registered SigLIP 2 architecture presets name the same settings: their tokenizer, given the vocabulary.
    import json

    from vlzoo.tokenizers import SentencePieceTokenizer

    config = json.loads((vlzoo.presets.resolve_preset("siglip2_vit_b16") / "tokenizer.json").read_text())["config"]
    registered = SentencePieceTokenizer(str(tmp_path / "gemma.model"), **{**config, "sequence_length": 12})
    np.testing.assert_array_equal(np.asarray(registered(texts)["token_ids"]), want["token_ids"])
