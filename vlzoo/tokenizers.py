"""Text tokenizers and image preprocessing for vlzoo models.

Everything here is backend-neutral: inputs may be Python strings, numpy arrays or any
backend tensor, and outputs are always numpy arrays, so the same preprocessing feeds a
model on JAX, TensorFlow or PyTorch. These classes run eagerly in Python (they are not
`tf.data` graph ops); use them in a Python input pipeline or before `model.predict`.

- `CLIPTokenizer`: OpenAI CLIP byte-pair encoding (49,408 tokens), id-for-id identical
  to open_clip's `SimpleTokenizer` (with `ftfy` installed), backed by
  `keras_hub.models.CLIPTokenizer` and `keras_hub.layers.StartEndPacker`.
- `SentencePieceTokenizer`: a SentencePiece model (e.g. SigLIP's), backed by
  `keras_hub.tokenizers.SentencePieceTokenizer`. No SentencePiece model is shipped.
- `WordPieceTokenizer`: BERT WordPiece (STAIR's bert-base-uncased vocabulary, 30,522
  tokens, bundled), backed by `keras_hub.tokenizers.WordPieceTokenizer`.
- `tokenizer_from_config(config, assets_dir)`: rebuild a tokenizer from a serialised
  config plus the directory holding its asset files (what preset loading calls).
- `ImagePreprocessor`: resize (shortest side, bicubic) + centre crop + normalise, as
  open_clip's inference transform.

Example:

```python
tok = CLIPTokenizer.from_assets("presets/_assets/clip_bpe")
out = tok(["a photo of a cat", "a dog"])
out["token_ids"].shape      # (2, 77) int32
out["padding_mask"].shape   # (2, 77) bool

pre = ImagePreprocessor(image_size=224)
pre(np.zeros((480, 640, 3), np.uint8)).shape   # (1, 224, 224, 3) float32
```

`keras_hub` (which imports TensorFlow) is imported lazily, on a tokenizer's first call.
"""

from __future__ import annotations

import functools
import html
import json
import os
import re
import unicodedata
import warnings

import keras
import numpy as np

__all__ = [
    "CLIPTokenizer",
    "SentencePieceTokenizer",
    "WordPieceTokenizer",
    "ImagePreprocessor",
    "tokenizer_from_config",
    "TOKENIZER_CLASSES",
    "CLIP_MEAN",
    "CLIP_STD",
    "SIGLIP_MEAN",
    "SIGLIP_STD",
]

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
SIGLIP_MEAN = (0.5, 0.5, 0.5)
SIGLIP_STD = (0.5, 0.5, 0.5)


# --------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------


