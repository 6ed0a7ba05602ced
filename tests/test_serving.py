"""Serving artefacts (`vlzoo.export`): every family's towers run in ONNX Runtime, TensorFlow and the LiteRT
interpreter give the Keras model's embeddings, from each backend Keras exports that format from."""

import json
import os
import warnings

import keras
import numpy as np
import pytest

import vlzoo
from vlzoo.cli import main
from vlzoo.data import shapes
from vlzoo.serving import quantize_onnx, run_artefact, unsupported

from backend_utils import run_once
from families import FAMILIES
from margins import shallow_towers

BACKEND = keras.backend.backend()
# What Keras exports from each backend (vlzoo.serving's table). ONNX from PyTorch goes through the
# output naming: every family's entries. ONNX from TensorFlow goes through vlzoo's rewrite of
# TensorFlow-only nodes (GELU's Erfc, STAIR's Log1p), ONNX from JAX through the naming of jax2onnx's
# outputs (SPARC's text mask, Llip's four image entries) and jax2onnx's `arange` (SPARO's end token), and
# both formats from JAX trace the same symbolic batch through the families' shape checks (jax.export's shape
# polymorphism), which ONNX checks for CLIP, SPARC, Llip, SPARO and STAIR (SigLIP's and FILIP's towers are
# CLIP's and SPARC's with other heads). The SavedModel, from TensorFlow and from JAX (jax2tf, 35 to 48 s a
# family on the AVX2-only EPYC), takes Llip, the family with the most outputs; LiteRT CLIP, SPARC (tokens and
# a mask) and STAIR (the vocabulary head, which LiteRT takes in one block).
DISTINCT = ("clip", "sparc", "llip", "sparo", "stair")
CASES = {
    "tensorflow": [*(("onnx", f) for f in DISTINCT), ("tf_saved_model", "llip"),
                   *(("litert", f) for f in ("clip", "sparc", "stair"))],
    "jax": [*(("onnx", f) for f in DISTINCT), ("tf_saved_model", "llip")],
    "torch": [("onnx", f) for f in FAMILIES],
}[BACKEND]
# PyTorch's ONNX export takes a fixed batch; the others any batch, checked at two sizes.
FIXED_BATCH = 3 if BACKEND == "torch" else None
CAPTIONS = ["a red circle", "two blue squares to the left of a green triangle", "x"]


def _model(family):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny presets have no weights: a seeded random init
        keras.utils.set_random_seed(0)
        return vlzoo.from_preset(f"{family}_tiny", **shallow_towers(family))


