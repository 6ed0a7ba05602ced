"""OpenAI CLIP byte-level BPE: open_clip's text cleaning and split pattern, the
byte <-> unicode table, vocabulary/merges loading, and `CLIPTokenizer`."""

from __future__ import annotations

import functools
import html
import json
import os
import unicodedata
import warnings

import keras
import numpy as np

from vlzoo.tokenizers._base import _read_asset_file
from vlzoo.tokenizers._base import parse_once
from vlzoo.tokenizers._base import _VocabularyTokenizer

_FTFY_WARNED = False


def _fix_text(text):
    global _FTFY_WARNED
    try:
        import ftfy
    except ImportError:
        if not _FTFY_WARNED:
            warnings.warn(
                "ftfy is not installed: vlzoo's CLIPTokenizer falls back to NFC "
                "normalisation, so ids can differ from open_clip/OpenAI CLIP on text "
                "with mojibake, curly quotes, ligatures or full-width characters. "
                "`pip install ftfy` for exact parity.",
                stacklevel=3,
            )
            _FTFY_WARNED = True
        return unicodedata.normalize("NFC", text)
    return ftfy.fix_text(text)


def clip_clean_text(text):
    """open_clip's default ("lower") text cleaning.

    `ftfy.fix_text`, HTML-unescape twice, strip, collapse whitespace runs to one space,
    lowercase.
    """
    text = _fix_text(text)
    text = html.unescape(html.unescape(text)).strip()
    return " ".join(text.split()).strip().lower()


_CLIP_SPLIT_PATTERN = None


def _clip_split_pattern():
    # The exact pattern (and flags) of open_clip's SimpleTokenizer, which also
    # recognises its own two special-token strings inside the text.
    global _CLIP_SPLIT_PATTERN
    if _CLIP_SPLIT_PATTERN is None:
        import regex

        _CLIP_SPLIT_PATTERN = regex.compile(
            r"<start_of_text>|<end_of_text>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]"
            r"|[^\s\p{L}\p{N}]+",
            regex.IGNORECASE,
        )
    return _CLIP_SPLIT_PATTERN


