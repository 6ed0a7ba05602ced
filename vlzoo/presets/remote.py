"""Remote presets as local preset directories: hub handles, catalogue URLs, pretrained names.

A handle (`hf://org/name[@revision]`) is downloaded and checked by `vlzoo.presets.huggingface`. A
vlzoo preset loads from the snapshot as it is; any other model the repository holds
(transformers, open_clip, keras-hub; see `vlzoo.convert.repository`) is converted once and stored
as a vlzoo preset in the converted cache, keyed by the repository, the commit and the hashes of its
files:

    $VLZOO_CACHE (default ~/.cache/vlzoo)/converted/<org>/<name>/<commit>-<digest>/

so a second load neither converts nor downloads: online it asks the Hub only which commit
the handle points at (none for a handle pinned to a commit), and with `HF_HUB_OFFLINE=1`
it makes no network call at all. A conversion is written to a temporary directory and
renamed into place when complete, so an interrupted one leaves nothing a later call loads.

A `kaggle://owner/model/framework/variation[/version]` handle (keras-hub's presets) is
downloaded by `vlzoo.presets.kaggle` and cached the same way under `converted/kaggle/...`, keyed
by its version number. The URL of a single-file checkpoint (the Llip authors' `.pt` files) loads
when the pretrained catalogue names it, which pins its sha256 and says which vlzoo preset its
weights fit; `fetch_url` downloads it with a progress bar to a temporary name, compares its sha256
with the pinned one, and only then moves it to `<cache_dir()>/downloads/<sha256>/<file name>`.

Example:
>>> local_directory("hf://openai/clip-vit-base-patch32")  # doctest: +SKIP
PosixPath('/home/me/.cache/vlzoo/converted/openai/clip-vit-base-patch32/<commit>-<digest>')
"""

import hashlib
import http.client
import os
import pathlib
import shutil
import tempfile
import urllib.parse
import urllib.request

from huggingface_hub.utils import tqdm

from vlzoo import formats
from vlzoo.convert.checkpoints import progress_bar
from vlzoo.convert.converters import converter
from vlzoo.convert.repository import convert_repository
from vlzoo.convert.repository import detect_format
from vlzoo.convert.repository import weight_files
from vlzoo.presets import catalogue
from vlzoo.presets import huggingface
from vlzoo.presets import kaggle
from vlzoo.presets.files import read_metadata
from vlzoo.presets.huggingface import file_hash

_COMMIT = 40
_CHUNK = 1 << 20


def cache_dir():
    """Root of vlzoo's own cache: `$VLZOO_CACHE`, else `$XDG_CACHE_HOME/vlzoo`, else `~/.cache/vlzoo`."""
    if os.environ.get("VLZOO_CACHE"):
        return pathlib.Path(os.environ["VLZOO_CACHE"]).expanduser()
    return pathlib.Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "vlzoo"


def files_digest(blob_ids):
    """A short digest of `{path: blob id}`: the key of one repository state."""
    text = "\n".join(f"{path}\t{blob}" for path, blob in sorted(blob_ids.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _converted_dir(repo_id, commit, digest):
    return cache_dir() / "converted" / repo_id / f"{commit}-{digest}"


def _pinned_commit(handle):
    _, revision = huggingface.parse_hf_handle(handle)
    is_commit = revision is not None and len(revision) == _COMMIT and all(c in "0123456789abcdef" for c in revision)
    return revision if is_commit else None


def _cached_conversion(repo_id, commit):
    """The converted preset of `repo_id` at `commit`, if one is cached (any digest)."""
    parent = cache_dir() / "converted" / repo_id
    found = sorted(parent.glob(f"{commit}-*")) if parent.is_dir() else []
    return found[0] if found else None


def _save_into_cache(handle, model, target):
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=".partial-", dir=target.parent))
    try:
        model.save_to_preset(str(staging))
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    print(f"{handle}: converted to a vlzoo preset in {target}")
    return target


def is_handle(preset):
    """Whether `preset` is a remote handle (`hf://` or `kaggle://`) rather than a name or a directory."""
    return huggingface.is_handle(preset) or kaggle.is_kaggle_handle(preset)


def is_remote(preset):
    """Whether `from_preset` fetches `preset`: a handle, or an `https://` URL of the catalogue."""
    return is_handle(preset) or (isinstance(preset, str) and preset.startswith(("https://", "http://")))


def _kaggle_preset(handle):
    """A local vlzoo preset directory for a `kaggle://` handle (see `vlzoo.presets.kaggle`), cached by version."""
    model, version = kaggle.parse_kaggle_handle(handle)
    key = f"kaggle/{model}"
    cached = _cached_conversion(key, str(version)) if version is not None else None
    if cached is not None:
        return cached
    directory = kaggle.download(handle)
    return _converted(handle, directory, key, directory.name, file_digests(directory))


def file_digests(directory):
    """`{relative path: sha256}` of every file of a downloaded model version (kagglehub's markers left out)."""
    directory = pathlib.Path(directory)
    return {path.relative_to(directory).as_posix(): file_hash(path, "sha256") for path in sorted(directory.rglob("*"))
            if path.is_file() and not path.name.startswith(".") and ".kaggle" not in path.parts}


def _converted(handle, directory, key, revision, file_ids):
    """The vlzoo preset for a downloaded `directory`: itself when it is one, else its cached conversion
    under `key`/`revision`-<digest of `file_ids`> (converted now when absent)."""
    if detect_format(directory) == "vlzoo":
        return directory
    target = _converted_dir(key, revision, files_digest(file_ids))
    if target.is_dir():
        return target
    return _save_into_cache(handle, convert_repository(directory, progress=progress_bar()), target)


