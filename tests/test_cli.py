"""The `vlzoo` commands zeroshot, retrieve, train and convert (in-process, clip_tiny, tiny image folders).

Every metric printed by a command is checked against the library function computed
directly on the same preset (saved once with weights, so both sides use the same ones).

These tests check the commands' wiring (arguments, data files, what reaches the library, what is
printed and written) and run once, in the torch pass: each library function a command calls is
checked on every backend in its own file (test_evaluation, test_training, test_presets, test_locking,
test_gradient_caching, test_lora, test_stair, test_convert_open_clip).
"""

import csv
import json
import os
import re
import subprocess
import sys
import tarfile

import keras
import numpy as np
import pytest
from backend_utils import run_once
from PIL import Image, ImageDraw
from test_selection_benchmarks import _winoground

import vlzoo
from vlzoo import cli, training
from vlzoo.cli import _logs
from vlzoo.evaluation import SIMPLE_TEMPLATES, retrieval_recall, zero_shot_accuracy

COLORS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}
# One batch size everywhere: fewer distinct shapes for JAX's eager op compilation.
BATCH = 4

pytestmark = run_once
COMMANDS = ("list", "info", "zeroshot", "retrieve", "eval", "train", "upload", "convert", "demo")


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def preset_dir(tmp_path_factory):
    """clip_tiny with (random, seeded) weights saved, so every load gets the same model."""
    keras.utils.set_random_seed(7)
    model = vlzoo.from_preset("clip_tiny", load_weights=False)  # the warn-once is test_presets' to check
    directory = tmp_path_factory.mktemp("cli") / "clip_tiny_weights"
    model.save_to_preset(str(directory))
    return str(directory)


@pytest.fixture(scope="module")
def preset_model(preset_dir):
    """The preset, loaded once: the reference side of the comparisons and the weights a run starts from. Read,
    never changed (a test that locks, trains or loads adapters into the preset's model loads its own)."""
    return vlzoo.from_preset(preset_dir)


def draw(path, color, shape, size=(40, 36), seed=0):
    """A small picture: a coloured shape on a grey background, with a little noise."""
    rng = np.random.default_rng(seed)
    background = rng.integers(90, 140, size=(size[1], size[0], 3), dtype=np.uint8)
    image = Image.fromarray(background)
    pen = ImageDraw.Draw(image)
    box = (6 + seed % 5, 5, size[0] - 6, size[1] - 5 - seed % 4)
    (pen.ellipse if shape == "circle" else pen.rectangle)(box, fill=color)
    image.save(path)
    return path


@pytest.fixture()
def image_folder(tmp_path):
    """`root/<class>/*.png|jpg`: 3 classes (light_red has an underscore), 2-3 images each."""
    root = tmp_path / "images"
    layout = {"blue": 2, "green": 3, "light_red": 2}
    for c, (name, count) in enumerate(layout.items()):
        (root / name).mkdir(parents=True)
        color = COLORS[name.split("_")[-1]]
        for i in range(count):
            ext = "jpg" if i % 2 else "png"
            draw(root / name / f"{i}.{ext}", color, "circle" if i % 2 else "square", seed=3 * c + i)
    (root / "green" / "notes.txt").write_text("not an image")
    return root


def folder_pixels(model, root, folders):
    """(pixels, labels) of the folder, read directly with PIL and the model's preprocessor."""
    paths, labels = [], []
    for label, folder in enumerate(folders):
        for name in sorted(os.listdir(root / folder)):
            if name.endswith((".png", ".jpg")):
                paths.append(root / folder / name)
                labels.append(label)
    images = [Image.open(p).convert("RGB") for p in paths]
    return np.asarray(model.preprocessor(images), np.float32), np.array(labels)


@pytest.fixture()
def caption_file(tmp_path):
    """A CSV of 5 images and 7 captions (images 0 and 3 have two captions each)."""
    rows = [
        ("img/0.png", "a red square"), ("img/1.png", "a green circle"), ("img/0.png", "red box"),
        ("img/2.png", "a blue square"), ("img/3.png", "a green square"), ("img/4.png", "a blue circle"),
        ("img/3.png", "green block"),
    ]
    specs = [("red", "square"), ("green", "circle"), ("blue", "square"), ("green", "square"), ("blue", "circle")]
    (tmp_path / "img").mkdir()
    for i, (color, shape) in enumerate(specs):
        draw(tmp_path / "img" / f"{i}.png", COLORS[color], shape, seed=i)
    path = tmp_path / "captions.csv"
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["image", "caption"])
        writer.writerows(rows)
    captions = [caption for _, caption in rows]
    image_ids = np.array([int(image[4]) for image, _ in rows])
    return path, captions, image_ids


def caption_pixels(model, root, count):
    images = [Image.open(root / "img" / f"{i}.png").convert("RGB") for i in range(count)]
    return np.asarray(model.preprocessor(images), np.float32)


def run(capsys, *argv):
    """`cli.main(argv)` -> (status, stdout, stderr)."""
    status = cli.main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# ----------------------------------------------------------------------------- zeroshot