def _to_numpy(x):
    """Any backend tensor (or array-like) -> numpy, without importing a backend."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch
        return x.detach().cpu().numpy()
    if hasattr(x, "numpy") and callable(x.numpy):  # tf eager
        return np.asarray(x.numpy())
    return np.asarray(x)  # jax arrays, lists, scalars


def _canonicalize_texts(texts):
    """Returns (list of str, batched flag). Raises TypeError naming `texts`."""
    if isinstance(texts, bytes):
        return [texts.decode("utf-8")], False
    if isinstance(texts, str):
        return [texts], False
    if isinstance(texts, np.ndarray) or hasattr(texts, "numpy") or hasattr(
        texts, "detach"
    ):
        arr = _to_numpy(texts)
        if arr.dtype.kind not in ("U", "S", "O"):
            raise TypeError(
                "`texts` must be a str or a sequence of str; received an array of "
                f"dtype {arr.dtype} with shape {arr.shape}."
            )
        if arr.ndim == 0:
            return _canonicalize_texts(arr.item())[0], False
        if arr.ndim != 1:
            raise TypeError(
                "`texts` must be a str or a 1-D sequence of str; received an array "
                f"with shape {arr.shape}."
            )
        texts = arr.tolist()
    if not isinstance(texts, (list, tuple)):
        raise TypeError(
            "`texts` must be a str or a list of str; received an object of type "
            f"{type(texts).__name__}."
        )
    out = []
    for i, t in enumerate(texts):
        if isinstance(t, bytes):
            t = t.decode("utf-8")
        if not isinstance(t, str):
            raise TypeError(
                "`texts` must be a str or a list of str; element "
                f"{i} has type {type(t).__name__} ({t!r:.50})."
            )
        out.append(t)
    return out, True


@functools.lru_cache(maxsize=32)
def _packer(sequence_length, start_value, end_value, pad_value):
    from keras_hub.layers import StartEndPacker

    return StartEndPacker(
        sequence_length=sequence_length,
        start_value=start_value,
        end_value=end_value,
        pad_value=pad_value,
        return_padding_mask=True,
    )


def _pack(sequences, sequence_length, start_value, end_value, pad_value):
    """Add start/end, truncate (end kept), pad, via keras_hub's StartEndPacker.

    Returns int32 ids (B, T) and a bool mask (B, T) (True = start, token or end).
    """
    batch = len(sequences)
    if batch == 0:
        return (
            np.zeros((0, sequence_length), np.int32),
            np.zeros((0, sequence_length), bool),
        )
    packer = _packer(sequence_length, start_value, end_value, pad_value)
    ids, mask = packer([list(map(int, s)) for s in sequences])
    ids = np.asarray(keras.ops.convert_to_numpy(ids)).astype(np.int32)
    mask = np.asarray(keras.ops.convert_to_numpy(mask)).astype(bool)
    return ids.reshape(batch, sequence_length), mask.reshape(batch, sequence_length)


def _check_sequence_length(sequence_length):
    if (
        isinstance(sequence_length, bool)
        or not isinstance(sequence_length, (int, np.integer))
        or sequence_length < 2
    ):
        raise ValueError(
            "`sequence_length` must be an int >= 2 (room for the start and end "
            f"tokens); received {sequence_length!r}."
        )
    return int(sequence_length)


def _read_asset_file(path, what, hint, binary=False):
    """Contents of the asset file `path` (str, or bytes if `binary`).

    Raises FileNotFoundError "`what` file not found: `path`. `hint`" when `path` is
    not a file.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{what} file not found: {path!r}. {hint}")
    with open(path, "rb" if binary else "r", encoding=None if binary else "utf-8") as f:
        return f.read()


# --------------------------------------------------------------------------------------
# CLIP BPE
# --------------------------------------------------------------------------------------

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
def _byte_decoder():
    """The inverse of `bytes_to_unicode()`: printable unicode -> byte."""
    return {v: k for k, v in bytes_to_unicode().items()}


def _load_vocabulary(vocabulary):
    if isinstance(vocabulary, (str, os.PathLike)):
        text = _read_asset_file(
            vocabulary,
            "CLIP BPE vocabulary",
            "Generate it with `python tools/build_clip_bpe_assets.py` or pass a dict.",
        )
        vocabulary = json.loads(text)
    if not isinstance(vocabulary, dict):
        raise TypeError(
            "`vocabulary` must be a path to a json file or a dict {token: id}; "
            f"received {type(vocabulary).__name__}."
        )
    return {str(k): int(v) for k, v in vocabulary.items()}


def _load_merges(merges):
    if isinstance(merges, (str, os.PathLike)):
        merges = _read_asset_file(
            merges,
            "CLIP BPE merges",
            "Generate it with `python tools/build_clip_bpe_assets.py` or pass a list.",
        ).split("\n")
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


