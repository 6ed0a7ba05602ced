"""Image-text records from caption files (CSV/TSV/JSONL) and webdataset tar shards.

Pure Python (no TensorFlow): these readers feed `vlzoo.data.image_text_dataset` and
can be used on their own, e.g. to inspect or clean a dataset.

- `read_caption_file(path)`: a CSV/TSV (header row) or JSONL caption file whose rows
  name an image file (relative to the caption file's folder) and its caption. Missing
  images and empty captions are found here, eagerly; `validate=True` also decodes
  every image with PIL.
- `read_tar_samples(shard)`: webdataset-style samples of one tar shard, members
  `KEY.jpg|jpeg|png|webp` + `KEY.txt` (and optionally `KEY.json`) grouped by `KEY`.
- `expand_shards(spec)`: a glob, a `{000..009}` brace range, a directory or a list of
  those -> sorted shard paths.
- `DatasetStats`: the bad records skipped with `on_error="skip"`, by reason.

Every bad record is named by its `source`: `"<caption file> line <n>"` or
`"<shard> member <name>"`; `on_error="raise"` raises with that name, `"skip"` drops
the record and counts it in a `DatasetStats`.

Example:
>>> records = read_caption_file("data/captions.csv")  # columns image, caption  # doctest: +SKIP
>>> records[0]  # doctest: +SKIP
ImageTextRecord(image='/abs/data/img/0.png', caption='a red circle', source='/abs/data/captions.csv line 2')
"""

from __future__ import annotations

import collections
import concurrent.futures
import csv
import glob
import io
import json
import logging
import os
import re
import tarfile
import threading
from typing import NamedTuple

logger = logging.getLogger("vlzoo.data")

IMAGE_KEYS = ("image", "file_name", "filename", "filepath", "image_path", "path")
CAPTION_KEYS = ("caption", "text", "title")
IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
CAPTION_FILE_EXTENSIONS = (".csv", ".tsv", ".jsonl")
SHARD_EXTENSIONS = (".tar", ".tar.gz", ".tgz")
ON_ERROR = ("raise", "skip")
LOGGED_SKIPS = 5

# Skip reasons, the keys of `DatasetStats.counts`.
MISSING_IMAGE = "missing image"
UNDECODABLE_IMAGE = "undecodable image"
EMPTY_CAPTION = "empty caption"
BAD_ROW = "bad row"
UNREADABLE_SHARD = "unreadable shard"


class ImageTextRecord(NamedTuple):
    """One image-text pair.

    Attributes:
        image: absolute image path (caption files) or the encoded image bytes
            (tar shards).
        caption: the caption, a non-empty str.
        source: where the record comes from, for messages:
            `"/abs/captions.csv line 7"` or `"/abs/shard-000.tar member 000007.jpg"`.
    """

    image: str | bytes
    caption: str
    source: str


class DatasetStats:
    """The bad records a pipeline skipped (`on_error="skip"`), by reason.

    Thread-safe; a record skipped again on a later pass (repeat, next epoch) counts
    once. Reasons: `"missing image"`, `"undecodable image"`, `"empty caption"`,
    `"bad row"` (invalid JSON, missing column, non-string caption, tar sample without
    image or caption) and `"unreadable shard"` (a corrupt tar; its remaining samples
    are lost).

    Attributes:
        num_records: records listed by the caption file(s), good and bad (`None` for
            tar shards, which are only known while streaming).

    Example:
    >>> ds = image_text_dataset("data/captions.csv", tok, pre, 32, on_error="skip")  # doctest: +SKIP
    >>> ds.stats.counts  # doctest: +SKIP
    Counter({'missing image': 2})
    >>> ds.stats.summary()  # doctest: +SKIP
    'skipped 2 of 100 records (2 missing image)'
    """

    def __init__(self):
        self.num_records = None
        self._skipped = {}
        self._lock = threading.Lock()

    def skip(self, source, reason, detail):
        """Count the record `source` as skipped for `reason`.

        The first `LOGGED_SKIPS` records are logged at WARNING level, later ones at
        DEBUG; a record met again (next pass) is neither counted nor logged again.
        """
        with self._lock:
            if source in self._skipped:
                return
            self._skipped[source] = reason
            number = len(self._skipped)
        if number <= LOGGED_SKIPS:
            more = (
                " (further skipped records are logged at DEBUG level; see the stats)"
                if number == LOGGED_SKIPS
                else ""
            )
            logger.warning("vlzoo.data: skipped %s: %s%s", source, detail, more)
        else:
            logger.debug("vlzoo.data: skipped %s: %s", source, detail)

    @property
    def skipped(self):
        """dict `{source: reason}` of every skipped record."""
        with self._lock:
            return dict(self._skipped)

    @property
    def counts(self):
        """`collections.Counter` `{reason: number of skipped records}`."""
        return collections.Counter(self.skipped.values())

    @property
    def num_skipped(self):
        with self._lock:
            return len(self._skipped)

    def summary(self):
        """One line, e.g. `"skipped 3 of 10 records (2 missing image, 1 empty caption)"`."""
        counts = self.counts
        of = "" if self.num_records is None else f" of {self.num_records}"
        detail = ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))
        return f"skipped {sum(counts.values())}{of} records" + (f" ({detail})" if detail else "")

    def __repr__(self):
        return f"DatasetStats({self.summary()})"


