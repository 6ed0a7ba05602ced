"""The bundled `*_shapes` presets: real weights that reproduce their recorded held-out metrics.

`tools/train_shapes.py` trained each preset on `vlzoo.data.shapes` and wrote the
metrics of `shapes_benchmark.evaluate` (held-out compositions) to `training.json`; here the
shipped weights are loaded on the current backend and evaluated again, and the
README's table is compared with those files.
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

import vlzoo
from backend_utils import run_once
from vlzoo import presets
from vlzoo.data import shapes
from vlzoo.evaluation import shapes_benchmark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = ("clip", "siglip", "filip", "sparc", "sparo", "llip", "stair", "flair")
NAMES = [f"{family}_shapes" for family in FAMILIES]


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


@pytest.mark.parametrize("name", NAMES)
def test_shipped_weights_reproduce_the_recorded_metrics(name):
    """On jax, where they were trained, the weights give every held-out number of the training
    run exactly. On the other backends the retrieval recalls (120 scenes) are recomputed: they may
    move by one scene where float rounding flips a near-tie."""
    import keras

    from vlzoo.evaluation import retrieval_recall

    record = _record(name)["metrics"]
    model = vlzoo.from_preset(name)
    if keras.backend.backend() == "jax":
        metrics, slack = shapes_benchmark.evaluate(model), 0.0
        assert set(metrics) == set(record)
    else:
        scenes = shapes.retrieval_scenes("test")
        metrics = retrieval_recall(model, model.preprocessor(scenes["images"]), scenes["captions"], ks=(1, 5))
        slack = 1.0 / 120 + 1e-9
    for key, value in metrics.items():
        assert abs(value - record[key]) <= slack, (key, value, record[key])
    # Learned, not random: far above chance on compositions never seen in training.
    assert record["zero_shot_accuracy"] > 0.3  # chance 1/24
    assert metrics["t2i_r@1"] > 0.1 and metrics["i2t_r@1"] > 0.1  # chance 1/120


def test_readme_table_is_the_training_records():
    table = _train_shapes().table(presets.presets_root())
    assert len(table.splitlines()) == 2 + len(NAMES)
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert table in f.read()


@run_once
def test_train_shapes_smoke_run_writes_presets_that_load(tmp_path):
    """tools/train_shapes.py end to end on a few steps (STAIR through its three stages)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tools", "train_shapes.py"), "--family", "clip", "stair",
         "--steps", "8", "--batch-size", "16", "--examples", "64", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "STAIR stage 3: 2 steps" in done.stdout
    for name in ("clip_shapes", "stair_shapes"):
        record = json.loads((tmp_path / name / "training.json").read_text())
        assert record["settings"]["steps"] == 8 and set(record["metrics"]) == set(_record(name)["metrics"])
        model = vlzoo.from_preset(str(tmp_path / name))
        assert model.count_params() == vlzoo.preset_info(name)["params"]
    table = _train_shapes().table(tmp_path)
    assert "| `clip_shapes` |" in table and "| `stair_shapes` |" in table and "8 steps" in table
