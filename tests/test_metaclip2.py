"""MetaCLIP 2 (transformers' `MetaClip2Model`) -> `vlzoo.CLIP`: CLIP's network with the text pooled at the first
end token (`eos_token_id`, XLM-V's `</s>` = 2), on the active backend.

The peers are built offline from configs, with random weights, at each public geometry (`GEOMETRIES`: every
width, head count, MLP width, patch and image size and context length of the released configs) with two blocks
per tower and a 1,000-piece vocabulary (the released 901,629 rows would need gigabytes for nothing the
comparison needs). The texts are laid out as the checkpoints' tokenizers lay them out (`LAYOUTS`: XLM-V's and
mT5's), with pieces above the special ids, so a model that pooled at the largest id would fail.
"""

import numpy as np
import pytest

import vlzoo
import vlzoo.convert as vc
from vlzoo.layers import TextTransformer

from backend_utils import run_once
from test_convert_transformers import hf, torch  # noqa: F401  (transformers and torch, or a skip)

try:
    import peers
except ImportError:  # tests/ imported as a package
    from tests import peers

pytestmark = pytest.mark.peer

DEPTH, VOCAB = 2, 1000
# How each tokenizer lays out a caption: XLM-V's (`<s>` 0, pieces, `</s>` 2, `<pad>` 1) and mT5's (pieces, `</s>` 1,
# `<pad>` 0).
LAYOUTS = {"xlm_v": dict(start=0, end=2, pad=1), "mt5": dict(start=None, end=1, pad=0)}
# Released checkpoint -> vision (width, heads, MLP width, patch, image size), text (width, heads, MLP width,
# context), the projection's width and the activation of both towers, from its config.json.
GEOMETRIES = {
    "facebook/metaclip-2-worldwide-s16": dict(vision=(384, 6, 1536, 16, 224), text=(384, 6, 1536, 77), projection=384),
    "facebook/metaclip-2-worldwide-m16": dict(vision=(512, 8, 2048, 16, 224), text=(512, 8, 2048, 77), projection=512),
    "facebook/metaclip-2-worldwide-b32": dict(vision=(768, 12, 3072, 32, 224), text=(512, 8, 2048, 77), projection=512),
    "facebook/metaclip-2-worldwide-b16": dict(vision=(768, 12, 3072, 16, 224), text=(512, 8, 2048, 77), projection=512),
    "facebook/metaclip-2-worldwide-l14": dict(vision=(1024, 16, 4096, 14, 224), text=(768, 12, 3072, 77),
                                              projection=768),
    "facebook/metaclip-2-worldwide-huge-quickgelu": dict(vision=(1280, 16, 5120, 14, 224), text=(1024, 16, 4096, 77),
                                                         projection=1024, act="quick_gelu"),
    "facebook/metaclip-2-worldwide-huge-378": dict(vision=(1280, 16, 5120, 14, 378), text=(1024, 16, 4096, 77),
                                                   projection=1024),
    "facebook/metaclip-2-worldwide-giant": dict(vision=(1664, 16, 8192, 14, 224), text=(1280, 20, 5120, 77),
                                                projection=1280),
    "facebook/metaclip-2-worldwide-giant-378": dict(vision=(1664, 16, 8192, 14, 378), text=(1280, 20, 5120, 77),
                                                    projection=1280),
}
# The architecture preset of each checkpoint (the mT5 ones: `metaclip2_mt5_vit_*`).
PRESETS = {f"facebook/metaclip-2-worldwide-{size}": f"metaclip2_vit_{key}" for size, key in (
    ("s16", "s16"), ("m16", "m16"), ("b32", "b32"), ("b16", "b16"), ("l14", "l14"),
    ("huge-quickgelu", "h14_quickgelu"), ("huge-378", "h14_378"), ("giant", "g14"), ("giant-378", "g14_378"))}
# The mT5-tokenized checkpoints (facebook/metaclip-2-mt5-worldwide-{s16,m16,b32}) are the s16, m16 and b32 networks
# with a 250,000-piece vocabulary whose end token is 1: checked at b32's geometry with that end token.
CASES = [(name, "xlm_v") for name in sorted(GEOMETRIES)] + [("facebook/metaclip-2-worldwide-b32", "mt5")]


