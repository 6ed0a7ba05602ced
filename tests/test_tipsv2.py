"""TIPSv2 (transformers' `Tipsv2Model`) -> `vlzoo.TIPSv2`, on the active backend: embeddings, logits, the register
token's embedding and the patch features at every released geometry, and `fit` on the two caption kinds.

The peers are built offline from configs, with random weights, at each public geometry (`GEOMETRIES`: every
width, head count, MLP width and kind, patch and image size, context length and temperature of the released
configs) with two blocks per tower and a 1,000-piece vocabulary (the released 32,000 rows add nothing the
comparison needs).
"""

import json

import numpy as np
import pytest

import vlzoo
import vlzoo.convert as vc

from backend_utils import run_once
from test_convert_transformers import hf, torch  # noqa: F401  (transformers and torch, or a skip)

try:
    import peers
except ImportError:  # tests/ imported as a package
    from tests import peers

pytestmark = pytest.mark.peer

DEPTH, VOCAB, CONTEXT = 2, 1000, 64
# Released checkpoint -> image tower (width, heads, MLP width, SwiGLU), text tower (width, heads, MLP width) and
# temperature, from transformers' Tipsv2 configurations (448 px, patch 14, one register token).
# The architecture preset of each checkpoint.
PRESETS = {"google/tipsv2-b14": "tipsv2_b14", "google/tipsv2-l14": "tipsv2_l14",
           "google/tipsv2-so400m14": "tipsv2_so400m14", "google/tipsv2-g14": "tipsv2_g14"}
GEOMETRIES = {
    "google/tipsv2-b14": dict(vision=(768, 12, 3072, False), text=(768, 12, 3072), temperature=0.005065968260169029),
    "google/tipsv2-l14": dict(vision=(1024, 16, 4096, False), text=(1024, 16, 4096), temperature=0.004785),
    "google/tipsv2-so400m14": dict(vision=(1152, 16, 4304, False), text=(1152, 16, 4304), temperature=0.004638),
    "google/tipsv2-g14": dict(vision=(1536, 24, 6144, True), text=(1536, 24, 6144), temperature=0.003623),
}


def _peer(hf, torch, vision, text, temperature, image_size=448, seed=0):
    width, heads, mlp, swiglu = vision
    text_width, text_heads, text_mlp = text
    config = hf.Tipsv2Config(
        vision_config=dict(hidden_size=width, num_attention_heads=heads, mlp_ratio=mlp / width, use_swiglu_ffn=swiglu,
                           num_hidden_layers=DEPTH, image_size=image_size, patch_size=14),
        text_config=dict(hidden_size=text_width, num_attention_heads=text_heads, intermediate_size=text_mlp,
                         num_hidden_layers=DEPTH, vocab_size=VOCAB, max_position_embeddings=CONTEXT),
        temperature_init_value=temperature,
    )
    torch.manual_seed(seed)
    model = hf.Tipsv2Model(config).eval()
    with torch.no_grad():  # LayerNorms, LayerScale and biases start at constants: moved, so every weight is checked
        for name, parameter in model.named_parameters():
            if name != "temperature":  # the released value of each size
                parameter.add_(0.02 * torch.randn_like(parameter))
    return model


def _texts(batch, seed=0):
    """Captions of other lengths per row: pieces in [1, VOCAB), then padding 0 with a False mask."""
    rng = np.random.default_rng(seed)
    ids = np.zeros((batch, CONTEXT), "int32")
    for row, length in enumerate(rng.integers(3, CONTEXT, batch)):
        ids[row, :length] = rng.integers(1, VOCAB, length)
    return {"token_ids": ids, "padding_mask": ids != 0}


def _torch_inputs(torch, images, texts):
    return dict(input_ids=torch.from_numpy(texts["token_ids"]).long(),
                attention_mask=torch.from_numpy(texts["padding_mask"]).long(),
                pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2).copy()))


