"""Text tokenizers for vlzoo models.

Inputs may be Python strings, numpy arrays or any backend tensor; outputs are numpy arrays, so
one tokenization feeds a model on any backend. They run eagerly in Python (not as `tf.data`
graph ops). The CLIP tokenizer is plain Python; the WordPiece and SentencePiece ones import
`keras_hub` (which imports TensorFlow) on their first call.

- `CLIPTokenizer` (`clip_bpe.py`): OpenAI CLIP byte-pair encoding (49,408 tokens), id for id
  open_clip's `SimpleTokenizer` (with `ftfy` installed).
- `SentencePieceTokenizer` (`sentencepiece.py`): a SentencePiece model (e.g. SigLIP's); none is
  shipped. `XLMRobertaTokenizer`: one in fairseq's id layout (XLM-R, XLM-V: MetaCLIP 2's).
- `WordPieceTokenizer` (`wordpiece.py`): BERT WordPiece (STAIR's bert-base-uncased vocabulary,
  30,522 tokens, bundled).
- `tokenizer_from_config(config, assets_dir)`, `bundled_tokenizer(spec, sequence_length)`: a
  tokenizer from a serialised config, or from a vocabulary shipped under `presets/_assets/`
  (`CLIP_BPE`, `BERT_UNCASED`, `SHAPES_WORDS`).

Example:
>>> tok = CLIPTokenizer.from_assets("presets/_assets/clip_bpe")  # doctest: +SKIP
>>> out = tok(["a photo of a cat", "a dog"])  # doctest: +SKIP
>>> out["token_ids"].shape, out["token_ids"].dtype, out["padding_mask"].dtype  # doctest: +SKIP
((2, 77), dtype('int32'), dtype('bool'))
"""

from __future__ import annotations

import os

from vlzoo._paths import DATA_ROOT
from vlzoo.tokenizers.clip_bpe import CLIPTokenizer
from vlzoo.tokenizers.clip_bpe import bytes_to_unicode  # re-exported (tools/build_clip_bpe_assets.py)
from vlzoo.tokenizers.clip_bpe import clip_clean_text  # re-exported
from vlzoo.tokenizers.sentencepiece import SentencePieceTokenizer
from vlzoo.tokenizers.sentencepiece import XLMRobertaTokenizer
from vlzoo.tokenizers.wordpiece import WordPieceTokenizer

__all__ = [
    "CLIPTokenizer",
    "SentencePieceTokenizer",
    "WordPieceTokenizer",
    "XLMRobertaTokenizer",
    "tokenizer_from_config",
    "TOKENIZER_CLASSES",
]

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
    "XLMRobertaTokenizer": XLMRobertaTokenizer,
    "vlzoo>XLMRobertaTokenizer": XLMRobertaTokenizer,
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
        A `CLIPTokenizer`, `SentencePieceTokenizer`, `XLMRobertaTokenizer` or `WordPieceTokenizer`.

    Raises:
        TypeError: `config` is not a dict.
        ValueError: the class name is not a key of `TOKENIZER_CLASSES`.

    Example:
    >>> tokenizer_from_config({"class_name": "clip_bpe", "sequence_length": 16}).sequence_length  # doctest: +SKIP
    16
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


CLIP_BPE = {"class_name": "CLIPTokenizer", "assets": "clip_bpe"}
CLIP_BPE_VOCABULARY_SIZE = 49408
BERT_UNCASED = {"class_name": "WordPieceTokenizer", "assets": "bert_uncased"}
BERT_UNCASED_VOCABULARY_SIZE = 30522
# The 45 words of `vlzoo.data.shapes.vocabulary()` (the `stair_shapes` preset).
SHAPES_WORDS = {"class_name": "WordPieceTokenizer", "assets": "shapes_words"}


def bundled_assets_dir(name):
    """Directory of a tokenizer asset set shipped with vlzoo (e.g. `"clip_bpe"`)."""
    return DATA_ROOT / "_assets" / name


def bundled_asset_names():
    """Sorted names of the tokenizer asset sets shipped with vlzoo (`["bert_uncased", "clip_bpe", ...]`)."""
    return sorted(path.name for path in (DATA_ROOT / "_assets").iterdir() if path.is_dir())


def bundled_tokenizer(spec, sequence_length):
    """Tokenizer described by a preset table's `tokenizer` entry.

    Args:
        spec: dict with `"class_name"` (a key of `TOKENIZER_CLASSES`),
            `"assets"` (a bundled asset set name, or `None` when the
            vocabulary cannot be shipped) and optionally `"options"`, the
            class's other constructor arguments (e.g. SigLIP 2's end and
            padding pieces).
        sequence_length: the text tower's context length.

    Returns:
        The tokenizer, with its vocabulary loaded when bundled.

    Example:
    >>> bundled_tokenizer(CLIP_BPE, 77)(["a cat"])["token_ids"].shape  # doctest: +SKIP
    (1, 77)
    """
    tokenizer = TOKENIZER_CLASSES[spec["class_name"]](sequence_length=sequence_length, **spec.get("options", {}))
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

    Raises:
        FileNotFoundError: when called, with `message`.
    """

    def __init__(self, message, config=None):
        self.message = message
        self.config = config

    def __call__(self, *args, **kwargs):
        raise FileNotFoundError(f"No tokenizer available: {self.message}")
