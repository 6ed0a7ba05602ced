"""A family from outside vlzoo, as its author meets it (docs/adding_a_family.md): a preset whose module nobody
imported is refused with that module named, and never imported; a family installed from a wheel as a plugin
(entry-point groups `vlzoo.families` and `vlzoo.presets`) is seen, in a fresh process, by `vlzoo list` and
`vlzoo train --help` without a backend, and by `from_preset`, `vlzoo convert --from` and the transfer from CLIP,
which keeps CLIP's projections for a family that projects to `embed_dim` and writes no `configure`."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from backend_utils import run_once

import vlzoo
from vlzoo.presets import catalogue
from vlzoo.presets.files import CONFIG_FILE
from vlzoo.presets.files import METADATA_FILE

# Read from files and run in processes of their own, the same on every backend: one pass.
pytestmark = run_once

PLUGIN_PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "vlzoo-plugin-demo"
version = "0.1"

[project.entry-points."vlzoo.families"]
plugin_clip = "vlzoo_plugin_demo.model"

[project.entry-points."vlzoo.presets"]
plugin_clip = "vlzoo_plugin_demo.presets:PRESETS"

[tool.setuptools]
packages = ["vlzoo_plugin_demo"]
"""

# The family module: CLIP under another name (its own defaults: both towers projected to `embed_dim`), with the
# checkpoint format of its authors' code, a `{variable path: array}` file.
PLUGIN_MODEL = '''
"""A family installed as a vlzoo plugin."""

import keras
import numpy as np

import vlzoo
from vlzoo.convert import register_converter
from vlzoo.formats import CheckpointFormat, register_format
from vlzoo.models import CLIP, CLIPTransfer, Family, register_family
from vlzoo_plugin_demo.presets import PRESETS


@keras.saving.register_keras_serializable(package="vlzoo_plugin_demo")
class PluginCLIP(CLIP):
    family = "plugin_clip"


def from_plugin_checkpoint(weights, preset, *, dtype=None, progress=None):
    model = vlzoo.from_preset(preset, dtype=dtype, load_weights=False)
    for variable in model.weights:
        variable.assign(np.asarray(weights[variable.path]))
    return model


register_family(Family("plugin_clip", PluginCLIP, score_loss="softmax", from_clip=CLIPTransfer(logit_scale=True),
                       presets=PRESETS))
register_format(CheckpointFormat("plugin_checkpoint", "its authors' checkpoint", architecture="plugin_clip_tiny"))
register_converter("plugin_checkpoint", from_plugin_checkpoint)
'''

# What the command line reads without a backend: the listing, the help; then nothing heavy may be imported.
LIGHT = """
import contextlib, io, sys
from vlzoo.cli import main
for argv in (["list"], ["list", "--family", "plugin_clip"], ["train", "--help"]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            status = main(argv)
        except SystemExit as exit:  # --help
            status = exit.code
    assert status == 0, (argv, status)
    print(out.getvalue(), end="@@@\\n")
print(sorted(name for name in ("keras", "jax", "tensorflow", "torch", "vlzoo_plugin_demo.model")
             if name in sys.modules))
"""

HEAVY = """
import sys
import keras
import numpy as np
import safetensors.numpy
import vlzoo
from vlzoo.cli import main

directory, checkpoint, converted = sys.argv[1:]
assert "vlzoo_plugin_demo.model" not in sys.modules
model = vlzoo.from_preset(directory)  # the family's module is the installed plugin's, found by the family's name
print("directory:", type(model).__name__, type(model).__module__)
authors = vlzoo.from_preset("plugin_clip_tiny", load_weights=False)  # the preset the plugin declares, by name
safetensors.numpy.save_file({v.path: np.array(keras.ops.convert_to_numpy(v)) for v in authors.weights}, checkpoint)
status = main(["convert", "--from", "plugin_checkpoint", "--checkpoint", checkpoint, "--preset", "plugin_clip_tiny",
               "--out", converted, "--quiet", "--no-peer-check"])
print("convert:", status)
clip = vlzoo.from_preset("clip_tiny", load_weights=False)
transferred, report = vlzoo.transfer.from_clip(clip, "plugin_clip", verbose=False)
print("transfer:", sorted(report.new), "vision/projection/kernel" in report.transferred,
      "text/projection/kernel" in report.transferred)
"""


