"""vlzoo.tokenizers: CLIP BPE (parity with open_clip) and SentencePiece wrappers."""

import importlib.util
import json
import os
import random

import keras
import numpy as np
import pytest
from backend_utils import run_once

from vlzoo import tokenizers as T

try:
    from peers import open_clip_or_skip
except ImportError:  # tests/ imported as a package
    from tests.peers import open_clip_or_skip

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ASSETS = os.path.join(ROOT, "presets", "_assets", "clip_bpe")

# The tokenizers return numpy arrays whatever the backend (keras-hub's tokenizers run on TensorFlow on
# every backend): one pass checks them.
pytestmark = run_once


@pytest.fixture(scope="module")
def tok():
    return T.CLIPTokenizer.from_assets(ASSETS)


@pytest.fixture(scope="module")
def simple_tokenizer():
    open_clip = open_clip_or_skip()
    return open_clip.tokenizer.SimpleTokenizer()


# ------------------------------------------------------------------ test strings

_FIXED = [
    "",
    " ",
    "\t\n  \u3000\xa0",
    "a photo of a cat",
    "A PHOTO OF A CAT.",
    "Hello, World!!!",
    "don't stop; it's what we'll do, I'd say, they've... you're I'm",
    "DON'T IT'S WE'LL",
    "café naïve résumé Ångström façade coöperate",
    "e\u0301 a\u0301 combining marks q\u0301",
    "Straße STRASSE ẞ",
    "İstanbul ıi DİYARBAKIR",
    "ΣΟΦΟΣ σοφός Ὀδυσσεύς",
    "Москва — столица России",
    "猫の写真です。日本語のテキスト",
    "一张猫的照片，中文文本！",
    "고양이 사진 한국어",
    "صورة قطة ٣٤٥ عربي",
    "תמונה של חתול",
    "बिल्ली की तस्वीर हिन्दी",
    "รูปแมว ภาษาไทย",
    "emoji 🐱🐶 👍🏽 👨‍👩‍👧 🇫🇷 ❤️",
    "🐱",
    "numbers 3.14159 1,000,000 2024-05-17 007 ½ ² ①",
    "punctuation!?!?... ---- ((nested)) [brackets] {braces} <angle> @#$%^&*_~`|\\/",
    "html &amp; entities &lt;b&gt; &#39;quoted&#39; &quot;x&quot; &amp;amp;",
    "mojibake cafÃ© naÃ¯ve",
    "curly \u201cquotes\u201d and \u2018single\u2019 \u2014 dash",
    "ligature ﬁne ﬂow",
    "full width ＡＢＣ１２３",
    "zero\u200bwidth\u200d joiner\ufeff bom",
    "control\x01chars\x7f here",
    "tab\tseparated\twords\nnew\r\nlines",
    "multiple     spaces   between",
    "<start_of_text> literal specials <end_of_text> and <|startoftext|> <|endoftext|>",
    "URL https://example.com/path?q=1&r=2#frag email a.b@c.org",
    "snake_case camelCase kebab-case UPPER_CASE",
    "x" * 300,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "the " * 100,
    " ".join(str(i) for i in range(60)),
    "a" + " b" * 74,  # exactly 77 with start and end
    "a" + " b" * 75,  # one over: truncated
    "😀" * 40,
]

_WORDS = (
    "a the photo of cat dog bird tree red blue big small on in with running sits "
    "image picture painting sketch close-up portrait city night beach mountain "
    "café niño über façade jalapeño crème brûlée smörgåsbord"
).split()
_UNICODE = list("éàüßçøñłžšđ猫犬鳥日本中文한국ÁÉÍÓÚΩπλж") + [
    "🐱", "👍🏽", "🇯🇵", "❤️", "👨‍👩‍👧", "½", "①", "ℕ", "ﬁ", "Ａ", "\u0301",
]
_PUNCT = list(".,;:!?'\"()[]{}<>-_/\\|@#$%^&*+=~`") + ["...", "--", "'s", "'ll", "&amp;", "&lt;"]
_SPACES = [" ", "  ", "\t", "\n", "\u3000", "\xa0", " \n\t "]


