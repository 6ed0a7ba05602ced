"""`vlzoo.from_preset`: registered names, preset directories, hub handles and catalogue URLs.

A handle (`hf://org/name[@revision]`) is downloaded and checked by `vlzoo.hub`. A vlzoo
preset loads from the snapshot as it is; any other model the repository holds
(transformers, open_clip, keras-hub; see `vlzoo.convert.repository`) is converted once
and stored as a vlzoo preset in the converted cache, keyed by the repository, the commit
and the hashes of its files:

    $VLZOO_CACHE (default ~/.cache/vlzoo)/converted/<org>/<name>/<commit>-<digest>/

so a second load neither converts nor downloads: online it asks the Hub only which commit
the handle points at (none for a handle pinned to a commit), and with `HF_HUB_OFFLINE=1`
it makes no network call at all. A conversion is written to a temporary directory and
renamed into place when complete, so an interrupted one leaves nothing a later call loads.

A `kaggle://owner/model/framework/variation[/version]` handle (keras-hub's presets) is
downloaded by `vlzoo.kaggle` and cached the same way under `converted/kaggle/...`, keyed by
its version number. The URL of a single-file checkpoint (the Llip authors' `.pt` files)
loads when the pretrained catalogue names it, which pins its sha256 and says which vlzoo
preset its weights fit (`vlzoo.pretrained`).
"""

import hashlib
import pathlib
import shutil
import tempfile

from vlzoo import formats
from vlzoo import hub
from vlzoo import kaggle
from vlzoo import presets
from vlzoo import pretrained
from vlzoo import transfer
from vlzoo.convert.checkpoints import progress_bar
from vlzoo.convert.converters import converter
from vlzoo.convert.repository import convert_repository
from vlzoo.convert.repository import detect_format
from vlzoo.convert.repository import weight_files

_COMMIT = 40


