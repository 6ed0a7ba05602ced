"""vlzoo.data: caption files, webdataset shards, tf.data pipelines feeding model.fit."""

import csv
import io
import json
import logging
import re
import tarfile

import numpy as np
import pytest
from PIL import Image

from vlzoo import data
from vlzoo.data import transforms
from vlzoo.preprocessing import CLIP_MEAN, CLIP_STD, ImagePreprocessor
from vlzoo.tokenizers import CLIP_BPE, bundled_tokenizer

try:
    from peers import open_clip_or_skip
except ImportError:  # tests/ imported as a package
    from tests.peers import open_clip_or_skip


def op_error():
    """TensorFlow's `OpError`, what a `tf.data` pipeline raises as it reads (imported here, not when the suite is
    collected: a JAX or PyTorch worker loads TensorFlow only for the pipelines it runs)."""
    return pytest.importorskip("tensorflow").errors.OpError


SEQ = 16
SIZE = 32
# (height, width, kind): constant colours and gradients, PNG and JPEG, landscape and portrait.
IMAGES = [(40, 50, "const"), (48, 48, "grad"), (37, 61, "grad"), (64, 40, "const"), (45, 45, "grad"), (50, 70, "grad")]
COLOURS = [(200, 100, 50), (10, 240, 128), (0, 0, 0), (255, 255, 255), (33, 66, 99), (7, 8, 9)]


@pytest.fixture(scope="module")
def tok():
    return bundled_tokenizer(CLIP_BPE, SEQ)


@pytest.fixture(scope="module")
def pre():
    return ImagePreprocessor(SIZE)


