"""Presets on this machine built into models: a registered name, a directory, a preset defined in code.

A registered name resolves to `<name>/` of the registered presets' folder
(`vlzoo._paths.presets_root()`), which `tools/build_presets.py` writes from the registry
(`vlzoo.presets.catalogue`). A preset defined in code (`vlzoo.families.Family.presets`) gets its
directory written, once per process, when `resolve_preset` first meets it. This module imports no
model class statically: a config names its class and the module that defines it, and when that
module is vlzoo's it is imported before Keras' registry resolves the class (as Keras does for its
own classes), so a preset loads whatever the process imported before. A registered preset's
tokenizer reads the vocabulary vlzoo ships (`tokenizer_assets` in its metadata names it) rather
than a copy of its own. Remote presets are `vlzoo.presets.remote`'s; `vlzoo.presets.from_preset`
loads either.

Example:
>>> model = load_local_preset("clip_tiny")
>>> preset_info("clip_vit_b16")["params"]
149620737
"""

import contextlib
import functools
import importlib
import json
import pathlib
import tempfile
import warnings

import h5py
import keras
import numpy as np

from vlzoo import families
from vlzoo import plugins
from vlzoo._backends.keras_internals import initialized_for_loading
from vlzoo._backends.keras_internals import without_weights
from vlzoo.presets import catalogue
from vlzoo.presets.files import CONFIG_FILE
from vlzoo.presets.files import METADATA_FILE
from vlzoo.presets.files import PREPROCESSOR_FILE
from vlzoo.presets.files import TOKENIZER_ASSETS
from vlzoo.presets.files import TOKENIZER_FILE
from vlzoo.presets.files import WEIGHTS_FILE
from vlzoo.presets.files import read_json
from vlzoo.presets.files import read_preset
from vlzoo.presets.saving import write_registered_preset
from vlzoo.tokenizers import UnavailableTokenizer
from vlzoo.tokenizers import bundled_asset_names
from vlzoo.tokenizers import bundled_assets_dir
from vlzoo.tokenizers import tokenizer_from_config

_warned_random = set()
_written = {}  # preset defined in code -> the temporary directory holding its files


def resolve_preset(preset):
    """The directory of `preset`: a registered name or a path (`vlzoo.presets.catalogue.preset_directory`).

    A preset defined in code has its directory written on first use, into a temporary
    directory kept (and removed) with the process.

    Raises:
        ValueError: an unknown name, with the closest registered names.
        FileNotFoundError: a path that is not a directory, or a registered preset whose directory is missing.

    Example:
    >>> resolve_preset("clip_tiny").name
    'clip_tiny'
    """
    name = str(preset)
    if not catalogue.defined_in_code(name) or pathlib.Path(name).is_dir():
        return catalogue.preset_directory(preset)
    if name not in _written:
        entry = catalogue.definition(name)
        holder = tempfile.TemporaryDirectory(prefix="vlzoo-preset-")
        write_registered_preset(name, entry, families.get_family(entry["family"]).model_class,
                                pathlib.Path(holder.name) / name)
        _written[name] = holder
    return pathlib.Path(_written[name].name) / name


def preset_info(name):
    """`vlzoo.presets.catalogue.describe(name)`, with `params` always counted.

    Where the catalogue has no count (a preset directory, a preset defined in code), it is
    computed from the config without allocating the model's weights (`count_parameters_abstractly`),
    so it works for presets too large for this machine.

    Example:
    >>> preset_info("clip_vit_b16")["params"]
    149620737
    """
    info = catalogue.describe(name)
    if info["params"] is None:
        info["params"] = count_parameters_abstractly(read_json(resolve_preset(name) / CONFIG_FILE))
    return info