def _peer(hf, torch, vision, text, projection, act="gelu", layout="xlm_v", seed=0):
    width, heads, mlp, patch, image = vision
    text_width, text_heads, text_mlp, context = text
    config = hf.MetaClip2Config(
        vision_config=dict(hidden_size=width, num_attention_heads=heads, intermediate_size=mlp, patch_size=patch,
                           image_size=image, num_hidden_layers=DEPTH, hidden_act=act),
        text_config=dict(hidden_size=text_width, num_attention_heads=text_heads, intermediate_size=text_mlp,
                         max_position_embeddings=context, num_hidden_layers=DEPTH, hidden_act=act, vocab_size=VOCAB,
                         eos_token_id=LAYOUTS[layout]["end"], pad_token_id=LAYOUTS[layout]["pad"]),
        projection_dim=projection,
    )
    torch.manual_seed(seed)
    model = hf.MetaClip2Model(config).eval()
    with torch.no_grad():  # LayerNorms and biases start at constants: moved, so every weight is checked
        for parameter in model.parameters():
            parameter.add_(0.02 * torch.randn_like(parameter))
    return model


def _texts(batch, context, start, end, pad, seed=0):
    """Captions as a tokenizer of `LAYOUTS` lays them out, pieces in [3, VOCAB), of other lengths per row."""
    rng = np.random.default_rng(seed)
    ids = np.full((batch, context), pad, "int32")
    first = 0 if start is None else 1
    for row, length in enumerate(rng.integers(1, context - 2, batch)):
        if start is not None:
            ids[row, 0] = start
        ids[row, first:first + length] = rng.integers(3, VOCAB, length)
        ids[row, first + length] = end
    return {"token_ids": ids, "padding_mask": ids != pad}


# Checked on every backend: the cheapest geometry, and the mT5 layout's end token, which pools at a token that is
# not the largest id (no tiny preset's). GELU and quick GELU are the tiny presets' activations.
@pytest.mark.parametrize("checkpoint, layout", peers.geometries(CASES, (("facebook/metaclip-2-worldwide-s16", "xlm_v"),
                                                                        ("facebook/metaclip-2-worldwide-b32", "mt5"))))
def test_parity_with_transformers_at_every_geometry(hf, torch, checkpoint, layout):
    peer = _peer(hf, torch, **GEOMETRIES[checkpoint], layout=layout)
    model = vc.from_transformers(peer)
    end = LAYOUTS[layout]["end"]
    assert isinstance(model, vlzoo.CLIP) and model.text.end_token_id == end and model.text.pooling == "eot"
    images, _ = peers.parity_inputs(model, 2)
    texts = _texts(2, model.text.sequence_length, **LAYOUTS[layout])
    # The largest id is a piece: pooling there, not at the end token, would fail.
    assert (np.argmax(texts["token_ids"], axis=-1) != np.argmax(texts["token_ids"] == end, axis=-1)).all()
    with torch.no_grad():
        out = peer(input_ids=torch.from_numpy(texts["token_ids"]).long(),
                   attention_mask=torch.from_numpy(texts["padding_mask"]).long(),
                   pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2).copy()))
    peers.assert_relative_parity(model, images, texts, out.image_embeds.numpy(), out.text_embeds.numpy(),
                                 out.logits_per_image.numpy(), f"transformers MetaClip2Model {checkpoint} ({layout})")
    preset = PRESETS[checkpoint] if layout == "xlm_v" else PRESETS[checkpoint].replace("metaclip2_", "metaclip2_mt5_")
    peers.assert_towers_match_preset(model, preset)


def test_fit_trains_on_the_loss_metaclip2model_computes(hf, torch):
    """`fit` on a converted MetaCLIP 2 (S/16's geometry): the loss of its first step is transformers'
    `MetaClip2Model(..., return_loss=True)` loss on the same batch (CLIP's symmetric cross-entropy), and the
    step lowers it."""
    import keras

    peer = _peer(hf, torch, **GEOMETRIES["facebook/metaclip-2-worldwide-s16"])
    model = vc.from_transformers(peer)
    images, _ = peers.parity_inputs(model, 4)
    texts = _texts(4, model.text.sequence_length, **LAYOUTS["xlm_v"], seed=1)
    with torch.no_grad():
        want = float(peer(input_ids=torch.from_numpy(texts["token_ids"]).long(),
                          attention_mask=torch.from_numpy(texts["padding_mask"]).long(),
                          pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2).copy()), return_loss=True).loss)
    model.compile(optimizer=keras.optimizers.SGD(1e-3))
    losses = model.fit({"images": images, **texts}, batch_size=4, epochs=2, shuffle=False, verbose=0).history["loss"]
    assert abs(losses[0] - want) <= 1e-5 * want, (losses, want)
    assert losses[1] < 0.995 * losses[0], losses  # measured: 1.4290 then 1.4110 on PyTorch


