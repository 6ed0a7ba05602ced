"""A model repository's files (a hub snapshot or any directory) -> a vlzoo model.

`detect_format(directory)` names the layout from the files it holds:

- `"vlzoo"`: a preset written by `save_to_preset` (`config.json` naming a vlzoo
  class, `metadata.json`);
- `"keras_hub"`: a keras-hub preset of a `CLIPBackbone` or `SigLIPBackbone`
  (`config.json` naming the keras-hub class, `model.weights.h5`);
- `"transformers"`: `CLIPModel` / `MetaClip2Model` / `SiglipModel` saved by `save_pretrained`
  (`config.json` + `model.safetensors` or `pytorch_model.bin`);
- `"open_clip"`: open_clip's hub layout (`open_clip_config.json` +
  `open_clip_model.safetensors` or `open_clip_pytorch_model.bin`).

`convert_repository(directory)` converts the last three with vlzoo's converters,
with the tokenizer and image preprocessing read from the repository's own files
(`vocab.json`/`merges.txt`, `spiece.model`, SigLIP 2's Gemma `tokenizer.model`, MetaCLIP 2's XLM-V
`sentencepiece.bpe.model` or Unigram `tokenizer.json`, TIPSv2's `tokenizer.model`, `preprocessor_config.json`,
open_clip's `preprocess_cfg`), so `model.tokenizer` gives the source library's ids.
safetensors files load without torch; pickled `.bin` files load with torch's
weights-only unpickler, so nothing in a downloaded file runs code.

Example:
>>> model = convert_repository("/path/to/clip-vit-base-patch32")  # doctest: +SKIP
"""

import pathlib

import numpy as np

from vlzoo.convert.keras_hub import from_keras_hub
from vlzoo.convert.open_clip import from_open_clip_state_dict
from vlzoo.convert.converters import architecture
from vlzoo.convert.converters import architectures
from vlzoo.convert.repository_tokenizers import json_or_none
from vlzoo.convert.transformers import from_transformers_state_dict
from vlzoo.convert._common import open_clip_preprocess
from vlzoo.convert.state_dict import load_state_dict
from vlzoo.preprocessing import ImagePreprocessor
from vlzoo.presets.files import read_json
from vlzoo.tokenizers import SentencePieceTokenizer


_TRANSFORMERS_WEIGHTS = ("model.safetensors", "pytorch_model.bin")
_OPEN_CLIP_WEIGHTS = ("open_clip_model.safetensors", "open_clip_pytorch_model.bin")
# PIL's resampling filters as transformers' `resample` numbers them.
_RESAMPLE = {2: "bilinear", 3: "bicubic"}


def _files(directory):
    return sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file())


def _first(directory, names):
    return next((directory / n for n in names if (directory / n).is_file()), None)


def detect_format(directory, names=None):
    """The layout of a model directory: one of `vlzoo.formats.repository_formats()`.

    Args:
        directory: the directory (its `config.json` is read when present).
        names: the repository's file names when not every file is in `directory` yet (a
            listing before its weights are downloaded); default: the directory's files.

    Raises:
        ValueError: naming the files found when none of the layouts matches.
    """
    directory = pathlib.Path(directory)
    names = set(_files(directory) if names is None else names)
    config = json_or_none(directory / "config.json") if "config.json" in names else None
    registered = str((config or {}).get("registered_name", ""))
    if registered.startswith("vlzoo>") and "metadata.json" in names:
        return "vlzoo"
    if registered.startswith("keras_hub>") or str((config or {}).get("module", "")).startswith("keras_hub"):
        if config.get("class_name") not in architectures("keras_hub"):
            raise ValueError(
                f"{directory} is a keras-hub preset of a {config.get('class_name')}; vlzoo converts "
                f"{' and '.join(architectures('keras_hub'))} presets."
            )
        return "keras_hub"
    # A repository that holds open_clip's layout is loaded from it: open_clip wrote the weights first.
    if "open_clip_config.json" in names and names & set(_OPEN_CLIP_WEIGHTS):
        return "open_clip"
    if config is not None and "model_type" in config and names & set(_TRANSFORMERS_WEIGHTS):
        return "transformers"
    raise ValueError(
        f"{directory} holds no model vlzoo can load: expected a vlzoo or keras-hub preset, a transformers "
        "CLIPModel/SiglipModel (config.json + model.safetensors or pytorch_model.bin), or open_clip's hub "
        f"layout (open_clip_config.json + open_clip_model.safetensors); found: {', '.join(sorted(names)) or 'no files'}."
    )


