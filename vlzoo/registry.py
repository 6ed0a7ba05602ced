"""The registered presets as data: `presets/registry.json` is their one definition.

Each entry gives a preset's family and model class, its constructor arguments
(`config`), its tokenizer (`tokenizer`: bundled assets and options) and image
preprocessor arguments (`preprocessor`), and what a user reads about it
(`description`, `paper`, `weights_note`, and `upstream_weights` where the
authors publish a checkpoint). `tools/build_presets.py` writes each
`presets/<name>/` directory from its entry and `--check` fails when one has
drifted; the `*_shapes` presets' weights come from `tools/train_shapes.py`. A family
defined in code may also define presets (`vlzoo.families.Family.presets`): `register` adds
them here, and `vlzoo.presets` writes their directories when they are first loaded.

Reading the registry needs neither Keras nor a model class, so checking or
listing names imports no backend. Adding a preset is adding an entry and
running `python tools/build_presets.py` (see docs/adding_a_family.md).

Example:
>>> definition("clip_tiny")["family"]
'clip'
>>> names(family="llip")[:2]
['llip_shapes', 'llip_tiny']
"""

import functools
import json

from vlzoo._paths import DATA_ROOT

REGISTRY_FILE = DATA_ROOT / "registry.json"
REQUIRED = ("family", "class_name", "config", "tokenizer", "preprocessor", "description", "paper", "weights_note")
_IN_CODE = {}


def _check_entry(name, entry, where):
    missing = [key for key in REQUIRED if key not in entry]
    if missing:
        raise ValueError(f"{where}: preset {name!r} lacks {', '.join(missing)}.")


@functools.cache
def _file_definitions():
    entries = json.loads(REGISTRY_FILE.read_text())
    for name, entry in entries.items():
        _check_entry(name, entry, REGISTRY_FILE)
    return entries


def definitions():
    """`{name: entry}` of every registered preset: `presets/registry.json`'s, then those defined in code."""
    return {**_file_definitions(), **_IN_CODE}


def register(name, entry):
    """Registers the preset `name` defined in code (`entry`: the fields of a `registry.json` entry).

    Raises:
        ValueError: `entry` lacks a required field, or `name` is a preset of `registry.json`.
    """
    _check_entry(name, entry, "vlzoo.registry.register")
    if name in _file_definitions():
        raise ValueError(f"Preset {name!r} is already defined in {REGISTRY_FILE}; choose another name.")
    _IN_CODE[name] = dict(entry)


def defined_in_code(name):
    """Whether the registered preset `name` was defined in code (its directory is written on first load)."""
    return name in _IN_CODE


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