class _PackingTokenizer:
    """What vlzoo's tokenizers share: the call contract, encoding through a lazily
    built keras_hub tokenizer, detokenization, the config and the asset files.

    A subclass sets `_CONFIG_KEYS` (the `get_config()` keys, in order: constructor
    arguments kept as attributes of the same name) and `_ASSET_FILES` (those of the
    keys that name its asset files), and provides:

    - `_check_ready()`, raising until the assets are loaded;
    - `_set_assets(*paths)`, loading the asset files, given in `_ASSET_FILES` order;
    - `_asset_contents()`, those files' contents (str or bytes), in the same order;
    - `_build_backend()`, the keras_hub tokenizer (a subclass resets
      `_keras_hub_tokenizer` to `None` when its assets change);
    - `_clean(text)`, applied before the keras_hub tokenizer, or an own
      `_encode_batch(texts)` (ids without start/end tokens, one list per text);
    - `_decode(ids)`, the text of a row of ids without start/end tokens;
    - the `start_token_id`, `end_token_id` and `pad_token_id` properties.
    """

    _CONFIG_KEYS = ()
    _ASSET_FILES = ()

    def __init__(self, sequence_length):
        self.sequence_length = _check_sequence_length(sequence_length)
        self._keras_hub_tokenizer = None

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def get_config(self):
        return {key: getattr(self, key) for key in self._CONFIG_KEYS}

    def save_assets(self, directory):
        """Write the asset files (named by the `*_file` config keys) to `directory`."""
        contents = self._asset_contents()
        os.makedirs(directory, exist_ok=True)
        for key, content in zip(self._ASSET_FILES, contents):
            binary = isinstance(content, bytes)
            with open(
                os.path.join(directory, getattr(self, key)),
                "wb" if binary else "w",
                encoding=None if binary else "utf-8",
            ) as f:
                f.write(content)

    def load_assets(self, directory):
        """Read the asset files (named by the `*_file` config keys) from `directory`."""
        self._set_assets(
            *(os.path.join(directory, getattr(self, key)) for key in self._ASSET_FILES)
        )
        return self

    @classmethod
    def from_assets(cls, directory, **kwargs):
        """`cls(**kwargs)` then `load_assets(directory)`."""
        return cls(**kwargs).load_assets(directory)

    def _backend(self):
        """The keras_hub tokenizer, built by `_build_backend()` on first use."""
        if self._keras_hub_tokenizer is None:
            self._check_ready()
            self._keras_hub_tokenizer = self._build_backend()
        return self._keras_hub_tokenizer

    def encode(self, text):
        """Ids of one string, without start/end tokens (list of int)."""
        return self._encode_batch([text])[0]

    def _encode_batch(self, texts):
        self._check_ready()
        if not texts:
            return []
        encoded = self._backend().tokenize([self._clean(t) for t in texts])
        return [[int(i) for i in _to_numpy(row).reshape(-1)] for row in encoded]

    def __call__(self, texts, sequence_length=None):
        """Tokenize, add start/end, truncate and pad.

        Args:
            texts: str or list of str (also a 1-D numpy/tensor array of strings).
            sequence_length: optional override of `self.sequence_length`.

        Returns:
            dict with `"token_ids"` (np.int32, `(B, T)`) and `"padding_mask"`
            (np.bool_, `(B, T)`).
        """
        texts, _ = _canonicalize_texts(texts)
        self._check_ready()
        length = (
            self.sequence_length
            if sequence_length is None
            else _check_sequence_length(sequence_length)
        )
        ids, mask = _pack(
            self._encode_batch(texts),
            length,
            self.start_token_id,
            self.end_token_id,
            self.pad_token_id,
        )
        return {"token_ids": ids, "padding_mask": mask}

    def detokenize(self, token_ids):
        """Ids `(B, T)` or `(T,)` -> list of `B` strings (or one str).

        Each row stops at its first end token and drops start tokens; the ids in
        between are decoded as the tokenizer's class describes.
        """
        self._check_ready()
        arr = _to_numpy(token_ids)
        single = arr.ndim == 1
        arr = np.atleast_2d(arr)
        if arr.ndim != 2:
            raise ValueError(
                f"`token_ids` must have shape (B, T) or (T,); received {arr.shape}."
            )
        start, end = self.start_token_id, self.end_token_id
        out = []
        for row in arr.tolist():
            ids = []
            for i in row:
                if i == end:
                    break
                if i != start:
                    ids.append(int(i))
            out.append(self._decode(ids))
        return out[0] if single else out