# Checked on every backend: the cheapest geometry, and g14's SwiGLU image tower, which no tiny preset has.
@pytest.mark.parametrize("checkpoint", peers.geometries(sorted(GEOMETRIES), ("google/tipsv2-b14", "google/tipsv2-g14")))
def test_parity_with_transformers_at_every_geometry(hf, torch, checkpoint):
    import keras

    image_size = peers.parity_image_size(448, 14)
    peer = _peer(hf, torch, **GEOMETRIES[checkpoint], image_size=image_size)
    model = vc.from_transformers(peer)
    assert isinstance(model, vlzoo.TIPSv2)
    assert abs(float(model.logit_scale_value()) - 1 / GEOMETRIES[checkpoint]["temperature"]) < 1e-3
    images, _ = peers.parity_inputs(model, 2)
    texts = _texts(2)
    with torch.no_grad():
        out = peer(**_torch_inputs(torch, images, texts))
        hidden = out.vision_model_output.last_hidden_state.numpy()
    _, image, _ = peers.assert_relative_parity(model, images, texts, out.image_embeds.numpy(),
                                               out.text_embeds.numpy(), out.logits_per_image.numpy(),
                                               f"transformers Tipsv2Model {checkpoint}")
    peers.assert_towers_match_preset(model, PRESETS[checkpoint], differ=("num_layers", "vocabulary_size", "image_size"))
    assert model.vision.image_size == image_size
    # The register token (TIPS's embedding for synthetic captions) and the patch features.
    synthetic = keras.ops.convert_to_numpy(image["synthetic_embeds"])
    np.testing.assert_allclose(synthetic, hidden[:, 1], rtol=0, atol=1e-4 * np.abs(hidden[:, 1]).max())
    patches = keras.ops.convert_to_numpy(model.dense_image_embeddings(images))
    assert patches.shape == (2, (image_size // 14) ** 2, GEOMETRIES[checkpoint]["vision"][0])
    np.testing.assert_allclose(patches, hidden[:, 2:], rtol=0, atol=1e-4 * np.abs(hidden[:, 2:]).max())


def test_fit_trains_both_caption_kinds_on_the_loss_tipsv2model_computes(hf, torch):
    """`fit` on a converted TIPSv2 (B/14's widths at 56 px): with web captions alone, the first step's loss is
    transformers' `Tipsv2Model(..., return_loss=True)`; with both kinds `(B, 2, T)`, it is the mean of that
    loss and the register token's against the synthetic captions; and steps lower it."""
    import keras

    peer = _peer(hf, torch, **GEOMETRIES["google/tipsv2-b14"], image_size=56)
    model = vc.from_transformers(peer)
    images, _ = peers.parity_inputs(model, 4)
    web, synthetic = _texts(4, seed=1), _texts(4, seed=2)
    with torch.no_grad():
        web_loss = float(peer(**_torch_inputs(torch, images, web), return_loss=True).loss)
        out = peer(**_torch_inputs(torch, images, synthetic))
        register = torch.nn.functional.normalize(out.vision_model_output.last_hidden_state[:, 1], dim=-1)
        logits = out.text_embeds @ register.T / peer.temperature
        targets = torch.arange(4)
        synthetic_loss = float(0.5 * (torch.nn.functional.cross_entropy(logits, targets)
                                      + torch.nn.functional.cross_entropy(logits.T, targets)))
    model.compile(optimizer=keras.optimizers.SGD(1e-5))  # logits at scale 197: a small step
    one_kind = model.test_on_batch({"images": images, **web}, return_dict=True)["loss"]
    assert abs(one_kind - web_loss) <= 1e-5 * web_loss, (one_kind, web_loss)
    both = {"images": images, "token_ids": np.stack([web["token_ids"], synthetic["token_ids"]], axis=1),
            "padding_mask": np.stack([web["padding_mask"], synthetic["padding_mask"]], axis=1)}
    losses = model.fit(both, batch_size=4, epochs=2, shuffle=False, verbose=0).history["loss"]
    want = 0.5 * (web_loss + synthetic_loss)
    assert abs(losses[0] - want) <= 1e-5 * want, (losses, want)
    assert losses[1] < 0.97 * losses[0], losses  # measured: 5.62 then 5.23 on PyTorch


@run_once  # the names are mapped in numpy; both conversions assign the same arrays on any backend
def test_the_released_checkpoint_names_convert_as_transformers_loads_them(hf, torch, tmp_path):
    """A checkpoint as `save_pretrained` writes it and the Hub holds it (the authors' names: packed `qkv`,
    `in_proj`, SwiGLU's `w12`; no `temperature`) converts to the model the in-memory module converts to, its
    temperature taken from the config."""
    import keras
    from safetensors.numpy import load_file

    peer = _peer(hf, torch, **GEOMETRIES["google/tipsv2-g14"], image_size=56)
    peer.save_pretrained(tmp_path)
    released = load_file(str(tmp_path / "model.safetensors"))
    assert "vision_encoder.blocks.0.mlp.w12.weight" in released and "text_encoder.ln_final.weight" in released
    del released["temperature"]
    model = vc.from_transformers_state_dict(released, peer.config)
    reference = vc.from_transformers(peer)
    assert float(keras.ops.convert_to_numpy(model.logit_scale)) == pytest.approx(-np.log(0.003623), rel=1e-6)
    for got, want in zip(model.weights, reference.weights, strict=True):
        assert got.path.split("/", 1)[1] == want.path.split("/", 1)[1]
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want),
                                      err_msg=got.path)


