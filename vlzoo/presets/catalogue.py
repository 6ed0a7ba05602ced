"""The catalogue of presets, without Keras: what presets exist, where they are, what they are.

Two data files of vlzoo's data folder (`vlzoo._paths.DATA_ROOT`) are the single sources:

- `registry.json`, the registered presets: per name, the family and model class, the
  constructor arguments (`config`), the tokenizer (`tokenizer`: bundled assets and options) and
  image preprocessor arguments (`preprocessor`), and what a user reads about it (`description`,
  `paper`, `weights_note`, and `upstream_weights` where the authors publish a checkpoint).
  `tools/build_presets.py` writes each `<name>/` directory from its entry (`--check` fails when
  one has drifted). A family defined in code may also define presets
  (`vlzoo.families.Family.presets`): `register` adds them, and `vlzoo.presets.resolve_preset`
  writes their directories when they are first loaded. An installed plugin declares its presets
  with the same fields (`vlzoo.plugins.plugin_presets`), so they are listed before its family's
  module is imported.
- `pretrained.json`, the pretrained presets (real public weights): per name, where the weights
  live (`handle`: an `hf://` repository, a `kaggle://` model version, or a URL with its `sha256`),
  their layout there (`format`), the family and the registered preset of the same geometry
  (`architecture`), the licence, the download size as the publisher shows it, and `reference`:
  where those facts were read. `vlzoo.from_preset(name)` downloads and converts on first use.

`vlzoo list`, `vlzoo info` and `--help` read presets through this module and so import no backend.

Example:
>>> definition("clip_tiny")["family"]
'clip'
>>> list_presets(family="sparo")[:2]
['sparo_clip_vit_b16', 'sparo_clip_vit_b32']
>>> describe("clip_vit_b16")["params"]
149620737
"""

import difflib
import functools
import json
import os
import pathlib

from vlzoo import formats
from vlzoo import plugins
from vlzoo._paths import DATA_ROOT
from vlzoo._paths import presets_root
from vlzoo.presets.files import CONFIG_FILE
from vlzoo.presets.files import WEIGHTS_FILE
from vlzoo.presets.files import read_json
from vlzoo.presets.files import read_metadata

REGISTRY_FILE = DATA_ROOT / "registry.json"
REGISTRY_REQUIRED = ("family", "class_name", "config", "tokenizer", "preprocessor", "description", "paper",
                     "weights_note")
PRETRAINED_FILE = DATA_ROOT / "pretrained.json"
PRETRAINED_REQUIRED = ("handle", "format", "family", "architecture", "source", "licence", "reference",
                       "description")
_IN_CODE = {}

# ----------------------------------------------------------------------------- registered presets

def _check_entry(name, entry, where):
    missing = [key for key in REGISTRY_REQUIRED if key not in entry]
    if missing:
        raise ValueError(f"{where}: preset {name!r} lacks {', '.join(missing)}.")


@functools.cache
def _file_definitions():
    entries = json.loads(REGISTRY_FILE.read_text())
    for name, entry in entries.items():
        _check_entry(name, entry, REGISTRY_FILE)
    return entries


@functools.cache
def _plugin_definitions():
    entries = plugins.plugin_presets()
    for name, entry in entries.items():
        _check_entry(name, entry, f"entry point group {plugins.PRESETS_GROUP!r}")
        if name in _file_definitions():
            raise ValueError(f"Preset {name!r} of an installed vlzoo plugin is already defined in {REGISTRY_FILE}.")
    return entries


def definitions():
    """`{name: entry}` of every registered preset: `registry.json`'s, the installed plugins', then those defined
    in code."""
    return {**_file_definitions(), **_plugin_definitions(), **_IN_CODE}


def register(name, entry):
    """Registers the preset `name` defined in code (`entry`: the fields of a `registry.json` entry).

    Raises:
        ValueError: `entry` lacks a required field, or `name` is a preset of `registry.json`.
    """
    _check_entry(name, entry, "vlzoo.presets.catalogue.register")
    if name in _file_definitions():
        raise ValueError(f"Preset {name!r} is already defined in {REGISTRY_FILE}; choose another name.")
    _IN_CODE[name] = dict(entry)


def defined_in_code(name):
    """Whether the registered preset `name` was defined in code or by an installed plugin (its directory is
    written on first load)."""
    return name in _IN_CODE or name in _plugin_definitions()


def definition(name):
    """The registry entry of preset `name`; `KeyError` naming the registered presets otherwise."""
    entries = definitions()
    if name not in entries:
        raise KeyError(f"{name!r} is not a registered preset; registered: {', '.join(sorted(entries))}.")
    return entries[name]


def families():
    """The families that have registered presets, sorted."""
    return sorted({entry["family"] for entry in definitions().values()})


def names(family=None):
    """Sorted names of the registered presets, optionally of one `family`."""
    return sorted(name for name, entry in definitions().items() if family in (None, entry["family"]))


# ----------------------------------------------------------------------------- pretrained presets

def _check_pretrained(name, entry):
    missing = [key for key in PRETRAINED_REQUIRED if key not in entry]
    if missing:
        raise ValueError(f"{PRETRAINED_FILE}: pretrained preset {name!r} lacks {', '.join(missing)}.")
    if entry["format"] not in formats.catalogue_formats():
        raise ValueError(f"{PRETRAINED_FILE}: {name!r} has `format` {entry['format']!r}; expected one of "
                         f"{formats.catalogue_formats()}.")
    if not entry["handle"].startswith(("hf://", "kaggle://", "https://")):
        raise ValueError(
            f"{PRETRAINED_FILE}: {name!r} has handle {entry['handle']!r}; expected hf://, kaggle:// or https://.")
    if entry["handle"].startswith("https://") and "sha256" not in entry:
        raise ValueError(f"{PRETRAINED_FILE}: {name!r} downloads a URL: give its `sha256` (null where none is "
                         "published).")


