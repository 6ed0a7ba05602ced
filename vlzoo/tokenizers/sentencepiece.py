"""SentencePiece tokenizer (e.g. SigLIP's), backed by keras_hub's, with the text
cleanings of big_vision / open_clip and of keras-hub's SigLIP preprocessor."""

from __future__ import annotations

import os
import re
import string

import keras
import numpy as np

from vlzoo._arrays import to_numpy
from vlzoo.tokenizers._base import _PackingTokenizer
from vlzoo.tokenizers._base import _read_asset_file


def _canonicalize_punctuation(text):
    """big_vision / open_clip "canonicalize" cleaning: drop ASCII punctuation,
    `_` -> space, lowercase, collapse whitespace."""
    text = text.replace("_", " ")
    text = text.translate(str.maketrans("", "", string.punctuation))
    return " ".join(text.lower().split()).strip()


# keras-hub's SigLIPPreprocessor cleaning (`canonicalize_text=True`) runs TensorFlow string ops:
# `tf.strings.lower` lowercases ASCII letters only, its punctuation pattern is the 32 ASCII
# punctuation characters (`_` deleted, not made a space), `\s+` in RE2 is ASCII whitespace.
_KERAS_HUB_CLEAN = str.maketrans(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
)


def _keras_hub_canonicalize(text):
    """keras-hub SigLIP's cleaning: ASCII lowercase, ASCII punctuation deleted, ASCII whitespace collapsed."""
    return re.sub(r"[\t\n\f\r ]+", " ", text.translate(_KERAS_HUB_CLEAN)).strip(" \t\n\v\f\r")


@keras.saving.register_keras_serializable(package="vlzoo")
class SentencePieceTokenizer(_PackingTokenizer):
    """SentencePiece tokenizer (e.g. SigLIP's) with the `CLIPTokenizer` contract.

    Wraps `keras_hub.tokenizers.SentencePieceTokenizer(proto=...)`. vlzoo does not
    ship any SentencePiece model (SigLIP's 32k `spiece.model` is not redistributable
    offline here); supply the file yourself.

    Args:
        proto: path to a `.model` file, or its serialised bytes. May be `None` (e.g.
            in `from_config`); then call `load_assets(directory)` before use.
        sequence_length: output length `T` (64 for SigLIP).
        start_token: piece put first, or `None` for no start token (SigLIP).
        end_token: piece put last (kept on truncation), e.g. `"</s>"`.
        pad_value: id used after the end token; `None` means the end token's id
            (SigLIP pads with `</s>`).
        clean: `"none"`, `"lower"` (lowercase + collapse whitespace) or
            `"canonicalize"` (also strip ASCII punctuation; open_clip's SigLIP
            setting) or `"keras_hub"` (keras-hub's SigLIP preprocessor: ASCII
            letters lowercased, ASCII punctuation deleted, `_` included).
        proto_file: file name used by `save_assets` / `load_assets`.

    Call returns `{"token_ids": int32 (B, T), "padding_mask": bool (B, T)}`.

    Raises:
        ValueError: an unknown `clean`, or special pieces missing from the vocabulary.
        TypeError: `proto` neither a path nor bytes.
        RuntimeError: tokenizing or saving before a model is set.

    Example:
    >>> tok = SentencePieceTokenizer(proto="spiece.model", sequence_length=64)  # doctest: +SKIP
    >>> tok(["a photo of a cat"])["token_ids"].shape  # doctest: +SKIP
    (1, 64)
    """

    _CONFIG_KEYS = (
        "sequence_length",
        "start_token",
        "end_token",
        "pad_value",
        "clean",
        "proto_file",
    )
    _ASSET_FILES = ("proto_file",)

    def __init__(
        self,
        proto=None,
        sequence_length=64,
        start_token=None,
        end_token="</s>",
        pad_value=None,
        clean="canonicalize",
        proto_file="spiece.model",
    ):
        super().__init__(sequence_length)
        if clean not in ("none", "lower", "canonicalize", "keras_hub"):
            raise ValueError(
                "`clean` must be 'none', 'lower', 'canonicalize' or 'keras_hub'; "
                f"received {clean!r}."
            )
        self.start_token = start_token
        self.end_token = end_token
        self.pad_value = None if pad_value is None else int(pad_value)
        self.clean = clean
        self.proto_file = proto_file
        self._proto = None
        if proto is not None:
            self.set_proto(proto)

    def set_proto(self, proto):
        if isinstance(proto, (str, os.PathLike)):
            proto = _read_asset_file(
                proto,
                "SentencePiece model",
                "vlzoo does not ship SentencePiece vocabularies (e.g. SigLIP's 32k "
                "`spiece.model`, from the HF repo google/siglip-base-patch16-224 or "
                "big_vision). Download it where you have network access and pass "
                "`proto=<path>`, or copy it to that path "
                f"(`{self.proto_file}` in the preset's assets/tokenizer dir).",
                binary=True,
            )
        if not isinstance(proto, (bytes, bytearray)):
            raise TypeError(
                "`proto` must be a file path or the model's bytes; received "
                f"{type(proto).__name__}."
            )
        self._proto = bytes(proto)
        self._encoder = None
        for name in ("start_token", "end_token"):
            piece = getattr(self, name)
            if piece is not None:
                try:
                    self.token_to_id(piece)
                except ValueError:
                    raise ValueError(
                        f"`{name}`={piece!r} is not in the SentencePiece vocabulary."
                    ) from None

    _set_assets = set_proto

    def _check_ready(self):
        if self._proto is None:
            raise RuntimeError(
                "This SentencePieceTokenizer has no model yet: pass `proto` or call "
                "`load_assets(directory)`."
            )

    def _build_backend(self):
        from keras_hub.tokenizers import SentencePieceTokenizer as _KHSP

        return _KHSP(proto=self._proto)

    @property
    def vocabulary_size(self):
        return int(self._backend().vocabulary_size())

    def token_to_id(self, token):
        """The id of the piece `token` (a `ValueError` naming it when the vocabulary lacks it)."""
        self._check_ready()
        tok = self._backend()
        token_id = int(tok.token_to_id(token))
        if _as_str(tok.id_to_token(token_id)) != token:
            raise ValueError(f"{token!r} is not in the SentencePiece vocabulary.")
        return token_id

    @property
    def start_token_id(self):
        return None if self.start_token is None else self.token_to_id(self.start_token)

    @property
    def end_token_id(self):
        return None if self.end_token is None else self.token_to_id(self.end_token)

    @property
    def pad_token_id(self):
        if self.pad_value is not None:
            return self.pad_value
        return self.end_token_id if self.end_token is not None else 0

    def _clean(self, text):
        if self.clean == "canonicalize":
            return _canonicalize_punctuation(text)
        if self.clean == "keras_hub":
            return _keras_hub_canonicalize(text)
        if self.clean == "lower":
            return " ".join(text.lower().split())
        return text

    def _decode(self, ids):
        """keras_hub's SentencePiece detokenization."""
        if not ids:
            return ""
        return _as_str(self._backend().detokenize(np.asarray(ids, np.int32)))

    def _asset_contents(self):
        if self._proto is None:
            raise RuntimeError("No SentencePiece model to save.")
        return (self._proto,)


