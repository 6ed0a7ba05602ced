"""WiSE-FT weight-space ensembles: `vlzoo.training.interpolate`, its sweep and `vlzoo interpolate`."""

import functools
import json

import keras
import numpy as np
import pytest
from PIL import Image

import vlzoo
from vlzoo.cli import main
from vlzoo.evaluation import SIMPLE_TEMPLATES, benchmarks
from vlzoo.training import interpolate, interpolation_sweep

from backend_utils import run_once


def _numpy_weights(model):
    return [keras.ops.convert_to_numpy(w.value) for w in model.weights]


@functools.lru_cache(maxsize=None)
def _pair(preset="clip_shapes"):
    """A preset's model and a "fine-tuned" copy of it: every floating weight moved by seeded noise."""
    zero_shot = vlzoo.from_preset(preset)
    finetuned = vlzoo.from_preset(preset)
    rng = np.random.default_rng(0)
    for w in finetuned.weights:
        value = keras.ops.convert_to_numpy(w.value)
        w.assign(value + rng.normal(0, 0.02, value.shape).astype(value.dtype))
    return zero_shot, finetuned


def test_the_ends_are_the_two_models_exactly():
    zero_shot, finetuned = _pair()
    before = [_numpy_weights(zero_shot), _numpy_weights(finetuned)]
    pixels = zero_shot.preprocessor(np.full((2, 32, 32, 3), 90, np.uint8))
    for alpha, model in ((0, zero_shot), (1, finetuned)):
        mixed = interpolate(zero_shot, finetuned, alpha)
        assert mixed is not model and type(mixed) is type(model)
        for got, want in zip(_numpy_weights(mixed), _numpy_weights(model), strict=True):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(mixed.encode_image(pixels)["embeds"]),
                                      keras.ops.convert_to_numpy(model.encode_image(pixels)["embeds"]))
    for model, weights in zip((zero_shot, finetuned), before):  # the inputs are left as they were
        for got, want in zip(_numpy_weights(model), weights):
            np.testing.assert_array_equal(got, want)


def test_halfway_is_the_mean_of_every_weight():
    # 0.5 a and 0.5 b are exact in float32 and their float64 sum is exact: rounding it once to
    # float32 is what float32 arithmetic gives, so the reference must match bit for bit.
    zero_shot, finetuned = _pair()
    mixed = interpolate(zero_shot, finetuned, 0.5)
    for got, a, b in zip(_numpy_weights(mixed), _numpy_weights(zero_shot), _numpy_weights(finetuned)):
        want = ((a.astype(np.float64) + b.astype(np.float64)) / 2).astype(a.dtype)
        np.testing.assert_array_equal(got, want)
    assert mixed.tokenizer is finetuned.tokenizer and mixed.preprocessor is finetuned.preprocessor


def test_sweep_evaluates_each_alpha_in_order():
    # A metric linear in the weights (one weight's mean) moves linearly with alpha.
    zero_shot, finetuned = _pair()
    index = max(range(len(zero_shot.weights)), key=lambda i: np.prod(zero_shot.weights[i].shape))
    mean = lambda m: {"mean": float(np.mean(keras.ops.convert_to_numpy(m.weights[index].value), dtype=np.float64))}
    rows = interpolation_sweep(zero_shot, finetuned, [0, 0.25, 1], mean)
    ends = mean(zero_shot)["mean"], mean(finetuned)["mean"]
    assert [row["alpha"] for row in rows] == [0, 0.25, 1]
    np.testing.assert_allclose([row["mean"] for row in rows],
                               [ends[0], 0.75 * ends[0] + 0.25 * ends[1], ends[1]], rtol=0, atol=1e-7)


def test_bfloat16_models_interpolate_in_bfloat16():
    zero_shot = vlzoo.from_preset("clip_shapes", dtype="bfloat16")
    _, finetuned = _pair()
    finetuned_bf16 = vlzoo.from_preset("clip_shapes", dtype="bfloat16")
    finetuned_bf16.set_weights(finetuned.get_weights())
    mixed = interpolate(zero_shot, finetuned_bf16, 1)
    assert {keras.backend.standardize_dtype(w.dtype) for w in mixed.weights} >= {"bfloat16"}
    for got, want in zip(_numpy_weights(mixed), _numpy_weights(finetuned_bf16)):
        np.testing.assert_array_equal(got, want)


def test_mismatched_inputs_are_refused_by_name():
    zero_shot, finetuned = _pair()
    for alpha in (-0.1, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="`alpha` must be a number in \\[0, 1\\]"):
            interpolate(zero_shot, finetuned, alpha)
    with pytest.raises(TypeError, match="`finetuned` must be a vlzoo model"):
        interpolate(zero_shot, object(), 0.5)
    with pytest.raises(ValueError, match="two models of one family"):
        interpolate(zero_shot, vlzoo.from_preset("siglip_shapes"), 0.5)
    with pytest.raises(ValueError, match="differ in geometry"):
        interpolate(zero_shot, vlzoo.from_preset("clip_shapes", embed_dim=16), 0.5)
    with pytest.raises(ValueError, match="`alphas` must name at least one"):
        interpolation_sweep(zero_shot, finetuned, [], lambda m: {})