@functools.cache
def pretrained_presets():
    """`{name: entry}` of every pretrained preset, read once from `pretrained.json`."""
    entries = json.loads(PRETRAINED_FILE.read_text())
    for name, entry in entries.items():
        _check_pretrained(name, entry)
    return entries


def is_pretrained(name):
    """Whether `name` is a pretrained preset."""
    return isinstance(name, str) and name in pretrained_presets()


# ----------------------------------------------------------------------------- names, directories, descriptions

def list_presets(family=None, pretrained=False):
    """Names of every registered preset, optionally of one `family` (e.g. `"clip"`).

    With `pretrained=True`, the names of the pretrained presets instead (downloaded on first use).

    Raises:
        ValueError: `family` has no registered preset (the registered families are named).
    """
    if family is not None and family not in families():
        raise ValueError(f"Unknown `family` {family!r}; registered families: {families()}.")
    if pretrained:
        return sorted(name for name, entry in pretrained_presets().items() if family in (None, entry["family"]))
    return names(family)


def _unknown_preset_error(name):
    known = list_presets()
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.4)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return ValueError(
        f"Unknown preset {name!r}: not a registered name and not a directory.{hint} "
        f"Registered presets: {', '.join(known)}."
    )


def preset_directory(preset):
    """The directory of `preset`: a registered name (`presets_root()/<name>`) or a path.

    Raises:
        FileNotFoundError: a preset defined in code (`vlzoo.presets.resolve_preset` writes its
            directory), a registered preset whose directory is missing, or a path that is not a directory.
        ValueError: an unknown name, with the closest registered names.
    """
    path = pathlib.Path(os.path.expanduser(str(preset)))
    if path.is_dir():
        return path
    if defined_in_code(str(preset)):
        raise FileNotFoundError(
            f"Preset {preset!r} is defined in code (family {definition(str(preset))['family']!r}); "
            "`vlzoo.presets.resolve_preset` writes its directory, and `vlzoo.from_preset` loads it."
        )
    if str(preset) in definitions():
        directory = presets_root() / str(preset)
        if not directory.is_dir():
            raise FileNotFoundError(
                f"Preset {preset!r} is registered but its directory {directory} is missing; "
                "run `python tools/build_presets.py`."
            )
        return directory
    if os.sep in str(preset) or str(preset).startswith("."):
        raise FileNotFoundError(f"Preset directory not found: {path}.")
    raise _unknown_preset_error(str(preset))


def model_config(preset):
    """The Keras-serialised config dict of `preset` (name or directory; see `preset_directory`)."""
    return read_json(preset_directory(preset) / CONFIG_FILE)


def describe(name):
    """Family, parameter count, paper, weights availability and description of a preset, read without Keras.

    Args:
        name: a registered or pretrained preset, or a preset directory.

    Returns:
        A dict: `name`, `family`, `params`, `paper`, `weights_available`, `weights_note`, `description`,
        `directory`; `upstream_weights` (the repository, checkpoint file and `vlzoo convert` command)
        where the authors publish weights; for a pretrained preset its `handle`, `format`, `source`,
        `licence`, `download_size`, `architecture` and `reference`. `params` is the registered metadata's
        count, None for a directory or a preset defined in code (`vlzoo.preset_info` counts those).

    Raises:
        ValueError, FileNotFoundError: as `preset_directory`.

    Example:
    >>> describe("clip_tiny")["family"]
    'clip'
    """
    if name in pretrained_presets():
        return _pretrained_info(name)
    if defined_in_code(str(name)):  # no directory until it is loaded, and no count without Keras
        entry = definition(str(name))
        return {"name": str(name), "family": entry["family"], "params": None, "paper": entry["paper"],
                "weights_available": False, "weights_note": entry["weights_note"],
                "description": entry["description"], "directory": None}
    directory = preset_directory(name)
    metadata = read_metadata(directory)
    read_json(directory / CONFIG_FILE)  # a directory without a readable config.json is not a preset
    return {
        "name": metadata.get("name", str(name)),
        "family": metadata.get("family"),
        "params": (metadata["parameter_count"] if str(name) in definitions() and "parameter_count" in metadata
                   else None),
        "paper": metadata.get("paper"),
        "weights_available": (directory / WEIGHTS_FILE).is_file(),
        "weights_note": metadata.get("weights_note"),
        **({"upstream_weights": metadata["upstream_weights"]} if "upstream_weights" in metadata else {}),
        "description": metadata.get("description"),
        "directory": str(directory),
    }


def _pretrained_info(name):
    entry = pretrained_presets()[name]
    info = describe(entry["architecture"])
    return {
        "name": name, "family": entry["family"], "params": info["params"], "paper": info["paper"],
        "weights_available": True,
        "weights_note": f"Downloaded from {entry['handle']} on first use and converted into vlzoo's cache.",
        "source": entry["source"], "licence": entry["licence"], "handle": entry["handle"],
        "format": entry["format"], "download_size": entry.get("download_size"), "architecture": entry["architecture"],
        "reference": entry["reference"], "description": entry["description"],
    }