def test_zeroshot_folder_equals_zero_shot_accuracy(preset_dir, preset_model, image_folder, tmp_path, capsys):
    out_json = tmp_path / "out" / "acc.json"
    status, out, err = run(capsys, "zeroshot", "--preset", preset_dir, "--images", image_folder,
                           "--templates", "simple", "--top-k", "1", "2", "--batch-size", BATCH, "--json", out_json)
    assert status == 0, err
    report = json.loads(out_json.read_text())
    assert report["classes"] == ["blue", "green", "light red"]  # folder names, underscores as spaces
    assert report["num_images"] == 7 and report["num_templates"] == len(SIMPLE_TEMPLATES)

    pixels, labels = folder_pixels(preset_model, image_folder, ["blue", "green", "light_red"])
    expected = zero_shot_accuracy(preset_model, pixels, labels, ["blue", "green", "light red"], SIMPLE_TEMPLATES,
                                  top_k=(1, 2), batch_size=BATCH)
    assert report["metrics"] == pytest.approx(expected, abs=1e-12)
    assert f"top1: {expected['top1']:.4f}" in out and f"top2: {expected['top2']:.4f}" in out
    assert "7 images, 3 classes, 7 template(s) (simple)" in out


def spy_on(monkeypatch, name):
    """Replaces `vlzoo.evaluation.<name>` by a recorder of its arguments (images read in full)."""
    calls = []

    def spy(model, images, *args, **kwargs):
        calls.append({"images": np.asarray(images[0:len(images)]), "args": args, "kwargs": kwargs})
        return {"top1": 0.5}

    monkeypatch.setattr(vlzoo.evaluation, name, spy)
    return calls


def test_zeroshot_passes_labels_classes_and_pixels(preset_dir, preset_model, image_folder, tmp_path, capsys,
                                                  monkeypatch):
    """Explicit class names, in another order than the folders: labels follow the names."""
    calls = spy_on(monkeypatch, "zero_shot_accuracy")
    templates = tmp_path / "templates.txt"
    templates.write_text("a picture of a {}.\n\nitap of a {}\n")
    status, _, err = run(capsys, "zeroshot", "--preset", preset_dir, "--images", image_folder,
                         "--classes", "light_red, green,blue", "--templates", templates)
    assert status == 0, err
    (call,) = calls
    labels, class_names, used_templates = call["args"]
    assert class_names == ["light_red", "green", "blue"]
    assert used_templates == ("a picture of a {}.", "itap of a {}")
    assert call["kwargs"]["top_k"] == [1, 5]
    pixels, folder_labels = folder_pixels(preset_model, image_folder, ["blue", "green", "light_red"])
    np.testing.assert_array_equal(labels, np.array([2, 1, 0])[folder_labels])
    np.testing.assert_allclose(call["images"], pixels, rtol=0, atol=1e-6)


def test_zeroshot_sorted_folders_map_to_a_classes_file(preset_dir, image_folder, tmp_path, capsys, monkeypatch):
    """ImageNet style: folders (wnids) that are not class names map to the class list by sorted order."""
    calls = spy_on(monkeypatch, "zero_shot_accuracy")
    classes = tmp_path / "classnames.txt"
    classes.write_text("navy\nlime\n\ncrimson\n")
    status, out, err = run(capsys, "zeroshot", "--preset", preset_dir, "--images", image_folder,
                           "--classes-file", classes)
    assert status == 0, err
    assert "sorted order" in out
    labels, class_names, _ = calls[0]["args"]
    assert class_names == ["navy", "lime", "crimson"]
    assert labels.tolist() == [0, 0, 1, 1, 1, 2, 2]


def test_zeroshot_caption_file_labels(preset_dir, tmp_path, capsys, monkeypatch):
    """A label CSV: the `label` column is the class; integer labels index --classes."""
    calls = spy_on(monkeypatch, "zero_shot_accuracy")
    for i, color in enumerate(["red", "blue", "red"]):
        draw(tmp_path / f"{i}.png", COLORS[color], "square", seed=i)
    (tmp_path / "labels.csv").write_text("file_name,caption,label\n0.png,x,red\n1.png,y,blue\n2.png,z,red\n")
    status, _, err = run(capsys, "zeroshot", "--preset", preset_dir, "--images", tmp_path / "labels.csv")
    assert status == 0, err
    labels, class_names, _ = calls[-1]["args"]
    assert class_names == ["blue", "red"] and labels.tolist() == [1, 0, 1]

    (tmp_path / "ints.jsonl").write_text("".join(
        json.dumps({"image": f"{i}.png", "label": str(label)}) + "\n" for i, label in enumerate([2, 0, 2])))
    status, _, err = run(capsys, "zeroshot", "--preset", preset_dir, "--images", tmp_path / "ints.jsonl",
                         "--classes", "blue,green,red")
    assert status == 0, err
    labels, class_names, _ = calls[-1]["args"]
    assert class_names == ["blue", "green", "red"] and labels.tolist() == [2, 0, 2]


# ----------------------------------------------------------------------------- retrieve