@keras.saving.register_keras_serializable(package="vlzoo")
class XLMRobertaTokenizer(SentencePieceTokenizer):
    """A SentencePiece model in fairseq's dictionary layout: XLM-R's and XLM-V's (MetaCLIP 2's worldwide
    checkpoints), id for id transformers' `XLMRobertaTokenizer`.

    fairseq puts four special pieces first, `<s>` 0, `<pad>` 1, `</s>` 2, `<unk>` 3, then the model's own
    pieces from its fourth on, each at its SentencePiece id + 1, and `<mask>` last. A text becomes
    `<s> pieces </s>`, truncated to `sequence_length` with `</s>` kept last, padded with `<pad>`.

    Args:
        proto: path to the `sentencepiece.bpe.model` file, or its bytes; `None` until `load_assets`.
        sequence_length: output length `T` (77 for MetaCLIP 2).
        clean: the text cleaning, as `SentencePieceTokenizer`'s (`"none"`: transformers' tokenizer
            cleans nothing; the model's own normaliser still applies).
        proto_file: file name used by `save_assets` / `load_assets`.

    Call returns `{"token_ids": int32 (B, T), "padding_mask": bool (B, T)}`.

    Raises:
        ValueError: an unknown `clean`; on first use, a model whose first three pieces are not
            SentencePiece's `<unk>`, `<s>` and `</s>`.

    Example:
    >>> tok = XLMRobertaTokenizer(proto="sentencepiece.bpe.model", sequence_length=77)  # doctest: +SKIP
    >>> tok(["a photo of a cat", "一只猫的照片"])["token_ids"][:, 0]  # doctest: +SKIP
    array([0, 0], dtype=int32)
    """

    _CONFIG_KEYS = ("sequence_length", "clean", "proto_file")
    SPECIAL_PIECES = ("<s>", "<pad>", "</s>", "<unk>")
    MASK_PIECE = "<mask>"

    def __init__(self, proto=None, sequence_length=77, clean="none", proto_file="sentencepiece.bpe.model"):
        super().__init__(proto, sequence_length=sequence_length, start_token="<s>", end_token="</s>", pad_value=1,
                         clean=clean, proto_file=proto_file)

    def _build_backend(self):
        backend = super()._build_backend()
        first = [_as_str(backend.id_to_token(i)) for i in range(3)]
        if first != ["<unk>", "<s>", "</s>"]:
            raise ValueError(
                "An XLM-R layout SentencePiece model has `<unk>`, `<s>` and `</s>` as its first three pieces; "
                f"this one has {first}."
            )
        return backend

    @property
    def vocabulary_size(self):
        """The four special pieces, the model's pieces from its fourth on, and `<mask>`."""
        return int(self._backend().vocabulary_size()) + 2

    def token_to_id(self, token):
        """The fairseq id of the piece `token` (a `ValueError` naming it when the vocabulary lacks it)."""
        if token in self.SPECIAL_PIECES:
            return self.SPECIAL_PIECES.index(token)
        if token == self.MASK_PIECE:
            return self.vocabulary_size - 1
        return super().token_to_id(token) + 1

    def _encode_batch(self, texts):
        # SentencePiece's `<unk>` (0) is fairseq's 3; every other piece moves up by one.
        return [[i + 1 if i else 3 for i in row] for row in super()._encode_batch(texts)]

    def _decode(self, ids):
        mask = self.vocabulary_size - 1
        return super()._decode([0 if i == 3 else i - 1 for i in ids if 3 <= i < mask])


def _as_str(x):
    x = to_numpy(x) if not isinstance(x, (str, bytes)) else x
    if isinstance(x, np.ndarray):
        x = x.item()
    return x.decode("utf-8") if isinstance(x, bytes) else str(x)