def _assert_serves(got, want):
    """Every entry, by name: masks equal; each non-zero vector at cosine >= 0.9999 (the issue's bar) and within
    1e-4 (the artefacts compute the same float32 graph with other kernels: measured differences up to 1.5e-6 on
    these unit vectors), zero vectors (padding) zero."""
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        value = keras.ops.convert_to_numpy(value)
        assert got[name].shape == value.shape, name
        if value.dtype == bool:
            np.testing.assert_array_equal(got[name], value)
            continue
        rows, reference = got[name].reshape(-1, value.shape[-1]), value.reshape(-1, value.shape[-1])
        norms = np.linalg.norm(reference, axis=-1)
        live = norms > 0
        cosine = (rows * reference).sum(-1)[live] / (np.linalg.norm(rows, axis=-1)[live] * norms[live])
        assert cosine.min() >= 0.9999, (name, cosine.min())
        np.testing.assert_allclose(rows, reference, rtol=0, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("format, family", CASES)
def test_each_tower_serves_the_keras_models_embeddings(format, family, tmp_path):
    model = _model(family)
    artefacts = vlzoo.export(model, str(tmp_path), format=format, batch_size=FIXED_BATCH)
    # One file (a SavedModel: one folder) per tower and the manifest, nothing beside them.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["export.json", *(os.path.basename(path) for path in artefacts.values())])
    manifest = json.loads((tmp_path / "export.json").read_text())
    assert manifest["family"] == type(model).__name__ and manifest["format"] == format
    assert manifest["towers"]["image"]["outputs"] == list(model.image_embedding_keys)
    assert [spec["name"] for spec in manifest["towers"]["text"]["inputs"]] == ["token_ids", "padding_mask"]
    assert manifest["preprocessor"]["image_size"] == model.vision.image_size
    rng = np.random.default_rng(1)
    for batch in [FIXED_BATCH] if FIXED_BATCH else [1, 3]:
        size = model.vision.image_size
        images = rng.normal(size=(batch, size, size, 3)).astype("float32")
        _assert_serves(run_artefact(artefacts["image"], {"images": images}), model.encode_image(images, normalize=True))
        texts = {k: np.asarray(v) for k, v in model.tokenizer(CAPTIONS[:batch]).items()}
        _assert_serves(run_artefact(artefacts["text"], texts), model.encode_text(texts, normalize=True))


def test_what_cannot_be_exported_says_why(tmp_path):
    model = _model("clip")
    refusals = {"torch": [("tf_saved_model", None, "torch_xla"), ("onnx", None, "needs a fixed batch")],
                "jax": [("litert", None, "not from JAX")], "tensorflow": []}[BACKEND]
    for format, batch, why in refusals:
        with pytest.raises(ValueError, match=why):
            vlzoo.export(model, str(tmp_path / "x"), format=format, batch_size=batch)
    assert unsupported("onnx", "torch", 8) is None and unsupported("litert", "tensorflow") is None
    with pytest.raises(ValueError, match="`format` must be one of"):
        vlzoo.export(model, str(tmp_path / "x"), format="tflite")
    with pytest.raises(ValueError, match="`towers` must name 'image' and/or 'text'"):
        vlzoo.export(model, str(tmp_path / "x"), towers=("image", "image"))
    with pytest.raises(ValueError, match="`batch_size` must be a positive int"):
        vlzoo.export(model, str(tmp_path / "x"), batch_size=0)
    with pytest.raises(TypeError, match="`model` must be a vlzoo model"):
        vlzoo.export(keras.Sequential([keras.layers.Dense(2)]), str(tmp_path / "x"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        half = vlzoo.from_preset("clip_tiny", dtype="bfloat16")
    with pytest.raises(ValueError, match="Load it with dtype='float32'"):
        vlzoo.export(half, str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()  # refused before writing


@run_once  # the command's wiring; the artefacts are checked on every backend above
def test_vlzoo_export_writes_and_checks_the_artefacts(tmp_path, capsys):
    out = tmp_path / "serving"
    assert main(["export", "--preset", "sparc_tiny", "--format", "onnx", "--tower", "image", "--batch-size", "2",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out / 'image.onnx'}: smallest cosine to the Keras model embeds 1.000000, tokens 1.000000" in printed
    assert sorted(p.name for p in out.iterdir()) == ["export.json", "image.onnx"]
    assert main(["export", "--preset", "clip_tiny", "--format", "onnx", "--out", str(out)]) == 2
    assert "argument --batch-size: Keras' ONNX export from the PyTorch backend needs a fixed batch" in \
        capsys.readouterr().err
    assert main(["export", "--preset", "clip_tiny", "--format", "tf_saved_model", "--out", str(out)]) == 2
    assert "argument --format: Keras exports a TensorFlow SavedModel from the PyTorch backend only through" in \
        capsys.readouterr().err


@run_once  # ONNX Runtime's quantizer reads the file, whichever backend wrote it
def test_onnx_runtimes_int8_copy_keeps_the_embeddings(tmp_path, capsys):
    """ONNX Runtime's dynamic int8 (int8 weights per tensor, inputs per call) on clip_shapes' image tower, on
    shapes images: measured cosine >= 0.9995 to the float32 Keras model (AVX-512 EPYC); the bar is 0.99."""
    model = vlzoo.from_preset("clip_shapes")
    path = vlzoo.export(model, str(tmp_path), format="onnx", towers="image", batch_size=8)["image"]
    int8 = quantize_onnx(path)
    assert int8 == str(tmp_path / "image.int8.onnx") and os.path.getsize(int8) < 0.6 * os.path.getsize(path)
    pixels = np.asarray(model.preprocessor(shapes.classification(1, seed=2)["images"][:8]))
    want = keras.ops.convert_to_numpy(model.encode_image(pixels, normalize=True)["embeds"])
    got = run_artefact(int8, {"images": pixels})["embeds"]
    cosine = (got * want).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1))
    assert cosine.min() >= 0.99
    with pytest.raises(ValueError, match="must be an ONNX artefact"):
        quantize_onnx(str(tmp_path / "image.tflite"))
    out = tmp_path / "cli"
    assert main(["export", "--preset", "clip_tiny", "--format", "onnx", "--int8", "--tower", "text", "--batch-size",
                 "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"wrote {out / 'text.onnx'}: smallest" in printed and f"wrote {out / 'text.int8.onnx'}: smallest" in printed
    assert main(["export", "--preset", "clip_tiny", "--format", "litert", "--int8", "--out", str(out)]) == 2
    assert "argument --int8: ONNX Runtime's int8 quantizer reads ONNX artefacts, not litert" in capsys.readouterr().err