def files_digest(blob_ids):
    """A short digest of `{path: blob id}`: the key of one repository state."""
    text = "\n".join(f"{path}\t{blob}" for path, blob in sorted(blob_ids.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _converted_dir(repo_id, commit, digest):
    return hub.cache_dir() / "converted" / repo_id / f"{commit}-{digest}"


def _pinned_commit(handle):
    _, revision = hub.parse_hf_handle(handle)
    is_commit = revision is not None and len(revision) == _COMMIT and all(c in "0123456789abcdef" for c in revision)
    return revision if is_commit else None


def _cached_conversion(repo_id, commit):
    """The converted preset of `repo_id` at `commit`, if one is cached (any digest)."""
    parent = hub.cache_dir() / "converted" / repo_id
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
    return hub.is_handle(preset) or kaggle.is_kaggle_handle(preset)


def is_remote(preset):
    """Whether `from_preset` fetches `preset`: a handle, or an `https://` URL of the catalogue."""
    return is_handle(preset) or (isinstance(preset, str) and preset.startswith(("https://", "http://")))


def _kaggle_preset(handle):
    """A local vlzoo preset directory for a `kaggle://` handle (see `vlzoo.kaggle`), cached by version."""
    model, version = kaggle.parse_kaggle_handle(handle)
    key = f"kaggle/{model}"
    cached = _cached_conversion(key, str(version)) if version is not None else None
    if cached is not None:
        return cached
    directory = kaggle.download(handle)
    return _converted(handle, directory, key, directory.name, kaggle.file_digests(directory))


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
    repo_id, _ = hub.parse_hf_handle(handle)
    pinned = _pinned_commit(handle)
    cached = _cached_conversion(repo_id, pinned) if pinned else None
    if cached is not None:
        return cached
    if hub.offline():
        directory = hub.cached_snapshot(handle)
        commit, blob_ids = directory.name, hub.cached_blob_ids(directory)
    else:
        snapshot = hub.remote_snapshot(handle)
        cached = _cached_conversion(repo_id, snapshot.commit)
        if cached is not None:
            return cached
        directory, files = hub.download(handle, snapshot, weight_files)
        commit, blob_ids = snapshot.commit, {f.path: f.digest for f in files}
    return _converted(handle, directory, repo_id, commit, blob_ids)


def _url_preset(entry):
    """A local vlzoo preset for a catalogue entry whose weights are one file at a URL."""
    path = hub.fetch_url(entry["handle"], entry["sha256"])
    target = hub.cache_dir() / "converted" / "urls" / path.parent.name
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
    entry = pretrained.catalogue()[name]
    directory = local_preset(entry["handle"]) if is_handle(entry["handle"]) else _url_preset(entry)
    family = presets.read_metadata(directory).get("family")
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
    if pretrained.is_pretrained(preset):
        return pretrained_preset(preset)
    if is_remote(preset):
        names = [name for name, entry in pretrained.catalogue().items() if entry["handle"] == preset]
        if names:
            return pretrained_preset(names[0])
        urls = sorted(entry["handle"] for entry in pretrained.catalogue().values() if is_remote(entry["handle"])
                      and not is_handle(entry["handle"]))
        raise ValueError(
            f"{preset!r}: a single-file checkpoint at a URL loads by URL when the pretrained catalogue names "
            f"it (its sha256, format and architecture): {', '.join(urls)}. Download another file yourself and "
            "convert it with `vlzoo.convert` (e.g. `from_llip_checkpoint(path, 'llip_vit_b16')`)."
        )
    raise ValueError(
        f"{preset!r} is neither a hub handle (hf://org/name[@revision], "
        "kaggle://owner/model/framework/variation[/version]) nor a pretrained preset "
        f"({', '.join(sorted(pretrained.catalogue()))})."
    )


def from_preset(preset, load_weights=True, dtype=None, family=None, **config_overrides):
    """Builds a model from a preset name, a preset directory, a hub handle or a catalogue URL.

    Args:
        preset: a name from `list_presets()`, a pretrained preset from
            `list_presets(pretrained=True)` (downloaded and converted on first
            use), a directory written by `save_to_preset`, a Hugging Face
            Hub repository `"hf://org/name"` or `"hf://org/name@revision"`
            holding a vlzoo preset, a keras-hub CLIP/SigLIP preset, a
            transformers `CLIPModel`/`SiglipModel` or an open_clip model, a
            Kaggle Models version `"kaggle://owner/model/framework/variation
            [/version]"` holding a keras-hub preset (both converted once and
            cached; see `vlzoo.loading`), or the URL of a single-file
            checkpoint the pretrained catalogue names (checked by its sha256).
        load_weights: load the weights when the preset has them. A preset
            without weights loads randomly initialised and says so once.
        dtype: dtype policy (`"float32"`, `"bfloat16"`, `"mixed_bfloat16"`).
        family: build this family instead, on the towers and weights of the
            preset's CLIP model: `"filip"`, `"sparc"`, `"sparo"`, `"llip"`,
            `"stair"` or `"flair"` (see `vlzoo.transfer`: what transfers, what is new).
            None (default) or the preset's own family: the preset as it is.
        **config_overrides: replace entries of the preset's model config
            (with `family`: of the new family's config).

    Returns:
        The model, with its tokenizer and image preprocessor attached.

    Example:
    >>> model = vlzoo.from_preset("clip_tiny")
    >>> model = vlzoo.from_preset("clip_vit_b32_openai")  # doctest: +SKIP
    >>> model = vlzoo.from_preset("hf://openai/clip-vit-base-patch32")  # doctest: +SKIP
    >>> model = vlzoo.from_preset("kaggle://keras/siglip/keras/siglip2_base_patch16_224/1")  # doctest: +SKIP
    >>> sparc = vlzoo.from_preset("clip_vit_b16_openai", family="sparc")  # doctest: +SKIP
    """
    name = preset
    if is_remote(preset) or pretrained.is_pretrained(preset):
        preset = local_directory(preset)
    transferred = family is not None and family != presets.read_metadata(presets.resolve_preset(preset)).get("family")
    model = presets.from_preset(preset, load_weights=load_weights, dtype=dtype,
                                **({} if transferred else config_overrides))
    if load_weights:
        model.preset_origin = preset_origin(name, preset)
    if transferred:  # `from_clip` records the transfer in the new model's `preset_origin`
        model = transfer.from_clip(model, family, **config_overrides)[0]
    return model


def preset_origin(name, preset):
    """What `save_to_preset` records as the `base_preset` of a model `from_preset(name)` loaded from the local
    `preset`: its name (or handle, or directory) and the licence of its weights (the pretrained catalogue's, or
    what its `metadata.json` records, carried over from its own `base_preset`).

    Example:
    >>> preset_origin("clip_vit_b16_openai", local_directory("clip_vit_b16_openai"))  # doctest: +SKIP
    {'preset': 'clip_vit_b16_openai', 'licence': 'none stated ...'}
    """
    metadata = presets.read_metadata(presets.resolve_preset(preset))
    earlier = metadata.get("base_preset") or {}
    entry = pretrained.catalogue().get(name) if isinstance(name, str) and pretrained.is_pretrained(name) else None
    origin = {"preset": str(name), "licence": (entry or {}).get("licence") or earlier.get("licence")
              or metadata.get("licence")}
    return {key: value for key, value in origin.items() if value is not None}
