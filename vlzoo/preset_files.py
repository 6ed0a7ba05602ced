"""The preset directory format, and writing it: `save_to_preset`, `write_preset`.

A preset is a directory in keras-hub's layout:

    config.json          Keras-serialised model (`registered_name` "vlzoo>CLIP", ...)
    metadata.json        versions, family, parameter count, paper, licence, description; the
                         weights' quantization mode ("int8") where they are quantized
    tokenizer.json       serialised tokenizer (its asset files named, not inlined)
    preprocessor.json    serialised image preprocessor
    model.weights.h5     weights, when the preset has them
    assets/tokenizer/    tokenizer vocabularies

`vlzoo.presets` reads them back (`from_preset`). This module imports no model
class, so models can save themselves (`ContrastiveModel.save_to_preset`).

Example:
>>> save_to_preset(model, "my_preset")     # then vlzoo.from_preset("my_preset")
"""

import json
import pathlib

import keras

from vlzoo._keras import save_weights_only
from vlzoo.catalogue import CONFIG_FILE
from vlzoo.catalogue import METADATA_FILE
from vlzoo.catalogue import PREPROCESSOR_FILE
from vlzoo.catalogue import TOKENIZER_ASSETS
from vlzoo.catalogue import TOKENIZER_FILE
from vlzoo.catalogue import WEIGHTS_FILE
from vlzoo.tokenizers import UnavailableTokenizer
from vlzoo.version import __version__


def write_preset(directory, config, metadata, tokenizer=None, preprocessor=None, copy_assets=True):
    """Writes the JSON files (and tokenizer assets) of a preset directory.

    `copy_assets=False` leaves the tokenizer's files out: the registered presets name the
    vocabulary vlzoo ships instead (`tokenizer_assets` in their metadata, see `vlzoo.presets`).
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    info = {"keras_version": keras.__version__, "vlzoo_version": __version__, **metadata}
    (directory / METADATA_FILE).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    if tokenizer is not None and copy_assets:
        tokenizer.save_assets(str(directory / TOKENIZER_ASSETS))
    if tokenizer is not None:
        serialized = keras.saving.serialize_keras_object(tokenizer)
        (directory / TOKENIZER_FILE).write_text(json.dumps(serialized, indent=2, sort_keys=True) + "\n")
    if preprocessor is not None:
        serialized = keras.saving.serialize_keras_object(preprocessor)
        (directory / PREPROCESSOR_FILE).write_text(json.dumps(serialized, indent=2, sort_keys=True) + "\n")


def save_to_preset(model, directory, metadata=None):
    """Writes `model` (config, weights, tokenizer, preprocessor) as a preset directory.

    `metadata` entries join `metadata.json` (e.g. `training={"data": ..., "steps": ...}`, which
    `vlzoo.upload`'s model card reads); a model `vlzoo.from_preset` loaded records the preset it
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
        write_preset(directory, config, info, preprocessor=model.preprocessor)
        if tokenizer.config is not None:
            (pathlib.Path(directory) / TOKENIZER_FILE).write_text(json.dumps(tokenizer.config, indent=2) + "\n")
    else:
        write_preset(directory, config, info, tokenizer=tokenizer, preprocessor=model.preprocessor)
    save_model_weights(model, pathlib.Path(directory) / WEIGHTS_FILE)


def save_model_weights(model, path):
    """`model.save_weights(path)` without the optimizer's state, which a preset does not carry.

    (Keras writes a compiled model's optimizer variables into the file too: twice the
    weights' size again for Adam, and nothing `from_preset` would use.)
    """
    save_weights_only(model, path)