def local_preset(handle):
    """A local vlzoo preset directory for the hub handle `handle` (downloaded, converted, cached).

    Raises:
        ValueError: a malformed handle, a damaged download (the file is named), or a
            repository that holds no model vlzoo can load (its files are named).
        FileNotFoundError: an unknown repository or revision, or nothing cached offline.
    """
    if kaggle.is_kaggle_handle(handle):
        return _kaggle_preset(handle)
    repo_id, _ = huggingface.parse_hf_handle(handle)
    pinned = _pinned_commit(handle)
    cached = _cached_conversion(repo_id, pinned) if pinned else None
    if cached is not None:
        return cached
    if huggingface.offline():
        directory = huggingface.cached_snapshot(handle)
        commit, blob_ids = directory.name, huggingface.cached_blob_ids(directory)
    else:
        snapshot = huggingface.remote_snapshot(handle)
        cached = _cached_conversion(repo_id, snapshot.commit)
        if cached is not None:
            return cached
        directory, files = huggingface.download(handle, snapshot, weight_files)
        commit, blob_ids = snapshot.commit, {f.path: f.digest for f in files}
    return _converted(handle, directory, repo_id, commit, blob_ids)


def _url_preset(entry):
    """A local vlzoo preset for a catalogue entry whose weights are one file at a URL."""
    path = fetch_url(entry["handle"], entry["sha256"])
    target = cache_dir() / "converted" / "urls" / path.parent.name
    if target.is_dir():
        return target
    if entry["format"] not in formats.url_formats():
        raise ValueError(f"A URL entry of the catalogue must have `format` one of {sorted(formats.url_formats())}; "
                         f"found {entry['format']!r}.")
    read, convert = converter(entry["format"])
    model = convert(read(path), entry["architecture"], progress=progress_bar())
    return _save_into_cache(entry["handle"], model, target)


def pretrained_preset(name):
    """A local vlzoo preset directory for the pretrained preset `name` (downloaded on first use)."""
    entry = catalogue.pretrained_presets()[name]
    directory = local_preset(entry["handle"]) if is_handle(entry["handle"]) else _url_preset(entry)
    family = read_metadata(directory).get("family")
    if family != entry["family"]:
        raise ValueError(f"{name}: {entry['handle']} holds a {family} model, not {entry['family']}.")
    return directory


def local_directory(preset):
    """The local vlzoo preset directory `from_preset` loads for a handle, a catalogue URL or a pretrained name.

    Raises:
        ValueError: `preset` is neither a hub handle, a URL the catalogue names, nor a pretrained preset.
    """
    if is_handle(preset):
        return local_preset(preset)
    if catalogue.is_pretrained(preset):
        return pretrained_preset(preset)
    if is_remote(preset):
        names = [name for name, entry in catalogue.pretrained_presets().items() if entry["handle"] == preset]
        if names:
            return pretrained_preset(names[0])
        urls = sorted(entry["handle"] for entry in catalogue.pretrained_presets().values()
                      if is_remote(entry["handle"]) and not is_handle(entry["handle"]))
        raise ValueError(
            f"{preset!r}: a single-file checkpoint at a URL loads by URL when the pretrained catalogue names "
            f"it (its sha256, format and architecture): {', '.join(urls)}. Download another file yourself and "
            "convert it with `vlzoo.convert` (e.g. `from_llip_checkpoint(path, 'llip_vit_b16')`)."
        )
    raise ValueError(
        f"{preset!r} is neither a hub handle (hf://org/name[@revision], "
        "kaggle://owner/model/framework/variation[/version]) nor a pretrained preset "
        f"({', '.join(sorted(catalogue.pretrained_presets()))})."
    )


def fetch_url(url, sha256=None):
    """Local path of the file at `url`, downloaded once and checked against its pinned `sha256`.

    Where the publisher states no sha256 (`sha256=None`), the file is stored under a key of
    its URL and the digest found is printed, so that it can be pinned from then on.

    Raises:
        ValueError: the downloaded file's sha256 differs (it is deleted) or the transfer failed.
        FileNotFoundError: offline (`HF_HUB_OFFLINE=1`) and the file is not cached.
    """
    name = pathlib.PurePosixPath(urllib.parse.urlsplit(url).path).name or "download"
    key = sha256 or "url-" + hashlib.sha256(url.encode()).hexdigest()[:16]
    target = cache_dir() / "downloads" / key / name
    if target.is_file():
        return target
    if huggingface.offline():
        raise FileNotFoundError(f"{url}: not in the cache ({target}) and HF_HUB_OFFLINE is set.")
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=target.parent)
    digest = hashlib.sha256()
    try:
        with os.fdopen(handle, "wb") as out, urllib.request.urlopen(url) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=name, disable=None) as bar:
                for chunk in iter(lambda: response.read(_CHUNK), b""):
                    out.write(chunk)
                    digest.update(chunk)
                    bar.update(len(chunk))
            if total is not None and out.tell() != total:
                raise ValueError(f"{url}: the transfer of {name!r} stopped at {out.tell()} of {total} bytes.")
        if sha256 is None:
            print(f"{url}: no sha256 is published for {name!r}; downloaded with sha256 {digest.hexdigest()}.")
        elif digest.hexdigest() != sha256:
            raise ValueError(
                f"{url}: downloaded file {name!r} has sha256 {digest.hexdigest()}, not the pinned {sha256}: "
                "corrupted, truncated or replaced. It was deleted."
            )
        os.replace(partial, target)
    except (OSError, http.client.HTTPException) as error:
        raise ValueError(f"{url}: downloading {name!r} failed ({type(error).__name__}: {error}).") from error
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return target