class _VocabularyTokenizer(_PackingTokenizer):
    """A `_PackingTokenizer` whose vocabulary is held in Python.

    A subclass's vocabulary setter assigns `_vocabulary` (in the form the
    constructor takes: a dict `{token: id}` or a list of tokens), `_token_to_id` (a
    dict) and `_id_to_token` (a dict, or the token list). The subclass has
    `start_token` and `end_token` (the special tokens' strings) and may override
    `_VOCABULARY_ARGS` (the constructor arguments that supply the vocabulary, named
    in the error raised while it is missing) and `_REPR_KEYS` (attributes that
    `repr` shows after the vocabulary size and sequence length).
    """

    _VOCABULARY_ARGS = ("vocabulary",)
    _REPR_KEYS = ()

    def __init__(self, sequence_length):
        super().__init__(sequence_length)
        self._vocabulary = None
        self._token_to_id = None
        self._id_to_token = None

    def _check_ready(self):
        if self._vocabulary is None:
            args = " and ".join(f"`{arg}`" for arg in self._VOCABULARY_ARGS)
            raise RuntimeError(
                f"This {type(self).__name__} has no vocabulary yet: pass {args} to "
                "the constructor or call `load_assets(directory)`."
            )

    @property
    def vocabulary(self):
        self._check_ready()
        return self._vocabulary.copy()

    @property
    def vocabulary_size(self):
        self._check_ready()
        return len(self._vocabulary)

    @property
    def start_token_id(self):
        return self.token_to_id(self.start_token)

    @property
    def end_token_id(self):
        return self.token_to_id(self.end_token)

    def token_to_id(self, token):
        self._check_ready()
        return self._token_to_id[token]

    def id_to_token(self, token_id):
        self._check_ready()
        return self._id_to_token[int(token_id)]

    def __repr__(self):
        size = len(self._vocabulary) if self._vocabulary is not None else None
        extra = "".join(f", {key}={getattr(self, key)}" for key in self._REPR_KEYS)
        return (
            f"{type(self).__name__}(vocabulary_size={size}, "
            f"sequence_length={self.sequence_length}{extra})"
        )