def test_retrieve_equals_retrieval_recall(preset_dir, preset_model, caption_file, tmp_path, capsys):
    path, captions, image_ids = caption_file
    out_json = tmp_path / "recall.json"
    status, out, err = run(capsys, "retrieve", "--preset", preset_dir, "--data", path, "--ks", "1", "2", "5",
                           "--batch-size", BATCH, "--json", out_json)
    assert status == 0, err
    report = json.loads(out_json.read_text())
    assert report["num_images"] == 5 and report["num_captions"] == 7

    pixels = caption_pixels(preset_model, tmp_path, 5)
    expected = retrieval_recall(preset_model, pixels, captions, image_ids=image_ids, ks=(1, 2, 5), batch_size=BATCH,
                                ties="expected")
    assert report["metrics"] == pytest.approx(expected, abs=1e-12) and report["ties"] == "expected"
    assert set(expected) == {f"{d}_r@{k}" for d in ("i2t", "t2i") for k in (1, 2, 5)}
    for name, value in expected.items():
        assert f"{name}: {value:.4f}" in out


def test_retrieve_tar_shards(preset_dir, preset_model, caption_file, tmp_path, capsys):
    """webdataset shards (KEY.png + KEY.txt), one caption per image, read through a brace range."""
    del caption_file  # used for its images in tmp_path/img
    texts = ["a red square", "a green circle", "a blue square", "a green square"]
    for shard, keys in enumerate([(0, 1), (2, 3)]):
        with tarfile.open(tmp_path / f"shard-{shard:02d}.tar", "w") as tar:
            for key in keys:
                tar.add(tmp_path / "img" / f"{key}.png", arcname=f"{key:04d}.png")
                (tmp_path / f"{key}.txt").write_text(texts[key])
                tar.add(tmp_path / f"{key}.txt", arcname=f"{key:04d}.txt")
    out_json = tmp_path / "recall.json"
    status, _, err = run(capsys, "retrieve", "--preset", preset_dir, "--data", tmp_path / "shard-{00..01}.tar",
                         "--ks", "1", "3", "--batch-size", BATCH, "--json", out_json)
    assert status == 0, err
    expected = retrieval_recall(preset_model, caption_pixels(preset_model, tmp_path, 4), texts, ks=(1, 3),
                                batch_size=BATCH, ties="expected")
    assert json.loads(out_json.read_text())["metrics"] == pytest.approx(expected, abs=1e-12)


def test_retrieve_counts_repeated_captions_expected_by_default(preset_dir, caption_file, tmp_path, capsys):
    """Four images all captioned "a red square": each image's caption ties with the three others (the same
    tokens give the same embedding), so the pessimistic rule ranks it 4th and the expected one gives R@K = K/4
    (`vlzoo eval`'s default too)."""
    del caption_file  # used for its images in tmp_path/img
    path = tmp_path / "same.csv"
    path.write_text("image,caption\n" + "".join(f"img/{i}.png,a red square\n" for i in range(4)))
    results = {}
    for ties in (None, "pessimistic"):
        status, out, err = run(capsys, "retrieve", "--preset", preset_dir, "--data", path, "--ks", "1", "2", "3",
                               "--json", tmp_path / f"{ties}.json", *(["--ties", ties] if ties else []))
        assert status == 0, err
        results[ties] = json.loads((tmp_path / f"{ties}.json").read_text())["metrics"]
    assert [results[None][f"i2t_r@{k}"] for k in (1, 2, 3)] == pytest.approx([0.25, 0.5, 0.75], abs=1e-12)
    assert [results["pessimistic"][f"i2t_r@{k}"] for k in (1, 2, 3)] == [0.0, 0.0, 0.0]


def test_retrieve_query_prints_the_best_images(preset_dir, preset_model, caption_file, tmp_path, capsys):
    path, _, _ = caption_file
    query = "a green circle"
    out_json = tmp_path / "query.json"
    status, out, err = run(capsys, "retrieve", "--preset", preset_dir, "--data", path, "--query", query,
                           "--top", "3", "--batch-size", BATCH, "--json", out_json)
    assert status == 0, err
    model = preset_model
    pixels, text = caption_pixels(model, tmp_path, 5), model.encode_text(model.tokenizer([query]))
    scores = np.concatenate([
        keras.ops.convert_to_numpy(model.score(model.encode_image(pixels[i:i + BATCH]), text))[:, 0]
        for i in range(0, 5, BATCH)
    ])
    best = np.argsort(-scores, kind="stable")[:3]
    (result,) = json.loads(out_json.read_text())["queries"]
    assert result["query"] == query
    assert [os.path.basename(hit["image"]) for hit in result["results"]] == [f"{i}.png" for i in best]
    np.testing.assert_allclose([hit["score"] for hit in result["results"]], scores[best], rtol=1e-5, atol=1e-5)
    assert f"query {query!r}: top 3 of 5 images" in out
    assert f"1. {scores[best[0]]:9.4f}" in out


# ----------------------------------------------------------------------------- train


