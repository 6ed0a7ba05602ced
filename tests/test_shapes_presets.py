"""The bundled `*_shapes` presets: real weights that reproduce their recorded held-out metrics.

`tools/train_shapes.py` trained each preset on `vlzoo.data.shapes` and wrote the
metrics of `shapes.evaluate` (held-out compositions) to `training.json`; here the
shipped weights are loaded on the current backend and evaluated again, and the
README's table is compared with those files.
"""

import importlib.util
import json
import os

import pytest

import vlzoo
from vlzoo import presets
from vlzoo.data import shapes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = ("clip", "siglip", "filip", "sparc", "sparo", "llip", "stair")
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
    """Loaded on any backend, the weights give the training run's held-out numbers: a fraction may
    move by one item of its set (120 scenes, 300 pairs, 240 images) where float rounding flips a
    near-tie between backends; on jax, where they were trained, they are exact."""
    import keras

    record = _record(name)
    model = vlzoo.from_preset(name)
    metrics = shapes.evaluate(model)
    assert set(metrics) == set(record["metrics"])
    slack = 0.0 if keras.backend.backend() == "jax" else 1.0 / 120 + 1e-9
    for key, value in metrics.items():
        assert abs(value - record["metrics"][key]) <= slack, (key, value, record["metrics"][key])
    # Learned, not random: far above chance on compositions never seen in training.
    assert metrics["zero_shot_accuracy"] > 0.3  # chance 1/24
    assert metrics["t2i_r@1"] > 0.1 and metrics["i2t_r@1"] > 0.1  # chance 1/120


def test_readme_table_is_the_training_records():
    table = _train_shapes().table(presets.presets_root())
    assert len(table.splitlines()) == 2 + len(NAMES)
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert table in f.read()
