"""The tokenizer a transformers repository ships, read from its own files.

One reader per kind of vocabulary, each `reader(directory, config)` -> a vlzoo tokenizer, or None when
the repository holds none of its files (`config` is the repository's `config.json`):

- `clip_bpe_tokenizer`: CLIP's byte-level BPE, `vocab.json` + `merges.txt` or a BPE `tokenizer.json`;
- `siglip_tokenizer`: SigLIP's `spiece.model`, else the Gemma `tokenizer.model` of SigLIP 2 repositories
  that keep SigLIP's `model_type`;
- `gemma_tokenizer`: SigLIP 2's Gemma `tokenizer.model`, with the start, end and padding pieces and the
  text cleaning its `tokenizer_config.json` names.

The transformers converter registers them by `model_type` (`vlzoo.convert.transformers.register_model_type`).

Example:
>>> tokenizer = clip_bpe_tokenizer(pathlib.Path("clip-vit-base-patch32"), config)  # doctest: +SKIP
"""

import json

from vlzoo.presets.files import read_json
from vlzoo.tokenizers import CLIPTokenizer
from vlzoo.tokenizers import SentencePieceTokenizer

__all__ = ["clip_bpe_tokenizer", "gemma_tokenizer", "json_or_none", "siglip_tokenizer"]


def json_or_none(path):
    """A JSON file's contents, or None when it is absent or not JSON."""
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def _piece(token, default):
    """A special token of `tokenizer_config.json`: a string, or an AddedToken serialised as a dict."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else default


def _token_id(vocabulary, token, default):
    token = _piece(token, None)
    return vocabulary.get(token, default) if token is not None else default


def _clip_bpe(directory):
    """`(vocabulary, merges)` of a repository's CLIP BPE: `vocab.json` + `merges.txt`, or `tokenizer.json`."""
    if (directory / "vocab.json").is_file() and (directory / "merges.txt").is_file():
        return read_json(directory / "vocab.json", "CLIP vocabulary"), str(directory / "merges.txt")
    if (directory / "tokenizer.json").is_file():
        model = read_json(directory / "tokenizer.json", "tokenizer file").get("model") or {}
        if model.get("type") == "BPE":
            merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", ())]
            return model.get("vocab", {}), merges
    return None


def _text_length(config, default):
    return (config.get("text_config") or {}).get("max_position_embeddings", default)


def clip_bpe_tokenizer(directory, config):
    """A CLIP repository's BPE (`vocab.json` + `merges.txt`, or a BPE `tokenizer.json`), padded with the pad
    piece of `tokenizer_config.json` (CLIP's end piece when it names none); None without those files."""
    bpe = _clip_bpe(directory)
    if bpe is None:
        return None
    vocabulary, merges = bpe
    settings = json_or_none(directory / "tokenizer_config.json") or {}
    pad = _token_id(vocabulary, settings.get("pad_token"), vocabulary.get(CLIPTokenizer.END_TOKEN))
    return CLIPTokenizer(vocabulary, merges, sequence_length=_text_length(config, 77), pad_value=pad)


def siglip_tokenizer(directory, config):
    """A SigLIP repository's `spiece.model`; else the Gemma `tokenizer.model` (`gemma_tokenizer`) of the
    SigLIP 2 repositories that keep SigLIP's `model_type`; None without either."""
    if (directory / "spiece.model").is_file():
        return SentencePieceTokenizer(str(directory / "spiece.model"), sequence_length=_text_length(config, 64))
    return gemma_tokenizer(directory, config)


# transformers' tokenizer classes of SigLIP 2 repositories (Gemma's SentencePiece model, `tokenizer.model`)
# and their text cleaning: GemmaTokenizer's none, Siglip2Tokenizer's lowercasing.
_GEMMA_CLEANING = {"GemmaTokenizer": "none", "GemmaTokenizerFast": "none", "Siglip2Tokenizer": "lower"}


def _gemma_special_pieces(directory, settings):
    """`(start, end)` pieces a Gemma tokenizer puts around a text (None: none). `tokenizer_config.json`'s
    `add_bos_token` / `add_eos_token` where it has them (transformers 4 writes them); else the single-text
    template of `tokenizer.json`'s post-processor (transformers 5 writes only that); else Gemma's
    defaults, a start piece and no end piece."""
    bos = _piece(settings.get("bos_token"), "<bos>")
    eos = _piece(settings.get("eos_token"), "<eos>")
    if "add_bos_token" in settings or "add_eos_token" in settings:
        return (bos if settings.get("add_bos_token", True) else None,
                eos if settings.get("add_eos_token", False) else None)
    template = ((json_or_none(directory / "tokenizer.json") or {}).get("post_processor") or {})
    if template.get("type") == "TemplateProcessing":
        items = [next(iter(item.items())) for item in template.get("single", ())]
        text = next((k for k, (kind, _) in enumerate(items) if kind == "Sequence"), None)
        if text is not None and all(kind in ("Sequence", "SpecialToken") for kind, _ in items) and len(items) <= 3:
            before = [value["id"] for kind, value in items[:text]]
            after = [value["id"] for kind, value in items[text + 1:]]
            if len(before) <= 1 and len(after) <= 1:
                return (before or [None])[0], (after or [None])[0]
    return bos, None


def gemma_tokenizer(directory, config):
    """A SigLIP 2 repository's tokenizer: Gemma's `tokenizer.model`, with the start and end pieces the
    repository's tokenizer adds (`_gemma_special_pieces`; SigLIP 2's: none, then `<eos>`), padded with its
    pad piece, cleaned as the class `tokenizer_config.json` names cleans (`_GEMMA_CLEANING`); None without
    `tokenizer.model`. ValueError for a tokenizer class without a known cleaning."""
    if not (directory / "tokenizer.model").is_file():
        return None
    settings = json_or_none(directory / "tokenizer_config.json") or {}
    sequence_length = _text_length(config, 64)
    class_name = settings.get("tokenizer_class") or "GemmaTokenizer"
    if class_name not in _GEMMA_CLEANING:
        raise ValueError(f"{directory / 'tokenizer_config.json'} names tokenizer_class {class_name!r}; vlzoo reads "
                         f"`tokenizer.model` for {sorted(_GEMMA_CLEANING)}.")
    start, end = _gemma_special_pieces(directory, settings)
    options = dict(sequence_length=sequence_length, proto_file="tokenizer.model", clean=_GEMMA_CLEANING[class_name],
                   start_token=start, end_token=end)
    proto = str(directory / "tokenizer.model")
    pad = SentencePieceTokenizer(proto, **options).token_to_id(_piece(settings.get("pad_token"), "<pad>"))
    return SentencePieceTokenizer(proto, pad_value=pad, **options)
