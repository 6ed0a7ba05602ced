"""`image_text_dataset`: tf.data pipelines of image-text pairs for `model.fit`.

The pipeline is TensorFlow's `tf.data` on every Keras backend (Keras feeds a
`tf.data.Dataset` to `fit`/`evaluate`/`predict` on JAX, TensorFlow and PyTorch alike).
TensorFlow is imported when a pipeline is built, not by `import vlzoo.data`.

Stages (`B` = batch size, `H, W` = the preprocessor's image size, `T` = the
tokenizer's sequence length):

1. records: the rows of a caption file (checked eagerly, see `read_caption_file`;
   shuffled as file names, then the image files read with `tf.io.read_file`), or the
   samples of tar shards (streamed by a Python generator per shard, shards shuffled and
   interleaved, then a sample shuffle buffer).
2. images: decoded with PIL and transformed in a `tf.numpy_function` that knows the
   record's source, so an undecodable image raises naming the caption file and line
   (or the tar member), or is skipped and counted. Evaluation: the preprocessor itself
   (pixels equal `preprocessor(image)` exactly). Training: torchvision's
   RandomResizedCrop (`scale`, `ratio`) then the preprocessor's mean/std, in a
   parallel map.
3. batch, then tokenise: one `tf.py_function` call per batch runs the model's own
   tokenizer on the `B` captions (ids equal `tokenizer(captions)`; calls are serialised
   by a lock, the tokenizers' cache not being thread-safe). Why per batch:
   docs/finetuning.md, *The input pipeline*.
4. prefetch.

Several processes (`num_processes`, `process_index`; by default the launch's, see
`vlzoo.parallel.data_processes`): each pair is read by exactly one process per epoch.
A caption file's records are shuffled alike in every process (the same `seed`), cut to
a multiple of the process count, and process `i` keeps every `num_processes`-th record
from the `i`-th: equal shares, so every process runs the same number of steps. Tar
shards are dealt out whole (process `i` reads shards `i, i + n, ...`); their sample
counts can differ, so train on them with `repeat=True` and `steps_per_epoch`. Each
process draws its own augmentation seeds (`seed * num_processes + process_index`).

Determinism: with `seed` set, the order (shuffles) and the augmentation (a per-element
seed drawn from `tf.data.Dataset.random(seed)`) are the same every time the pipeline
is built; each new pass (epoch) draws a new order and new crops. All parallel stages
keep their order (`deterministic=True`).
"""

from __future__ import annotations

import logging
import os
import threading

import numpy as np

from vlzoo import parallel
from vlzoo._backends import switches
from vlzoo.data import records as R
from vlzoo.data import transforms

logger = logging.getLogger("vlzoo.data")

DEFAULT_SHARD_SHUFFLE_BUFFER = 1000


def _tensorflow():
    """`import tensorflow`, hiding GPUs from it unless Keras runs on TensorFlow.

    On JAX or PyTorch, tf.data only needs the CPU; a TensorFlow that sees the GPU
    would reserve its memory (`vlzoo._backends.switches.hides_gpus_from_tf_data`). (No
    effect once TensorFlow's runtime has started.)
    """
    import tensorflow as tf

    if switches.hides_gpus_from_tf_data():
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError:  # the runtime is already initialised
            pass
    return tf


def resolve_source(source):
    """What kind of data `source` names, as `image_text_dataset` reads it.

    Args:
        source: a caption file, a directory holding one caption file or only tar
            shards, a shard path, a glob or brace pattern, or a list of these.

    Returns:
        `("captions", path)` for a caption file, or `("shards", [shard paths])`.

    Raises:
        ValueError: naming `source` when it is none of these (or missing).

    Example:
    >>> resolve_source("data/{000..001}.tar")  # doctest: +SKIP
    ('shards', ['data/000.tar', 'data/001.tar'])
    """
    if isinstance(source, (list, tuple)):
        return "shards", R.expand_shards(source)
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            "`source` must be a caption file, a directory, a tar shard, a glob/brace "
            f"pattern or a list of shards; received {type(source).__name__}."
        )
    path = os.fspath(source)
    if os.path.isdir(path):
        names = sorted(os.listdir(path))
        captions = [n for n in names if n.lower().endswith(R.CAPTION_FILE_EXTENSIONS)]
        shards = [n for n in names if R.is_shard_path(n)]
        if len(captions) == 1 and not shards:
            return "captions", os.path.join(path, captions[0])
        if shards and not captions:
            return "shards", R.expand_shards(path)
        raise ValueError(
            f"`source` directory {path!r} must hold either one caption file "
            f"({', '.join(R.CAPTION_FILE_EXTENSIONS)}) or tar shards; found "
            f"{captions + shards or 'neither'}. Pass the caption file or a shard pattern."
        )
    if path.lower().endswith(R.CAPTION_FILE_EXTENSIONS):
        return "captions", path
    if os.path.isfile(path) and not R.is_shard_path(path):
        raise ValueError(
            f"`source` {path!r} is neither a caption file ({', '.join(R.CAPTION_FILE_EXTENSIONS)}) "
            f"nor a tar shard ({', '.join(R.SHARD_EXTENSIONS)})."
        )
    if not (os.path.exists(path) or R.is_pattern(path)):
        raise FileNotFoundError(
            f"`source` not found: {path!r} (expected a caption file, a directory, a tar "
            "shard, a glob/brace pattern or a list of shards)."
        )
    return "shards", R.expand_shards(path)


