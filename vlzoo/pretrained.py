"""The catalogue of pretrained presets: names that point at real public weights.

One data file, `presets/pretrained.json`, is the single source: per name, where the
weights live (`handle`, an `hf://` repository, a `kaggle://` model version, or a URL with
its `sha256`), the layout
there (`format`), the family and the vlzoo preset of the same geometry
(`architecture`), the licence, the download size as the publisher shows it, a URL's
sha256 (null where none is published), and `reference`: where those facts were read. `vlzoo.from_preset(name)` downloads
and converts on first use (see `vlzoo.loading`).

Example:
>>> sorted(catalogue())[:2]  # doctest: +SKIP
['clip_vit_b16_datacomp', 'clip_vit_b16_laion2b']
"""

import functools
import json

from vlzoo import formats
from vlzoo._deprecation import deprecated_constants
from vlzoo._paths import DATA_ROOT

CATALOGUE_FILE = DATA_ROOT / "pretrained.json"
REQUIRED = ("handle", "format", "family", "architecture", "source", "licence", "reference", "description")


def _check(name, entry):
    missing = [key for key in REQUIRED if key not in entry]
    if missing:
        raise ValueError(f"{CATALOGUE_FILE}: pretrained preset {name!r} lacks {', '.join(missing)}.")
    if entry["format"] not in formats.catalogue_formats():
        raise ValueError(f"{CATALOGUE_FILE}: {name!r} has `format` {entry['format']!r}; expected one of "
                         f"{formats.catalogue_formats()}.")
    if not entry["handle"].startswith(("hf://", "kaggle://", "https://")):
        raise ValueError(
            f"{CATALOGUE_FILE}: {name!r} has handle {entry['handle']!r}; expected hf://, kaggle:// or https://.")
    if entry["handle"].startswith("https://") and "sha256" not in entry:
        raise ValueError(f"{CATALOGUE_FILE}: {name!r} downloads a URL: give its `sha256` (null where none is "
                         "published).")


# A constant until the table of checkpoint formats; deprecated 2026-11-28.
__getattr__ = deprecated_constants(__name__, {"FORMATS": ("vlzoo.formats.catalogue_formats()",
                                                          formats.catalogue_formats)})


@functools.cache
def catalogue():
    """`{name: entry}` of every pretrained preset, read once from `presets/pretrained.json`."""
    entries = json.loads(CATALOGUE_FILE.read_text())
    for name, entry in entries.items():
        _check(name, entry)
    return entries


def is_pretrained(name):
    """Whether `name` is a pretrained preset of the catalogue."""
    return isinstance(name, str) and name in catalogue()
