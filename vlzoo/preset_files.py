"""Deprecated: writing preset directories, now `vlzoo.presets.files`, `vlzoo.presets.saving`.

Each name read here warns (`DeprecationWarning`, naming its new place) and is served from there.
"""

from vlzoo._deprecation import moved_module

__getattr__, __dir__ = moved_module(__name__, ["vlzoo.presets.files", "vlzoo.presets.saving"])