def _sequence_length(tokenizer):
    """T of the tokenizer's output, from one call (which also surfaces a broken tokenizer)."""
    if not callable(tokenizer):
        raise TypeError(
            "`tokenizer` must be callable: `tokenizer(list_of_str) -> {'token_ids', "
            f"'padding_mask'}}` (e.g. `model.tokenizer`); received {type(tokenizer).__name__}."
        )
    out = tokenizer(["a photo"])
    if not isinstance(out, dict) or not {"token_ids", "padding_mask"} <= set(out):
        raise TypeError(
            "`tokenizer(list_of_str)` must return a dict with 'token_ids' and 'padding_mask'; "
            f"received {type(out).__name__}"
            + (f" with keys {sorted(out)}" if isinstance(out, dict) else "")
            + "."
        )
    shape = np.shape(out["token_ids"])
    if len(shape) != 2 or shape[0] != 1:
        raise ValueError(
            f"`tokenizer` must return token_ids of shape (B, T); received {shape} for one text."
        )
    return shape[1]


def _check_int(value, name, minimum):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"`{name}` must be an int >= {minimum}; received {value!r}.")
    return int(value)


def _tokenize_fn(tokenizer, sequence_length):
    """Python body of the per-batch `tf.py_function`: captions (B,) -> ids, mask (B, T)."""
    lock = threading.Lock()

    def tokenize(captions):
        texts = [c.decode("utf-8") for c in captions.numpy().tolist()]
        with lock:
            out = tokenizer(texts)
        ids = np.asarray(out["token_ids"])
        mask = np.asarray(out["padding_mask"])
        expected = (len(texts), sequence_length)
        if ids.shape != expected or mask.shape != expected:
            raise ValueError(
                f"`tokenizer` returned token_ids {ids.shape} and padding_mask {mask.shape} "
                f"for {len(texts)} captions; expected {expected}."
            )
        return ids.astype(np.int32), mask.astype(bool)

    return tokenize


def _image_fn(preprocessor, training, scale, ratio, on_error, stats):
    """Python body of the per-element `tf.numpy_function`: bytes -> (pixels, ok)."""
    height, width = transforms.output_size(preprocessor)

    def load(data, source, seed):
        source = source.decode("utf-8")
        try:
            image = R.decode_image(data)
        except R.BadRecord as bad:
            R.handle_bad_record(bad, source, on_error, stats)
            return np.zeros((height, width, 3), np.float32), False
        if training:
            rng = np.random.default_rng(int(seed) % 2**64)
            pixels = transforms.train_transform(image, preprocessor, scale, ratio, rng)
        else:
            pixels = transforms.eval_transform(image, preprocessor)
        return pixels.astype(np.float32), True

    return load


def _processes(num_processes, process_index):
    """`(num_processes, process_index)`, checked; None: the launch's."""
    if num_processes is None and process_index is None:
        return parallel.data_processes()
    num_processes = _check_int(1 if num_processes is None else num_processes, "num_processes", 1)
    process_index = _check_int(0 if process_index is None else process_index, "process_index", 0)
    if process_index >= num_processes:
        raise ValueError(f"`process_index` must be below `num_processes` ({num_processes}); received {process_index}.")
    return num_processes, process_index


