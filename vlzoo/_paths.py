"""Where vlzoo's files live on disk: a leaf module (it imports nothing from vlzoo).

The files vlzoo reads at run time besides its code (the preset registry, the pretrained
catalogue, the tokenizer vocabularies and the bundled presets' weights) are the repository's
top-level `presets/` folder. An installed wheel or sdist carries that folder inside the package,
as `vlzoo/_presets/` (`pyproject.toml` maps it there); a checkout reads it where it is.
"""

import os
import pathlib

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parent
"""The `vlzoo/` package directory."""

_INSTALLED_DATA = PACKAGE_ROOT / "_presets"  # where a wheel or sdist install holds the presets/ folder

DATA_ROOT = _INSTALLED_DATA if _INSTALLED_DATA.is_dir() else PACKAGE_ROOT.parent / "presets"
"""vlzoo's data folder: `vlzoo/_presets/` when installed, the checkout's `presets/` otherwise.

Holds `registry.json`, `pretrained.json`, `_assets/<vocabulary>/` and the registered presets'
directories."""


def presets_root():
    """Directory holding the registered preset directories.

    `$VLZOO_PRESETS_DIR` when set (the vocabularies, registry and catalogue are still read from
    `DATA_ROOT`), else `DATA_ROOT`.
    """
    env = os.environ.get("VLZOO_PRESETS_DIR")
    if env:
        return pathlib.Path(env)
    return DATA_ROOT