class BadRecord(Exception):
    """A bad record (internal): `reason` (a `DatasetStats` key), the message, the
    exception type `on_error="raise"` raises, and (tar samples) the source naming the
    member."""

    def __init__(self, reason, message, error_type=ValueError, source=None):
        super().__init__(message)
        self.reason = reason
        self.error_type = error_type
        self.source = source


def check_on_error(on_error):
    """ValueError unless `on_error` is `"raise"` or `"skip"`."""
    if on_error not in ON_ERROR:
        raise ValueError(f"`on_error` must be 'raise' or 'skip'; received {on_error!r}.")


def handle_bad_record(bad, source, on_error, stats):
    """Raise `bad` as `bad.error_type("<source>: <message>")`, or count it in `stats`."""
    if on_error == "raise":
        raise bad.error_type(f"{source}: {bad}") from bad.__cause__
    stats.skip(source, bad.reason, str(bad))


def decode_image(data):
    """Encoded image bytes -> RGB `PIL.Image` (fully decoded; alpha dropped).

    Raises:
        BadRecord("undecodable image") with PIL's message.
    """
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as im:
            return im.convert("RGB")
    except Exception as error:  # PIL raises OSError, ValueError, SyntaxError, ...
        raise BadRecord(UNDECODABLE_IMAGE, f"cannot decode image: {error}") from error


# --------------------------------------------------------------------------------------
# Caption files
# --------------------------------------------------------------------------------------


def _pick_key(keys, wanted, defaults, what, argument):
    if wanted is not None:
        if wanted not in keys:
            raise BadRecord(
                BAD_ROW,
                f"no {what} field {wanted!r} (`{argument}`); fields: {sorted(keys)}",
            )
        return wanted
    for key in defaults:
        if key in keys:
            return key
    raise BadRecord(
        BAD_ROW,
        f"no {what} field: none of the default names {list(defaults)} is present "
        f"(fields: {sorted(keys)}); pass `{argument}`",
    )


def _rows(path):
    """Yields (line number, row dict or BadRecord) of a CSV/TSV/JSONL file."""
    lower = path.lower()
    with open(path, encoding="utf-8", newline="") as f:
        if lower.endswith(".jsonl"):
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    yield number, BadRecord(BAD_ROW, f"invalid JSON ({error})")
                    continue
                if not isinstance(row, dict):
                    yield number, BadRecord(
                        BAD_ROW, f"expected a JSON object, got {type(row).__name__}"
                    )
                    continue
                yield number, row
        else:
            reader = csv.DictReader(f, delimiter="\t" if lower.endswith(".tsv") else ",")
            if reader.fieldnames is None:  # reads the header; None for an empty file
                return
            start = reader.line_num + 1
            for row in reader:
                if None in row:  # more fields than header columns
                    yield start, BadRecord(
                        BAD_ROW, f"more fields than the {len(reader.fieldnames)} header columns"
                    )
                elif any(v.strip() for v in row.values() if v is not None):
                    yield start, row
                start = reader.line_num + 1