@keras.saving.register_keras_serializable(package="vlzoo")
class CLIPTokenizer(_VocabularyTokenizer):
    """OpenAI CLIP byte-pair-encoding tokenizer (lowercased, `ftfy`-cleaned).

    Gives exactly the ids of open_clip's `SimpleTokenizer()(texts, context_length)`:
    the text is cleaned as open_clip does (`ftfy.fix_text`, HTML-unescape, whitespace
    collapse, lowercase), split with open_clip's regex, byte-pair encoded by
    `keras_hub.models.CLIPTokenizer`, then wrapped in `<|startoftext|>` /
    `<|endoftext|>` by `keras_hub.layers.StartEndPacker`. Over-long texts are
    truncated to `sequence_length` with the end token kept last; shorter ones are
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

    Example:

    ```python
    tok = CLIPTokenizer("presets/_assets/clip_bpe/vocabulary.json",
                        "presets/_assets/clip_bpe/merges.txt")
    out = tok(["a photo of a cat"])
    out["token_ids"][0, :7]   # [49406, 320, 1125, 539, 320, 2368, 49407]
    tok.detokenize(out["token_ids"])   # ["a photo of a cat"]
    ```
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
        self._keras_hub_tokenizer = None
        self._cache = {}

    _set_assets = set_vocabulary_and_merges

    @property
    def pad_token_id(self):
        return self.pad_value

    # -- tokenization ------------------------------------------------------------------
    def _build_backend(self):
        from keras_hub.models import CLIPTokenizer as _KHCLIPTokenizer

        return _KHCLIPTokenizer(vocabulary=self._vocabulary, merges=self._merges)

    def _encode_batch(self, texts):
        self._check_ready()
        pattern = _clip_split_pattern()
        start, end = self.start_token_id, self.end_token_id
        # Split every text into open_clip's pre-tokens; encode the unseen ones in a
        # single keras_hub call (each pre-token is one BPE word).
        split = [pattern.findall(clip_clean_text(t)) for t in texts]
        unseen = sorted(
            {
                p
                for pieces in split
                for p in pieces
                if p not in self._cache
                and p not in ("<start_of_text>", "<end_of_text>")
            }
        )
        if unseen:
            encoded = self._backend().tokenize(unseen)
            for piece, ids in zip(unseen, encoded):
                self._cache[piece] = [int(i) for i in _to_numpy(ids).reshape(-1)]
            if len(self._cache) > 200_000:
                self._cache = {}
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


# --------------------------------------------------------------------------------------
# SentencePiece
# --------------------------------------------------------------------------------------


def _canonicalize_punctuation(text):
    """big_vision / open_clip "canonicalize" cleaning: drop ASCII punctuation,
    `_` -> space, lowercase, collapse whitespace."""
    import string

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
        self._keras_hub_tokenizer = None
        tok = self._backend()
        for name in ("start_token", "end_token"):
            piece = getattr(self, name)
            if piece is not None and _as_str(
                tok.id_to_token(tok.token_to_id(piece))
            ) != piece:
                raise ValueError(
                    f"`{name}`={piece!r} is not in the SentencePiece vocabulary."
                )

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

    @property
    def start_token_id(self):
        if self.start_token is None:
            return None
        return int(self._backend().token_to_id(self.start_token))

    @property
    def end_token_id(self):
        if self.end_token is None:
            return None
        return int(self._backend().token_to_id(self.end_token))

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


def _as_str(x):
    x = _to_numpy(x) if not isinstance(x, (str, bytes)) else x
    if isinstance(x, np.ndarray):
        x = x.item()
    return x.decode("utf-8") if isinstance(x, bytes) else str(x)


# --------------------------------------------------------------------------------------
# WordPiece (BERT)
# --------------------------------------------------------------------------------------


def _load_wordpiece_vocabulary(vocabulary):
    if isinstance(vocabulary, (str, os.PathLike)):
        vocabulary = _read_asset_file(
            vocabulary,
            "WordPiece vocabulary",
            "Generate the bundled BERT uncased one with "
            "`python tools/build_wordpiece_assets.py` or pass a list.",
        ).split("\n")
        if vocabulary and vocabulary[-1] == "":
            vocabulary = vocabulary[:-1]
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

    Example:

    ```python
    tok = WordPieceTokenizer.from_assets("presets/_assets/bert_uncased")
    tok(["a photo of a cat"])["token_ids"][0, :7]   # [101, 1037, 6302, 1997, 1037, 4937, 102]
    tok.detokenize(tok(["a photo of a cat"])["token_ids"])   # ["a photo of a cat"]
    ```
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
        self._keras_hub_tokenizer = None

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


# --------------------------------------------------------------------------------------
# Config -> tokenizer
# --------------------------------------------------------------------------------------

# Keys accepted in a config's "class_name" (or "type").
TOKENIZER_CLASSES = {
    "CLIPTokenizer": CLIPTokenizer,
    "vlzoo>CLIPTokenizer": CLIPTokenizer,
    "clip_bpe": CLIPTokenizer,
    "SentencePieceTokenizer": SentencePieceTokenizer,
    "vlzoo>SentencePieceTokenizer": SentencePieceTokenizer,
    "sentencepiece": SentencePieceTokenizer,
    "WordPieceTokenizer": WordPieceTokenizer,
    "vlzoo>WordPieceTokenizer": WordPieceTokenizer,
    "wordpiece": WordPieceTokenizer,
}


def tokenizer_from_config(config, assets_dir=None):
    """Build a tokenizer from a serialised config and its assets directory.

    Args:
        config: either `keras.saving.serialize_keras_object(tokenizer)` (a dict with
            `"class_name"` and `"config"`), or a flat dict holding the constructor
            arguments plus a `"class_name"` (or `"type"`) key naming one of
            `TOKENIZER_CLASSES` (e.g. `"CLIPTokenizer"`, `"clip_bpe"`).
        assets_dir: directory with the asset files named in the config (e.g. a
            preset's `assets/tokenizer/` with `vocabulary.json` and `merges.txt`).
            If `None`, the tokenizer is returned without a vocabulary.

    Returns:
        A `CLIPTokenizer`, `SentencePieceTokenizer` or `WordPieceTokenizer`.
    """
    if not isinstance(config, dict):
        raise TypeError(
            f"`config` must be a dict; received {type(config).__name__}."
        )
    if "config" in config and isinstance(config["config"], dict):
        name = config.get("class_name")
        kwargs = dict(config["config"])
    else:
        kwargs = dict(config)
        name = kwargs.pop("class_name", None)
        type_name = kwargs.pop("type", None)
        name = name or type_name
    kwargs.pop("name", None)
    if name not in TOKENIZER_CLASSES:
        raise ValueError(
            f"Unknown tokenizer class {name!r}; expected one of "
            f"{sorted(TOKENIZER_CLASSES)}."
        )
    tokenizer = TOKENIZER_CLASSES[name].from_config(kwargs)
    if assets_dir is not None:
        tokenizer.load_assets(os.fspath(assets_dir))
    return tokenizer


# --------------------------------------------------------------------------------------
# Images
# --------------------------------------------------------------------------------------

_FLOAT_TOLERANCE = 1e-3


@keras.saving.register_keras_serializable(package="vlzoo")
class ImagePreprocessor:
    """Resize, centre-crop and normalise images, as open_clip's inference transform.

    Per image: resize so the shortest side is `image_size` (long side
    `int(image_size * long / short)`, as torchvision), with PIL's antialiased bicubic
    filter; centre crop `image_size x image_size` (offsets rounded as torchvision);
    scale to [0, 1]; subtract `mean` and divide by `std`. With `crop="none"` the
    image is resized straight to `image_size x image_size` (aspect ratio not kept; as
    SigLIP / big_vision). uint8 images go through PIL in RGB mode, exactly like
    open_clip on a PIL image (the resized pixels are rounded to uint8); float images,
    assumed in [0, 1], are resized per channel in PIL's float mode (no rounding to
    uint8; horizontal then vertical pass, each clipped to [0, 1] as PIL clips uint8),
    so they differ from the uint8 path only by uint8 rounding (about one grey level).

    Args:
        image_size: output side `S` (int) or `(height, width)`.
        mean, std: per-channel normalisation (CLIP's by default; SigLIP uses 0.5).
        interpolation: `"bicubic"` or `"bilinear"`.
        crop: `"center"` or `"none"`.

    Call: `pre(images)` with `images` one image `(H, W, 3)`, a batch
    `(B, H, W, 3)`, or a list of images of different sizes (numpy arrays, backend
    tensors or PIL images). uint8 (or integer in [0, 255]) or float in [0, 1].
    Returns float32 numpy `(B, S, S, 3)` (`B = 1` for a single image).

    Example:

    ```python
    pre = ImagePreprocessor(224)
    pre([np.zeros((300, 400, 3), np.uint8), np.ones((50, 60, 3), np.float32)]).shape
    # (2, 224, 224, 3)
    ```
    """

    def __init__(
        self,
        image_size=224,
        mean=CLIP_MEAN,
        std=CLIP_STD,
        interpolation="bicubic",
        crop="center",
    ):
        if isinstance(image_size, (int, np.integer)) and not isinstance(
            image_size, bool
        ):
            size = (int(image_size), int(image_size))
        elif (
            isinstance(image_size, (list, tuple))
            and len(image_size) == 2
            and all(isinstance(s, (int, np.integer)) for s in image_size)
        ):
            size = tuple(int(s) for s in image_size)
        else:
            raise ValueError(
                f"`image_size` must be an int or (height, width); received {image_size!r}."
            )
        if min(size) < 1:
            raise ValueError(f"`image_size` must be positive; received {image_size!r}.")
        self.image_size = size[0] if size[0] == size[1] else size
        self._size = size
        self.mean = tuple(float(m) for m in mean)
        self.std = tuple(float(s) for s in std)
        if len(self.mean) != 3 or len(self.std) != 3:
            raise ValueError("`mean` and `std` must have 3 values (RGB).")
        if any(s <= 0 for s in self.std):
            raise ValueError(f"`std` must be positive; received {self.std}.")
        if interpolation not in ("bicubic", "bilinear"):
            raise ValueError(
                "`interpolation` must be 'bicubic' or 'bilinear'; received "
                f"{interpolation!r}."
            )
        if crop not in ("center", "none"):
            raise ValueError(f"`crop` must be 'center' or 'none'; received {crop!r}.")
        self.interpolation = interpolation
        self.crop = crop

    def get_config(self):
        return {
            "image_size": self.image_size
            if isinstance(self.image_size, int)
            else list(self.image_size),
            "mean": list(self.mean),
            "std": list(self.std),
            "interpolation": self.interpolation,
            "crop": self.crop,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __repr__(self):
        return (
            f"ImagePreprocessor(image_size={self.image_size}, mean={self.mean}, "
            f"std={self.std}, interpolation={self.interpolation!r}, crop={self.crop!r})"
        )

    # -- helpers -----------------------------------------------------------------------
    def _images_list(self, images):
        from PIL import Image

        if isinstance(images, Image.Image):
            return [images]
        if isinstance(images, (list, tuple)):
            if len(images) == 0:
                return []
            out = []
            for i, im in enumerate(images):
                if isinstance(im, Image.Image):
                    out.append(im)
                    continue
                arr = _to_numpy(im)
                if arr.ndim != 3:
                    raise ValueError(
                        "`images` given as a list must hold (H, W, 3) images; "
                        f"element {i} has shape {arr.shape}."
                    )
                out.append(arr)
            return out
        arr = _to_numpy(images)
        if arr.ndim == 3:
            return [arr]
        if arr.ndim == 4:
            return list(arr)
        raise ValueError(
            "`images` must be an image (H, W, 3), a batch (B, H, W, 3) or a list of "
            f"images; received shape {arr.shape}."
        )

    def _target_size(self, h, w):
        """(resize_h, resize_w) before cropping."""
        th, tw = self._size
        if self.crop == "none":
            return th, tw
        if th == tw:  # torchvision Resize(int): shortest side
            short, long = (w, h) if w <= h else (h, w)
            new_short, new_long = th, int(th * long / short)
            return (new_long, new_short) if w <= h else (new_short, new_long)
        scale = max(th / h, tw / w)  # cover the target, then crop
        return max(th, round(h * scale)), max(tw, round(w * scale))

    def _one(self, image):
        from PIL import Image

        resample = Image.BICUBIC if self.interpolation == "bicubic" else Image.BILINEAR
        if isinstance(image, Image.Image):
            image = np.asarray(image.convert("RGB"))
        arr = image
        if arr.ndim != 3 or arr.shape[-1] != 3:
            raise ValueError(
                "`images` must have 3 (RGB) channels last: (H, W, 3) per image; "
                f"received an image of shape {arr.shape}."
            )
        h, w = arr.shape[:2]
        if h < 1 or w < 1:
            raise ValueError(f"`images` has an empty image of shape {arr.shape}.")
        rh, rw = self._target_size(h, w)
        kind = arr.dtype.kind
        if kind == "b":
            raise ValueError("`images` must be uint8 or float; received dtype bool.")
        if kind in ("u", "i"):
            if arr.dtype != np.uint8:
                lo, hi = arr.min(), arr.max()
                if lo < 0 or hi > 255:
                    raise ValueError(
                        "Integer `images` must be in [0, 255]; received values in "
                        f"[{lo}, {hi}]."
                    )
                arr = arr.astype(np.uint8)
            pil = Image.fromarray(np.ascontiguousarray(arr), mode="RGB")
            if (rw, rh) != pil.size:
                pil = pil.resize((rw, rh), resample)
            out = np.asarray(pil, dtype=np.float32) / np.float32(255.0)
        elif kind == "f":
            arr = arr.astype(np.float32)
            if not np.all(np.isfinite(arr)):
                raise ValueError("`images` contains non-finite (NaN or inf) pixels.")
            lo, hi = float(arr.min()), float(arr.max())
            if lo < -_FLOAT_TOLERANCE or hi > 1 + _FLOAT_TOLERANCE:
                raise ValueError(
                    "Float `images` must be in [0, 1] (uint8 images may be in "
                    f"[0, 255]); received values in [{lo:.4g}, {hi:.4g}]."
                )
            arr = np.clip(arr, 0.0, 1.0)
            # PIL resamples separably, horizontal pass first; for uint8 images each
            # pass clips to [0, 255]. Do the same passes in float mode with the same
            # clipping (only the uint8 rounding differs).
            for size in ((rw, h), (rw, rh)):
                if size != (arr.shape[1], arr.shape[0]):
                    chans = [
                        np.asarray(
                            Image.fromarray(
                                np.ascontiguousarray(arr[..., c]), mode="F"
                            ).resize(size, resample),
                            dtype=np.float32,
                        )
                        for c in range(3)
                    ]
                    arr = np.clip(np.stack(chans, axis=-1), 0.0, 1.0)
            out = arr
        else:
            raise ValueError(
                f"`images` must be uint8 or float; received dtype {arr.dtype}."
            )
        th, tw = self._size
        if self.crop == "center":
            top = int(round((rh - th) / 2.0))
            left = int(round((rw - tw) / 2.0))
            out = out[top : top + th, left : left + tw]
        mean = np.asarray(self.mean, np.float32)
        std = np.asarray(self.std, np.float32)
        return (out - mean) / std

    def __call__(self, images):
        """Preprocess `images`; returns float32 numpy `(B, S, S, 3)`."""
        items = self._images_list(images)
        th, tw = self._size
        if not items:
            return np.zeros((0, th, tw, 3), np.float32)
        return np.stack([self._one(im) for im in items]).astype(np.float32)


CLIP_BPE = {"class_name": "CLIPTokenizer", "assets": "clip_bpe"}
CLIP_BPE_VOCABULARY_SIZE = 49408
BERT_UNCASED = {"class_name": "WordPieceTokenizer", "assets": "bert_uncased"}
BERT_UNCASED_VOCABULARY_SIZE = 30522
# The 45 words of `vlzoo.data.shapes.vocabulary()` (the `stair_shapes` preset).
SHAPES_WORDS = {"class_name": "WordPieceTokenizer", "assets": "shapes_words"}


def bundled_assets_dir(name):
    """Directory of a tokenizer asset set shipped with vlzoo (e.g. `"clip_bpe"`)."""
    from vlzoo.presets import presets_root

    return presets_root() / "_assets" / name


def bundled_tokenizer(spec, sequence_length):
    """Tokenizer described by a preset table's `tokenizer` entry.

    Args:
        spec: dict with `"class_name"` (a key of `TOKENIZER_CLASSES`) and
            `"assets"` (a bundled asset set name, or `None` when the
            vocabulary cannot be shipped).
        sequence_length: the text tower's context length.

    Returns:
        The tokenizer, with its vocabulary loaded when bundled.
    """
    tokenizer = TOKENIZER_CLASSES[spec["class_name"]](sequence_length=sequence_length)
    if spec.get("assets"):
        tokenizer.load_assets(os.fspath(bundled_assets_dir(spec["assets"])))
    return tokenizer


class UnavailableTokenizer:
    """Stands in for a tokenizer whose files are missing; calling it explains why.

    Args:
        message: why, and how to supply the files.
        config: the serialised tokenizer it stands for, kept so that
            `save_to_preset` writes it back (drop the files into the saved
            preset's `assets/tokenizer/` and it loads).
    """

    def __init__(self, message, config=None):
        self.message = message
        self.config = config

    def __call__(self, *args, **kwargs):
        raise FileNotFoundError(f"No tokenizer available: {self.message}")
