"""Where vlzoo's files live on disk: a leaf module (it imports nothing from vlzoo)."""

import os
import pathlib

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parent
"""The `vlzoo/` package directory."""


def presets_root():
    """Directory holding the registered preset directories.

    `$VLZOO_PRESETS_DIR` when set, else the repository's `presets/` (next to `vlzoo/`).
    """
    env = os.environ.get("VLZOO_PRESETS_DIR")
    if env:
        return pathlib.Path(env)
    return PACKAGE_ROOT.parent / "presets"