def _validate_image(path):
    """None when `path` decodes with PIL, else the error message."""
    try:
        with open(path, "rb") as f:
            decode_image(f.read())
    except BadRecord as bad:
        return str(bad)
    return None


def read_caption_file(
    path,
    image_key=None,
    caption_key=None,
    image_root=None,
    on_error="raise",
    validate=False,
    stats=None,
):
    """Reads image-text records from a CSV/TSV (with header) or JSONL caption file.

    Each row names an image file (relative to `image_root`, by default the caption
    file's folder; absolute paths are kept) and its caption. Checked here, eagerly:
    the columns exist, the caption is a non-empty string, the image file exists, and
    with `validate=True` that PIL decodes it (threads; costs a full decode per image).

    Args:
        path: `.csv`, `.tsv` or `.jsonl` file (UTF-8). Blank lines are ignored.
        image_key: column/key of the image path; default the first present of
            `"image"`, `"file_name"`, `"filename"`, `"filepath"`, `"image_path"`,
            `"path"`.
        caption_key: column/key of the caption; default the first present of
            `"caption"`, `"text"`, `"title"`.
        image_root: folder the image paths are relative to.
        on_error: `"raise"`: the first bad row raises `FileNotFoundError` (missing
            image) or `ValueError`, naming the file and line. `"skip"`: bad rows are
            dropped, counted in `stats` and logged, with a one-line summary.
        validate: also decode every image now (bad ones: `"undecodable image"`).
        stats: a `DatasetStats` to count skipped rows in (one is made if None).

    Returns:
        list of `ImageTextRecord(image=absolute path, caption, source="FILE line N")`
        in file order.

    Example:
    >>> # data/captions.jsonl: {"file_name": "img/0.png", "text": "a red circle"}
    >>> records = read_caption_file("data/captions.jsonl")  # doctest: +SKIP
    >>> records[0].caption  # doctest: +SKIP
    'a red circle'
    """
    check_on_error(on_error)
    path = os.path.abspath(os.fspath(path))
    if not path.lower().endswith(CAPTION_FILE_EXTENSIONS):
        raise ValueError(
            f"`path` must be a caption file ending in {', '.join(CAPTION_FILE_EXTENSIONS)}; "
            f"received {path!r}."
        )
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Caption file not found: {path!r}.")
    root = os.path.dirname(path) if image_root is None else os.path.abspath(os.fspath(image_root))
    if not os.path.isdir(root):
        raise FileNotFoundError(f"`image_root` is not a directory: {root!r}.")
    stats = DatasetStats() if stats is None else stats
    records = []
    num_rows = 0
    for number, row in _rows(path):
        num_rows += 1
        source = f"{path} line {number}"
        try:
            if isinstance(row, BadRecord):
                raise row
            image = row[_pick_key(row, image_key, IMAGE_KEYS, "image", "image_key")]
            caption = row[_pick_key(row, caption_key, CAPTION_KEYS, "caption", "caption_key")]
            if not isinstance(image, str) or not image.strip():
                raise BadRecord(BAD_ROW, f"image path must be a non-empty string; got {image!r}")
            if not isinstance(caption, str):
                raise BadRecord(BAD_ROW, f"caption must be a string; got {type(caption).__name__}")
            if not caption.strip():
                raise BadRecord(EMPTY_CAPTION, "empty caption")
            image_path = os.path.normpath(os.path.join(root, image))
            if not os.path.isfile(image_path):
                raise BadRecord(
                    MISSING_IMAGE,
                    f"image file {image!r} not found ({image_path})",
                    FileNotFoundError,
                )
        except BadRecord as bad:
            handle_bad_record(bad, source, on_error, stats)
            continue
        records.append(ImageTextRecord(image_path, caption, source))
    if validate:
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            errors = list(pool.map(_validate_image, [r.image for r in records]))
        good = []
        for record, error in zip(records, errors):
            if error is None:
                good.append(record)
            else:
                bad = BadRecord(UNDECODABLE_IMAGE, f"{record.image}: {error}")
                handle_bad_record(bad, record.source, on_error, stats)
        records = good
    stats.num_records = (stats.num_records or 0) + num_rows
    if stats.num_skipped:
        logger.warning("vlzoo.data: %s: %s", path, stats.summary())
    return records


# --------------------------------------------------------------------------------------
# Webdataset tar shards
# --------------------------------------------------------------------------------------

