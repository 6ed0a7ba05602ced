"""The tokenizer a transformers repository ships, read from its own files.

One reader per kind of vocabulary, each `reader(directory, config)` -> a vlzoo tokenizer, or None when
the repository holds none of its files (`config` is the repository's `config.json`):

- `clip_bpe_tokenizer`: CLIP's byte-level BPE, `vocab.json` + `merges.txt` or a BPE `tokenizer.json`;
- `siglip_tokenizer`: SigLIP's `spiece.model`, else the Gemma `tokenizer.model` of SigLIP 2 repositories
  that keep SigLIP's `model_type`;
- `gemma_tokenizer`: SigLIP 2's Gemma `tokenizer.model`, with the start, end and padding pieces and the
  text cleaning its `tokenizer_config.json` names;
- `tipsv2_tokenizer`: TIPSv2's SentencePiece BPE `tokenizer.model`, or rebuilt from the BPE `tokenizer.json`
  that transformers 5 writes alone;
- `metaclip2_tokenizer`: MetaCLIP 2's XLM-V SentencePiece model in fairseq's layout (`sentencepiece.bpe.model`,
  or rebuilt from the Unigram `tokenizer.json` that transformers 5 writes alone), else the mT5 `spiece.model`
  of its `mt5` repositories.

The transformers converter registers them by `model_type` (`vlzoo.convert.transformers.register_model_type`).

Example:
>>> tokenizer = clip_bpe_tokenizer(pathlib.Path("clip-vit-base-patch32"), config)  # doctest: +SKIP
"""

import base64
import json
import re

from sentencepiece import sentencepiece_model_pb2

from vlzoo.presets.files import read_json
from vlzoo.tokenizers import CLIPTokenizer
from vlzoo.tokenizers import SentencePieceTokenizer
from vlzoo.tokenizers import XLMRobertaTokenizer

__all__ = ["clip_bpe_tokenizer", "gemma_tokenizer", "json_or_none", "metaclip2_tokenizer", "siglip_tokenizer",
           "sentencepiece_bpe_proto", "tipsv2_tokenizer", "xlm_roberta_proto"]


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


def _padded(proto, pad_piece, **options):
    """`SentencePieceTokenizer(proto, **options)` padded with the id of `pad_piece` (a repository's pad token)."""
    pad = SentencePieceTokenizer(proto, **options).token_to_id(pad_piece)
    return SentencePieceTokenizer(proto, pad_value=pad, **options)


def _spiece_tokenizer(directory, config, default_length):
    """A repository's `spiece.model` as transformers' SiglipTokenizer reads it (SigLIP's cleaning, no start
    piece, `</s>` last), padded with the pad piece of `tokenizer_config.json` (`</s>` when it names none)."""
    settings = json_or_none(directory / "tokenizer_config.json") or {}
    options = dict(sequence_length=_text_length(config, default_length))
    proto = str(directory / "spiece.model")
    return _padded(proto, _piece(settings.get("pad_token"), "</s>"), **options)


def siglip_tokenizer(directory, config):
    """A SigLIP repository's `spiece.model`; else the Gemma `tokenizer.model` (`gemma_tokenizer`) of the
    SigLIP 2 repositories that keep SigLIP's `model_type`; None without either."""
    if (directory / "spiece.model").is_file():
        return _spiece_tokenizer(directory, config, 64)
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
    return _padded(proto, _piece(settings.get("pad_token"), "<pad>"), **options)


_PIECE = sentencepiece_model_pb2.ModelProto.SentencePiece
_XLM_R_SPECIAL = list(XLMRobertaTokenizer.SPECIAL_PIECES)


def _precompiled_charsmap(normalizer, where):
    """The SentencePiece character map of a `tokenizer.json` normaliser ("" when none). Its other steps
    must be those transformers adds around it, which SentencePiece's own whitespace handling does: a right
    strip and runs of spaces made one; NotImplementedError naming any other."""
    if not normalizer:
        return ""
    kind = normalizer.get("type")
    if kind == "Sequence":
        maps = [_precompiled_charsmap(step, where) for step in normalizer.get("normalizers", ())]
        return next((m for m in maps if m), "")
    if kind == "Precompiled":
        return normalizer.get("precompiled_charsmap") or ""
    if kind == "Strip" or (kind == "Replace" and (normalizer.get("pattern") or {}).get("Regex") == " {2,}"):
        return ""
    raise NotImplementedError(f"{where}: the normaliser step {kind!r} has no SentencePiece counterpart in vlzoo.")