def weight_files(directory, names):
    """The weight files a repository's format reads: one of its copies, safetensors first."""
    fmt = detect_format(directory, names)
    if fmt in ("vlzoo", "keras_hub"):
        return [n for n in names if n.endswith(".h5")]
    candidates = _OPEN_CLIP_WEIGHTS if fmt == "open_clip" else _TRANSFORMERS_WEIGHTS
    return [next(n for n in candidates if n in names)]


def transformers_preprocessor(directory, config):
    """The `ImagePreprocessor` that `preprocessor_config.json` describes (None when absent); pixels are scaled
    to [0, 1] and, unless `do_normalize` is false (TIPSv2), normalised by its mean and std."""
    settings = json_or_none(directory / "preprocessor_config.json")
    if not settings:
        return None
    if settings.get("do_normalize") is False:
        settings = {**settings, "image_mean": (0.0,) * 3, "image_std": (1.0,) * 3}
    size = settings.get("size") or {}
    size = size if isinstance(size, dict) else {"shortest_edge": size}
    crop = bool(settings.get("do_center_crop")) and "shortest_edge" in size
    side = (settings.get("crop_size") or {}).get("height") if crop else size.get("height")
    side = side or size.get("shortest_edge") or (config.get("vision_config") or {}).get("image_size", 224)
    return ImagePreprocessor(
        image_size=int(side), mean=settings.get("image_mean", (0.5,) * 3), std=settings.get("image_std", (0.5,) * 3),
        interpolation=_RESAMPLE.get(settings.get("resample"), "bicubic"), crop="center" if crop else "none",
    )


def transformers_tokenizer(directory, config):
    """The tokenizer a transformers repository ships, read by its `model_type`'s reader (None when it ships
    none, or its type has no reader)."""
    read = architecture("transformers", config.get("model_type")).tokenizer
    return read(directory, config) if read is not None else None


def _from_transformers(directory, dtype, progress):
    config = read_json(directory / "config.json", "transformers config")
    state_dict = load_state_dict(_first(directory, _TRANSFORMERS_WEIGHTS), torchscript=False)
    return from_transformers_state_dict(
        state_dict, config, dtype=dtype, tokenizer=transformers_tokenizer(directory, config),
        preprocessor=transformers_preprocessor(directory, config), progress=progress,
    )


def _from_open_clip(directory, dtype, progress):
    settings = read_json(directory / "open_clip_config.json", "open_clip config")
    if "model_cfg" not in settings:
        raise ValueError(f"{directory / 'open_clip_config.json'} has no `model_cfg` entry.")
    state_dict = load_state_dict(_first(directory, _OPEN_CLIP_WEIGHTS), torchscript=False)
    model = from_open_clip_state_dict(state_dict, settings["model_cfg"], dtype=dtype, progress=progress)
    preprocess = open_clip_preprocess(settings.get("preprocess_cfg"))
    if preprocess:
        model.preprocessor = ImagePreprocessor(**{**model.preprocessor.get_config(), **preprocess})
    return model


def _keras_hub_config(directory, name):
    """The `config` of a keras-hub preset's serialised layer file (`{}` when absent)."""
    return (json_or_none(directory / name) or {}).get("config") or {}


# The SentencePiece tokenizers of keras-hub's SigLIP presets, by the class their `tokenizer.json` names: the
# end piece and the padding piece (SigLIP's pads with its end piece; SigLIP 2's is Gemma's vocabulary).
KERAS_HUB_SIGLIP_TOKENIZERS = {"SigLIPTokenizer": ("</s>", "</s>"), "GemmaTokenizer": ("<eos>", "<pad>")}


