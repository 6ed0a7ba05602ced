"""The preset directory format, read and written: keras-hub's layout, without Keras.

A preset is a directory:

    config.json          Keras-serialised model (`registered_name` "vlzoo>CLIP", ...)
    metadata.json        versions, family, parameter count, paper, licence, description; the
                         weights' quantization mode ("int8") where they are quantized
    tokenizer.json       serialised tokenizer (its asset files named, not inlined)
    preprocessor.json    serialised image preprocessor
    model.weights.h5     weights, when the preset has them
    assets/tokenizer/    tokenizer vocabularies
    README.md            the model card of a published preset (optional)

This module reads and writes the JSON files (`read_preset`, `write_files`); turning a model
into them and back is `vlzoo.presets.saving` and `vlzoo.presets.local`.

Example:
>>> config, metadata = read_preset("my_preset")  # doctest: +SKIP
>>> metadata["family"]  # doctest: +SKIP
'clip'
"""

import json
import os
import pathlib

from packaging.version import InvalidVersion
from packaging.version import Version

from vlzoo.version import __version__

CONFIG_FILE = "config.json"
METADATA_FILE = "metadata.json"
TOKENIZER_FILE = "tokenizer.json"
PREPROCESSOR_FILE = "preprocessor.json"
WEIGHTS_FILE = "model.weights.h5"
TOKENIZER_ASSETS = os.path.join("assets", "tokenizer")
CARD_FILE = "README.md"


def read_json(path, what="Preset file"):
    """A JSON file's contents.

    Raises:
        FileNotFoundError: naming `what` and the path, when the file is missing.
        ValueError: naming `what` and the path, when it is not valid JSON.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} missing: {path}.")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{what} {path} is not valid JSON: {error}.") from error


def read_metadata(directory):
    """The `metadata.json` dict of a preset directory (see `read_json` for what it raises)."""
    return read_json(pathlib.Path(directory) / METADATA_FILE)


def read_preset(directory):
    """`(config, metadata)` of a preset directory, checked before a model is built from them.

    Raises:
        FileNotFoundError: `config.json` or `metadata.json` is missing.
        ValueError: `config.json` is not a serialised Keras model config, `metadata.json` is not a JSON
            object, or a newer vlzoo wrote the preset (its config may use what this one lacks).
    """
    directory = pathlib.Path(directory)
    config = read_json(directory / CONFIG_FILE)
    metadata = read_json(directory / METADATA_FILE)
    if not isinstance(config, dict) or "config" not in config or "class_name" not in config:
        raise ValueError(f"Preset file {directory / CONFIG_FILE} is not a serialised Keras model config.")
    if not isinstance(metadata, dict):
        raise ValueError(f"Preset file {directory / METADATA_FILE} is not a JSON object.")
    _check_version(metadata, directory / METADATA_FILE)
    return config, metadata


def _check_version(metadata, path):
    written = metadata.get("vlzoo_version")
    if written is None:
        return
    try:
        newer = Version(str(written)) > Version(__version__)
    except InvalidVersion as error:
        raise ValueError(f"Preset file {path}: `vlzoo_version` {written!r} is not a version number.") from error
    if newer:
        raise ValueError(
            f"Preset file {path} was written by vlzoo {written}, newer than the installed vlzoo {__version__}; "
            "upgrade vlzoo to load it."
        )


def write_json(path, value):
    """Writes `value` as indented JSON with sorted keys (the form of every file of a preset)."""
    pathlib.Path(path).write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")


def write_files(directory, config, metadata, tokenizer=None, preprocessor=None):
    """Writes the JSON files of a preset directory, creating it when absent.

    Args:
        directory: the preset directory.
        config: the Keras-serialised model (`config.json`).
        metadata: `metadata.json`'s entries; `vlzoo_version` is added (the version writing it).
        tokenizer: the serialised tokenizer (`tokenizer.json`), or None for none.
        preprocessor: the serialised image preprocessor (`preprocessor.json`), or None for none.

    Example:
    >>> write_files("my_preset", config, {"family": "clip"})  # doctest: +SKIP
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / CONFIG_FILE, config)
    write_json(directory / METADATA_FILE, {"vlzoo_version": __version__, **metadata})
    for name, value in ((TOKENIZER_FILE, tokenizer), (PREPROCESSOR_FILE, preprocessor)):
        if value is not None:
            write_json(directory / name, value)