def _set_normalizer(proto, charsmap):
    """Gives `proto` SentencePiece's normaliser of the base64 character map `charsmap` ("": none), with its own
    whitespace handling: a `▁` before the text, runs of spaces made one, spaces written as `▁`."""
    spec = proto.normalizer_spec
    spec.name = "nmt_nfkc" if charsmap else "identity"
    spec.precompiled_charsmap = base64.b64decode(charsmap)
    spec.add_dummy_prefix = spec.remove_extra_whitespaces = spec.escape_whitespaces = True


def xlm_roberta_proto(tokenizer_json, where="tokenizer.json"):
    """The SentencePiece model (serialised `ModelProto`) of an XLM-R layout Unigram `tokenizer.json`:
    fairseq's four special pieces first, the model's pieces, `<mask>` last, as transformers converts a
    `sentencepiece.bpe.model`; turned back into that file's layout (`<unk>`, `<s>`, `</s>`, the pieces with
    their scores) with its character map. ValueError when the vocabulary is not in that layout."""
    model = tokenizer_json.get("model") or {}
    vocabulary = [(str(piece), float(score)) for piece, score in model.get("vocab", ())]
    if model.get("type") != "Unigram" or [piece for piece, _ in vocabulary[:4]] != _XLM_R_SPECIAL:
        raise ValueError(f"{where}: not an XLM-R layout Unigram vocabulary (a Unigram model whose first pieces "
                         f"are {_XLM_R_SPECIAL}).")
    if vocabulary[-1][0] == "<mask>":
        vocabulary = vocabulary[:-1]
    proto = sentencepiece_model_pb2.ModelProto()
    for piece, score, kind in [("<unk>", 0.0, _PIECE.UNKNOWN), ("<s>", 0.0, _PIECE.CONTROL),
                               ("</s>", 0.0, _PIECE.CONTROL), *((p, s, _PIECE.NORMAL) for p, s in vocabulary[4:])]:
        proto.pieces.add(piece=piece, score=score, type=kind)
    proto.trainer_spec.model_type = sentencepiece_model_pb2.TrainerSpec.UNIGRAM
    proto.trainer_spec.unk_id, proto.trainer_spec.bos_id, proto.trainer_spec.eos_id = 0, 1, 2
    proto.trainer_spec.pad_id = -1
    charsmap = _precompiled_charsmap(tokenizer_json.get("normalizer"), where)
    _set_normalizer(proto, charsmap)
    return proto.SerializeToString()


def metaclip2_tokenizer(directory, config):
    """A MetaCLIP 2 repository's tokenizer: XLM-V's SentencePiece model as transformers' XLMRobertaTokenizer
    reads it (`<s>` first, `</s>` last, `<pad>` after), from `sentencepiece.bpe.model` or else from a Unigram
    `tokenizer.json` (`xlm_roberta_proto`); else the `spiece.model` of the `mt5` repositories as SiglipTokenizer
    reads it. Context from `config.json` (77 by default); None without any of these files."""
    length = _text_length(config, 77)
    if (directory / "sentencepiece.bpe.model").is_file():
        return XLMRobertaTokenizer(str(directory / "sentencepiece.bpe.model"), sequence_length=length)
    if (directory / "spiece.model").is_file():
        return _spiece_tokenizer(directory, config, 77)
    tokenizer_json = json_or_none(directory / "tokenizer.json")
    if tokenizer_json is None:
        return None
    proto = xlm_roberta_proto(tokenizer_json, str(directory / "tokenizer.json"))
    return XLMRobertaTokenizer(proto, sequence_length=length)


_BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")


def _metaspace_words(pre_tokenizer, where):
    """Checks that a `tokenizer.json` pre-tokeniser splits text as SentencePiece does: on whitespace, each word
    after a `▁` (transformers' layout: WhitespaceSplit, then Metaspace prepending `▁` always);
    NotImplementedError naming it otherwise."""
    steps = (pre_tokenizer or {}).get("pretokenizers") or [pre_tokenizer or {}]
    kinds = [step.get("type") for step in steps]
    metaspace = steps[-1]
    if (kinds != ["WhitespaceSplit", "Metaspace"] or metaspace.get("replacement") != "\u2581"
            or metaspace.get("prepend_scheme", "always") != "always"):
        raise NotImplementedError(f"{where}: the pre-tokeniser {kinds} has no SentencePiece counterpart in vlzoo "
                                  "(it reads WhitespaceSplit then Metaspace, prepending '\u2581' always).")


