"""Deprecated: the preset catalogue, now `vlzoo.presets.files`, `vlzoo.presets.catalogue`.

Each name read here warns (`DeprecationWarning`, naming its new place) and is served from there.
"""

from vlzoo._deprecation import moved_module

__getattr__, __dir__ = moved_module(__name__, ["vlzoo.presets.files", "vlzoo.presets.catalogue"], renamed={
    "resolve_preset": "vlzoo.presets.catalogue.preset_directory",
    "pretrained_catalogue": "vlzoo.presets.catalogue.pretrained_presets",
})
