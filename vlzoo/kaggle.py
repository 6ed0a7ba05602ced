"""Kaggle Models handles, where keras-hub publishes its presets: `kaggle://owner/model/framework/variation[/version]`.

Downloads go through `kagglehub`, the client keras-hub's own `from_preset` downloads these
handles with, so its cache (`KAGGLEHUB_CACHE`, default `~/.cache/kagglehub`), its
credentials (`KAGGLE_API_TOKEN`, `~/.kaggle`; public models need none) and its progress
bars apply, and it checks every file against the MD5 the server sends with it, deleting
a file that differs. A version number names immutable files: a handle with one is
converted once and then loads from vlzoo's converted cache without any network call
(offline too). A handle without one asks Kaggle for the latest version on every load.

Example:
>>> parse_kaggle_handle("kaggle://keras/siglip/keras/siglip2_base_patch16_224/1")
('keras/siglip/keras/siglip2_base_patch16_224', 1)
"""

import pathlib
import re

import kagglehub
from kagglehub.exceptions import KaggleApiHTTPError

from vlzoo.hub import file_hash

KAGGLE_SCHEME = "kaggle://"
_SEGMENT = re.compile(r"[A-Za-z0-9][\w.-]*")


def is_kaggle_handle(preset):
    """Whether `preset` is a `kaggle://` handle."""
    return isinstance(preset, str) and preset.startswith(KAGGLE_SCHEME)


def parse_kaggle_handle(handle):
    """`(model, version)` of `kaggle://owner/model/framework/variation[/version]` (version an int or None).

    Raises:
        ValueError: a handle of another form (the expected form is named).
    """
    parts = handle[len(KAGGLE_SCHEME):].split("/") if is_kaggle_handle(handle) else []
    version = None
    if len(parts) == 5 and parts[4].isdigit():
        version = int(parts.pop())
    if len(parts) != 4 or not all(_SEGMENT.fullmatch(part) for part in parts):
        raise ValueError(
            f"{handle!r} is not a Kaggle Models handle: expected kaggle://owner/model/framework/variation"
            "[/version], e.g. kaggle://keras/siglip/keras/siglip2_base_patch16_224/1."
        )
    return "/".join(parts), version


def download(handle):
    """The local directory of the model version `handle` names (downloaded by kagglehub when needed).

    Its name is the version number. Raises `FileNotFoundError` for a model or version Kaggle
    does not have (or does not show without credentials).
    """
    model, version = parse_kaggle_handle(handle)
    try:
        return pathlib.Path(kagglehub.model_download(model if version is None else f"{model}/{version}"))
    except KaggleApiHTTPError as error:
        status = getattr(error.response, "status_code", None)
        if status in (401, 403, 404):
            raise FileNotFoundError(
                f"{handle}: Kaggle has no such model version, or it needs credentials ({status}: {error})."
            ) from None
        raise


def file_digests(directory):
    """`{relative path: sha256}` of every file of a downloaded model version (kagglehub's markers left out)."""
    directory = pathlib.Path(directory)
    return {path.relative_to(directory).as_posix(): file_hash(path, "sha256") for path in sorted(directory.rglob("*"))
            if path.is_file() and not path.name.startswith(".") and ".kaggle" not in path.parts}