def sentencepiece_bpe_proto(tokenizer_json, unk_piece="<unk>", where="tokenizer.json"):
    """The SentencePiece BPE model (serialised `ModelProto`) of a BPE `tokenizer.json` that transformers converted
    from one, and whether its normaliser lowercases (SentencePiece cannot: the tokenizer's `clean` must).

    The pieces keep their ids; a piece made by a merge scores minus the rank of its first merge (SentencePiece
    merges the adjacent pair whose piece scores highest, as the ranks order `tokenizer.json`'s merges), and a
    longer piece that no merge makes is unused, as it is unreachable there. `unk_piece` is the unknown piece,
    the special added tokens are control pieces and, with byte fallback, `<0xXX>` are byte pieces.

    Raises:
        ValueError: not a BPE model, ids that are not 0 to N - 1, or `unk_piece` missing.
        NotImplementedError: a normaliser or pre-tokeniser step without a SentencePiece counterpart.
    """
    model = tokenizer_json.get("model") or {}
    vocabulary = model.get("vocab") if model.get("type") == "BPE" else None
    vocabulary = vocabulary if isinstance(vocabulary, dict) else {}
    pieces = sorted(vocabulary, key=vocabulary.get)
    if not pieces or [vocabulary[piece] for piece in pieces] != list(range(len(pieces))):
        raise ValueError(f"{where}: not a BPE vocabulary with ids 0 to N - 1.")
    if unk_piece not in vocabulary:
        raise ValueError(f"{where}: the unknown piece {unk_piece!r} is not in the vocabulary.")
    _metaspace_words(tokenizer_json.get("pre_tokenizer"), where)
    normalizer = tokenizer_json.get("normalizer") or {}
    steps = normalizer.get("normalizers") if normalizer.get("type") == "Sequence" else [normalizer]
    lowercase = bool(steps) and steps[0].get("type") == "Lowercase"
    charsmap = _precompiled_charsmap({"type": "Sequence", "normalizers": steps[lowercase:]}, where)
    first_merge = {}
    for rank, merge in enumerate(model.get("merges") or ()):
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        first_merge.setdefault(left + right, rank)
    special = {token["content"] for token in tokenizer_json.get("added_tokens") or () if token.get("special")}
    byte_fallback = bool(model.get("byte_fallback"))
    proto = sentencepiece_model_pb2.ModelProto()
    for index, piece in enumerate(pieces):
        if piece == unk_piece:
            kind = _PIECE.UNKNOWN
        elif piece in special:
            kind = _PIECE.CONTROL
        elif byte_fallback and _BYTE_PIECE.fullmatch(piece):
            kind = _PIECE.BYTE
        else:
            kind = _PIECE.NORMAL if piece in first_merge or len(piece) == 1 else _PIECE.UNUSED
        score = -float(first_merge.get(piece, len(first_merge) + index))
        proto.pieces.add(piece=piece, score=score if kind == _PIECE.NORMAL else 0.0, type=kind)
    trainer = proto.trainer_spec
    trainer.model_type = sentencepiece_model_pb2.TrainerSpec.BPE
    trainer.byte_fallback = byte_fallback
    trainer.unk_id, trainer.bos_id, trainer.eos_id, trainer.pad_id = vocabulary[unk_piece], -1, -1, -1
    _set_normalizer(proto, charsmap)
    return proto.SerializeToString(), lowercase


def tipsv2_tokenizer(directory, config):
    """A TIPSv2 repository's SentencePiece BPE model as transformers' Tipsv2Tokenizer reads it: lowercased, the
    pieces alone (no start or end piece), padded with the pad piece of `tokenizer_config.json` (`<pad>`, id 0),
    context from `config.json` (64 by default). From `tokenizer.model`, else rebuilt from the `tokenizer.json`
    that transformers 5 writes alone (`sentencepiece_bpe_proto`); None without either."""
    settings = json_or_none(directory / "tokenizer_config.json") or {}
    if (directory / "tokenizer.model").is_file():
        proto, lowercase = str(directory / "tokenizer.model"), True
    elif (tokenizer_json := json_or_none(directory / "tokenizer.json")) is not None:
        proto, lowercase = sentencepiece_bpe_proto(tokenizer_json, _piece(settings.get("unk_token"), "<unk>"),
                                                   str(directory / "tokenizer.json"))
    else:
        return None
    options = dict(sequence_length=_text_length(config, 64), proto_file="tokenizer.model",
                   clean="lower" if lowercase else "none", start_token=None, end_token=None)
    return _padded(proto, _piece(settings.get("pad_token"), "<pad>"), **options)
