"""Remote weights, downloaded safely: Hub repositories (`hf://org/name[@revision]`) and URLs.

`huggingface_hub` does the transfers, so it honours `HF_ENDPOINT`, `HF_HOME` (or
`HF_HUB_CACHE`), `HF_HUB_OFFLINE` and the usual token locations, and draws a progress
bar per file. vlzoo adds the checks a model zoo owes its users: every downloaded file is
compared with the size and hash the Hub lists for it (the sha256 of an LFS file, the git
blob id of any other); a file that differs, truncated or corrupted on the way, is removed
from the cache and the load refused with an error naming it, so the next call downloads it
anew instead of loading it. Offline (`HF_HUB_OFFLINE=1`) a snapshot already in the cache,
checked when it was downloaded, is used as it is.

A single file at a URL (`fetch_url(url, sha256)`, e.g. the Llip authors' checkpoints) is
downloaded with a progress bar to a temporary name, its sha256 compared with the pinned one,
and only then moved to `<cache_dir()>/downloads/<sha256>/<file name>`; a file that differs is
deleted and refused with an error naming it.

Example:
>>> parse_hf_handle("hf://google/siglip-base-patch16-224@main")
('google/siglip-base-patch16-224', 'main')
"""

import dataclasses
import hashlib
import http.client
import os
import pathlib
import re
import tempfile
import urllib.parse
import urllib.request

import httpx2
import huggingface_hub
from huggingface_hub import constants as hub_constants
from huggingface_hub.errors import LocalEntryNotFoundError
from huggingface_hub.errors import RepositoryNotFoundError
from huggingface_hub.errors import RevisionNotFoundError
from huggingface_hub.utils import tqdm

HF_SCHEME = "hf://"
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_CHUNK = 1 << 20


@dataclasses.dataclass(frozen=True)
class RemoteFile:
    """A file of a repository as the Hub lists it: `path`, `size`, and its hash."""

    path: str
    size: int
    algorithm: str  # "sha256" (LFS files) or "sha1" (git blob id)
    digest: str


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One commit of a repository: `repo_id`, `commit` and its `files` (tuple of `RemoteFile`)."""

    repo_id: str
    commit: str
    files: tuple


def is_handle(preset):
    """Whether `preset` is a hub handle rather than a registered name or a directory."""
    return isinstance(preset, str) and preset.startswith(HF_SCHEME)


def cache_dir():
    """Root of vlzoo's own cache: `$VLZOO_CACHE`, else `$XDG_CACHE_HOME/vlzoo`, else `~/.cache/vlzoo`."""
    if os.environ.get("VLZOO_CACHE"):
        return pathlib.Path(os.environ["VLZOO_CACHE"]).expanduser()
    return pathlib.Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "vlzoo"


def offline():
    """Whether `HF_HUB_OFFLINE` forbids network calls."""
    return bool(hub_constants.HF_HUB_OFFLINE)


def parse_hf_handle(handle):
    """`"hf://org/name@revision"` -> `("org/name", "revision")`; the revision is None when absent."""
    repo_id, at, revision = handle[len(HF_SCHEME):].partition("@")
    if not handle.startswith(HF_SCHEME) or not _REPO_ID.fullmatch(repo_id) or (at and not revision):
        raise ValueError(
            f"`preset` {handle!r} is not a valid hub handle: expected 'hf://org/name' or "
            "'hf://org/name@revision' (a branch, tag or commit)."
        )
    return repo_id, revision or None


def _unreachable(handle, error):
    return FileNotFoundError(
        f"{handle}: not in the cache ({hub_constants.HF_HUB_CACHE}) and the Hub cannot be reached"
        f"{' (HF_HUB_OFFLINE is set)' if offline() else ''}: {error}"
    )


def remote_snapshot(handle):
    """The commit `handle` points at and the files the Hub lists there (one metadata request).

    Raises:
        FileNotFoundError: the repository or revision does not exist, or the Hub cannot be reached.
    """
    repo_id, revision = parse_hf_handle(handle)
    try:
        info = huggingface_hub.HfApi().model_info(repo_id, revision=revision, files_metadata=True)
    except RevisionNotFoundError as error:
        raise FileNotFoundError(f"{handle}: the repository has no revision {revision!r}.") from error
    except RepositoryNotFoundError as error:
        raise FileNotFoundError(
            f"{handle}: no repository {repo_id!r} on {hub_constants.ENDPOINT} (or it is private: log in "
            "with `hf auth login` or set HF_TOKEN)."
        ) from error
    except httpx2.TransportError as error:
        raise _unreachable(handle, error) from error
    files = tuple(
        RemoteFile(s.rfilename, s.size, "sha256", s.lfs.sha256) if s.lfs is not None
        else RemoteFile(s.rfilename, s.size, "sha1", s.blob_id)
        for s in info.siblings
    )
    return Snapshot(repo_id, info.sha, files)