@run_once  # argument checks: nothing computed
def test_mismatched_widths_and_a_third_caption_kind_are_refused_by_name():
    with pytest.raises(ValueError, match="text\\['hidden_dim'\\].*must equal"):
        vlzoo.from_preset("tipsv2_tiny", text={"hidden_dim": 48})
    model = vlzoo.from_preset("tipsv2_tiny")
    ids = np.ones((2, 3, 16), "int32")
    with pytest.raises(ValueError, match="web and synthetic captions"):
        model({"images": np.zeros((2, 32, 32, 3), "float32"), "token_ids": ids, "padding_mask": ids > 0})


@run_once  # tokenizers are numpy: the same on every backend
def test_tokenizer_gives_transformers_ids(hf, tmp_path):
    """A repository's `tokenizer.model` as vlzoo reads it, id for id transformers' Tipsv2Tokenizer of it: a
    SentencePiece BPE model in TIPSv2's layout (`<pad>` 0, `<unk>` 1, no start or end piece, byte fallback)
    trained here on the multilingual captions of test_metaclip2, lowercased, padded with `<pad>`, truncated."""
    sentencepiece = pytest.importorskip("sentencepiece")
    from vlzoo.convert.repository_tokenizers import sentencepiece_bpe_proto, tipsv2_tokenizer
    from test_metaclip2 import SAMPLES

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join([text.lower().replace("☃", "") for text in SAMPLES] * 30), encoding="utf-8")
    source = tmp_path / "source"
    source.mkdir()
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(source / "tokenizer"), model_type="bpe", vocab_size=420, pad_id=0,
        unk_id=1, bos_id=-1, eos_id=-1, byte_fallback=True, character_coverage=1.0, hard_vocab_limit=False,
        minloglevel=2)
    reference = hf.Tipsv2Tokenizer.from_pretrained(str(source))
    repository = tmp_path / "repository"
    reference.save_pretrained(str(repository))
    (repository / "tokenizer.model").write_bytes((source / "tokenizer.model").read_bytes())
    config = {"text_config": {"max_position_embeddings": 16}}
    tokenizer = tipsv2_tokenizer(repository, config)
    ids, mask = _transformers_ids(reference, SAMPLES)
    # Padded, truncated, no special piece among the real ones, and the unseen snowman in byte pieces (ids 2-257).
    assert (ids == 0).any() and mask[:, -1].sum() >= 2 and (ids[mask] >= 2).all() and (ids[mask] < 258).any()
    _assert_same_ids(tokenizer, SAMPLES, ids, mask)
    # transformers 5 saved tokenizer.json alone: the model rebuilt from its merges gives, on the samples and on
    # strings of their words and of their characters, the ids of the Tipsv2Tokenizer that transformers reads
    # from that file, with the original model's pieces and piece types.
    (repository / "tokenizer.model").unlink()
    rebuilt = tipsv2_tokenizer(repository, config)
    rng = np.random.default_rng(0)
    words, characters = " ".join(SAMPLES).split(), list(" ".join(SAMPLES))
    texts = SAMPLES + [" ".join(rng.choice(words, 3)) for _ in range(60)] + [
        "".join(rng.choice(characters, 12)) for _ in range(60)]
    ids, mask = _transformers_ids(hf.Tipsv2Tokenizer.from_pretrained(str(repository)), texts)
    _assert_same_ids(rebuilt, texts, ids, mask)
    _assert_same_ids(tokenizer, texts, ids, mask)
    proto, lowercase = sentencepiece_bpe_proto(json.loads((repository / "tokenizer.json").read_text("utf-8")))
    assert lowercase
    original = sentencepiece.SentencePieceProcessor(model_file=str(source / "tokenizer.model"))
    again = sentencepiece.SentencePieceProcessor(model_proto=proto)
    assert [(original.id_to_piece(i), original.is_byte(i), original.is_control(i), original.is_unknown(i))
            for i in range(original.get_piece_size())] == [
        (again.id_to_piece(i), again.is_byte(i), again.is_control(i), again.is_unknown(i))
        for i in range(again.get_piece_size())]