def _clip_tiny_saved_as(directory, family, class_name, module, registered_name):
    """`clip_tiny`'s files in `directory`, as a preset of `family`'s class `class_name` from `module` would be
    saved (its config.json naming them, its metadata.json the family)."""
    shutil.copytree(catalogue.preset_directory("clip_tiny"), directory)
    config = json.loads((directory / CONFIG_FILE).read_text())
    config.update(class_name=class_name, module=module, registered_name=registered_name)
    (directory / CONFIG_FILE).write_text(json.dumps(config))
    metadata = json.loads((directory / METADATA_FILE).read_text())
    (directory / METADATA_FILE).write_text(json.dumps({**metadata, "family": family}))
    return directory


def test_a_preset_of_a_class_nobody_imported_names_its_module_and_imports_nothing(tmp_path, monkeypatch):
    (tmp_path / "vlzoo_unimported_family.py").write_text("raise AssertionError('a preset file chose what runs')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    preset = _clip_tiny_saved_as(tmp_path / "preset", "third_party_clip", "ThirdPartyCLIP", "vlzoo_unimported_family",
                                 "third_party>ThirdPartyCLIP")
    with pytest.raises(ValueError, match="Import `vlzoo_unimported_family`, the module config.json names") as error:
        vlzoo.from_preset(str(preset))
    assert "'third_party>ThirdPartyCLIP'" in str(error.value) and "vlzoo.families" in str(error.value)
    assert "vlzoo_unimported_family" not in sys.modules


def _run(code, *args, env, cwd):
    result = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                            env=env, cwd=cwd, check=False, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout, result.stderr


@pytest.mark.slow
def test_a_family_installed_from_a_wheel_is_seen_in_a_fresh_process(tmp_path):
    source = tmp_path / "source"
    (source / "vlzoo_plugin_demo").mkdir(parents=True)
    (source / "pyproject.toml").write_text(PLUGIN_PYPROJECT)
    (source / "vlzoo_plugin_demo" / "__init__.py").write_text('"""A vlzoo plugin family."""\n')
    (source / "vlzoo_plugin_demo" / "model.py").write_text(PLUGIN_MODEL)
    tiny = {**catalogue.definition("clip_tiny"), "family": "plugin_clip", "class_name": "PluginCLIP",
            "description": "Tiny plugin CLIP.", "paper": "vlzoo's tests", "weights_note": "Random initialisation."}
    (source / "vlzoo_plugin_demo" / "presets.py").write_text(
        '"""The plugin\'s presets, importable without Keras."""\n\n'
        f"PRESETS = {{'plugin_clip_tiny': {tiny!r}}}\n")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist", source],
                   check=True, cwd=tmp_path, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("vlzoo_plugin_demo-0.1-*.whl")
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", site, wheel], check=True,
                   capture_output=True, timeout=300)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))}
    work = tmp_path / "work"  # away from the tests' modules
    work.mkdir()

    listed, listed_family, help_text, imported = _run(LIGHT, env=env, cwd=work)[0].split("@@@\n")
    rows = [line.split()[:2] for line in listed.splitlines()]
    assert ["plugin_clip_tiny", "plugin_clip"] in rows and ["clip_tiny", "clip"] in rows
    assert [line.split()[:2] for line in listed_family.splitlines()][2:] == [["plugin_clip_tiny", "plugin_clip"]]
    assert "an installed plugin's: plugin_clip," in " ".join(help_text.split())
    assert imported.strip() == "[]"  # listed and helped without the plugin's module or a backend

    # A preset saved from the family, loaded in a fresh process that never imported its module.
    preset = _clip_tiny_saved_as(tmp_path / "saved", "plugin_clip", "PluginCLIP", "vlzoo_plugin_demo.model",
                                 "vlzoo_plugin_demo>PluginCLIP")
    out, err = _run(HEAVY, preset, tmp_path / "checkpoint.safetensors", tmp_path / "converted", env=env, cwd=work)
    assert "directory: PluginCLIP vlzoo_plugin_demo.model" in out
    assert "convert: 0" in out and "identical" in out, err[-2000:]
    assert "transfer: [] True True" in out  # CLIP's scale and projections all carried over; nothing new