def file_hash(path, algorithm):
    """Hex digest of a file: `"sha256"` of its bytes, or `"sha1"` as git hashes a blob."""
    digest = hashlib.new(algorithm)
    if algorithm == "sha1":
        digest.update(b"blob %d\0" % os.path.getsize(path))
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _evict(path):
    """Removes a cached file: the snapshot's link and the blob it points to."""
    for target in {path.resolve(), path}:
        if target.exists() or target.is_symlink():
            target.unlink()


def _check(handle, remote, path):
    size = path.stat().st_size
    found = f"{size} bytes" if size != remote.size else None
    if found is None:
        got = file_hash(path, remote.algorithm)
        found = None if got == remote.digest else f"{remote.algorithm} {got}"
    if found is not None:
        _evict(path)
        raise ValueError(
            f"{handle}: downloaded file {remote.path!r} does not match the Hub's listing ({remote.size} bytes, "
            f"{remote.algorithm} {remote.digest}; found {found}): truncated or corrupted on the way. It was "
            "removed from the cache; load again to download it anew."
        )


# Files that hold weights: a repository often holds several copies of one model (safetensors, a
# pickle, TensorFlow's and Flax's); only the one the converter reads is downloaded.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".h5", ".msgpack", ".pt", ".pth", ".ckpt", ".onnx", ".npz", ".gguf",
                   ".tflite", ".pb")


def _download_file(handle, snapshot, remote, revision):
    try:  # by the handle's revision, so that the cache records it for offline use
        path = pathlib.Path(huggingface_hub.hf_hub_download(snapshot.repo_id, remote.path, revision=revision))
    except (OSError, httpx2.HTTPError) as error:
        raise ValueError(
            f"{handle}: downloading {remote.path!r} failed ({type(error).__name__}: {error}). Nothing "
            "incomplete is loaded; load again to resume."
        ) from error
    directory = path.parents[len(pathlib.PurePosixPath(remote.path).parts) - 1]
    if directory.name != snapshot.commit:
        raise ValueError(
            f"{handle}: the revision moved from commit {snapshot.commit} to {directory.name} during the "
            "download; load again."
        )
    _check(handle, remote, path)
    return directory


def download(handle, snapshot, choose_weights):
    """Downloads (or finds in the cache) what `snapshot` needs, checks each file, returns the directory.

    Every file but weights comes first; then `choose_weights(directory, names)` (the
    directory so far, every name of the listing) names the weight files to fetch.

    Returns:
        `(directory, files)`: the snapshot directory and the `RemoteFile`s downloaded.

    Raises:
        ValueError: naming a file whose transfer failed or whose size or hash differs from the listing;
            nothing of it is left where a later call would load it.
    """
    _, revision = parse_hf_handle(handle)
    small = [f for f in snapshot.files if not f.path.endswith(WEIGHT_SUFFIXES)]
    if not small:
        raise FileNotFoundError(f"{handle}: the repository holds no configuration files: "
                                f"{', '.join(f.path for f in snapshot.files) or 'no files'}.")
    directory = None
    for remote in small:
        directory = _download_file(handle, snapshot, remote, revision or "main")
    wanted = set(choose_weights(directory, [f.path for f in snapshot.files]))
    weights = [f for f in snapshot.files if f.path in wanted]
    for remote in weights:
        _download_file(handle, snapshot, remote, revision or "main")
    return directory, small + weights


def cached_snapshot(handle):
    """The directory of `handle`'s snapshot in the local cache, without any network call.

    Raises:
        FileNotFoundError: naming the handle and the cache when it is not there.
    """
    repo_id, revision = parse_hf_handle(handle)
    try:
        return pathlib.Path(huggingface_hub.snapshot_download(repo_id, revision=revision, local_files_only=True))
    except LocalEntryNotFoundError as error:
        raise _unreachable(handle, error) from error


def cached_blob_ids(directory):
    """`{path: blob id}` of a cached snapshot: the cache names each blob by its sha256 (LFS) or git id."""
    directory = pathlib.Path(directory)
    return {p.relative_to(directory).as_posix(): p.resolve().name
            for p in sorted(directory.rglob("*")) if p.is_file()}




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
    if offline():
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
