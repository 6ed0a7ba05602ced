"""`vlzoo.convert.from_big_vision_checkpoint` against big_vision's own code.

`tests/fixtures/big_vision/` holds a small random SigLIP two-tower model of big_vision
(google-research/big_vision at 0127fb6: `vit` with a MAP head, `text_transformer`
pooled at the last position, `scan=True`, a logit bias: the modules of the SigLIP 2
checkpoints), saved as the released `.npz` files are, its inputs and what big_vision
computes for them, written by `tests/fixtures/big_vision/make_fixture.py`.
"""

import json
import pathlib

import numpy as np
import pytest
from backend_utils import run_once
from conftest import to_numpy

import vlzoo
from vlzoo.convert import _common as C
from vlzoo.convert.big_vision import from_big_vision_checkpoint, read_big_vision_params

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "big_vision"
ATOL = 1e-5  # float32; embeddings of norm 1, logits up to ~20; rtol 0


def overrides():
    """`from_preset("siglip_tiny", **overrides())`: the fixture's architecture (flax's tanh GELU, vocabulary 512)."""
    arguments = json.loads((FIXTURE / "config.json").read_text())["arguments"]
    return dict(vision=dict(activation="gelu_tanh"),
                text=dict(vocabulary_size=arguments["text"]["vocab_size"], activation="gelu_tanh"),
                embed_dim=arguments["out_dim"][1])


def load():
    return [dict(np.load(FIXTURE / f"{name}.npz")) for name in ("params", "inputs", "outputs")]


def test_converted_model_matches_big_vision():
    params, inputs, outputs = load()
    model = from_big_vision_checkpoint(FIXTURE / "params.npz", "siglip_tiny", **overrides())
    texts = {"token_ids": inputs["token_ids"], "padding_mask": np.ones_like(inputs["token_ids"], bool)}
    image = model.encode_image(inputs["images"], normalize=True)["embeds"]
    text = model.encode_text(texts, normalize=True)["embeds"]
    np.testing.assert_allclose(to_numpy(image), outputs["zimg"], atol=ATOL, rtol=0)
    np.testing.assert_allclose(to_numpy(text), outputs["ztxt"], atol=ATOL, rtol=0)
    np.testing.assert_allclose(to_numpy(model.similarity(inputs["images"], texts)), outputs["logits"], atol=ATOL,
                               rtol=0)
    np.testing.assert_allclose(float(to_numpy(model.logit_scale_value())), outputs["t"], rtol=1e-6)


@run_once
def test_unscanned_and_naflex_layouts_and_the_errors():
    params, _, _ = load()
    scanned = from_big_vision_checkpoint(params, "siglip_tiny", **overrides())
    want = {name: to_numpy(v) for name, v in C.vlzoo_variables(scanned).items()}
    # Unscanned checkpoints store `encoderblock_{i}`; NaFlex ones a Dense patch kernel over (row, column,
    # channel)-flattened patches and a (g, g, W) position grid. Both give the same weights.
    unscanned, naflex = {}, {}
    for key, value in read_big_vision_params(params).items():
        unscanned[f"params/{key}"] = value
        if key == "img/embedding/kernel":
            value = value.reshape(-1, value.shape[-1])
        elif key == "img/pos_embedding":
            value = value.reshape(4, 4, value.shape[-1])
        naflex[key] = value
    for layout in (unscanned, naflex):
        got = C.vlzoo_variables(from_big_vision_checkpoint(layout, "siglip_tiny", **overrides()))
        for name, variable in got.items():
            np.testing.assert_array_equal(to_numpy(variable), want[name], err_msg=name)
    with pytest.raises(ValueError, match=r"'siglip_tiny'.*vocabulary: checkpoint 512 \('txt/Embed_0/embedding' "
                                         r"\(512, 32\)\), preset 49408"):
        from_big_vision_checkpoint(params, "siglip_tiny")
    with pytest.raises(ValueError, match="'clip_tiny' is a CLIP preset; expected a SigLIP preset"):
        from_big_vision_checkpoint(params, "clip_tiny")
    with pytest.raises(KeyError, match="txt/head/bias"):
        from_big_vision_checkpoint({k: v for k, v in params.items() if k != "params/txt/head/bias"}, "siglip_tiny",
                                   **overrides())
    with pytest.raises(TypeError, match="path_or_arrays"):
        read_big_vision_params(3)
    assert vlzoo.convert.from_big_vision_checkpoint is from_big_vision_checkpoint


@run_once
def test_vlzoo_convert_command_reads_the_npz(tmp_path, capsys):
    from vlzoo import cli

    _, inputs, outputs = load()
    architecture = tmp_path / "architecture"
    vlzoo.from_preset("siglip_tiny", load_weights=False, **overrides()).save_to_preset(str(architecture))
    argv = ["convert", "--from", "big_vision", "--checkpoint", FIXTURE / "params.npz", "--preset", architecture,
            "--out", tmp_path / "converted", "--quiet"]
    assert cli.main([str(a) for a in argv]) == 0
    assert "preset reload: identical similarities" in capsys.readouterr().out
    texts = {"token_ids": inputs["token_ids"], "padding_mask": np.ones_like(inputs["token_ids"], bool)}
    converted = vlzoo.from_preset(str(tmp_path / "converted"))
    np.testing.assert_allclose(to_numpy(converted.similarity(inputs["images"], texts)), outputs["logits"], atol=ATOL,
                               rtol=0)