def test_vlzoo_interpolate_writes_a_preset(tmp_path, capsys):
    zero_shot, finetuned = _pair()
    finetuned.save_to_preset(tmp_path / "finetuned")
    out = tmp_path / "mixed"
    assert main(["interpolate", "--zero-shot", "clip_shapes", "--finetuned", str(tmp_path / "finetuned"),
                 "--alpha", "0.5", "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    reloaded, want = vlzoo.from_preset(str(out)), interpolate(zero_shot, finetuned, 0.5)
    for got, expected in zip(_numpy_weights(reloaded), _numpy_weights(want), strict=True):
        np.testing.assert_array_equal(got, expected)
    assert main(["interpolate", "--zero-shot", "no_such_preset", "--finetuned", str(tmp_path / "finetuned"),
                 "--alpha", "0.5", "--out", str(out)]) == 2
    assert "argument --zero-shot" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["interpolate", "--zero-shot", "clip_shapes", "--finetuned", "clip_shapes", "--alpha", "2",
              "--out", str(out)])
    assert "expected a number in [0, 1]" in capsys.readouterr().err


@run_once  # the CLI's wiring; the mixes themselves are checked on every backend above
def test_vlzoo_eval_sweeps_the_mixes(tmp_path, capsys):
    zero_shot, finetuned = _pair()
    finetuned.save_to_preset(tmp_path / "finetuned")
    root = tmp_path / "colours"
    for name, colour in (("red", (220, 30, 30)), ("green", (30, 200, 40)), ("blue", (30, 40, 220))):
        (root / name).mkdir(parents=True)
        for i in range(2):
            Image.new("RGB", (40, 36), tuple(c + 15 * i for c in colour)).save(root / name / f"{i}.png")
    common = ["eval", "--preset", "clip_shapes", "--benchmark", "image_folder", "--data", str(root),
              "--templates", "simple"]
    assert main([*common, "--finetuned", str(tmp_path / "finetuned"), "--alphas", "0,0.5,1",
                 "--json", str(tmp_path / "sweep.json")]) == 0
    assert "clip_shapes + " in capsys.readouterr().out
    records = json.loads((tmp_path / "sweep.json").read_text())
    assert [record["alpha"] for record in records] == [0.0, 0.5, 1.0]
    benchmark = benchmarks.image_folder(str(root))
    for record, model in zip(records, (zero_shot, interpolate(zero_shot, finetuned, 0.5), finetuned), strict=True):
        want = benchmarks.evaluate_classification(model, benchmark, SIMPLE_TEMPLATES)
        assert record["metrics"] == pytest.approx(want["metrics"], abs=1e-12)
    assert main([*common, "--alphas", "0.5"]) == 2
    assert "--alphas: the WiSE-FT shares need --finetuned" in capsys.readouterr().err
    assert main([*common, "--finetuned", "clip_tiny"]) == 2  # another geometry
    err = capsys.readouterr().err
    assert "argument --finetuned" in err and "differ in geometry" in err


def test_counters_are_the_finetuned_models():
    # STAIR's step counters are int32 variables: not weights to mix, the fine-tuned run's state.
    zero_shot, finetuned = vlzoo.from_preset("stair_shapes"), vlzoo.from_preset("stair_shapes")
    finetuned.global_step.assign(7)
    mixed = interpolate(zero_shot, finetuned, 0.5)
    assert int(keras.ops.convert_to_numpy(mixed.global_step.value)) == 7
    assert keras.backend.standardize_dtype(mixed.global_step.dtype) == "int32"


def test_a_stair_model_after_its_stages_mixes_with_its_start():
    # The staged fit ends at stage 3, a config entry the zero-shot preset (stage 1) does not share: where
    # training stands, not the geometry. The mix is the fine-tuned model's stage; a change of geometry is
    # still refused.
    zero_shot, finetuned = vlzoo.from_preset("stair_shapes"), vlzoo.from_preset("stair_shapes")
    finetuned.set_stage(3)
    mixed = interpolate(zero_shot, finetuned, 1.0)
    assert mixed.stage == 3 and mixed.stage_fractions is None
    for got, want in zip(_numpy_weights(mixed), _numpy_weights(finetuned), strict=True):
        np.testing.assert_array_equal(got, want)
    other = vlzoo.from_preset("stair_shapes", image_flops_weight=0.5)
    with pytest.raises(ValueError, match=r"differ in geometry \(config entries \['image_flops_weight'\]\)"):
        interpolate(zero_shot, other, 0.5)