@run_once  # argument checks and the config: nothing computed
def test_end_token_pooling_is_checked_and_saved():
    tower = TextTransformer(16, 6, 8, 1, 2, 16, pooling="eot", end_token_id=2)
    assert tower.get_config()["end_token_id"] == 2
    assert TextTransformer.from_config(tower.get_config()).end_token_id == 2
    assert "end_token_id" not in TextTransformer(16, 6, 8, 1, 2, 16).get_config()  # CLIP's largest-id pooling
    with pytest.raises(ValueError, match="end_token_id.*below `vocabulary_size` \\(16\\)"):
        TextTransformer(16, 6, 8, 1, 2, 16, end_token_id=16)
    with pytest.raises(ValueError, match="end_token_id.*pooling='mean'"):
        TextTransformer(16, 6, 8, 1, 2, 16, pooling="mean", end_token_id=2)


@run_once  # the converter's check of the config, before any backend computes
def test_a_list_of_end_tokens_is_refused_by_name(hf, torch):
    peer = _peer(hf, torch, **GEOMETRIES["facebook/metaclip-2-worldwide-b32"])
    config = peer.config.to_dict()
    config["text_config"]["eos_token_id"] = [2, 3]
    with pytest.raises(ValueError, match="eos_token_id"):
        vc.from_transformers_state_dict(peer.state_dict(), config)


# ----------------------------------------------------------------------------- tokenizers

# An English and a multilingual sample: scripts beyond Latin (Cyrillic, Greek, Arabic, Hebrew, Devanagari, Thai,
# Han, Kana, Hangul), accents, digits, runs of spaces, a character the model never saw (its `<unk>`), and captions
# longer than the context (truncated with the end piece kept).
SAMPLES = [
    "a photo of a cat", "Two  DOGS playing, in the snow!", "une photo d'un chat noir à Paris",
    "Фотография кошки на диване", "φωτογραφία μιας γάτας", "صورة قطة على الأريكة", "תמונה של חתול",
    "एक बिल्ली की तस्वीर", "ภาพถ่ายของแมว", "一只猫的照片", "猫の写真です", "고양이 사진", "façade 2024 ünïcödé",
    "a ☃ under the snow", " ".join(["a long caption about a black cat"] * 6),
]
CONTEXT = 16