def image_text_dataset(
    source,
    tokenizer,
    preprocessor,
    batch_size,
    training=False,
    *,
    image_key=None,
    caption_key=None,
    image_root=None,
    shuffle=None,
    shuffle_buffer=None,
    seed=None,
    repeat=False,
    drop_remainder=None,
    scale=(0.9, 1.0),
    ratio=(3 / 4, 4 / 3),
    on_error="raise",
    validate=False,
    num_processes=None,
    process_index=None,
):
    """A `tf.data.Dataset` of batched, preprocessed image-text pairs for `model.fit`.

    Args:
        source: where the pairs are:
            - a caption file (`.csv`/`.tsv` with a header, or `.jsonl`) whose rows
              name an image (path relative to the file's folder, or `image_root`)
              and its caption, see `read_caption_file`; or a directory holding
              exactly one such file;
            - webdataset tar shards (members `KEY.jpg|jpeg|png|webp` + `KEY.txt`,
              optionally `KEY.json`, see `read_tar_samples`): one shard, a glob
              (`"data/*.tar"`), a brace range (`"data/{000..009}.tar"`), a directory
              of shards, or a list of these.
        tokenizer: `tokenizer(list_of_str) -> {"token_ids", "padding_mask"}` of shape
            `(B, T)`, e.g. `model.tokenizer`.
        preprocessor: an `ImagePreprocessor`, e.g. `model.preprocessor`: image size,
            interpolation, mean and std.
        batch_size: `B`.
        training: random resized crops (else the preprocessor's resize + centre
            crop); also the default of `shuffle` and `drop_remainder`.
        image_key, caption_key: caption-file columns/keys of the image path and the
            caption (defaults: the first present of `"image"`, `"file_name"`,
            `"filename"`, `"filepath"`, `"image_path"`, `"path"`, and of `"caption"`,
            `"text"`, `"title"`). `caption_key` also names the caption field of a tar
            sample's `.json` when it has no `.txt`.
        image_root: folder the caption file's image paths are relative to.
        shuffle: shuffle the pairs (default: `training`).
        shuffle_buffer: shuffle buffer size; default every record of a caption file
            (only names are buffered), or 1000 samples for tar shards (which are also
            shuffled shard by shard).
        seed: int making order and augmentation reproducible; None for fresh
            randomness every time.
        repeat: repeat forever (pass `steps_per_epoch` to `fit`).
        drop_remainder: drop the last partial batch (default: `training`).
        scale: (low, high) area fraction of the training crops, as open_clip's
            `(0.9, 1.0)`; `(1, 1)` with `ratio=(1, 1)` keeps square images whole.
        ratio: (low, high) aspect-ratio (width / height) jitter of the crops,
            log-uniform, torchvision's default `(3/4, 4/3)`.
        on_error: `"raise"`: a bad record (missing or undecodable image, empty
            caption, malformed row or tar sample) raises an error naming the caption
            file and line, or the shard and member. Caption files are checked when the
            dataset is built (`FileNotFoundError`/`ValueError`); decoding errors and
            tar records surface while iterating, as TensorFlow errors whose message
            carries the same text. `"skip"`: bad records are dropped and counted in
            `dataset.stats`, each logged once (logger `"vlzoo.data"`), plus a one-line
            summary of a caption file's problems.
        validate: caption files only: decode every image with PIL while building, so
            undecodable images fail (or are skipped) up front.
        num_processes, process_index: read only this process's share of the pairs
            (module docstring); None: the launch's (`vlzoo.parallel.data_processes()`:
            the torch.distributed ranks, the JAX processes of a distribution with
            `auto_shard_dataset=False`; 1 process on TensorFlow, whose strategies
            shard by worker themselves). With several processes and `shuffle`,
            `seed` is required. `batch_size` is then each process's own.

    Returns:
        `tf.data.Dataset` of dicts `{"images": float32 (B, H, W, 3), "token_ids":
        int32 (B, T), "padding_mask": bool (B, T)}` (`H, W` from `preprocessor`, `T`
        from `tokenizer`), with a `stats` attribute: the `DatasetStats` of skipped
        records (keep a reference before chaining other `tf.data` methods).

    Example:
    >>> model = vlzoo.from_preset("clip_tiny")  # doctest: +SKIP
    >>> train = vlzoo.data.image_text_dataset(
    ...     "data/captions.csv", model.tokenizer, model.preprocessor, batch_size=32,
    ...     training=True, seed=0, on_error="skip")  # doctest: +SKIP
    >>> model.compile(optimizer="adamw")  # doctest: +SKIP
    >>> model.fit(train, epochs=2)  # doctest: +SKIP
    >>> train.stats.summary()  # doctest: +SKIP
    'skipped 0 of 1000 records'
    """
    batch_size = _check_int(batch_size, "batch_size", 1)
    R.check_on_error(on_error)
    transforms.check_preprocessor(preprocessor)
    scale = transforms.check_crop_range(scale, "scale", upper=1.0)
    ratio = transforms.check_crop_range(ratio, "ratio")
    shuffle = training if shuffle is None else bool(shuffle)
    drop_remainder = training if drop_remainder is None else bool(drop_remainder)
    if shuffle_buffer is not None:
        shuffle_buffer = _check_int(shuffle_buffer, "shuffle_buffer", 1)
    if seed is not None:
        seed = _check_int(seed, "seed", 0)
    num_processes, process_index = _processes(num_processes, process_index)
    if num_processes > 1 and shuffle and seed is None:
        raise ValueError(
            f"With {num_processes} processes, `seed` must be set: every process shuffles the pairs alike "
            "and reads its own share, so that each pair is read by exactly one process per epoch."
        )
    kind, location = resolve_source(source)
    if kind == "shards" and num_processes > 1:
        if len(location) < num_processes:
            raise ValueError(f"{len(location)} tar shard(s) cannot be dealt out to {num_processes} processes; "
                             "write at least one shard per process.")
        location = location[process_index::num_processes]
    tf = _tensorflow()  # before a tokenizer whose keras_hub ops would start TensorFlow (WordPiece, SentencePiece)
    sequence_length = _sequence_length(tokenizer)
    autotune = tf.data.AUTOTUNE
    stats = R.DatasetStats()

    if kind == "captions":
        records = R.read_caption_file(
            location, image_key=image_key, caption_key=caption_key, image_root=image_root,
            on_error=on_error, validate=validate, stats=stats,
        )
        if not records:
            raise ValueError(f"No usable records in {location} ({stats.summary()}).")
        share = len(records) // num_processes
        if drop_remainder and not repeat and share < batch_size:
            raise ValueError(
                f"{location} has {len(records)} usable records"
                + (f" ({share} per process for {num_processes})" if num_processes > 1 else "")
                + f", fewer than batch_size={batch_size}: with drop_remainder=True the dataset would be empty."
            )
        ds = tf.data.Dataset.from_tensor_slices(
            tuple(list(field) for field in zip(*records))
        )
        if shuffle:
            ds = ds.shuffle(shuffle_buffer or len(records), seed=seed, reshuffle_each_iteration=True)
        if num_processes > 1:  # after the shuffle, the same in every process; before `repeat`: per epoch
            ds = ds.take(share * num_processes).shard(num_processes, process_index)
        if repeat:
            ds = ds.repeat()
        ds = ds.map(
            lambda path, caption, where: (tf.io.read_file(path), caption, where),
            num_parallel_calls=autotune, deterministic=True,
        )
    else:
        if validate:
            raise ValueError(
                "`validate=True` applies to caption files; tar shards are streamed and "
                "their images checked while decoding."
            )
        if image_key is not None or image_root is not None:
            raise ValueError("`image_key` and `image_root` apply to caption files, not tar shards.")

        def samples(shard):
            for record in R.read_tar_samples(shard.decode("utf-8"), caption_key, on_error, stats):
                yield record.image, record.caption, record.source

        signature = tuple(tf.TensorSpec((), tf.string) for _ in range(3))
        ds = tf.data.Dataset.from_tensor_slices(location)
        if shuffle:
            ds = ds.shuffle(len(location), seed=seed, reshuffle_each_iteration=True)
        if repeat:
            ds = ds.repeat()
        ds = ds.interleave(
            lambda shard: tf.data.Dataset.from_generator(samples, output_signature=signature, args=(shard,)),
            cycle_length=min(len(location), os.cpu_count() or 1) if shuffle else 1,
            num_parallel_calls=autotune, deterministic=True,
        )
        if shuffle:
            ds = ds.shuffle(
                shuffle_buffer or DEFAULT_SHARD_SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=True
            )

    if training:
        element_seed = None if seed is None else seed * num_processes + process_index
        seeds = tf.data.Dataset.random(seed=element_seed, rerandomize_each_iteration=True)
    else:
        seeds = tf.data.Dataset.from_tensors(tf.constant(0, tf.int64)).repeat()
    load = _image_fn(preprocessor, training, scale, ratio, on_error, stats)
    height, width = transforms.output_size(preprocessor)

    def decode(record, element_seed):
        data, caption, where = record
        pixels, ok = tf.numpy_function(load, [data, where, element_seed], [tf.float32, tf.bool])
        pixels.set_shape((height, width, 3))
        return pixels, caption, ok

    ds = tf.data.Dataset.zip(ds, seeds).map(decode, num_parallel_calls=autotune, deterministic=True)
    if on_error == "skip":
        ds = ds.filter(lambda pixels, caption, ok: ok)
    ds = ds.map(lambda pixels, caption, ok: (pixels, caption))
    ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    tokenize = _tokenize_fn(tokenizer, sequence_length)
    batch_dim = batch_size if drop_remainder else None

    def to_inputs(pixels, captions):
        ids, mask = tf.py_function(tokenize, [captions], [tf.int32, tf.bool])
        ids.set_shape((batch_dim, sequence_length))
        mask.set_shape((batch_dim, sequence_length))
        return {"images": pixels, "token_ids": ids, "padding_mask": mask}

    ds = ds.map(to_inputs, num_parallel_calls=autotune, deterministic=True).prefetch(autotune)
    ds.stats = stats
    return ds
