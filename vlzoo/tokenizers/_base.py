"""What vlzoo's tokenizers share: text canonicalisation, start/end packing, asset
files, and the `_PackingTokenizer` / `_VocabularyTokenizer` base classes."""

from __future__ import annotations

import functools
import os

import numpy as np

from vlzoo._arrays import to_numpy


def _canonicalize_texts(texts):
    """Returns (list of str, batched flag). Raises TypeError naming `texts`."""
    if isinstance(texts, bytes):
        return [texts.decode("utf-8")], False
    if isinstance(texts, str):
        return [texts], False
    if isinstance(texts, np.ndarray) or hasattr(texts, "numpy") or hasattr(
        texts, "detach"
    ):
        arr = to_numpy(texts)
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


def _pack(sequences, sequence_length, start_value, end_value, pad_value):
    """Adds the start and end ids (where not None), truncates the ids between them so that the whole
    fits `sequence_length` (the end id kept last), and pads after the end with `pad_value` (None: 0),
    as keras_hub's `StartEndPacker` does.

    Returns int32 ids `(B, T)` and a bool mask `(B, T)` (True = start, token or end).
    """
    start = [] if start_value is None else [int(start_value)]
    end = [] if end_value is None else [int(end_value)]
    room = sequence_length - len(start) - len(end)
    ids = np.full((len(sequences), sequence_length), 0 if pad_value is None else int(pad_value), np.int32)
    mask = np.zeros((len(sequences), sequence_length), bool)
    for row, sequence in enumerate(sequences):
        packed = start + [int(i) for i in sequence][:room] + end
        ids[row, : len(packed)] = packed
        mask[row, : len(packed)] = True
    return ids, mask


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


@functools.lru_cache(maxsize=8)
def parse_once(parse, text):
    """`parse(text)`, computed once per process for each (function, text): the presets a
    process loads share their tokenizers' parsed vocabularies. The result is shared:
    callers copy what they keep."""
    return parse(text)


class _PackingTokenizer:
    """What vlzoo's tokenizers share: the call contract, encoding through a lazily
    built encoder, detokenization, the config and the asset files.

    A subclass sets `_CONFIG_KEYS` (the `get_config()` keys, in order: constructor
    arguments kept as attributes of the same name) and `_ASSET_FILES` (those of the
    keys that name its asset files), and provides:

    - `_check_ready()`, raising until the assets are loaded;
    - `_set_assets(*paths)`, loading the asset files, given in `_ASSET_FILES` order;
    - `_asset_contents()`, those files' contents (str or bytes), in the same order;
    - `_build_backend()`, the encoder: a keras_hub tokenizer, or the subclass's own (a subclass
      resets `_encoder` to `None` when its assets change);
    - `_clean(text)`, applied before the keras_hub tokenizer, or an own
      `_encode_batch(texts)` (ids without start/end tokens, one list per text);
    - `_decode(ids)`, the text of a row of ids without start/end tokens;
    - the `start_token_id`, `end_token_id` and `pad_token_id` properties.
    """

    _CONFIG_KEYS = ()
    _ASSET_FILES = ()

    def __init__(self, sequence_length):
        self.sequence_length = _check_sequence_length(sequence_length)
        self._encoder = None

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
        """The encoder, built by `_build_backend()` on first use."""
        if self._encoder is None:
            self._check_ready()
            self._encoder = self._build_backend()
        return self._encoder

    def encode(self, text):
        """Ids of one string, without start/end tokens (list of int)."""
        return self._encode_batch([text])[0]

    def _encode_batch(self, texts):
        self._check_ready()
        if not texts:
            return []
        encoded = self._backend().tokenize([self._clean(t) for t in texts])
        return [[int(i) for i in to_numpy(row).reshape(-1)] for row in encoded]

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
        arr = to_numpy(token_ids)
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
