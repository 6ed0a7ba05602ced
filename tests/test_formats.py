"""The table of checkpoint formats (`vlzoo.formats`) and their converters (`vlzoo.convert.register_converter`):
every list of formats vlzoo keeps is read from it, and a format registered outside vlzoo (the test family's
"headwise", tests/extension_family.py) converts through `vlzoo convert` like vlzoo's own.

The table is Keras-free and the command's wiring is the same on every backend: these tests run once."""

import json

import keras
import numpy as np
import pytest
from backend_utils import run_once
from families import EXTENSION_FAMILY

import vlzoo
from vlzoo import cli, formats
from vlzoo.convert import checkpoints, converters
from vlzoo.presets import catalogue

pytestmark = run_once

BUILT_IN = ("vlzoo", "open_clip", "transformers", "keras_hub", "llip", "sparo", "flair", "big_vision")


def test_each_list_of_formats_is_read_from_the_table():
    assert formats.converted_formats()[:7] == BUILT_IN[1:]
    assert "vlzoo" not in formats.converted_formats() and "headwise" in formats.converted_formats()
    assert set(formats.repository_formats()) == {"vlzoo", "open_clip", "transformers", "keras_hub"}
    assert {name: formats.architecture_formats()[name] for name in ("llip", "sparo", "flair", "big_vision")} == {
        "llip": "llip_vit_b16", "sparo": "sparo_clip_vit_b16", "flair": "flair_vit_b16",
        "big_vision": "siglip2_vit_b16"}
    # The catalogue's entries use the formats it allows; its URL entries, the formats given by URL.
    entries = catalogue.pretrained_presets().values()
    assert {entry["format"] for entry in entries} <= set(formats.catalogue_formats())
    assert {entry["format"] for entry in entries if entry["handle"].startswith("https://")} <= set(
        formats.url_formats())
    assert set(formats.url_formats()) == {"llip", "flair"}


def test_every_format_with_an_architecture_has_a_converter_and_a_preset():
    presets = set(vlzoo.list_presets())
    for name, preset in formats.architecture_formats().items():
        read, convert = converters.converter(name)
        assert callable(read) and callable(convert) and preset in presets, name


def test_the_command_offers_the_tables_formats():
    parser = cli.build_parser()
    convert = parser._subparsers._group_actions[0].choices["convert"]
    (option,) = [action for action in convert._actions if action.dest == "from_"]
    assert tuple(option.choices) == formats.converted_formats()


def test_registration_refusals_name_what_is_wrong():
    with pytest.raises(TypeError, match="CheckpointFormat"):
        formats.register_format({"name": "mine"})
    with pytest.raises(ValueError, match="'llip' is registered already"):
        formats.register_format(formats.CheckpointFormat("llip", "another Llip"))
    formats.register_format(formats.get_format("llip"))  # the same format again: nothing changes
    with pytest.raises(ValueError, match="Unknown checkpoint format 'mine'; expected one of vlzoo, open_clip"):
        formats.get_format("mine")
    with pytest.raises(ValueError, match="carries its configuration"):
        converters.register_converter("open_clip", lambda weights, preset: None)
    with pytest.raises(ValueError, match="No converter is registered for the checkpoint format 'vlzoo'"):
        converters.converter("vlzoo")


def test_a_format_registered_outside_vlzoo_converts_through_the_command(tmp_path, capsys):
    safetensors = pytest.importorskip("safetensors.numpy")
    authors = vlzoo.from_preset(f"{EXTENSION_FAMILY}_tiny", load_weights=False)
    rng = np.random.default_rng(0)
    weights = {v.path: rng.normal(size=v.shape).astype("float32") for v in authors.weights}
    safetensors.save_file(weights, str(tmp_path / "headwise.safetensors"))

    status = cli.main(["convert", "--from", "headwise", "--checkpoint", str(tmp_path / "headwise.safetensors"),
                       "--preset", f"{EXTENSION_FAMILY}_tiny", "--out", str(tmp_path / "preset"), "--quiet",
                       "--no-peer-check"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert f"Assigning {len(weights)} tensors to {EXTENSION_FAMILY}_tiny" in out and "identical" in out
    converted = vlzoo.from_preset(str(tmp_path / "preset"))
    assert converted.family == EXTENSION_FAMILY
    assert json.loads((tmp_path / "preset" / "metadata.json").read_text())["family"] == EXTENSION_FAMILY
    for variable in converted.weights:
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), weights[variable.path])
    # A checkpoint that misses a variable is refused by name.
    del weights[authors.weights[0].path]
    safetensors.save_file(weights, str(tmp_path / "short.safetensors"))
    with pytest.raises(KeyError, match=authors.weights[0].path):
        checkpoints.convert_checkpoint("headwise", tmp_path / "short.safetensors", tmp_path / "x",
                                       preset=f"{EXTENSION_FAMILY}_tiny", log=lambda message: None, progress=False)