def bytes_to_unicode():
    """OpenAI CLIP's reversible byte -> printable unicode table (256 entries)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(2**8):
        if b not in bs:
            bs.append(b)
            cs.append(2**8 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


@functools.lru_cache(maxsize=None)
def _byte_encoder():
    """`bytes_to_unicode()`, built once."""
    return bytes_to_unicode()


@functools.lru_cache(maxsize=None)
def _byte_decoder():
    """The inverse of `bytes_to_unicode()`: printable unicode -> byte."""
    return {v: k for k, v in _byte_encoder().items()}


class _BytePairEncoder:
    """CLIP's byte-pair encoding of one pre-token (a piece of open_clip's split pattern) into ids.

    The piece's UTF-8 bytes become printable symbols (`bytes_to_unicode`), the last one marked with
    `</w>`; while some adjacent pair of symbols is a merge rule, every occurrence of the pair with the
    lowest rank is merged, left to right; the symbols are then looked up in the vocabulary (a symbol
    outside it, possible only with a vocabulary that lacks byte symbols, gives `unknown_id`).

    Args:
        vocabulary: dict `{token: id}`.
        merges: list of `"a b"` rules, highest priority first.
        unknown_id: the id of a symbol outside `vocabulary`.

    Call: `encoder(piece)` with `piece` a non-empty str; returns a list of int ids.

    Raises:
        ValueError: a merge rule whose two tokens are not both in `vocabulary`.
    """

    def __init__(self, vocabulary, merges, unknown_id):
        ranks = {}
        for rank, merge in enumerate(merges):
            first, second = merge.split(" ")
            if first not in vocabulary or second not in vocabulary:
                raise ValueError(
                    f"Merge rule {merge!r} contains token {first!r} or {second!r} that is not in the vocabulary."
                )
            ranks.setdefault((first, second), rank)
        self._ranks = ranks
        self._vocabulary = vocabulary
        self._unknown_id = unknown_id

    def __call__(self, piece):
        encoder = _byte_encoder()
        symbols = [encoder[byte] for byte in piece.encode("utf-8")]
        symbols[-1] += "</w>"
        ranks = self._ranks
        while len(symbols) > 1:
            pairs = {(a, b) for a, b in zip(symbols, symbols[1:]) if (a, b) in ranks}
            if not pairs:
                break
            first, second = min(pairs, key=ranks.__getitem__)
            merged, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and symbols[i] == first and symbols[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(symbols[i])
                    i += 1
            symbols = merged
        return [self._vocabulary.get(symbol, self._unknown_id) for symbol in symbols]


def _load_vocabulary(vocabulary):
    if isinstance(vocabulary, (str, os.PathLike)):
        text = _read_asset_file(
            vocabulary,
            "CLIP BPE vocabulary",
            "Generate it with `python tools/build_clip_bpe_assets.py` or pass a dict.",
        )
        return dict(parse_once(_vocabulary_from_json, text))
    return _checked_vocabulary(vocabulary)


def _vocabulary_from_json(text):
    return _checked_vocabulary(json.loads(text))


def _checked_vocabulary(vocabulary):
    if not isinstance(vocabulary, dict):
        raise TypeError(
            "`vocabulary` must be a path to a json file or a dict {token: id}; "
            f"received {type(vocabulary).__name__}."
        )
    return {str(k): int(v) for k, v in vocabulary.items()}


def _load_merges(merges):
    if isinstance(merges, (str, os.PathLike)):
        text = _read_asset_file(
            merges,
            "CLIP BPE merges",
            "Generate it with `python tools/build_clip_bpe_assets.py` or pass a list.",
        )
        return list(parse_once(_merges_from_text, text))
    return _checked_merges(merges)


def _merges_from_text(text):
    return _checked_merges(text.split("\n"))


def _checked_merges(merges):
    if not isinstance(merges, (list, tuple)):
        raise TypeError(
            "`merges` must be a path to a text file or a list of 'a b' strings; "
            f"received {type(merges).__name__}."
        )
    out = []
    for m in merges:
        m = " ".join(m) if isinstance(m, (list, tuple)) else str(m)
        if not m.strip() or m.lstrip().startswith("#version"):
            continue
        out.append(m)
    return out


@keras.saving.register_keras_serializable(package="vlzoo")
class CLIPTokenizer(_VocabularyTokenizer):
    """OpenAI CLIP byte-pair-encoding tokenizer (lowercased, `ftfy`-cleaned).

    Gives exactly the ids of open_clip's `SimpleTokenizer()(texts, context_length)`:
    the text is cleaned as open_clip does (`ftfy.fix_text`, HTML-unescape, whitespace
    collapse, lowercase), split with open_clip's regex, each piece byte-pair encoded (in
    Python: no TensorFlow is imported), then wrapped in `<|startoftext|>` / `<|endoftext|>`.
    Over-long texts are truncated to `sequence_length` with the end token kept last; shorter ones are
    padded with `pad_value`. As in open_clip, the literal strings `<start_of_text>` and
    `<end_of_text>` inside a text become the start and end ids. `detokenize` gives
    the cleaned (lowercased) text, as open_clip's `decode` does, outer spaces
    stripped.

    Args:
        vocabulary: path to `vocabulary.json` or a dict `{token: id}`. May be `None`
            (e.g. in `from_config`); then call `load_assets(directory)` before use.
        merges: path to `merges.txt` or a list of `"a b"` merge rules (a
            `#version` header line is ignored).
        sequence_length: int, output length `T` (77 for CLIP).
        pad_value: int id written after the end token (open_clip pads with 0).
        vocabulary_file, merges_file: file names used by `save_assets` /
            `load_assets` (recorded in the config instead of the vocabulary).

    Call: `tokenizer(texts, sequence_length=None)` with `texts` a str or a list of
    str (`B` of them; a single str gives `B = 1`). Returns a dict of numpy arrays:
    `"token_ids"` int32 `(B, T)` and `"padding_mask"` bool `(B, T)`, True on the
    start token, the text tokens and the end token.

    Raises:
        ValueError: a non-int `pad_value`, only one of `vocabulary` and `merges`, or a vocabulary
            without CLIP's start and end tokens.

    Example:
    >>> tok = CLIPTokenizer("presets/_assets/clip_bpe/vocabulary.json",
    ...                     "presets/_assets/clip_bpe/merges.txt")  # doctest: +SKIP
    >>> out = tok(["a photo of a cat"])  # doctest: +SKIP
    >>> out["token_ids"][0, :7].tolist()  # doctest: +SKIP
    [49406, 320, 1125, 539, 320, 2368, 49407]
    >>> tok.detokenize(out["token_ids"])  # doctest: +SKIP
    ['a photo of a cat']
    """

    START_TOKEN = "<|startoftext|>"
    END_TOKEN = "<|endoftext|>"
    start_token, end_token = START_TOKEN, END_TOKEN  # fixed, not arguments
    _CONFIG_KEYS = ("sequence_length", "pad_value", "vocabulary_file", "merges_file")
    _ASSET_FILES = ("vocabulary_file", "merges_file")
    _VOCABULARY_ARGS = ("vocabulary", "merges")
    _REPR_KEYS = ("pad_value",)

    def __init__(
        self,
        vocabulary=None,
        merges=None,
        sequence_length=77,
        pad_value=0,
        vocabulary_file="vocabulary.json",
        merges_file="merges.txt",
    ):
        super().__init__(sequence_length)
        if isinstance(pad_value, bool) or not isinstance(pad_value, (int, np.integer)):
            raise ValueError(f"`pad_value` must be an int; received {pad_value!r}.")
        self.pad_value = int(pad_value)
        self.vocabulary_file = vocabulary_file
        self.merges_file = merges_file
        self._merges = None
        self._cache = {}
        if (vocabulary is None) != (merges is None):
            raise ValueError(
                "Pass both `vocabulary` and `merges`, or neither (then call "
                "`load_assets(directory)`)."
            )
        if vocabulary is not None:
            self.set_vocabulary_and_merges(vocabulary, merges)

    # -- vocabulary --------------------------------------------------------------------
    def set_vocabulary_and_merges(self, vocabulary, merges):
        vocabulary = _load_vocabulary(vocabulary)
        merges = _load_merges(merges)
        for token in (self.START_TOKEN, self.END_TOKEN):
            if token not in vocabulary:
                raise ValueError(
                    f"The CLIP vocabulary has no {token!r} token; got a vocabulary "
                    f"of {len(vocabulary)} tokens."
                )
        self._vocabulary = self._token_to_id = vocabulary
        self._id_to_token = {v: k for k, v in vocabulary.items()}
        self._merges = merges
        self._encoder = None
        self._cache = {}

    _set_assets = set_vocabulary_and_merges

    @property
    def pad_token_id(self):
        return self.pad_value

    # -- tokenization ------------------------------------------------------------------
    def _build_backend(self):
        return _BytePairEncoder(self._vocabulary, self._merges, self.end_token_id)

    def _encode_batch(self, texts):
        self._check_ready()
        pattern = _clip_split_pattern()
        start, end = self.start_token_id, self.end_token_id
        # Split every text into open_clip's pre-tokens and byte-pair encode each one not met
        # before (each pre-token is one BPE word).
        split = [pattern.findall(clip_clean_text(t)) for t in texts]
        if len(self._cache) > 200_000:
            self._cache = {}
        encode = self._backend()
        for pieces in split:
            for p in pieces:
                if p not in self._cache and p not in ("<start_of_text>", "<end_of_text>"):
                    self._cache[p] = encode(p)
        out = []
        for pieces in split:
            ids = []
            for p in pieces:
                if p == "<start_of_text>":
                    ids.append(start)
                elif p == "<end_of_text>":
                    ids.append(end)
                else:
                    ids.extend(self._cache[p])
            out.append(ids)
        return out

    def _decode(self, ids):
        """Byte-level BPE tokens back to text; `</w>` ends a word."""
        byte_decoder = _byte_decoder()
        text = "".join(self._id_to_token.get(i, "") for i in ids)
        data = bytearray(byte_decoder[c] for c in text if c in byte_decoder)
        return data.decode("utf-8", errors="replace").replace("</w>", " ").strip()

    # -- serialisation -----------------------------------------------------------------
    def _asset_contents(self):
        self._check_ready()
        vocabulary = json.dumps(
            self._vocabulary, ensure_ascii=False, separators=(",", ":")
        )
        merges = "#version: 0.2\n" + "\n".join(self._merges) + "\n"
        return vocabulary, merges