def merge_config(base, overrides):
    """`base` with `overrides`' entries replacing its own; dicts are merged key by key."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_config(merged[key], value)
        else:
            merged[key] = value
    return merged


def import_defining_module(config):
    """Imports the vlzoo module a serialised Keras object names (`"module": "vlzoo.models.clip"`).

    Importing it registers its classes with Keras, so `keras.saving.deserialize_keras_object`
    finds them whatever the process imported before. A config without `module` whose
    `registered_name` is vlzoo's (`"vlzoo>CLIP"`) imports `vlzoo.models`, which registers every
    family. Only vlzoo's own modules are imported; a module that no longer exists (a preset written
    by another vlzoo) is left to the registry lookup, whose error names the class; any other import
    error is raised.
    """
    if not isinstance(config, dict):
        return
    module = config.get("module")
    if module is None and str(config.get("registered_name")).startswith("vlzoo>"):
        module = "vlzoo.models"
    if isinstance(module, str) and module.split(".")[0] == "vlzoo":
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            if error.name is None or not module.startswith(error.name):
                raise


def _deserialize(config, path):
    import_defining_module(config)
    try:
        return keras.saving.deserialize_keras_object(config)
    except NotImplementedError:  # e.g. a distribution on a backend without one: not the file's fault
        raise
    except Exception as error:
        raise ValueError(f"Could not build the model described by {path}: {error}") from error


def _check_family(config, metadata, directory):
    """The config's model class must be a vlzoo family (or a registered subclass) and agree with
    the metadata's family.

    A class that is not registered yet is looked for in the installed plugin of the metadata's family
    (`vlzoo.plugins.load_family`); the module `config.json` names is never imported unless it is vlzoo's
    (`import_defining_module`): a file does not choose what code runs. The error names that module.
    """
    class_name, family, module = config["class_name"], metadata.get("family"), config.get("module")
    import_defining_module(config)
    registered_name = config.get("registered_name") or class_name
    cls = keras.saving.get_registered_object(registered_name)
    if cls is None and isinstance(family, str) and plugins.load_family(family):
        cls = keras.saving.get_registered_object(registered_name)
    if cls is None:
        hint = (f"Import `{module}`, the module {CONFIG_FILE} names (vlzoo does not import it for you: a preset file "
                "does not choose what code runs), or install the package that provides it as a vlzoo plugin "
                f"(entry point group {plugins.FAMILIES_GROUP!r}, docs/adding_a_family.md), before calling "
                "`from_preset`." if isinstance(module, str) and module.split(".")[0] != "vlzoo"
                else "For your own subclass, import the module that registers it before calling `from_preset`.")
        raise ValueError(
            f"Preset file {directory / CONFIG_FILE} describes a model of class {class_name!r} (registered as "
            f"{registered_name!r}, family {family!r} in {METADATA_FILE}), which is neither a vlzoo family model "
            f"({', '.join(catalogue.families())}) nor a registered Keras class. {hint}"
        )
    own = getattr(cls, "family", None) if cls.__module__.startswith("vlzoo.") else None
    if family is not None and own is not None and family != own:
        raise ValueError(
            f"Preset files disagree: {directory / METADATA_FILE} says family {family!r} but "
            f"{directory / CONFIG_FILE} describes a {class_name}, a {own!r} model "
            f"(vlzoo's families: {', '.join(catalogue.families())})."
        )


def _load_weights(model, path):
    """Loads `path` into `model`, using every array in the file (optimizer state aside) exactly once."""
    try:
        model.load_weights(str(path))
    except Exception as error:
        raise ValueError(
            f"Could not load the weights file {path}: {error}. "
            "Is it complete, and does config.json (with your overrides) match it?"
        ) from error
    # Keras raises for a variable the file lacks but ignores arrays the model does not use
    # (a config with fewer layers than the weights): count them.
    with h5py.File(path, "r") as file:
        arrays = []
        file.visititems(lambda name, obj: arrays.append(name) if isinstance(obj, h5py.Dataset) else None)
    arrays = [name for name in arrays if not name.startswith("optimizer/")]
    if len(arrays) != len(model.weights):
        raise ValueError(
            f"The weights file {path} holds {len(arrays)} arrays but the model that config.json (with your "
            f"overrides) describes has {len(model.weights)} weights: they do not match."
        )


def count_parameters_abstractly(config):
    """Parameter count of a serialised model config, without allocating weights.

    Variables are created inside a `keras.StatelessScope` that defers their
    initialisation; only their shapes are read. A config is counted once per
    process (`vlzoo list` and `preset_info` ask for the same big presets again).
    """
    return _count_parameters(json.dumps(config, sort_keys=True))


@functools.cache
def _count_parameters(config_json):
    config = json.loads(config_json)
    import_defining_module(config)
    with without_weights():
        model = keras.saving.deserialize_keras_object(config)
        return sum(int(np.prod(v.shape)) for v in model.weights)


def load_local_preset(preset, load_weights=True, dtype=None, **config_overrides):
    """Builds the model of a preset on this machine: a registered name or a preset directory.

    `vlzoo.presets.from_preset` is the entry point (it also fetches remote presets and
    changes families); converters call this to build the model they fill.

    Args:
        preset: a name from `list_presets()` or a directory written by `save_to_preset`.
        load_weights: load `model.weights.h5` when present. A preset without
            weights loads randomly initialised and says so once.
        dtype: dtype policy (`"float32"`, `"bfloat16"`, `"mixed_bfloat16"`).
        **config_overrides: constructor arguments replacing the preset's;
            dicts (`vision=...`, `text=...`) are merged key by key.

    Returns:
        A `keras.Model` of the preset's family, with `tokenizer` and
        `preprocessor` attached.

    Raises:
        ValueError: an unknown name (the closest are named), or preset files that do not describe
            a vlzoo model or do not fit one another (the file is named).
        FileNotFoundError: a missing preset directory, preset file or tokenizer asset.

    Example:
    >>> model = load_local_preset("clip_tiny")
    >>> model.encode_text(model.tokenizer(["a photo of a cat"]))["embeds"].shape
    (1, 24)
    """
    directory = resolve_preset(preset)
    config, metadata = read_preset(directory)
    _check_family(config, metadata, directory)
    inner = merge_config(config["config"], config_overrides)
    if dtype is not None:
        inner["dtype"] = dtype
    weights = directory / WEIGHTS_FILE
    loading = load_weights and weights.is_file()
    with initialized_for_loading() if loading else contextlib.nullcontext():  # no draws for what is loaded
        model = _deserialize({**config, "config": inner}, directory / CONFIG_FILE)
    if metadata.get("quantization"):  # the variables the quantized weights fill
        model.quantize(metadata["quantization"])

    if loading:
        _load_weights(model, weights)
    elif load_weights and str(directory) not in _warned_random:
        _warned_random.add(str(directory))
        warnings.warn(
            f"Preset {metadata.get('name', str(preset))!r} has no weights ({WEIGHTS_FILE} absent): "
            "the model is randomly initialised. "
            + metadata.get("weights_note", ""),
            stacklevel=3,  # the caller of `vlzoo.presets.from_preset`
        )

    # The tokenizer and preprocessor follow the model's context length and image size,
    # which `config_overrides` may have changed.
    tokenizer_file = directory / TOKENIZER_FILE
    if tokenizer_file.is_file():
        model.tokenizer = _load_tokenizer(tokenizer_file, _tokenizer_assets(directory, metadata), metadata,
                                          model.text.sequence_length)
    preprocessor_file = directory / PREPROCESSOR_FILE
    if preprocessor_file.is_file():
        preprocessor = read_json(preprocessor_file)
        preprocessor.setdefault("config", {})["image_size"] = model.vision.image_size
        model.preprocessor = _deserialize(preprocessor, preprocessor_file)
    return model


def _tokenizer_assets(directory, metadata):
    """The preset's own `assets/tokenizer/`, or else the vocabulary vlzoo ships that its metadata names."""
    own, shipped = directory / TOKENIZER_ASSETS, metadata.get("tokenizer_assets")
    if own.is_dir() or shipped is None:
        return own
    if shipped not in bundled_asset_names():
        raise ValueError(
            f"Preset file {directory / METADATA_FILE}: `tokenizer_assets` {shipped!r} is not a vocabulary "
            f"vlzoo ships ({', '.join(bundled_asset_names())}), and {own} is absent."
        )
    return bundled_assets_dir(shipped)


def _load_tokenizer(tokenizer_file, assets, metadata, sequence_length):
    """The preset's tokenizer; a stand-in that explains itself when its files are declared unbundled."""
    config = read_json(tokenizer_file)
    config.setdefault("config", {})["sequence_length"] = sequence_length
    try:
        return tokenizer_from_config(config, assets)
    except FileNotFoundError as error:
        if metadata.get("tokenizer_bundled", True) is False:
            return UnavailableTokenizer(f"{metadata.get('tokenizer_note', '')} ({error})", config=config)
        raise FileNotFoundError(f"Tokenizer asset missing in {assets} (named by {tokenizer_file}): {error}") from error