def _transformers_ids(tokenizer, texts):
    """`(ids, mask)` of a transformers tokenizer, padded and truncated to 16."""
    want = tokenizer(texts, padding="max_length", max_length=16, truncation=True)
    return np.asarray(want["input_ids"]), np.asarray(want["attention_mask"], bool)


def _assert_same_ids(tokenizer, texts, ids, mask):
    got = tokenizer(texts)
    for row, text in enumerate(texts):
        np.testing.assert_array_equal(got["token_ids"][row], ids[row], err_msg=text)
    np.testing.assert_array_equal(got["padding_mask"], mask)


@run_once  # file checks: nothing computed
def test_a_tokenizer_json_without_a_sentencepiece_counterpart_is_refused_by_name():
    from vlzoo.convert.repository_tokenizers import sentencepiece_bpe_proto

    words = {"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"}, {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always"}]}
    bpe = {"type": "BPE", "vocab": {"<unk>": 0, "\u2581": 1, "a": 2, "\u2581a": 3}, "merges": [["\u2581", "a"]]}
    assert sentencepiece_bpe_proto({"model": bpe, "pre_tokenizer": words})[1] is False
    with pytest.raises(ValueError, match="not a BPE vocabulary"):
        sentencepiece_bpe_proto({"model": {"type": "Unigram", "vocab": [["<unk>", 0.0]]}, "pre_tokenizer": words})
    with pytest.raises(ValueError, match="not a BPE vocabulary"):
        sentencepiece_bpe_proto({"model": {**bpe, "vocab": {"<unk>": 0, "a": 2}}, "pre_tokenizer": words})
    with pytest.raises(ValueError, match="unknown piece '<unk>'"):
        sentencepiece_bpe_proto({"model": {**bpe, "vocab": {"\u2581": 0, "a": 1}}, "pre_tokenizer": words})
    with pytest.raises(NotImplementedError, match=r"pre-tokeniser \['ByteLevel'\]"):
        sentencepiece_bpe_proto({"model": bpe, "pre_tokenizer": {"type": "ByteLevel"}})
    with pytest.raises(NotImplementedError, match="normaliser step 'NFD'"):
        sentencepiece_bpe_proto({"model": bpe, "pre_tokenizer": words, "normalizer": {"type": "NFD"}})


@run_once  # configs: nothing computed
def test_the_new_tower_settings_are_saved_only_when_set():
    """LayerScale, register tokens, SwiGLU, sinusoidal positions and scaled embeddings round-trip through the
    towers' configs, and towers without them keep the configs they had (every registered preset's files are
    checked byte for byte by tools/build_presets.py --check)."""
    from vlzoo.layers import TextTransformer, TransformerBlock, VisionTransformer

    block = TransformerBlock(32, 4, 64, activation="swiglu", layer_scale=0.1)
    assert block.get_config()["layer_scale"] == 0.1 and "layer_scale" not in TransformerBlock(32, 4, 64).get_config()
    vision = VisionTransformer(32, 8, 32, 1, 4, 64, num_register_tokens=2, layer_scale=1e-5, use_pre_norm=False)
    config = vision.get_config()
    assert config["num_register_tokens"] == 2 and config["layer_scale"] == 1e-5
    assert VisionTransformer.from_config(config).num_register_tokens == 2
    assert not {"num_register_tokens", "layer_scale"} & set(VisionTransformer(32, 8, 32, 1, 4, 64).get_config())
    text = TextTransformer(100, 8, 32, 1, 4, 64, positions="sinusoidal", scale_embeddings=True)
    text.build()
    assert text.weights and text.position_embedding is None and not [w for w in text.weights if "position" in w.path]
    assert {"positions": "sinusoidal", "scale_embeddings": True}.items() <= text.get_config().items()
    assert not {"positions", "scale_embeddings"} & set(TextTransformer(100, 8, 32, 1, 4, 64).get_config())
    with pytest.raises(ValueError, match="`positions` must be one of"):
        TextTransformer(100, 8, 32, 1, 4, 64, positions="rotary")
    with pytest.raises(ValueError, match="`num_register_tokens` must be an int >= 0"):
        VisionTransformer(32, 8, 32, 1, 4, 64, num_register_tokens=-1)
    with pytest.raises(ValueError, match="cannot be combined"):
        VisionTransformer(32, 8, 32, 1, 4, 64, num_register_tokens=1, rotary_theta=100.0)
