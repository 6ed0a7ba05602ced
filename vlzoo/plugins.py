"""Families installed by other packages: the entry-point groups `vlzoo.families` and `vlzoo.presets`.

A package that defines a family (docs/adding_a_family.md, *A family installed as a plugin*) declares
it in its `pyproject.toml`:

    [project.entry-points."vlzoo.families"]
    headwise_clip = "headwise_plugin.model"            # the family's name = the module that registers it

    [project.entry-points."vlzoo.presets"]
    headwise_clip = "headwise_plugin.presets:PRESETS"  # {preset name: registry entry}, in a module without Keras

Entry points are read from the installed packages' metadata, which imports none of them: the command
line names the installed families (`vlzoo train --help`) without a backend. A family's module is
imported when the family is first needed: looked up by name (`vlzoo.families.get_family`, which
`from_preset(..., family=...)`, a preset of the family and a preset directory whose `metadata.json`
names the family go through), or when every family is enumerated (`registered_families()`, an unknown
`vlzoo convert --from` format). The `vlzoo.presets` objects are loaded when the preset catalogue is
first read (`vlzoo list`), so they must import no backend. Keras-free: the standard library only.

Example:
>>> plugin_families()  # the families of the installed plugins, none imported
()
>>> load_family("sparc")  # a built-in family is no plugin
False
"""

import collections.abc
import functools
import importlib.metadata

FAMILIES_GROUP = "vlzoo.families"
PRESETS_GROUP = "vlzoo.presets"
_loaded = set()  # plugin families whose module was imported (or is being imported)


@functools.cache
def _entry_points(group):
    """`{name: importlib.metadata.EntryPoint}` of `group` over the installed packages, read once per process."""
    return {entry.name: entry for entry in importlib.metadata.entry_points(group=group)}


def _origin(entry):
    """`'name = value' (package)`: an entry point, for messages."""
    package = entry.dist.name if entry.dist is not None else "an installed package"
    return f"{entry.name} = {entry.value!r} ({package})"


def plugin_families():
    """The family names the installed packages declare (entry points of `vlzoo.families`), sorted; imports none."""
    return tuple(sorted(_entry_points(FAMILIES_GROUP)))


def load_family(name):
    """Imports the module of the installed plugin family `name` (once per process).

    Args:
        name: a family name.

    Returns:
        Whether a plugin declares `name` (False for vlzoo's own families and unknown names).

    Raises:
        ImportError: the plugin's module failed to import; the entry point and its package are named.
    """
    entry = _entry_points(FAMILIES_GROUP).get(name)
    if entry is None:
        return False
    if name not in _loaded:
        _loaded.add(name)  # a module that enumerates the families while it registers does not import itself again
        try:
            entry.load()
        except Exception as error:
            _loaded.discard(name)
            raise ImportError(f"The vlzoo plugin family {_origin(entry)} failed to import: {error}") from error
    return True


def load_families():
    """Imports the module of every installed plugin family (`load_family`)."""
    for name in plugin_families():
        load_family(name)


@functools.cache
def plugin_presets():
    """`{preset name: registry entry}` the installed packages declare (entry points of `vlzoo.presets`).

    Each entry point names a mapping of the fields of a `presets/registry.json` entry; it is loaded
    once per process, and `vlzoo.presets.catalogue` checks the entries.

    Raises:
        TypeError: an entry point's object is not a mapping of mappings (the entry point is named).
        ValueError: two packages declare the same preset name.
    """
    presets, origins = {}, {}
    for entry in _entry_points(PRESETS_GROUP).values():
        declared = entry.load()
        if not isinstance(declared, collections.abc.Mapping) or not all(
                isinstance(value, collections.abc.Mapping) for value in declared.values()):
            raise TypeError(f"The vlzoo plugin presets {_origin(entry)} must be a mapping of preset names to registry "
                            f"entries; received {type(declared).__name__}.")
        for name, definition in declared.items():
            if name in presets:
                raise ValueError(f"Preset {name!r} is declared by two vlzoo plugins: {origins[name]} and "
                                 f"{_origin(entry)}.")
            presets[name], origins[name] = dict(definition), _origin(entry)
    return presets