def test_train_writes_a_preset_that_loads_with_new_weights(preset_dir, preset_model, caption_file, tmp_path,
                                                            capsys):
    path, _, _ = caption_file
    out_dir = tmp_path / "trained"
    status, out, err = run(capsys, "train", "--preset", preset_dir, "--data", path, "--epochs", "2",
                           "--steps-per-epoch", "2", "--batch-size", "4", "--learning-rate", "0.01",
                           "--weight-decay", "0.01", "--warmup-steps", "1", "--seed", "3", "--verbose", "2",
                           "--out", out_dir)
    assert status == 0, err
    assert "2 epoch(s) x 2 steps, batch 4" in out and "final loss:" in out and f"saved to {out_dir}" in out
    assert "Epoch 2/2" in out  # Keras's fit log
    start = preset_model
    trained = vlzoo.from_preset(str(out_dir))
    assert type(trained) is type(start)
    changed = [
        not np.array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
        for a, b in zip(start.weights, trained.weights)
    ]
    assert len(changed) == len(start.weights) and sum(changed) > len(changed) // 2
    metadata = json.loads((out_dir / "metadata.json").read_text())  # what `vlzoo upload`'s model card reads
    assert metadata["training"] == {"data": str(path), "steps": 4, "epochs": 2, "batch_size": 4, "learning_rate": 0.01}
    assert metadata["base_preset"]["preset"] == str(preset_dir)


def test_train_runs_stairs_stages_as_told(caption_file, tmp_path, capsys):
    path, _, _ = caption_file
    common = ["train", "--preset", "stair_tiny", "--data", path, "--steps-per-epoch", "4", "--batch-size", "4",
              "--learning-rate", "0.001"]
    out_dir = tmp_path / "stair"
    status, out, err = run(capsys, *common, "--stair-stages", "0.25,0.25,0.5", "--stair-lr-factors", "1,0.5,0.1",
                           "--out", out_dir)
    assert status == 0, err
    trained = vlzoo.from_preset(str(out_dir))
    assert trained.stage == 3 and int(keras.ops.convert_to_numpy(trained.global_step)) == 4
    assert trained.stage_learning_rate_factors == (1.0, 0.5, 0.1)
    status, out, err = run(capsys, *common, "--stair-stages", "manual", "--out", tmp_path / "manual")
    assert status == 0, err
    manual = vlzoo.from_preset(str(tmp_path / "manual"))
    assert manual.stage == 1 and int(keras.ops.convert_to_numpy(manual.global_step)) == 4
    status, _, err = run(capsys, *common, "--warmup-steps", "1", "--out", out_dir)  # stages of 1, 1 and 2 steps
    assert status == 2 and "--warmup-steps: 1 is not below STAIR's shortest stage (1 optimizer updates" in err
    # Under accumulation the schedule counts updates: stages of 2, 2 and 4 steps are 1, 1 and 2 updates.
    status, _, err = run(capsys, *common[:5], "--steps-per-epoch", "8", *common[7:], "--gradient-accumulation-steps",
                         "2", "--warmup-steps", "1", "--out", out_dir)
    assert status == 2 and "--warmup-steps: 1 is not below STAIR's shortest stage (1 optimizer updates" in err
    status, _, err = run(capsys, *common, "--gradient-accumulation-steps", "2", "--out", out_dir)
    assert status == 2 and "--gradient-accumulation-steps: STAIR's stages of (1, 1, 2) steps must each be a " in err
    status, _, err = run(capsys, *common, "--stair-stages", "0.5,0.5", "--out", out_dir)
    assert status == 2 and "--stair-stages: `stage_fractions` must hold 3 numbers" in err
    status, _, err = run(capsys, *common[:2], "clip_tiny", *common[3:], "--stair-stages", "manual", "--out", out_dir)
    assert status == 2 and "--stair-stages: clip_tiny is a CLIP model, not STAIR" in err
    status, _, err = run(capsys, *common, "--stair-stages", "manual", "--stair-lr-factors", "1,1,1", "--out", out_dir)
    assert status == 2 and "--stair-lr-factors: the per-stage factors need the schedule" in err
    trained_preset = [*common[:2], str(out_dir), *common[3:]]  # at stage 3 after its schedule
    status, _, err = run(capsys, *trained_preset, "--stair-stages", "0.5,0.25,0.25", "--out", tmp_path / "again")
    assert status == 2 and "--stair-stages: " in err and "is past its stage schedule's start (stage 3)" in err
    status, _, err = run(capsys, *trained_preset, "--out", tmp_path / "again")  # trains its current stage
    assert status == 0, err
    assert vlzoo.from_preset(str(tmp_path / "again")).stage == 3


