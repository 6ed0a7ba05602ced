"""The Hugging Face Hub: `hf://org/name[@revision]` handles, downloaded safely and uploaded in one commit.

`huggingface_hub` does the transfers, so it honours `HF_ENDPOINT`, `HF_HOME` (or
`HF_HUB_CACHE`), `HF_HUB_OFFLINE` and the usual token locations (`HF_TOKEN`, `hf auth login`),
and draws a progress bar per file. vlzoo adds the checks a model zoo owes its users: every
downloaded file is compared with the size and hash the Hub lists for it (the sha256 of an LFS
file, the git blob id of any other); a file that differs, truncated or corrupted on the way, is
removed from the cache and the load refused with an error naming it, so the next call downloads
it anew instead of loading it. Offline (`HF_HUB_OFFLINE=1`) a snapshot already in the cache,
checked when it was downloaded, is used as it is. An upload (`upload`) sends every file in ONE
commit made against the revision read before it, so a failed upload leaves the repository as it was.

Example:
>>> parse_hf_handle("hf://google/siglip-base-patch16-224@main")
('google/siglip-base-patch16-224', 'main')
"""

import dataclasses
import hashlib
import os
import pathlib
import re
import tempfile

import httpx2
import huggingface_hub
from huggingface_hub import constants as hub_constants
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.errors import LocalEntryNotFoundError
from huggingface_hub.errors import RepositoryNotFoundError
from huggingface_hub.errors import RevisionNotFoundError

from vlzoo.presets.files import CARD_FILE

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


def upload(handle, files, card, message):
    """Commits `files` to the Hub repository `handle` names, creating it when absent; returns the commit sha.

    Args:
        handle: `"hf://user/name"` or `"hf://user/name@branch"` (an existing branch).
        files: `{path in the repository: local path}`.
        card: the text of the `README.md` added when neither `files` nor the repository has one.
        message: the commit message.

    Raises:
        ValueError: a malformed `handle`.
        PermissionError: the Hub refused the credentials.
        RuntimeError: the transfer failed. Nothing was committed in either case: the repository is as it was.

    Example:
    >>> upload("hf://me/clip-tiny", {"config.json": "runs/tiny/config.json"}, card, "Upload")  # doctest: +SKIP
    'c0ffee...'
    """
    repo_id, revision = parse_hf_handle(handle)
    api = huggingface_hub.HfApi(endpoint=os.environ.get("HF_ENDPOINT") or hub_constants.ENDPOINT)
    try:
        api.create_repo(repo_id, exist_ok=True)
        info = api.model_info(repo_id, revision=revision)
        files = dict(files)
        with tempfile.TemporaryDirectory(prefix="vlzoo-card-") as scratch:
            if CARD_FILE not in files and CARD_FILE not in {s.rfilename for s in info.siblings or ()}:
                files[CARD_FILE] = pathlib.Path(scratch) / CARD_FILE
                files[CARD_FILE].write_text(card)
            operations = [huggingface_hub.CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(path))
                          for name, path in sorted(files.items())]
            commit = api.create_commit(repo_id, operations, commit_message=message, revision=revision,
                                       parent_commit=info.sha)
    except HfHubHTTPError as error:
        reason = " ".join(str(error).split())  # one line
        if getattr(error.response, "status_code", None) in (401, 403):
            raise PermissionError(
                f"{handle}: the Hub refused the upload ({reason}). Log in with `hf auth login` or set HF_TOKEN to a "
                "token that may write to it. Nothing was committed: the repository is as it was."
            ) from error
        raise RuntimeError(f"{handle}: the upload to {api.endpoint} failed ({reason}). Nothing was committed: the "
                           "repository is as it was.") from error
    return commit.oid
