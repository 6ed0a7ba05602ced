"""Kaggle Models, where keras-hub publishes its presets: `kaggle://owner/model/framework/variation[/version]`.

Downloads and uploads go through `kagglehub`, the client keras-hub's own `from_preset` and
`upload_preset` use, so its cache (`KAGGLEHUB_CACHE`, default `~/.cache/kagglehub`), its
credentials (`KAGGLE_USERNAME`/`KAGGLE_KEY`, `KAGGLE_API_TOKEN`, `~/.kaggle`; downloading public
models needs none), its server (`KAGGLE_API_ENVIRONMENT`) and its progress bars apply, and it
checks every downloaded file against the MD5 the server sends with it, deleting a file that
differs. A version number names immutable files: a handle with one is converted once and then
loads from vlzoo's converted cache without any network call (offline too). A handle without one
asks Kaggle for the latest version on every load. An upload creates a new version of a variation.

Example:
>>> parse_kaggle_handle("kaggle://keras/siglip/keras/siglip2_base_patch16_224/1")
('keras/siglip/keras/siglip2_base_patch16_224', 1)
"""

import pathlib
import re
import shutil
import tempfile

import kagglehub
from kagglehub.clients import build_kaggle_client
from kagglehub.exceptions import KaggleApiHTTPError
from kagglehub.exceptions import handle_call
from kagglehub.handle import parse_model_handle
from kagglesdk.models.types.model_api_service import ApiGetModelInstanceRequest

from vlzoo.presets.files import CARD_FILE

KAGGLE_SCHEME = "kaggle://"
_SEGMENT = re.compile(r"[A-Za-z0-9][\w.-]*")
_LICENCES = {"mit": "MIT", "apache-2.0": "Apache 2.0"}  # Kaggle's names of the licences it knows


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


def latest_version(handle):
    """The latest version number Kaggle lists for the variation `handle` names, None when it has none."""
    model, _ = parse_kaggle_handle(handle)
    parsed = parse_model_handle(model)
    request = ApiGetModelInstanceRequest()
    request.owner_slug, request.model_slug = parsed.owner, parsed.model
    request.framework, request.instance_slug = parsed.framework_enum(), parsed.variation
    try:
        with build_kaggle_client() as client:
            return handle_call(lambda: client.models.model_api_client.get_model_instance(request)).version_number
    except KaggleApiHTTPError:
        return None


def upload(handle, files, card, licence, message):
    """Uploads `files` as a new version of the Kaggle Models variation `handle` names (created when absent).

    Args:
        handle: `"kaggle://user/model/framework/variation"`, without a version (Kaggle numbers them).
        files: `{path in the model: local path}`; symbolic links are followed, the sources left as they are.
        card: the text of the `README.md` added when `files` has none.
        licence: the licence's SPDX identifier in lower case (`"mit"`, `"apache-2.0"`); any other,
            or None, leaves Kaggle's default.
        message: the version notes.

    Returns:
        The new version number, or None when Kaggle does not list it yet (a new version is
        processed before it is listed).

    Raises:
        ValueError: a malformed handle, or one that names a version.

    Example:
    >>> upload("kaggle://me/clip-tiny/keras/shapes", files, card, "mit", "Upload")  # doctest: +SKIP
    1
    """
    model, version = parse_kaggle_handle(handle)
    if version is not None:
        raise ValueError(f"`handle` {handle!r} names a version: Kaggle numbers the versions an upload creates; "
                         "name the variation, kaggle://owner/model/framework/variation.")
    before = latest_version(handle)
    with tempfile.TemporaryDirectory(prefix="vlzoo-upload-") as scratch:
        staged = pathlib.Path(scratch) / "preset"
        for name, path in files.items():
            (staged / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, staged / name)
        if not (staged / CARD_FILE).exists():
            (staged / CARD_FILE).write_text(card)
        kagglehub.model_upload(model, str(staged), license_name=_LICENCES.get(licence), version_notes=message)
    after = latest_version(handle)
    return after if after is not None and (before is None or after > before) else None