def _corpus(root):
    """Every sample but the unseen snowman, each line many times: a multilingual training text."""
    path = root / "corpus.txt"
    lines = [text.replace("☃", "") for text in SAMPLES] + ["a black dog and two red cats", "Кошка и собака"]
    path.write_text("\n".join(lines * 30), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def xlm_v_files(tmp_path_factory):
    """A 300-piece Unigram SentencePiece model in XLM-V's layout (`<unk>` 0, `<s>` 1, `</s>` 2, as
    `sentencepiece.bpe.model`), trained here, and transformers' XLMRobertaTokenizer of it: its directory as
    transformers 5 writes it (`tokenizer.json` and its configs, no SentencePiece file)."""
    sentencepiece = pytest.importorskip("sentencepiece")
    hf = pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("xlm-v")
    source = root / "source"
    source.mkdir()
    sentencepiece.SentencePieceTrainer.train(
        input=str(_corpus(root)), model_prefix=str(source / "sentencepiece.bpe"), vocab_size=300,
        character_coverage=1.0, hard_vocab_limit=False, minloglevel=2)
    reference = hf.XLMRobertaTokenizer.from_pretrained(str(source))
    written = root / "written"
    reference.save_pretrained(str(written))
    return source / "sentencepiece.bpe.model", written, reference


def _reference_ids(reference, texts, length):
    out = reference(texts, padding="max_length", max_length=length, truncation=True)
    return np.asarray(out["input_ids"], "int32"), np.asarray(out["attention_mask"], bool)


def _assert_same_tokens(tokenizer, reference, texts, length):
    got = tokenizer(texts)
    ids, mask = _reference_ids(reference, texts, length)
    for row, text in enumerate(texts):
        np.testing.assert_array_equal(got["token_ids"][row], ids[row], err_msg=text)
    np.testing.assert_array_equal(got["padding_mask"], mask)


@run_once  # tokenizers are numpy: the same on every backend
def test_xlm_v_tokenizer_gives_transformers_ids(xlm_v_files):
    """From the SentencePiece file and from transformers 5's `tokenizer.json` alone, id for id transformers'
    XLMRobertaTokenizer: `<s>` first, pieces at their SentencePiece id + 1, `<unk>` 3, `</s>` kept last on
    truncation, `<pad>` 1 after it."""
    from vlzoo.convert.repository_tokenizers import metaclip2_tokenizer
    from vlzoo.tokenizers import XLMRobertaTokenizer

    spm_file, written, reference = xlm_v_files
    assert not (written / "sentencepiece.bpe.model").exists() and (written / "tokenizer.json").is_file()
    config = {"text_config": {"max_position_embeddings": CONTEXT}}
    from_file = XLMRobertaTokenizer(str(spm_file), sequence_length=CONTEXT)
    from_json = metaclip2_tokenizer(written, config)
    ids, _ = _reference_ids(reference, SAMPLES, CONTEXT)
    assert (ids == 3).any() and (ids[:, -1] == 2).sum() >= 2 and (ids == 1).any()  # unk, truncation, padding
    assert len({int(i) for i in ids.ravel()}) > 60  # many pieces of many scripts
    for tokenizer in (from_file, from_json):
        assert isinstance(tokenizer, XLMRobertaTokenizer)
        _assert_same_tokens(tokenizer, reference, SAMPLES, CONTEXT)
        assert tokenizer.vocabulary_size == len(reference) and tokenizer.token_to_id("<mask>") == len(reference) - 1
        assert [tokenizer.token_to_id(p) for p in ("<s>", "<pad>", "</s>", "<unk>")] == [0, 1, 2, 3]
        assert tokenizer.token_to_id("▁cat") == reference.convert_tokens_to_ids("▁cat")
        assert tokenizer.detokenize(tokenizer(["a photo of a cat"])["token_ids"]) == ["a photo of a cat"]
    # A repository with the SentencePiece file reads it; the rebuilt model is that file's pieces and map.
    (written / "sentencepiece.bpe.model").write_bytes(spm_file.read_bytes())
    _assert_same_tokens(metaclip2_tokenizer(written, config), reference, SAMPLES, CONTEXT)


@run_once
def test_mt5_tokenizer_gives_siglip_tokenizers_ids(tmp_path):
    """The mT5 repositories' `spiece.model` (`<pad>` 0, `</s>` 1, `<unk>` 2) as transformers' SiglipTokenizer
    reads it: SigLIP's cleaning, no start piece, `</s>` last, padded with the repository's `<pad>`."""
    sentencepiece = pytest.importorskip("sentencepiece")
    hf = pytest.importorskip("transformers")
    from vlzoo.convert.repository_tokenizers import metaclip2_tokenizer

    sentencepiece.SentencePieceTrainer.train(
        input=str(_corpus(tmp_path)), model_prefix=str(tmp_path / "spiece"), vocab_size=300, pad_id=0, eos_id=1,
        unk_id=2, bos_id=-1, character_coverage=1.0, hard_vocab_limit=False, minloglevel=2)
    reference = hf.SiglipTokenizer(vocab_file=str(tmp_path / "spiece.model"), pad_token="<pad>")
    repository = tmp_path / "repository"
    reference.save_pretrained(str(repository))
    tokenizer = metaclip2_tokenizer(repository, {"text_config": {"max_position_embeddings": CONTEXT}})
    ids, _ = _reference_ids(reference, SAMPLES, CONTEXT)
    assert (ids == 0).any() and (ids == 1).sum() >= len(SAMPLES)  # padded with <pad>, every row ends with </s>
    _assert_same_tokens(tokenizer, reference, SAMPLES, CONTEXT)


@run_once
def test_a_repository_without_a_tokenizer_file_has_none_and_a_foreign_vocabulary_is_refused(tmp_path):
    from vlzoo.convert.repository_tokenizers import metaclip2_tokenizer, xlm_roberta_proto

    assert metaclip2_tokenizer(tmp_path, {}) is None
    with pytest.raises(ValueError, match="not an XLM-R layout Unigram vocabulary"):
        xlm_roberta_proto({"model": {"type": "BPE", "vocab": {}}})
    with pytest.raises(NotImplementedError, match="'Lowercase'"):
        xlm_roberta_proto({"model": {"type": "Unigram", "vocab": [[p, 0.0] for p in ("<s>", "<pad>", "</s>", "<unk>")]},
                           "normalizer": {"type": "Sequence", "normalizers": [{"type": "Lowercase"}]}})