def test_train_lock_image_leaves_the_image_tower_as_it_was(preset_dir, preset_model, caption_file, tmp_path,
                                                            capsys):
    path, _, _ = caption_file
    out_dir = tmp_path / "lit"
    status, out, err = run(capsys, "train", "--preset", preset_dir, "--data", path, "--steps-per-epoch", "2",
                           "--batch-size", "4", "--learning-rate", "0.01", "--lock-image", "--out", out_dir)
    assert status == 0, err
    start, trained = preset_model, vlzoo.from_preset(str(out_dir))
    assert f"{sum(int(np.prod(v.shape)) for v in start.vision.weights):,} parameters locked" in out
    for a, b in zip(start.vision.weights, trained.vision.weights, strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    assert not all(np.array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
                   for a, b in zip(start.text.weights, trained.text.weights))
    status, _, err = run(capsys, "train", "--preset", preset_dir, "--data", path, "--lock-text-unlocked-groups", "1",
                         "--out", out_dir)
    assert status == 2 and "--lock-text-unlocked-groups: needs --lock-text" in err


def test_train_cache_locked_trains_on_the_towers_outputs_computed_once(preset_dir, preset_model, caption_file,
                                                                        tmp_path, capsys):
    path, _, _ = caption_file
    common = ["train", "--preset", preset_dir, "--data", path, "--batch-size", "2", "--epochs", "2",
              "--learning-rate", "0.01", "--seed", "4"]
    status, out, err = run(capsys, *common, "--lock-image", "--cache-locked", "--out", tmp_path / "lit")
    assert status == 0, err
    assert "cached the locked image tower outputs of 7 pairs" in out and "2 epoch(s) x 3 steps" in out
    start, trained = preset_model, vlzoo.from_preset(str(tmp_path / "lit"))
    for a, b in zip(start.vision.weights, trained.vision.weights, strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    # The API's recipe on the same pairs: an unaugmented pass, the image tower's outputs cached, 3 whole
    # batches of 2 per epoch. Same loss, up to the rounding of another order of rows (the shuffles differ).
    keras.utils.set_random_seed(4)
    model = vlzoo.from_preset(preset_dir)
    data = vlzoo.data.image_text_dataset(path, model.tokenizer, model.preprocessor, 2, shuffle=False)
    training.lock_tower(model, "image")
    cached = training.cache_tower(model, data, "image")
    cached = {key: keras.tree.map_structure(lambda a: a[:6], value) for key, value in cached.items()}
    training.configure(model, learning_rate=0.01, total_steps=6, weight_decay=0.1, lock_image=True)
    want = model.fit(cached, batch_size=2, epochs=2, shuffle=True, verbose=0).history["loss"][-1]
    assert float(re.search(r"final loss: ([0-9.]+)", out).group(1)) == pytest.approx(want, rel=1e-3)
    for extra, message in ((["--cache-locked"], "--cache-locked: needs --lock-image or --lock-text"),
                           (["--lock-text", "--lock-text-unlocked-groups", "1", "--cache-locked"],
                            "--cache-locked: the text tower is not wholly locked"),
                           (["--lock-image", "--cache-locked", "--lora-rank", "2"],
                            "--cache-locked: --lora-towers adapts the locked image tower"),
                           (["--lock-image", "--cache-locked", "--steps-per-epoch", "2"],
                            "--steps-per-epoch: with --cache-locked an epoch is one pass")):
        status, _, err = run(capsys, *common, *extra, "--out", tmp_path / "bad")
        assert status == 2 and message in err


def test_train_micro_batches_give_the_whole_batchs_model(preset_dir, caption_file, tmp_path, capsys):
    # Gradient caching changes the memory, not the training (test_gradient_caching checks the
    # gradients to 1e-5): the same seed, data and steps end at the same loss with --micro-batch-size 2
    # as with the whole batch of 4. (Weights are not compared: Adam's normalisation turns the rounding
    # differences of near-zero gradients into full-size steps.)
    path, _, _ = caption_file
    losses = {}
    for micro in (None, "2"):
        extra = ["--micro-batch-size", micro] if micro else []
        status, out, err = run(capsys, "train", "--preset", preset_dir, "--data", path, "--steps-per-epoch", "2",
                               "--batch-size", "4", "--learning-rate", "0.01", "--seed", "5", *extra,
                               "--out", tmp_path / f"micro_{micro}")
        assert status == 0, err
        assert f"micro-batch {micro or 4}," in out
        losses[micro] = float(re.search(r"final loss: ([0-9.]+)", out).group(1))
    assert losses["2"] == pytest.approx(losses[None], rel=1e-3)
    status, _, err = run(capsys, "train", "--preset", preset_dir, "--data", path, "--micro-batch-size", "3",
                         "--batch-size", "4", "--out", tmp_path / "bad")
    assert status == 2 and "--micro-batch-size: 3 does not divide --batch-size 4" in err


def test_train_lora_saves_the_merged_model_and_the_adapters(preset_dir, preset_model, caption_file, tmp_path,
                                                             capsys):
    path, _, _ = caption_file
    out_dir, adapters = tmp_path / "lora", tmp_path / "adapters.npz"
    status, out, err = run(capsys, "train", "--preset", preset_dir, "--data", path, "--steps-per-epoch", "2",
                           "--batch-size", "4", "--learning-rate", "0.05", "--lora-rank", "2",
                           "--save-adapters", adapters, "--out", out_dir)
    assert status == 0, err
    start, merged = preset_model, vlzoo.from_preset(str(out_dir))
    assert f"{sum(int(np.prod(v.shape)) for v in merged.weights):,} parameters locked" in out  # all but adapters
    base = vlzoo.from_preset(preset_dir)
    vlzoo.training.load_lora_weights(base, str(adapters))
    pixels = np.random.default_rng(0).normal(size=(2,) + tuple(start.vision.image_size for _ in range(2)) + (3,))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(merged.encode_image(pixels)["embeds"]),
                               keras.ops.convert_to_numpy(base.encode_image(pixels)["embeds"]), rtol=1e-5, atol=1e-6)
    assert not np.allclose(keras.ops.convert_to_numpy(merged.encode_image(pixels)["embeds"]),
                           keras.ops.convert_to_numpy(start.encode_image(pixels)["embeds"]))
    status, _, err = run(capsys, "train", "--preset", preset_dir, "--data", path, "--save-adapters", adapters,
                         "--out", out_dir)
    assert status == 2 and "--save-adapters: needs --lora-rank" in err
    text_only = tmp_path / "lora_text"
    status, out, err = run(capsys, "train", "--preset", preset_dir, "--data", path, "--steps-per-epoch", "2",
                           "--batch-size", "4", "--learning-rate", "0.05", "--lora-rank", "2", "--lora-towers", "text",
                           "--lora-alpha", "4", "--save-adapters", adapters, "--out", text_only)
    assert status == 0, err
    trained = vlzoo.from_preset(str(text_only))
    for a, b in zip(start.vision.weights, trained.vision.weights, strict=True):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(a), keras.ops.convert_to_numpy(b))
    with np.load(adapters) as saved:
        config = json.loads(str(saved[[name for name in saved.files if "config" in name][0]]))
    assert config["rank"] == 2 and config["alpha"] == 4.0 and all("text" in layer for layer in config["layers"])
    status, _, err = run(capsys, "train", "--preset", preset_dir, "--data", path, "--lora-alpha", "4", "--out", out_dir)
    assert status == 2 and "--lora-alpha: needs --lora-rank" in err