def keras_hub_tokenizer(directory, sequence_length):
    """A keras-hub SigLIP or SigLIP 2 preset's tokenizer, from its own files; None for other presets.

    `assets/tokenizer/vocabulary.spm` with the settings of its `SigLIPPreprocessor`
    (`preprocessor.json`: end token, `canonicalize_text`; keras-hub's defaults when
    the file is absent, as in keras-hub's published presets), with the end and
    padding pieces of the class `tokenizer.json` names (`KERAS_HUB_SIGLIP_TOKENIZERS`).
    """
    class_name = (json_or_none(directory / "tokenizer.json") or {}).get("class_name")
    if class_name not in KERAS_HUB_SIGLIP_TOKENIZERS:
        return None
    end, pad = KERAS_HUB_SIGLIP_TOKENIZERS[class_name]
    settings = _keras_hub_config(directory, "preprocessor.json")
    proto = directory / "assets" / "tokenizer" / "vocabulary.spm"
    options = dict(sequence_length=sequence_length, start_token=None, proto_file=proto.name,
                   clean="keras_hub" if settings.get("canonicalize_text", True) else "none")
    tokenizer = SentencePieceTokenizer(str(proto), end_token=end, **options)
    end = end if settings.get("add_end_token", True) else None
    return SentencePieceTokenizer(str(proto), end_token=end, pad_value=tokenizer.token_to_id(pad), **options)


def keras_hub_preprocessor(directory):
    """The `ImagePreprocessor` of a keras-hub preset's `image_converter.json` (None when absent).

    keras-hub scales pixels as `x * scale + offset`: `std = 1 / (255 scale)`, `mean = -offset * std`.
    """
    settings = _keras_hub_config(directory, "image_converter.json")
    if not settings.get("image_size"):
        return None
    scale = np.broadcast_to(np.asarray(settings.get("scale", 1 / 255), "float64"), (3,))
    offset = np.broadcast_to(np.asarray(settings.get("offset", 0.0), "float64"), (3,))
    std = 1.0 / (255.0 * scale)
    return ImagePreprocessor(
        image_size=tuple(settings["image_size"]), mean=tuple(float(m) for m in -offset * std),
        std=tuple(float(s) for s in std), interpolation=settings.get("interpolation", "bilinear"),
        crop="center" if settings.get("crop_to_aspect_ratio", True) else "none",
    )


def _from_keras_hub(directory, dtype, progress):
    import keras_hub  # optional, and its import pulls in TensorFlow (seconds): only when a keras-hub preset loads

    backbone = keras_hub.models.Backbone.from_preset(str(directory))
    model = from_keras_hub(backbone, dtype=dtype, progress=progress, preprocessor=keras_hub_preprocessor(directory))
    tokenizer = keras_hub_tokenizer(directory, model.text.sequence_length)
    if tokenizer is not None:
        model.tokenizer = tokenizer
    return model


_CONVERTERS = {"transformers": _from_transformers, "open_clip": _from_open_clip, "keras_hub": _from_keras_hub}


def convert_repository(directory, fmt=None, *, dtype=None, progress=None):
    """Converts the model in `directory` (format detected unless `fmt` is given) to a vlzoo model.

    Args:
        directory: a local directory, e.g. a hub snapshot.
        fmt: `"keras_hub"`, `"transformers"` or `"open_clip"` (default: `detect_format`).
        dtype: dtype policy of the vlzoo model (default float32).
        progress: optional `progress(done, total)` callback while assigning weights.

    Returns:
        A `vlzoo.CLIP` or `vlzoo.SigLIP` with the repository's tokenizer and preprocessor.

    Raises:
        ValueError: an unknown `fmt`; `detect_format`'s and the converters' errors.

    Example:
    >>> model = convert_repository("snapshots/clip-vit-base-patch32")  # doctest: +SKIP
    """
    directory = pathlib.Path(directory)
    fmt = fmt or detect_format(directory)
    if fmt not in _CONVERTERS:
        raise ValueError(f"`fmt` must be one of {sorted(_CONVERTERS)} to convert; received {fmt!r}.")
    return _CONVERTERS[fmt](directory, dtype, progress)
