"""The bundled `*_shapes` presets: real weights that reproduce their recorded held-out metrics.

`tools/train_shapes.py` trained each preset on `vlzoo.data.shapes` and wrote the
metrics of `shapes_benchmark.evaluate` (held-out compositions) to `training.json`; here the
shipped weights are loaded on the current backend, the same metrics are computed again from
their scores (within the share of decisions those scores take within rounding), and the
shapes table of docs/presets.md is compared with those files.
"""

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import vlzoo
from backend_utils import ONCE_BACKEND, run_once
from conftest import to_numpy
from families import SHAPES_PRESETS
from margins import DECISION_MARGIN
from vlzoo import presets
from vlzoo.data import shapes
from vlzoo.evaluation import recall_at_k

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = list(SHAPES_PRESETS)
# Binding pairs scored per call: 300 in three blocks (the last padded), each the shape of the 120 retrieval scenes,
# so that the towers and the scores run the programs the retrieval compiled.
BINDING_BLOCK = 120


def _train_shapes():
    spec = importlib.util.spec_from_file_location("train_shapes", os.path.join(ROOT, "tools", "train_shapes.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _record(name):
    return json.loads((presets.resolve_preset(name) / "training.json").read_text())


def test_every_family_has_a_shapes_preset_with_weights():
    assert set(NAMES) <= set(presets.list_presets())
    for name in NAMES:
        directory = presets.resolve_preset(name)
        weights = directory / presets.WEIGHTS_FILE
        assert weights.is_file(), name
        assert weights.stat().st_size < 10 * 2**20, name  # a few MB each
        assert vlzoo.preset_info(name)["weights_available"]
        record = _record(name)
        assert record["preset"] == name and record["backend"] == "jax"
        assert record["train_seconds"] < 15 * 60, (name, record["train_seconds"])


def _embeddings(model, images, texts):
    return model.encode_image(model.preprocessor(images)), model.encode_text(model.tokenizer(list(texts)))


def _pair_scores(model, pairs, block=BINDING_BLOCK):
    """Each image's score with its true caption and with its swapped one, `(N,)` each: `block` images against
    their `2 * block` captions per call (the diagonals of the `(N, N)` scores, without the rest), the last
    block padded with the last pair so that every call has one shape."""
    n, diagonal = len(pairs["images"]), np.arange(block)
    right, wrong = [], []
    for start in range(0, n, block):
        rows = np.minimum(start + diagonal, n - 1)
        image, true = _embeddings(model, pairs["images"][rows], [pairs["captions"][r] for r in rows])
        swapped = model.encode_text(model.tokenizer([pairs["swapped_captions"][r] for r in rows]))
        right.append(np.diag(to_numpy(model.score(image, true)))[: n - start])
        wrong.append(np.diag(to_numpy(model.score(image, swapped)))[: n - start])
    return np.concatenate(right), np.concatenate(wrong)


def _held_out(model, retrieval_only=False):
    """`shapes_benchmark.evaluate`'s metrics (its data and seeds), computed here from the model's scores, and
    for each metric the share of its decisions that those scores take by less than `DECISION_MARGIN` of their
    scale: a ranking's target against another candidate, a true caption against its swap, an image's best class
    against the next. Another CPU or backend computes the scores with float32 errors below that margin and may
    take those decisions either way, so its metric may differ by that share and no more."""

    def share(close, scores):
        return float(np.mean(close(DECISION_MARGIN * np.abs(scores).max())))

    scenes = shapes.retrieval_scenes("test", image_size=model.vision.image_size)
    image, text = _embeddings(model, scenes["images"], scenes["captions"])
    i2t = to_numpy(model.score(image, text))  # (120, 120): one scene per row and column
    t2i = i2t if model.symmetric_score else to_numpy(model.score(image, text, direction="t2i"))
    metrics, ties = recall_at_k(i2t, ks=(1, 5), t2i_scores=t2i), {}
    for direction, scores, axis in (("i2t", i2t, 1), ("t2i", t2i, 0)):
        target = np.expand_dims(np.diag(scores), axis)  # image i's caption (i2t), caption j's image (t2i)
        gaps = np.abs(scores - target) + np.diag(np.full(len(scores), np.inf))
        for k in (1, 5):
            ties[f"{direction}_r@{k}"] = share(lambda d: (gaps < d).any(axis=axis), scores)
    if retrieval_only:
        return metrics, ties
    for offset, swap in enumerate(shapes.SWAPS, start=1):
        pairs = shapes.binding_pairs("test", 300, swap=swap, image_size=model.vision.image_size, seed=offset)
        right, wrong = _pair_scores(model, pairs)
        metrics[f"binding_{swap}"] = float(np.mean(right > wrong))  # a tie counts as a failure
        ties[f"binding_{swap}"] = share(lambda d: np.abs(right - wrong) < d, np.concatenate([right, wrong]))
    for values in (metrics, ties):
        values["binding_mean"] = float(np.mean([values[f"binding_{swap}"] for swap in shapes.SWAPS]))
    data = shapes.classification(10, seed=len(shapes.SWAPS) + 1, image_size=model.vision.image_size)
    scores = to_numpy(model.score(*_embeddings(model, data["images"], ["a " + c for c in data["class_names"]])))
    ordered = np.sort(scores, axis=1)
    metrics["zero_shot_accuracy"] = float(np.mean(np.argmax(scores, axis=1) == data["labels"]))
    ties["zero_shot_accuracy"] = share(lambda d: ordered[:, -1] - ordered[:, -2] < d, scores)
    return metrics, ties


@pytest.mark.parametrize("name", NAMES)
def test_shipped_weights_reproduce_the_recorded_metrics(name):
    """The weights give every held-out number of the training run (in the `ONCE_BACKEND` pass, PyTorch's, whose
    eager calls cost about half of JAX's compiled and TensorFlow's traced ones for the 900 binding pairs and 240
    classification images; the retrieval recalls of 120 scenes in the others), each within the share of its
    decisions that the scores take within rounding (`_held_out`), which is 0 for most. A backend other than the
    one that trained the weights (JAX) computes them within that slack as well as that one does."""
    import keras

    record = _record(name)["metrics"]
    model = vlzoo.from_preset(name)
    every_metric = keras.backend.backend() == ONCE_BACKEND
    metrics, slack = _held_out(model, retrieval_only=not every_metric)
    if every_metric:
        assert set(metrics) == set(record)
    for key, value in metrics.items():
        assert abs(value - record[key]) <= slack[key] + 1e-9, (key, value, record[key], slack[key])
    # Learned, not random: far above chance on compositions never seen in training.
    assert record["zero_shot_accuracy"] > 0.3  # chance 1/24
    assert metrics["t2i_r@1"] > 0.1 and metrics["i2t_r@1"] > 0.1  # chance 1/120


def test_presets_doc_table_is_the_training_records():
    table = _train_shapes().table(presets.presets_root())
    assert len(table.splitlines()) == 2 + len(NAMES)
    with open(os.path.join(ROOT, "docs", "presets.md"), encoding="utf-8") as f:
        assert table in f.read()


@run_once
def test_train_shapes_smoke_run_writes_presets_that_load(tmp_path):
    """tools/train_shapes.py end to end on a few steps (STAIR through its three stages, FLAIR on three captions
    per image)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "train_shapes.py"), "--family", "clip", "stair",
         "flair", "--steps", "8", "--batch-size", "16", "--examples", "64", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "STAIR stage 3: 2 steps" in done.stdout
    for name in ("clip_shapes", "stair_shapes", "flair_shapes"):
        record = json.loads((tmp_path / name / "training.json").read_text())
        assert record["settings"]["steps"] == 8 and set(record["metrics"]) == set(_record(name)["metrics"])
        model = vlzoo.from_preset(str(tmp_path / name))
        assert model.count_params() == vlzoo.preset_info(name)["params"]
    table = _train_shapes().table(tmp_path)
    assert "| `clip_shapes` |" in table and "| `stair_shapes` |" in table and "8 steps" in table