@pytest.mark.slow
def test_train_family_trains_that_family_on_the_clip_presets_towers(preset_dir, preset_model, caption_file, tmp_path,
                                                                     capsys):
    path, _, _ = caption_file
    out_dir = tmp_path / "sparc"
    status, out, err = run(capsys, "train", "--preset", preset_dir, "--family", "sparc", "--data", path,
                           "--steps-per-epoch", "2", "--batch-size", "4", "--learning-rate", "0.01",
                           "--new-params-steps", "1", "--out", out_dir)
    assert status == 0, err
    assert "sparc from CLIP:" in out and f"saved to {out_dir}" in out
    start, trained = preset_model, vlzoo.from_preset(str(out_dir))
    assert trained.family == "sparc" and trained.vision.num_prefix_tokens == start.vision.num_prefix_tokens
    before = keras.ops.convert_to_numpy(start.vision.patch_embedding.conv.kernel)
    assert not np.array_equal(keras.ops.convert_to_numpy(trained.vision.patch_embedding.conv.kernel), before)


def test_train_family_trains_the_new_parameters_first_with_the_rest_held(preset_dir, preset_model, caption_file,
                                                                         tmp_path, capsys):
    """SPARC's h_v (new) trains alone first; a main phase at lr 1e-12 then leaves every weight where it was:
    the towers are CLIP's, and h_v differs from the same run's without the first phase."""
    path, _, _ = caption_file
    heads = {}
    for steps in (2, 0):
        out_dir = tmp_path / f"sparc{steps}"
        status, out, err = run(capsys, "train", "--preset", preset_dir, "--family", "sparc", "--data", path,
                               "--steps-per-epoch", "1", "--batch-size", "4", "--learning-rate", "1e-12",
                               "--new-params-steps", steps, "--out", out_dir)
        assert status == 0, err
        width = preset_model.vision_config["hidden_dim"]  # h_v: a Dense(width) on the pooled patches
        assert (f"training the {width * width + width:,} new parameters first: 2 steps" in out) == (steps == 2), out
        trained = vlzoo.from_preset(str(out_dir))
        heads[steps] = keras.ops.convert_to_numpy(trained.vision_head.kernel)
        origin = json.loads((out_dir / "metadata.json").read_text())["base_preset"]
        assert (origin["preset"], origin["family"], origin["from_family"]) == (str(preset_dir), "sparc", "clip")
    start = preset_model
    for ours, clips in ((trained.vision.patch_embedding.conv.kernel, start.vision.patch_embedding.conv.kernel),
                        (trained.image_projection.kernel, start.vision.projection.kernel)):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(ours), keras.ops.convert_to_numpy(clips), atol=1e-9)
    # Two AdamW steps at 3e-3 move each weight by up to 6e-3; lr 1e-12 moves none by more than 1e-11.
    assert np.abs(heads[2] - heads[0]).max() > 1e-3


def test_train_family_must_be_a_transfer_family(preset_dir, caption_file, tmp_path, capsys):
    status, _, err = run(capsys, "train", "--preset", preset_dir, "--family", "siglip", "--data",
                         caption_file[0], "--out", tmp_path / "x")
    assert status == 2
    # The registered families with a CLIPTransfer: vlzoo's, and the tests' own where this process registered it.
    expected = ", ".join(vlzoo.models.transfer_families())
    assert {"filip", "flair", "llip", "sparc", "sparo", "stair"} <= set(vlzoo.models.transfer_families())
    assert "argument --family" in err and f"'siglip' is not one of {expected}\n" in err