def _generated(n, seed=1234):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        parts = []
        for _ in range(rng.randint(0, 30 if i % 10 else 90)):
            r = rng.random()
            if r < 0.5:
                w = rng.choice(_WORDS)
                w = w.upper() if rng.random() < 0.1 else (w.title() if rng.random() < 0.2 else w)
                parts.append(w)
            elif r < 0.65:
                parts.append(rng.choice(_UNICODE) * rng.randint(1, 3))
            elif r < 0.8:
                parts.append(rng.choice(_PUNCT))
            elif r < 0.9:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 7))))
            else:
                parts.append("".join(rng.choice(_UNICODE + _PUNCT) for _ in range(rng.randint(1, 5))))
            parts.append(rng.choice(_SPACES) if rng.random() < 0.2 else " ")
        out.append("".join(parts))
    return out


TEXTS = _FIXED + _generated(220)


# ------------------------------------------------------------------ assets


def test_assets_layout(tok):
    assert tok.vocabulary_size == 49408
    assert tok.start_token_id == 49406
    assert tok.end_token_id == 49407
    assert tok.pad_token_id == 0
    assert tok.sequence_length == 77
    assert os.path.isfile(os.path.join(ASSETS, "LICENSE_NOTE.md"))
    with open(os.path.join(ASSETS, "merges.txt"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert lines[0].startswith("#version") and len(lines) == 1 + 48894


def test_a_process_parses_each_vocabulary_once_and_each_tokenizer_owns_its_copy(tmp_path):
    from vlzoo.tokenizers._base import parse_once

    first = T.CLIPTokenizer.from_assets(ASSETS)
    hits = parse_once.cache_info().hits
    second = T.CLIPTokenizer.from_assets(ASSETS)
    assert parse_once.cache_info().hits == hits + 2  # the vocabulary and the merges
    assert second._vocabulary == first._vocabulary and second._vocabulary is not first._vocabulary
    assert second._merges == first._merges and second._merges is not first._merges
    # A changed file is parsed anew.
    for name in ("vocabulary.json", "merges.txt"):
        with open(os.path.join(ASSETS, name), encoding="utf-8") as f:
            (tmp_path / name).write_text(f.read(), encoding="utf-8")
    vocabulary = json.loads((tmp_path / "vocabulary.json").read_text(encoding="utf-8"))
    vocabulary["<|endoftext|>"], vocabulary["<|startoftext|>"] = 49406, 49407
    (tmp_path / "vocabulary.json").write_text(json.dumps(vocabulary), encoding="utf-8")
    swapped = T.CLIPTokenizer.from_assets(str(tmp_path))
    assert (swapped.start_token_id, swapped.end_token_id) == (49407, 49406)
    assert first.start_token_id == 49406


def test_build_script_reproduces_assets(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "build_clip_bpe_assets", os.path.join(ROOT, "tools", "build_clip_bpe_assets.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    try:
        source = mod.find_open_clip_source()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    mod.write_assets(source, str(tmp_path))
    for name in ("vocabulary.json", "merges.txt"):
        with open(tmp_path / name, "rb") as a, open(os.path.join(ASSETS, name), "rb") as b:
            assert a.read() == b.read(), name


# ------------------------------------------------------------------ parity


def test_parity_with_open_clip(tok, simple_tokenizer):
    assert len(TEXTS) >= 250
    expected = simple_tokenizer(TEXTS, context_length=77).numpy()
    out = tok(TEXTS)
    assert out["token_ids"].dtype == np.int32 and out["token_ids"].shape == (len(TEXTS), 77)
    mismatched = [t for t, a, b in zip(TEXTS, out["token_ids"], expected) if not np.array_equal(a, b)]
    assert not mismatched, f"{len(mismatched)} mismatches, e.g. {mismatched[:3]!r}"
    # open_clip's pad is 0: every position after the last real token.
    lengths = out["padding_mask"].sum(axis=1)
    nonpad = np.array([np.max(np.nonzero(r)[0]) + 1 for r in expected])
    np.testing.assert_array_equal(lengths, nonpad)


def test_parity_short_context(tok, simple_tokenizer):
    texts = TEXTS[:80]
    expected = simple_tokenizer(texts, context_length=12).numpy()
    np.testing.assert_array_equal(tok(texts, sequence_length=12)["token_ids"], expected)


# ------------------------------------------------------------------ contract


def test_single_string_and_mask(tok):
    out = tok("a photo of a cat")
    ids, mask = out["token_ids"], out["padding_mask"]
    assert ids.shape == (1, 77) and mask.shape == (1, 77) and mask.dtype == np.bool_
    np.testing.assert_array_equal(ids[0, :7], [49406, 320, 1125, 539, 320, 2368, 49407])
    assert ids[0, 7:].tolist() == [0] * 70
    assert mask[0, :7].all() and not mask[0, 7:].any()


def test_empty_string_and_empty_batch(tok):
    out = tok([""])
    assert out["token_ids"][0, :3].tolist() == [49406, 49407, 0]
    assert out["padding_mask"][0].sum() == 2
    empty = tok([])
    assert empty["token_ids"].shape == (0, 77) and empty["padding_mask"].shape == (0, 77)


def test_truncation_keeps_end_token(tok):
    out = tok(["word " * 200, "short"])
    ids, mask = out["token_ids"], out["padding_mask"]
    assert ids[0, 0] == 49406 and ids[0, -1] == 49407 and mask[0].all()
    assert (ids[0, 1:-1] != 49407).all()
    assert ids[1, 2] == 49407


def test_pad_value_and_sequence_length(tok):
    t = T.CLIPTokenizer.from_assets(ASSETS, sequence_length=10, pad_value=49407)
    out = t(["a cat"])
    assert out["token_ids"].tolist() == [[49406, 320, 2368] + [49407] * 7]
    assert out["padding_mask"].tolist() == [[True] * 4 + [False] * 6]
    with pytest.raises(ValueError, match="sequence_length"):
        T.CLIPTokenizer(sequence_length=1)


def test_string_arrays_and_bytes(tok):
    ref = tok(["a cat", "a dog"])["token_ids"]
    np.testing.assert_array_equal(tok(np.array(["a cat", "a dog"]))["token_ids"], ref)
    np.testing.assert_array_equal(tok([b"a cat", "a dog"])["token_ids"], ref)
    np.testing.assert_array_equal(tok(("a cat", "a dog"))["token_ids"], ref)


@pytest.mark.parametrize(
    "bad", [None, 3, 1.5, ["ok", 3], [None], np.zeros((2,), np.int32), [["nested"]], np.array([["a"]])]
)
def test_bad_inputs(tok, bad):
    with pytest.raises(TypeError, match="texts"):
        tok(bad)


def test_detokenize(tok):
    ids = tok(["A Photo of a CAT!", "héllo wörld"])["token_ids"]
    assert tok.detokenize(ids) == ["a photo of a cat !", "héllo wörld"]
    assert tok.detokenize(ids[0]) == "a photo of a cat !"


def test_no_vocabulary_errors(tmp_path):
    t = T.CLIPTokenizer()
    with pytest.raises(RuntimeError, match="load_assets"):
        t("x")
    with pytest.raises(FileNotFoundError, match="vocabulary.json"):
        t.load_assets(str(tmp_path))
    with pytest.raises(ValueError, match="both"):
        T.CLIPTokenizer(vocabulary={"a": 0})


def test_byte_pair_merges_by_rank_and_maps_unknown_symbols_to_the_end_id():
    # Hand-worked: "abab" is a b a b</w>; rank 0 merges (a, b) -> ab a b</w>; rank 1 (a, b</w>) -> ab ab</w>;
    # rank 2 (ab, ab</w>) -> abab</w> (id 8). "c</w>" is not in the vocabulary: the end id, 1.
    vocabulary = {"<|startoftext|>": 0, "<|endoftext|>": 1, "a": 2, "b": 3, "a</w>": 4, "b</w>": 5, "ab": 6,
                  "ab</w>": 7, "abab</w>": 8}
    merges = ["#version: 0.2", "a b", "a b</w>", "ab ab</w>"]
    t = T.CLIPTokenizer(vocabulary, merges, sequence_length=6)
    np.testing.assert_array_equal(t(["abab c", "ba"])["token_ids"], [[0, 8, 1, 1, 0, 0], [0, 3, 4, 1, 0, 0]])
    with pytest.raises(ValueError, match="Merge rule 'a z'"):
        T.CLIPTokenizer(vocabulary, ["a z"])("a")


def test_dict_and_list_inputs(tok):
    with open(os.path.join(ASSETS, "vocabulary.json"), encoding="utf-8") as f:
        vocab = json.load(f)
    with open(os.path.join(ASSETS, "merges.txt"), encoding="utf-8") as f:
        merges = f.read().splitlines()
    t = T.CLIPTokenizer(vocabulary=vocab, merges=merges)
    np.testing.assert_array_equal(t(TEXTS[:20])["token_ids"], tok(TEXTS[:20])["token_ids"])


def test_config_and_assets_round_trip(tok, tmp_path):
    config = tok.get_config()
    assert config == {
        "sequence_length": 77,
        "pad_value": 0,
        "vocabulary_file": "vocabulary.json",
        "merges_file": "merges.txt",
    }
    json.dumps(config)
    asset_dir = tmp_path / "preset" / "assets" / "tokenizer"
    tok.save_assets(str(asset_dir))
    assert sorted(os.listdir(asset_dir)) == ["merges.txt", "vocabulary.json"]
    for name in ("vocabulary.json", "merges.txt"):
        with open(asset_dir / name, "rb") as a, open(os.path.join(ASSETS, name), "rb") as b:
            assert a.read() == b.read()

    serialized = keras.saving.serialize_keras_object(tok)
    assert "vlzoo>CLIPTokenizer" in json.dumps(serialized)
    restored = keras.saving.deserialize_keras_object(serialized)
    assert isinstance(restored, T.CLIPTokenizer)
    restored.load_assets(str(asset_dir))

    for cfg in (serialized, dict(config, class_name="CLIPTokenizer"), dict(config, type="clip_bpe")):
        t2 = T.tokenizer_from_config(cfg, asset_dir)
        np.testing.assert_array_equal(t2(TEXTS[:30])["token_ids"], tok(TEXTS[:30])["token_ids"])
    with pytest.raises(ValueError, match="Unknown tokenizer"):
        T.tokenizer_from_config({"class_name": "Nope"}, asset_dir)


# ------------------------------------------------------------------ SentencePiece


@pytest.fixture(scope="module")
def sp_model(tmp_path_factory):
    spm = pytest.importorskip("sentencepiece")
    path = tmp_path_factory.mktemp("spm") / "tiny"
    corpus = _generated(300, seed=7) + [w for w in _WORDS] * 5
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus),
        model_prefix=str(path),
        vocab_size=200,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=3,
        hard_vocab_limit=False,
        minloglevel=2,
    )
    return str(path) + ".model", spm.SentencePieceProcessor(model_file=str(path) + ".model")


def test_sentencepiece_contract(sp_model, tmp_path):
    path, ref = sp_model
    t = T.SentencePieceTokenizer(proto=path, sequence_length=16, clean="lower")
    texts = ["a photo of a cat", "Big RED dog " * 10, ""]
    out = t(texts)
    ids, mask = out["token_ids"], out["padding_mask"]
    assert ids.shape == (3, 16) and ids.dtype == np.int32 and mask.dtype == np.bool_
    assert t.end_token_id == 1 and t.start_token_id is None and t.pad_token_id == 1
    want = ref.encode("a photo of a cat") + [1]
    assert ids[0, : len(want)].tolist() == want and mask[0].sum() == len(want)
    assert (ids[0, len(want):] == 1).all()
    assert ids[1, -1] == 1 and mask[1].all()
    assert ids[2, 0] == 1 and mask[2].sum() == 1
    assert t.detokenize(ids[0]) == "a photo of a cat"

    t_start = T.SentencePieceTokenizer(proto=path, sequence_length=8, start_token="<s>", pad_value=0)
    assert t_start("cat")["token_ids"][0, 0] == 3
    with pytest.raises(TypeError, match="texts"):
        t([1, 2])

    asset_dir = tmp_path / "tok"
    t.save_assets(str(asset_dir))
    t2 = T.tokenizer_from_config(keras.saving.serialize_keras_object(t), asset_dir)
    np.testing.assert_array_equal(t2(texts)["token_ids"], ids)


def test_sentencepiece_missing_proto(tmp_path):
    with pytest.raises(FileNotFoundError, match="spiece.model"):
        T.SentencePieceTokenizer(proto=str(tmp_path / "spiece.model"))
    with pytest.raises(FileNotFoundError, match="not ship"):
        T.tokenizer_from_config({"class_name": "sentencepiece", "sequence_length": 64}, tmp_path)
