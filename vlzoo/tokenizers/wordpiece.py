"""BERT WordPiece tokenizer (STAIR's), backed by keras_hub's."""

from __future__ import annotations

import os
import unicodedata

import keras

from vlzoo.tokenizers._base import _read_asset_file
from vlzoo.tokenizers._base import parse_once
from vlzoo.tokenizers._base import _VocabularyTokenizer


def _load_wordpiece_vocabulary(vocabulary):
    if isinstance(vocabulary, (str, os.PathLike)):
        text = _read_asset_file(
            vocabulary,
            "WordPiece vocabulary",
            "Generate the bundled BERT uncased one with "
            "`python tools/build_wordpiece_assets.py` or pass a list.",
        )
        return list(parse_once(_wordpiece_vocabulary_from_text, text))
    return _checked_wordpiece_vocabulary(vocabulary)


def _wordpiece_vocabulary_from_text(text):
    vocabulary = text.split("\n")
    if vocabulary and vocabulary[-1] == "":
        vocabulary = vocabulary[:-1]
    return _checked_wordpiece_vocabulary(vocabulary)


def _checked_wordpiece_vocabulary(vocabulary):
    if not isinstance(vocabulary, (list, tuple)) or not all(isinstance(t, str) for t in vocabulary):
        raise TypeError(
            "`vocabulary` must be a path to a text file (one token per line) or a list of "
            f"str; received {type(vocabulary).__name__}."
        )
    if len(set(vocabulary)) != len(vocabulary):
        raise ValueError("The WordPiece `vocabulary` has repeated tokens.")
    return list(vocabulary)


@keras.saving.register_keras_serializable(package="vlzoo")
class WordPieceTokenizer(_VocabularyTokenizer):
    """BERT WordPiece tokenizer (STAIR's, bert-base-uncased by default).

    The text is lowercased (`str.lower`) and stripped of accents (NFD, then
    combining marks dropped) in Python, as BERT's basic tokenizer does (no
    NFKC folding, so e.g. "½" stays one character), then
    `keras_hub.tokenizers.WordPieceTokenizer` splits on whitespace,
    punctuation and CJK characters and applies greedy longest-match
    WordPiece with `##` continuations; out-of-vocabulary words become
    `[UNK]`. The ids are wrapped in `[CLS]` ... `[SEP]` and padded with
    `[PAD]` by `keras_hub.layers.StartEndPacker`; over-long texts are
    truncated with `[SEP]` kept last. With the bundled
    `presets/_assets/bert_uncased/vocab.txt` the ids equal Hugging Face's
    `BertTokenizer(do_lower_case=True)`. `detokenize` glues word pieces back
    (`"un ##aff ##able"` -> `"unaffable"`) and joins words with one space.

    Args:
        vocabulary: path to `vocab.txt` (one token per line, line `i` = id `i`)
            or a list of tokens. May be `None` (e.g. in `from_config`); then call
            `load_assets(directory)` before use.
        sequence_length: output length `T` (76 for STAIR).
        lowercase: lowercase the text (True for an uncased vocabulary).
        strip_accents: drop combining accents after NFD (True, as BERT uncased).
        start_token, end_token, pad_token, oov_token: special tokens of the
            vocabulary (`[CLS]`, `[SEP]`, `[PAD]`, `[UNK]`).
        vocabulary_file: file name used by `save_assets` / `load_assets`.

    Call: `tokenizer(texts, sequence_length=None)` -> `{"token_ids": int32 (B, T),
    "padding_mask": bool (B, T)}`, True on `[CLS]`, the word pieces and `[SEP]`.

    Raises:
        ValueError: a special token missing from the vocabulary.

    Example:
    >>> tok = WordPieceTokenizer.from_assets("presets/_assets/bert_uncased")  # doctest: +SKIP
    >>> tok(["a photo of a cat"])["token_ids"][0, :7].tolist()  # doctest: +SKIP
    [101, 1037, 6302, 1997, 1037, 4937, 102]
    >>> tok.detokenize(tok(["a photo of a cat"])["token_ids"])  # doctest: +SKIP
    ['a photo of a cat']
    """

    _CONFIG_KEYS = (
        "sequence_length",
        "lowercase",
        "strip_accents",
        "start_token",
        "end_token",
        "pad_token",
        "oov_token",
        "vocabulary_file",
    )
    _ASSET_FILES = ("vocabulary_file",)

    def __init__(
        self,
        vocabulary=None,
        sequence_length=76,
        lowercase=True,
        strip_accents=True,
        start_token="[CLS]",
        end_token="[SEP]",
        pad_token="[PAD]",
        oov_token="[UNK]",
        vocabulary_file="vocab.txt",
    ):
        super().__init__(sequence_length)
        self.lowercase = bool(lowercase)
        self.strip_accents = bool(strip_accents)
        self.start_token = start_token
        self.end_token = end_token
        self.pad_token = pad_token
        self.oov_token = oov_token
        self.vocabulary_file = vocabulary_file
        if vocabulary is not None:
            self.set_vocabulary(vocabulary)

    def set_vocabulary(self, vocabulary):
        vocabulary = _load_wordpiece_vocabulary(vocabulary)
        for name in ("start_token", "end_token", "pad_token", "oov_token"):
            if getattr(self, name) not in vocabulary:
                raise ValueError(
                    f"`{name}`={getattr(self, name)!r} is not in the WordPiece vocabulary "
                    f"({len(vocabulary)} tokens)."
                )
        self._vocabulary = self._id_to_token = vocabulary
        self._token_to_id = {token: i for i, token in enumerate(vocabulary)}
        self._encoder = None

    _set_assets = set_vocabulary

    @property
    def pad_token_id(self):
        return self.token_to_id(self.pad_token)

    def _build_backend(self):
        from keras_hub.tokenizers import WordPieceTokenizer as _KHWordPiece

        return _KHWordPiece(
            vocabulary=self._vocabulary,
            lowercase=False,
            strip_accents=False,
            oov_token=self.oov_token,
        )

    def _clean(self, text):
        if self.lowercase:
            text = text.lower()
        if self.strip_accents:
            text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
        return text

    def _decode(self, ids):
        """Word pieces glued back, words joined by one space."""
        return " ".join(self._id_to_token[i] for i in ids).replace(" ##", "")

    def _asset_contents(self):
        self._check_ready()
        return ("\n".join(self._vocabulary) + "\n",)