BRACES = re.compile(r"\{(\d+)\.\.(\d+)\}")


def _expand_braces(pattern):
    """`"a-{00..02}.tar"` -> `["a-00.tar", "a-01.tar", "a-02.tar"]` (webdataset notation)."""
    match = BRACES.search(pattern)
    if match is None:
        return [pattern]
    first, last = match.group(1), match.group(2)
    width = len(first)
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [
        expanded
        for i in range(int(first), int(last) + 1)
        for expanded in _expand_braces(f"{head}{i:0{width}d}{tail}")
    ]


def is_shard_path(path):
    return os.fspath(path).lower().endswith(SHARD_EXTENSIONS)


def is_pattern(path):
    """True for a glob or a webdataset brace range."""
    return glob.has_magic(path) or BRACES.search(path) is not None


def expand_shards(spec):
    """Shard paths from a glob, a brace range, a directory or a list of those.

    Args:
        spec: `"data/shard-*.tar"`, `"data/shard-{000..009}.tar"`, a directory
            (its `.tar`, `.tar.gz` and `.tgz` files), one shard path, or a list/tuple
            of any of these.

    Returns:
        list of absolute shard paths: sorted within each pattern, patterns in order.

    Raises:
        FileNotFoundError: a pattern matches nothing or a listed shard is missing.
    """
    specs = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    if not specs:
        raise ValueError("`source` is an empty list of shards.")
    shards = []
    for item in specs:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(
                f"Shards must be paths or glob patterns; received {type(item).__name__} ({item!r:.60})."
            )
        item = os.fspath(item)
        if os.path.isdir(item):
            found = sorted(
                os.path.join(item, name) for name in os.listdir(item) if is_shard_path(name)
            )
            if not found:
                raise FileNotFoundError(
                    f"No tar shards ({', '.join(SHARD_EXTENSIONS)}) in directory {item!r}."
                )
            shards.extend(found)
            continue
        for pattern in _expand_braces(item):
            if glob.has_magic(pattern):
                found = sorted(glob.glob(pattern))
                if not found:
                    raise FileNotFoundError(f"No shard matches the pattern {pattern!r}.")
                shards.extend(found)
            elif os.path.isfile(pattern):
                shards.append(pattern)
            else:
                raise FileNotFoundError(f"Shard not found: {pattern!r}.")
    return [os.path.abspath(s) for s in shards]


def _split_member(name):
    """webdataset's key/extension split: `"dir/0001.seg.png"` -> `("dir/0001", "seg.png")`."""
    directory, base = os.path.split(name)
    stem, _, ext = base.partition(".")
    return os.path.join(directory, stem) if directory else stem, ext.lower()


def _grouped_members(tar):
    """Yields (key, {extension: (member name, bytes or None)}) of consecutive members.

    Only image, `.txt` and `.json` members are read; others are listed by name.
    """
    key, members = None, {}
    for info in tar:
        if not info.isfile():
            continue
        member_key, ext = _split_member(info.name)
        if member_key != key and members:
            yield key, members
            members = {}
        key = member_key
        wanted = ext in IMAGE_EXTENSIONS or ext in ("txt", "json")
        members.setdefault(ext, (info.name, tar.extractfile(info).read() if wanted else None))
    if members:
        yield key, members


def _caption_from_json(name, data, caption_key):
    try:
        meta = json.loads(data)
    except ValueError as error:  # JSONDecodeError and UnicodeDecodeError
        raise BadRecord(BAD_ROW, f"invalid JSON in {name} ({error})") from None
    if not isinstance(meta, dict):
        raise BadRecord(BAD_ROW, f"{name} holds a JSON {type(meta).__name__}, not an object")
    try:
        return meta[_pick_key(meta, caption_key, CAPTION_KEYS, "caption", "caption_key")]
    except BadRecord as bad:
        raise BadRecord(BAD_ROW, f"{name}: {bad}") from None