def test_handles_reach_the_loader_as_presets(caption_file, tmp_path, capsys):
    """A handle is not a preset directory: `--preset` passes it to `from_preset`, which names what is wrong."""
    for handle, problem in (("hf://just-a-name", "is not a valid hub handle"),
                            ("kaggle://keras/siglip", "not a Kaggle Models handle")):
        status, _, err = run(capsys, "train", "--preset", handle, "--data", caption_file[0], "--batch-size", "4",
                             "--out", tmp_path / "x")
        assert status == 2 and "argument --preset" in err and problem in err, err


def test_train_one_pass_needs_a_full_batch(preset_dir, caption_file, tmp_path, capsys):
    path, _, _ = caption_file
    status, _, err = run(capsys, "train", "--preset", preset_dir, "--data", path, "--batch-size", "8",
                         "--out", tmp_path / "x")
    assert status == 2
    assert "argument --batch-size" in err and "7 usable pairs" in err


def test_train_counts_the_warm_up_in_optimizer_updates(preset_dir, caption_file, tmp_path, capsys):
    """The schedule's steps are optimizer updates: 2 epochs of 2 batches, 2 batches per update, are 2."""
    path, _, _ = caption_file
    common = ["train", "--preset", preset_dir, "--data", path, "--epochs", "2", "--steps-per-epoch", "2",
              "--batch-size", "4", "--gradient-accumulation-steps", "2", "--out", tmp_path / "x"]
    status, _, err = run(capsys, *common, "--warmup-steps", "2")
    assert status == 2 and "--warmup-steps: 2 is not below the run's 2 optimizer updates (4 steps / 2)" in err
    status, _, err = run(capsys, *common[:-4], "--gradient-accumulation-steps", "8", *common[-2:])
    assert status == 2 and "--gradient-accumulation-steps: 8 batches per update is more than the run's 4" in err


# ----------------------------------------------------------------------------- convert


def _open_clip_checkpoint(model, directory):
    """`(checkpoint, config)` files of `model` as open_clip writes them, for `vlzoo convert`."""
    safetensors = pytest.importorskip("safetensors.numpy")
    import vlzoo.convert as vc

    state_dict = vc.to_open_clip_state_dict(model)
    assert any(key.startswith("visual.") for key in state_dict)
    checkpoint, config = directory / "tiny_open_clip.safetensors", directory / "tiny.json"
    safetensors.save_file({k: np.ascontiguousarray(v) for k, v in state_dict.items()}, str(checkpoint))
    config.write_text(json.dumps(vc.open_clip_config(model)))
    return checkpoint, config


def test_convert_round_trips_an_open_clip_state_dict(preset_model, tmp_path, capsys):
    """vlzoo -> open_clip state dict (+ its model config JSON) on disk -> `vlzoo convert` -> same model."""
    import vlzoo.convert as vc

    model = preset_model
    checkpoint, config = _open_clip_checkpoint(model, tmp_path)
    out_dir = tmp_path / "converted"
    status, out, err = run(capsys, "convert", "--from", "open_clip", "--checkpoint", checkpoint,
                           "--config", config, "--out", out_dir, "--no-peer-check", "--quiet",
                           "--batch-size", BATCH)
    assert status == 0, err
    assert "preset reload: identical similarities" in out and "Saved CLIP" in out
    converted = vlzoo.from_preset(str(out_dir))
    images, ids, mask = vc.random_inputs(model, BATCH, seed=1)
    texts = {"token_ids": ids.astype("int32"), "padding_mask": mask}
    for fn in (lambda m: m.encode_image(images)["embeds"], lambda m: m.encode_text(texts)["embeds"]):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(fn(converted)), keras.ops.convert_to_numpy(fn(model)),
                                   rtol=1e-6, atol=1e-6)


# ----------------------------------------------------------------------------- help and errors