def _pixels(i):
    h, w, kind = IMAGES[i]
    if kind == "const":
        return np.full((h, w, 3), COLOURS[i], np.uint8)
    y, x = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(i)
    img = np.stack([x * 255 / w, y * 255 / h, (x + y + 40 * i) % 256], -1) + rng.normal(0, 20, (h, w, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def _encode(i):
    """(file name, encoded bytes) of image i: PNG, except every third one a JPEG."""
    fmt, ext = ("JPEG", "jpg") if i % 3 == 2 else ("PNG", "png")
    buffer = io.BytesIO()
    Image.fromarray(_pixels(i)).save(buffer, fmt)
    return f"{i:04d}.{ext}", buffer.getvalue()


def _caption(i):
    return f"a photo of shape number {i}"


def _write_images(root, n=len(IMAGES)):
    (root / "img").mkdir(exist_ok=True)
    names = []
    for i in range(n):
        name, payload = _encode(i)
        (root / "img" / name).write_bytes(payload)
        names.append(f"img/{name}")
    return names


def _write_csv(path, rows, header=("image", "caption"), delimiter=","):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def _folder(tmp_path, n=len(IMAGES)):
    """tmp_path/captions.csv naming n images under img/."""
    names = _write_images(tmp_path, n)
    return _write_csv(tmp_path / "captions.csv", [(name, _caption(i)) for i, name in enumerate(names)])


def _write_tar(path, members):
    """members: list of (name, bytes)."""
    with tarfile.open(path, "w") as tar:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return path


def _sample(i, caption=None):
    name, payload = _encode(i)
    key = name.split(".")[0]
    return [(name, payload), (f"{key}.txt", (_caption(i) if caption is None else caption).encode())]


def _batches(ds):
    return list(ds.as_numpy_iterator())


def _concat(batches, key):
    return np.concatenate([b[key] for b in batches])


def _expected_pixels(i, pre):
    return pre(Image.open(io.BytesIO(_encode(i)[1])))[0]


# --------------------------------------------------------------------------- caption files


def test_read_caption_file_csv_default_columns(tmp_path):
    path = _folder(tmp_path, 3)
    records = data.read_caption_file(path)
    assert [r.caption for r in records] == [_caption(i) for i in range(3)]
    assert records[1].image == str(tmp_path / "img" / "0001.png")
    assert records[2].source == f"{path} line 4"  # line 1 is the header


def test_read_caption_file_jsonl_hf_names_tsv_and_custom_keys(tmp_path):
    names = _write_images(tmp_path, 3)
    jsonl = tmp_path / "metadata.jsonl"
    lines = [json.dumps({"file_name": names[0], "text": "first"}), "", json.dumps({"file_name": names[1], "text": "second"})]
    jsonl.write_text("\n".join(lines) + "\n")
    records = data.read_caption_file(jsonl)
    assert [(r.caption, r.source) for r in records] == [("first", f"{jsonl} line 1"), ("second", f"{jsonl} line 3")]

    sub = tmp_path / "lists"
    sub.mkdir()
    tsv = _write_csv(sub / "pairs.tsv", [(names[2], "a, comma")], header=("img", "desc"), delimiter="\t")
    records = data.read_caption_file(tsv, image_key="img", caption_key="desc", image_root=tmp_path)
    assert records == [data.ImageTextRecord(str(tmp_path / names[2]), "a, comma", f"{tsv} line 2")]


def test_caption_file_missing_column_names_file_line_and_fields(tmp_path):
    path = _folder(tmp_path, 2)
    with pytest.raises(ValueError, match=re.escape(f"{path} line 2: no caption field 'desc'") + r".*\['caption', 'image'\]"):
        data.read_caption_file(path, caption_key="desc")
    odd = _write_csv(tmp_path / "odd.csv", [("img/0000.png", "x")], header=("picture", "caption"))
    with pytest.raises(ValueError, match=re.escape(f"{odd} line 2: no image field") + ".*pass `image_key`"):
        data.read_caption_file(odd)


@pytest.mark.parametrize(
    "row, error, message",
    [
        (("img/missing.png", "a caption"), FileNotFoundError, "line 3: image file 'img/missing.png' not found"),
        (("img/0000.png", "   "), ValueError, "line 3: empty caption"),
        (("img/0000.png", "x", "extra"), ValueError, "line 3: more fields than the 2 header columns"),
    ],
)
def test_bad_csv_record_raises_naming_file_and_line(tmp_path, row, error, message):
    _write_images(tmp_path, 1)
    path = _write_csv(tmp_path / "captions.csv", [("img/0000.png", "fine"), row])
    with pytest.raises(error, match=re.escape(f"{path} {message}")):
        data.read_caption_file(path)


def test_bad_jsonl_record_raises_naming_file_and_line(tmp_path):
    _write_images(tmp_path, 1)
    path = tmp_path / "captions.jsonl"
    path.write_text('{"image": "img/0000.png", "caption": "ok"}\n{"image": "img/0000.png", "caption": \n')
    with pytest.raises(ValueError, match=re.escape(f"{path} line 2: invalid JSON")):
        data.read_caption_file(path)
    path.write_text('{"image": "img/0000.png", "caption": ["two", "captions"]}\n')
    with pytest.raises(ValueError, match=re.escape(f"{path} line 1: caption must be a string; got list")):
        data.read_caption_file(path)


def test_skip_drops_counts_and_logs_summary(tmp_path, caplog):
    names = _write_images(tmp_path, 3)
    rows = [(names[0], "one"), ("img/gone.png", "two"), (names[1], ""), ("img/gone2.jpg", "three"), (names[2], "four")]
    path = _write_csv(tmp_path / "captions.csv", rows)
    stats = data.DatasetStats()
    with caplog.at_level(logging.WARNING, logger="vlzoo.data"):
        records = data.read_caption_file(path, on_error="skip", stats=stats)
    assert [r.caption for r in records] == ["one", "four"]
    assert stats.counts == {"missing image": 2, "empty caption": 1}
    assert stats.skipped == {f"{path} line 3": "missing image", f"{path} line 4": "empty caption", f"{path} line 5": "missing image"}
    assert stats.num_records == 5
    assert f"{path}: skipped 3 of 5 records (1 empty caption, 2 missing image)" in caplog.text


def test_dataset_stats_counts_each_record_once_and_limits_warnings(caplog):
    stats = data.DatasetStats()
    with caplog.at_level(logging.DEBUG, logger="vlzoo.data"):
        for i in range(7):
            stats.skip(f"f.csv line {i}", "missing image" if i % 2 else "empty caption", "detail")
        stats.skip("f.csv line 0", "empty caption", "detail")  # met again on a later pass
    assert stats.num_skipped == 7 and stats.counts == {"empty caption": 4, "missing image": 3}
    assert stats.summary() == "skipped 7 records (4 empty caption, 3 missing image)"
    levels = [r.levelname for r in caplog.records]
    assert levels == ["WARNING"] * 5 + ["DEBUG"] * 2
    assert "further skipped records are logged at DEBUG level" in caplog.records[4].getMessage()


# --------------------------------------------------------------------------- pipeline output


def test_eval_pixels_and_tokens_exact(tmp_path, tok, pre):
    path = _folder(tmp_path)
    ds = data.image_text_dataset(path, tok, pre, batch_size=4)
    assert ds.element_spec["images"].shape.as_list() == [None, SIZE, SIZE, 3]
    batches = _batches(ds)
    assert [len(b["images"]) for b in batches] == [4, 2]
    images = _concat(batches, "images")
    assert images.dtype == np.float32
    for i, (_, _, kind) in enumerate(IMAGES):
        if kind == "const":  # a constant image stays constant through resize and crop
            expected = (np.float32(COLOURS[i]) / np.float32(255) - np.float32(CLIP_MEAN)) / np.float32(CLIP_STD)
            np.testing.assert_allclose(images[i], np.broadcast_to(expected, (SIZE, SIZE, 3)), rtol=0, atol=1e-6)
        np.testing.assert_array_equal(images[i], _expected_pixels(i, pre))
    expected = tok([_caption(i) for i in range(len(IMAGES))])
    ids, mask = _concat(batches, "token_ids"), _concat(batches, "padding_mask")
    assert ids.dtype == np.int32 and mask.dtype == bool
    np.testing.assert_array_equal(ids, expected["token_ids"])
    np.testing.assert_array_equal(mask, expected["padding_mask"])


def test_training_full_crop_equals_preprocessor_on_square_images(tmp_path, tok, pre):
    path = _folder(tmp_path)
    ds = data.image_text_dataset(path, tok, pre, 2, training=True, shuffle=False, seed=0, scale=(1, 1), ratio=(1, 1))
    images = _concat(_batches(ds), "images")
    square = [i for i, (h, w, _) in enumerate(IMAGES) if h == w]
    assert square
    for i in square:
        np.testing.assert_array_equal(images[i], _expected_pixels(i, pre))


def test_train_transform_matches_open_clip_for_the_same_box(pre, monkeypatch):
    open_clip = open_clip_or_skip()
    import torchvision

    image = Image.fromarray(_pixels(2))
    rng = np.random.default_rng(5)
    box = transforms.random_resized_crop_box(image.height, image.width, (0.5, 1.0), (3 / 4, 4 / 3), rng)
    assert box != (0, 0, image.height, image.width)
    monkeypatch.setattr(torchvision.transforms.RandomResizedCrop, "get_params", staticmethod(lambda *a, **k: box))
    reference = open_clip.image_transform(SIZE, is_train=True)(image).numpy().transpose(1, 2, 0)
    ours = transforms.train_transform(image, pre, (0.5, 1.0), (3 / 4, 4 / 3), np.random.default_rng(5))
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-6)


def test_random_resized_crop_box_bounds_and_fallback():
    rng = np.random.default_rng(0)
    for _ in range(200):
        top, left, h, w = transforms.random_resized_crop_box(60, 80, (0.9, 1.0), (3 / 4, 4 / 3), rng)
        assert 0 <= top and top + h <= 60 and 0 <= left and left + w <= 80
        assert 0.85 <= h * w / (60 * 80) <= 1.0
        assert 0.7 <= w / h <= 1.4
    # No crop of 90-100% area fits a 10 x 200 strip with ratio <= 4/3: centred fallback.
    assert transforms.random_resized_crop_box(10, 200, (0.9, 1.0), (3 / 4, 4 / 3), rng) == (0, 93, 10, 13)


def test_seeded_training_is_deterministic_and_new_each_epoch(tmp_path, tok, pre):
    path = _folder(tmp_path)

    def two_epochs(seed, shuffle=True):
        ds = data.image_text_dataset(path, tok, pre, 3, training=True, seed=seed, shuffle=shuffle, scale=(0.3, 1.0))
        return [_batches(ds), _batches(ds)]

    first, again, other = two_epochs(7), two_epochs(7), two_epochs(8)
    for epoch_a, epoch_b in zip(first, again):
        for a, b in zip(epoch_a, epoch_b):
            for key in a:
                np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(_concat(first[0], "token_ids"), _concat(first[1], "token_ids"))  # new order
    assert not np.array_equal(_concat(first[0], "token_ids"), _concat(other[0], "token_ids"))
    # Unshuffled: same order every epoch, new crops of each image every epoch and seed.
    fixed, fixed_other = two_epochs(7, shuffle=False), two_epochs(8, shuffle=False)
    np.testing.assert_array_equal(_concat(fixed[0], "token_ids"), _concat(fixed[1], "token_ids"))
    for other_images in (_concat(fixed[1], "images"), _concat(fixed_other[0], "images")):
        differs = np.abs(_concat(fixed[0], "images") - other_images).max(axis=(1, 2, 3)) > 0
        assert differs[[i for i, (_, _, kind) in enumerate(IMAGES) if kind == "grad"]].all()
    # Shuffled pairs stay pairs: each caption keeps its own tokens.
    ids = _concat(first[0], "token_ids")
    expected = tok([_caption(i) for i in range(len(IMAGES))])["token_ids"]
    assert sorted(map(tuple, ids)) == sorted(map(tuple, expected))
    assert not np.array_equal(ids, expected)


def test_batching_drop_remainder_and_repeat(tmp_path, tok, pre):
    path = _folder(tmp_path, 5)
    sizes = lambda ds: [len(b["images"]) for b in _batches(ds)]  # noqa: E731
    assert sizes(data.image_text_dataset(path, tok, pre, 2)) == [2, 2, 1]
    dropped = data.image_text_dataset(path, tok, pre, 2, drop_remainder=True)
    assert dropped.element_spec["token_ids"].shape.as_list() == [2, SEQ]
    assert sizes(dropped) == [2, 2]
    assert sizes(data.image_text_dataset(path, tok, pre, 2, training=True, seed=0)) == [2, 2]
    repeated = data.image_text_dataset(path, tok, pre, 2, repeat=True)
    captions = _concat(_batches(repeated.take(6)), "token_ids")
    np.testing.assert_array_equal(captions[5:10], captions[:5])
    with pytest.raises(ValueError, match="5 usable records, fewer than batch_size=8"):
        data.image_text_dataset(path, tok, pre, 8, training=True)


# --------------------------------------------------------------------------- tar shards


def _shards(tmp_path):
    """Two shards holding samples 0-2 and 3-5; sample 4 has its caption in a .json only."""
    (tmp_path / "shards").mkdir()
    members = [m for i in range(3) for m in _sample(i)]
    _write_tar(tmp_path / "shards" / "part-000.tar", members)
    members = _sample(3) + [_sample(4)[0], ("0004.json", json.dumps({"caption": _caption(4), "url": "x"}).encode())]
    members += [("0004.cls", b"3")] + _sample(5)
    _write_tar(tmp_path / "shards" / "part-001.tar", members)
    return tmp_path / "shards"


def test_tar_shards_match_caption_folder(tmp_path, tok, pre):
    shards = _shards(tmp_path)
    samples = list(data.read_tar_samples(shards / "part-001.tar"))
    assert [s.caption for s in samples] == [_caption(i) for i in (3, 4, 5)]
    assert samples[1].source == f"{shards / 'part-001.tar'} member 0004.png"
    assert samples[2].image == _encode(5)[1]

    reference = _batches(data.image_text_dataset(_folder(tmp_path), tok, pre, 4))
    for source in (
        str(shards / "part-*.tar"),
        str(shards / "part-{000..001}.tar"),
        [shards / "part-000.tar", shards / "part-001.tar"],
        shards,
    ):
        batches = _batches(data.image_text_dataset(source, tok, pre, 4))
        for key in reference[0]:
            np.testing.assert_array_equal(_concat(batches, key), _concat(reference, key))


def test_tar_bad_samples_raise_naming_shard_and_member(tmp_path, tok, pre):
    shard = tmp_path / "bad.tar"
    _write_tar(shard, _sample(0) + _sample(1, caption=" \n"))
    with pytest.raises(ValueError, match=re.escape(f"{shard} member 0001.txt: empty caption")):
        list(data.read_tar_samples(shard))
    ds = data.image_text_dataset(shard, tok, pre, 2)
    with pytest.raises(op_error(), match=re.escape(f"{shard} member 0001.txt: empty caption")):
        _batches(ds)
    _write_tar(shard, _sample(0) + [("0001.txt", b"no image")])
    with pytest.raises(ValueError, match=re.escape(f"{shard} member 0001.txt: sample '0001' has no image member")):
        list(data.read_tar_samples(shard))


def test_tar_bad_samples_skipped_and_counted(tmp_path, tok, pre, caplog):
    shard = tmp_path / "mixed.tar"
    members = _sample(0) + [("0001.txt", b"orphan caption")] + _sample(2, caption="") + [_sample(3)[0]] + _sample(4)
    _write_tar(shard, members)
    with caplog.at_level(logging.WARNING, logger="vlzoo.data"):
        ds = data.image_text_dataset(shard, tok, pre, 8, on_error="skip")
        batches = _batches(ds)
        _batches(ds)  # a second pass counts nothing twice
    np.testing.assert_array_equal(_concat(batches, "token_ids"), tok([_caption(0), _caption(4)])["token_ids"])
    assert ds.stats.counts == {"missing image": 1, "empty caption": 1, "bad row": 1}
    assert ds.stats.skipped[f"{shard} member 0003.png"] == "bad row"  # image without caption
    assert f"{shard}: skipped 3 of 5 samples (1 bad row, 1 empty caption, 1 missing image)" in caplog.text


def test_corrupt_shard(tmp_path, tok, pre):
    good = _write_tar(tmp_path / "a.tar", _sample(0))
    corrupt = tmp_path / "b.tar"
    corrupt.write_bytes(b"this is not a tar archive" * 40)
    with pytest.raises(ValueError, match=re.escape(f"{corrupt}: unreadable tar shard")):
        list(data.read_tar_samples(corrupt))
    ds = data.image_text_dataset([good, corrupt], tok, pre, 2, on_error="skip")
    assert len(_concat(_batches(ds), "images")) == 1
    assert ds.stats.skipped == {str(corrupt): "unreadable shard"}


# --------------------------------------------------------------------------- undecodable images


def test_undecodable_image_raises_lazily_naming_file_and_line(tmp_path, tok, pre):
    path = _folder(tmp_path, 3)
    (tmp_path / "img" / "0001.png").write_bytes(b"\x89PNG not really")
    ds = data.image_text_dataset(path, tok, pre, 2)  # the file exists: building succeeds
    with pytest.raises(op_error(), match=re.escape(f"{path} line 3: cannot decode image")):
        _batches(ds)
    with pytest.raises(ValueError, match=re.escape(f"{path} line 3: ") + ".*0001.png: cannot decode image"):
        data.image_text_dataset(path, tok, pre, 2, validate=True)


@pytest.mark.parametrize("validate", [False, True])
def test_undecodable_image_skipped_and_counted(tmp_path, tok, pre, validate):
    path = _folder(tmp_path, 4)
    (tmp_path / "img" / "0001.png").write_bytes(b"")
    ds = data.image_text_dataset(path, tok, pre, 8, on_error="skip", validate=validate)
    batches = _batches(ds)
    np.testing.assert_array_equal(_concat(batches, "token_ids"), tok([_caption(i) for i in (0, 2, 3)])["token_ids"])
    np.testing.assert_array_equal(_concat(batches, "images")[1], _expected_pixels(2, pre))
    assert ds.stats.skipped == {f"{path} line 3": "undecodable image"}
    assert ds.stats.summary() == "skipped 1 of 4 records (1 undecodable image)"


# --------------------------------------------------------------------------- arguments


def test_argument_errors(tmp_path, tok, pre):
    path = _folder(tmp_path, 2)
    with pytest.raises(ValueError, match="`on_error` must be 'raise' or 'skip'; received 'ignore'"):
        data.image_text_dataset(path, tok, pre, 2, on_error="ignore")
    with pytest.raises(ValueError, match="`batch_size` must be an int >= 1; received 0"):
        data.image_text_dataset(path, tok, pre, 0)
    with pytest.raises(ValueError, match=r"`scale` must satisfy 0 < low <= high <= 1.0; received \(0.5, 1.2\)"):
        data.image_text_dataset(path, tok, pre, 2, scale=(0.5, 1.2))
    with pytest.raises(TypeError, match="`preprocessor` must be a vlzoo `ImagePreprocessor`"):
        data.image_text_dataset(path, tok, object(), 2)
    with pytest.raises(TypeError, match="`tokenizer` must be callable"):
        data.image_text_dataset(path, "clip", pre, 2)
    with pytest.raises(FileNotFoundError, match="`source` not found: .*nowhere"):
        data.image_text_dataset(tmp_path / "nowhere", tok, pre, 2)
    with pytest.raises(FileNotFoundError, match="Caption file not found: .*absent.csv"):
        data.image_text_dataset(tmp_path / "absent.csv", tok, pre, 2)
    with pytest.raises(FileNotFoundError, match="No shard matches the pattern .*x-\\*.tar"):
        data.image_text_dataset(str(tmp_path / "x-*.tar"), tok, pre, 2)
    _write_csv(tmp_path / "more.csv", [])
    with pytest.raises(ValueError, match="must hold either one caption file .*'captions.csv', 'more.csv'"):
        data.image_text_dataset(tmp_path, tok, pre, 2)
    shard = _write_tar(tmp_path / "s.tar", _sample(0))
    with pytest.raises(ValueError, match="`validate=True` applies to caption files"):
        data.image_text_dataset(shard, tok, pre, 2, validate=True)
    with pytest.raises(ValueError, match=re.escape(f"No usable records in {tmp_path / 'more.csv'}")):
        data.image_text_dataset(tmp_path / "more.csv", tok, pre, 2)


# --------------------------------------------------------------------------- model.fit


def test_model_fit_consumes_one_epoch(tmp_path):
    import keras

    import vlzoo

    model = vlzoo.from_preset("clip_tiny")
    ds = data.image_text_dataset(_folder(tmp_path), model.tokenizer, model.preprocessor, 2, training=True, seed=0)
    assert ds.element_spec["token_ids"].shape.as_list() == [2, model.text.sequence_length]
    steps = []

    class Count(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            steps.append(batch)

    model.compile(optimizer=keras.optimizers.AdamW(1e-3))
    history = model.fit(ds, epochs=1, verbose=0, shuffle=False, callbacks=[Count()])
    assert steps == [0, 1, 2]
    assert np.isfinite(history.history["loss"][0])


# --------------------------------------------------------------------------- several processes


def _captions_read(ds, tok):
    """The caption indices of a pipeline's batches, in order."""
    index = {tuple(ids): i for i, ids in enumerate(tok([_caption(i) for i in range(len(IMAGES))])["token_ids"])}
    return [index[tuple(ids)] for ids in _concat(_batches(ds), "token_ids")]


def test_processes_each_read_their_own_share_every_epoch(tmp_path, tok, pre):
    path = _folder(tmp_path)  # 6 pairs
    for processes in (2, 3, 4):
        pipelines = [data.image_text_dataset(path, tok, pre, 1, training=True, seed=3, scale=(1, 1), ratio=(1, 1),
                                             num_processes=processes, process_index=i) for i in range(processes)]
        orders = []
        for epoch in range(2):
            shares = [_captions_read(ds, tok) for ds in pipelines]
            share = len(IMAGES) // processes  # the same number of steps for every process
            assert [len(s) for s in shares] == [share] * processes, (processes, shares)
            read = [i for s in shares for i in s]
            assert len(set(read)) == len(read) == share * processes  # each pair read once, by one process
            orders.append(read)
        assert orders[0] != orders[1]  # a new shuffle (and, with 4 processes, other pairs left out) each epoch
    # One process is the whole pipeline.
    whole = data.image_text_dataset(path, tok, pre, 2, training=True, seed=3)
    alone = data.image_text_dataset(path, tok, pre, 2, training=True, seed=3, num_processes=1, process_index=0)
    for a, b in zip(_batches(whole), _batches(alone)):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_processes_deal_out_tar_shards(tmp_path, tok, pre):
    shards = _shards(tmp_path)  # samples 0-2, 3-5
    read = [_captions_read(data.image_text_dataset(shards, tok, pre, 1, num_processes=2, process_index=i), tok)
            for i in range(2)]
    assert read == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match="2 tar shard\\(s\\) cannot be dealt out to 3 processes"):
        data.image_text_dataset(shards, tok, pre, 1, num_processes=3, process_index=0)


def test_processes_need_a_seed_to_shuffle_alike(tmp_path, tok, pre):
    path = _folder(tmp_path)
    with pytest.raises(ValueError, match="With 2 processes, `seed` must be set"):
        data.image_text_dataset(path, tok, pre, 1, training=True, num_processes=2, process_index=0)
    with pytest.raises(ValueError, match="`process_index` must be below `num_processes` \\(2\\); received 2"):
        data.image_text_dataset(path, tok, pre, 1, num_processes=2, process_index=2)
    with pytest.raises(ValueError, match="6 usable records \\(2 per process for 3\\), fewer than batch_size=4"):
        data.image_text_dataset(path, tok, pre, 4, training=True, seed=0, num_processes=3, process_index=1)
