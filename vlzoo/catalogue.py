"""The preset catalogue without Keras: names, directories, metadata and descriptions.

`vlzoo list`, `vlzoo info` and `--help` read presets through this module and so
import no backend. Registered names (`vlzoo.registry`, defined in
`presets/registry.json`) resolve to `<name>/` of vlzoo's data folder (`vlzoo._paths.DATA_ROOT`: the
checkout's `presets/`, or `vlzoo/_presets/` installed; or
`$VLZOO_PRESETS_DIR/<name>/`); the catalogue of real public weights is
`vlzoo.pretrained`. `vlzoo.presets` builds models from what this module finds.

Example:
>>> list_presets(family="sparo")[:2]
['sparo_clip_vit_b16', 'sparo_clip_vit_b32']
>>> describe("clip_vit_b16")["params"]
149620737
"""

import difflib
import json
import os
import pathlib

from vlzoo import registry
from vlzoo._paths import presets_root
from vlzoo.pretrained import catalogue as pretrained_catalogue

# The files of a preset directory (keras-hub's layout; `vlzoo.preset_files` writes them).
CONFIG_FILE = "config.json"
METADATA_FILE = "metadata.json"
TOKENIZER_FILE = "tokenizer.json"
PREPROCESSOR_FILE = "preprocessor.json"
WEIGHTS_FILE = "model.weights.h5"
TOKENIZER_ASSETS = os.path.join("assets", "tokenizer")


def list_presets(family=None, pretrained=False):
    """Names of every registered preset, optionally of one `family` (e.g. `"clip"`).

    With `pretrained=True`, the names of the catalogue of real public weights instead
    (`presets/pretrained.json`; downloaded on first use, see `preset_info`).
    """
    if family is not None and family not in registry.families():
        raise ValueError(f"Unknown `family` {family!r}; registered families: {registry.families()}.")
    if pretrained:
        return sorted(name for name, entry in pretrained_catalogue().items() if family in (None, entry["family"]))
    return registry.names(family)


def _unknown_preset_error(name):
    names = list_presets()
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.4)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return ValueError(
        f"Unknown preset {name!r}: not a registered name and not a directory.{hint} "
        f"Registered presets: {', '.join(names)}."
    )


def read_metadata(directory):
    """The `metadata.json` dict of a preset directory."""
    return read_json(pathlib.Path(directory) / METADATA_FILE)


def read_json(path, what="Preset file"):
    """A JSON file's contents; FileNotFoundError / ValueError naming `what` and the path."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} missing: {path}.")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{what} {path} is not valid JSON: {error}.") from error


def resolve_preset(preset):
    """Returns the directory of `preset` (a registered name or a path)."""
    path = pathlib.Path(os.path.expanduser(str(preset)))
    if path.is_dir():
        return path
    if registry.defined_in_code(str(preset)):
        raise FileNotFoundError(
            f"Preset {preset!r} is defined in code (family {registry.definition(str(preset))['family']!r}); "
            "`vlzoo.presets.resolve_preset` writes its directory, and `vlzoo.from_preset` loads it."
        )
    if str(preset) in registry.definitions():
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
    """The Keras-serialised config dict of `preset` (name or directory)."""
    return read_json(resolve_preset(preset) / CONFIG_FILE)


def describe(name):
    """Family, parameter count, paper, weights availability and description of a preset.

    Presets whose weights are published upstream (Llip's released B/16 and
    G/14) also give `upstream_weights`: the repository, the checkpoint file
    and the `vlzoo convert` command that turns it into a preset directory.

    The parameter count of a registered preset is its metadata's (written
    by `tools/build_presets.py` from the config, and checked by its `--check`);
    for a directory, or a preset a family defines in code, it is None here:
    `vlzoo.preset_info` counts it from the config (with Keras, without
    allocating weights).
    """
    if name in pretrained_catalogue():
        return _pretrained_info(name)
    if registry.defined_in_code(str(name)):  # no directory until it is loaded, and no count without Keras
        entry = registry.definition(str(name))
        return {"name": str(name), "family": entry["family"], "params": None, "paper": entry["paper"],
                "weights_available": False, "weights_note": entry["weights_note"],
                "description": entry["description"], "directory": None}
    directory = resolve_preset(name)
    metadata = read_json(directory / METADATA_FILE)
    config = read_json(directory / CONFIG_FILE)
    return {
        "name": metadata.get("name", str(name)),
        "family": metadata.get("family"),
        "params": (metadata["parameter_count"] if str(name) in registry.definitions() and "parameter_count" in metadata
                   else None),
        "paper": metadata.get("paper"),
        "weights_available": (directory / WEIGHTS_FILE).is_file(),
        "weights_note": metadata.get("weights_note"),
        **({"upstream_weights": metadata["upstream_weights"]} if "upstream_weights" in metadata else {}),
        "description": metadata.get("description"),
        "directory": str(directory),
    }


def _pretrained_info(name):
    entry = pretrained_catalogue()[name]
    info = describe(entry["architecture"])
    return {
        "name": name, "family": entry["family"], "params": info["params"], "paper": info["paper"],
        "weights_available": True,
        "weights_note": f"Downloaded from {entry['handle']} on first use and converted into vlzoo's cache.",
        "source": entry["source"], "licence": entry["licence"], "handle": entry["handle"],
        "format": entry["format"], "download_size": entry.get("download_size"), "architecture": entry["architecture"],
        "reference": entry["reference"], "description": entry["description"],
    }
