"""Deprecated: the pretrained presets, now `vlzoo.presets.catalogue`.

Each name read here warns (`DeprecationWarning`, naming its new place) and is served from there.
"""

from vlzoo._deprecation import moved_module

__getattr__, __dir__ = moved_module(__name__, ["vlzoo.presets.catalogue"], renamed={
    "catalogue": "vlzoo.presets.catalogue.pretrained_presets",
    "CATALOGUE_FILE": "vlzoo.presets.catalogue.PRETRAINED_FILE",
    "REQUIRED": "vlzoo.presets.catalogue.PRETRAINED_REQUIRED",
})