def _sample_record(shard, key, members, caption_key):
    """The ImageTextRecord of one grouped sample; raises BadRecord naming its member."""
    names = ", ".join(name for name, _ in members.values())
    image_ext = next((e for e in IMAGE_EXTENSIONS if e in members), None)
    if image_ext is None:
        raise BadRecord(
            MISSING_IMAGE,
            f"sample {key!r} has no image member (.{', .'.join(IMAGE_EXTENSIONS)}); members: {names}",
            source=f"{shard} member {next(iter(members.values()))[0]}",
        )
    image_name, image = members[image_ext]
    if "txt" in members:
        caption_name, data = members["txt"]
        try:
            caption = data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise BadRecord(
                BAD_ROW, f"caption is not UTF-8 ({error})", source=f"{shard} member {caption_name}"
            ) from None
    elif "json" in members:
        caption_name, data = members["json"]
        try:
            caption = _caption_from_json(caption_name, data, caption_key)
        except BadRecord as bad:
            bad.source = f"{shard} member {caption_name}"
            raise
    else:
        raise BadRecord(
            BAD_ROW,
            f"sample {key!r} has no caption member (.txt or .json); members: {names}",
            source=f"{shard} member {image_name}",
        )
    if not isinstance(caption, str) or not caption.strip():
        raise BadRecord(
            EMPTY_CAPTION, f"empty caption ({caption!r:.40})", source=f"{shard} member {caption_name}"
        )
    return ImageTextRecord(image, caption, f"{shard} member {image_name}")


def read_tar_samples(shard, caption_key=None, on_error="raise", stats=None):
    """Yields the image-text samples of one webdataset-style tar shard, in order.

    Members are grouped by key, webdataset's way: consecutive members sharing the
    name up to the first dot of their base name (`"dir/0001.jpg"` and `"dir/0001.txt"`
    are sample `"dir/0001"`). A sample needs an image (`.jpg`, `.jpeg`, `.png` or
    `.webp`, first found in that order) and a caption: the UTF-8 `.txt` member, or else
    the `caption_key` field of its `.json` member. Other members are ignored. Images are
    not decoded here (see `decode_image`). Compressed shards (`.tar.gz`) are read as
    streams.

    Args:
        shard: path of a `.tar` / `.tar.gz` / `.tgz` file.
        caption_key: field of the `.json` member used when a sample has no `.txt`;
            default the first present of `"caption"`, `"text"`, `"title"`.
        on_error: `"raise"`: a bad sample raises `ValueError` naming the shard and
            the member (`"<shard> member 0007.txt: empty caption"`); a corrupt shard
            raises `ValueError` naming it. `"skip"`: bad samples are dropped, counted in
            `stats` and logged; a corrupt shard ends early (`"unreadable shard"`).
        stats: a `DatasetStats` to count skipped samples in (one is made if None).

    Yields:
        `ImageTextRecord(image=encoded image bytes, caption, source="<shard> member
        <image member>")`.

    Example:
    >>> for record in read_tar_samples("data/shard-000.tar"):  # doctest: +SKIP
    ...     print(record.source, record.caption)
    """
    check_on_error(on_error)
    shard = os.path.abspath(os.fspath(shard))
    if not os.path.isfile(shard):
        raise FileNotFoundError(f"Shard not found: {shard!r}.")
    stats = DatasetStats() if stats is None else stats
    try:
        tar = tarfile.open(shard, "r|*")
    except (tarfile.TarError, OSError, EOFError) as error:
        bad = BadRecord(UNREADABLE_SHARD, f"unreadable tar shard ({error})")
        handle_bad_record(bad, shard, on_error, stats)
        return
    num_samples, skipped = 0, collections.Counter()
    with tar:
        groups = _grouped_members(tar)
        while True:
            try:
                key, members = next(groups)
            except StopIteration:
                break
            except (tarfile.TarError, OSError, EOFError) as error:
                bad = BadRecord(UNREADABLE_SHARD, f"unreadable tar shard ({error})")
                handle_bad_record(bad, shard, on_error, stats)
                skipped[bad.reason] += 1
                break
            num_samples += 1
            try:
                record = _sample_record(shard, key, members, caption_key)
            except BadRecord as bad:
                handle_bad_record(bad, bad.source, on_error, stats)
                skipped[bad.reason] += 1
                continue
            yield record
    if skipped:
        detail = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items()))
        logger.warning(
            "vlzoo.data: %s: skipped %d of %d samples (%s)",
            shard, sum(skipped.values()), num_samples, detail,
        )