@pytest.mark.parametrize("command", COMMANDS)
def test_help_documents_every_option(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    sub = next(a for a in cli.build_parser()._actions if a.dest == "command").choices[command]
    assert sub.description and "examples:" in out and f"vlzoo {command}" in out.split("examples:")[1]
    for action in sub._actions:
        if action.dest == "help":
            continue
        assert action.help, f"{command}: option {action.dest} has no help"
        for flag in action.option_strings:
            assert flag in out, f"{command}: {flag} missing from --help"


def test_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert command in out


@pytest.mark.parametrize("argv, named", [
    (["zeroshot", "--preset", "clip_tiny"], "--images"),
    (["zeroshot", "--preset", "clip_tiny", "--images", "x", "--top-k", "0"], "--top-k"),
    (["zeroshot", "--preset", "clip_tiny", "--images", "x", "--classes", "a", "--classes-file", "f"], "--classes"),
    (["retrieve", "--preset", "clip_tiny", "--data", "x", "--ks", "two"], "--ks"),
    (["train", "--preset", "clip_tiny", "--data", "x", "--out", "o", "--learning-rate", "-1"], "--learning-rate"),
    (["convert", "--from", "onnx", "--checkpoint", "x", "--out", "o"], "--from"),
    (["convert", "--checkpoint", "x", "--out", "o"], "--from"),
])
def test_bad_arguments_are_named_by_argparse(argv, named, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert named in err and "error:" in err


def test_user_mistakes_are_one_line_errors_naming_the_argument(preset_dir, image_folder, caption_file, tmp_path,
                                                               capsys):
    path, _, _ = caption_file
    cases = [
        (["zeroshot", "--preset", "clip_tiyn", "--images", image_folder], ["--preset", "clip_tiny"]),
        (["zeroshot", "--preset", preset_dir, "--images", tmp_path / "nope"], ["--images", "not found"]),
        (["zeroshot", "--preset", preset_dir, "--images", image_folder, "--templates", "fancy"], ["--templates"]),
        (["zeroshot", "--preset", preset_dir, "--images", image_folder, "--classes", "cat,dog"],
         ["--classes", "light_red"]),
        (["zeroshot", "--preset", preset_dir, "--images", image_folder, "--classes", "a,b,a,c"],
         ["--classes", "duplicate"]),
        (["retrieve", "--preset", preset_dir, "--data", tmp_path / "none.csv"], ["none.csv", "not found"]),
        (["retrieve", "--preset", preset_dir, "--data", tmp_path / "none.tar"], ["--data", "none.tar"]),
        (["train", "--preset", tmp_path / "missing_preset", "--data", path, "--out", tmp_path / "o"],
         ["--preset", "missing_preset"]),
        (["convert", "--from", "open_clip", "--checkpoint", path, "--out", tmp_path / "o"], ["--model", "--config"]),
        (["convert", "--from", "transformers", "--checkpoint", tmp_path / "no_dir", "--out", tmp_path / "o"],
         ["--checkpoint", "not found"]),
    ]
    for argv, words in cases:
        status, _, err = run(capsys, *argv)
        assert status == 2, (argv, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"vlzoo {argv[0]}: error: "), (argv, err)
        for word in words:
            assert word in lines[0], (argv, word, err)
        assert "Traceback" not in err


# ----------------------------------------------------------------------------- quiet by default


# Commands whose fresh-process run has a test of its own: the demo's output is checked line by line
# (test_cli_demo.py), an upload needs a loopback Hub (test_upload.py). `download` needs the real
# repository layout of a catalogue name; `from_preset` of handles runs in fresh processes in test_hub.py.
FRESH_ELSEWHERE = {"demo", "upload", "download"}


@pytest.mark.slow
def test_every_command_runs_in_a_fresh_process_quietly(preset_dir, preset_model, caption_file, tmp_path):
    """Each command as a user runs it: a new process whose first vlzoo call it is (the backends taken in
    turn), a real call that succeeds and prints its result, and nothing on stderr: TensorFlow's load-time
    lines ("oneDNN custom operations are on", "Could not find cuda drivers"), which TensorFlow 2.20+ writes
    before TF_CPP_MIN_LOG_LEVEL applies, are filtered out. With VLZOO_VERBOSE=1 they show."""
    path, _, _ = caption_file
    tuned, mixed = tmp_path / "tuned", tmp_path / "mixed"
    checkpoint, config = _open_clip_checkpoint(preset_model, tmp_path)
    commands = [
        ["list"],
        ["info", "clip_shapes"],
        ["zeroshot", "--preset", preset_dir, "--images", path],
        ["retrieve", "--preset", preset_dir, "--data", path, "--ks", "1"],
        ["train", "--preset", preset_dir, "--data", path, "--out", tuned, "--epochs", "1", "--batch-size", "4"],
        ["interpolate", "--zero-shot", preset_dir, "--finetuned", tuned, "--alpha", "0.5", "--out", mixed],
        ["eval", "--preset", preset_dir, "--benchmark", "winoground", "--data", _winoground(tmp_path)],
        ["convert", "--from", "open_clip", "--checkpoint", checkpoint, "--config", config, "--out",
         tmp_path / "converted", "--no-peer-check", "--quiet", "--batch-size", BATCH],
        ["export", "--preset", preset_dir, "--format", "onnx", "--tower", "image", "--batch-size", "2",
         "--out", tmp_path / "onnx"],
    ]
    subcommands, = (action for action in cli.build_parser()._actions if action.dest == "command")
    assert {argv[0] for argv in commands} | FRESH_ELSEWHERE == set(subcommands.choices)
    backends = ("tensorflow", "jax", "torch")
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "VLZOO_VERBOSE")}
    for k, argv in enumerate(commands):
        backend = backends[k % 3] if argv[0] != "export" else "torch"
        done = subprocess.run([sys.executable, "-m", "vlzoo.cli", *map(str, argv)], capture_output=True, text=True,
                              env=dict(env, KERAS_BACKEND=backend), timeout=300)
        assert done.returncode == 0, (argv, done.stderr[-2000:])
        assert done.stdout and done.stderr == "", (argv, backend, done.stderr[-2000:])
    # The filter has something to remove on this machine: the same command on TensorFlow (on PyTorch and JAX a
    # CLIP preset no longer loads TensorFlow), verbose, shows the lines.
    done = subprocess.run([sys.executable, "-m", "vlzoo.cli", "retrieve", "--preset", preset_dir, "--data", str(path)],
                          capture_output=True, text=True, env=dict(env, KERAS_BACKEND="tensorflow", VLZOO_VERBOSE="1"),
                          timeout=300)
    assert done.returncode == 0 and any(_logs._LOAD_LOG_LINE.match(line) for line in done.stderr.splitlines()), \
        done.stderr[-2000:]
