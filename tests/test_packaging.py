"""vlzoo as a package: the sdist and the wheel built from the checkout carry everything the library
reads at run time, and the wheel, installed outside the checkout, works from another directory.

The build calls the PEP 517 hooks of the pinned hatchling (`hatchling.build`), as
`python -m build --no-isolation` would: the sdist from a copy of the checkout, then the wheel from
the unpacked sdist, so a file the sdist lacks is a file the wheel lacks. The wheel is installed
with pip, without dependencies (the venv has them), into a folder of its own that `PYTHONPATH`
puts first; its console script `vlzoo` is the one that runs. The editable wheel (the Makefile's
`pip install -e`) is built from the checkout itself. No build prints a warning.
"""

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import zipfile

import keras
import numpy as np
import pytest
from backend_utils import run_once
from conftest import shipped_presets
from test_selection_benchmarks import _winoground

import vlzoo
from vlzoo import _paths
from vlzoo.evaluation import benchmarks

ROOT = pathlib.Path(__file__).resolve().parent.parent
# What a checkout may hold beyond its tracked files: the venv, build outputs, caches.
NOT_SOURCES = shutil.ignore_patterns(".git", ".venv", "out", "build", "dist", "*.egg-info", "__pycache__",
                                     ".pytest_cache", ".ipynb_checkpoints", "*.pyc")
# Files at least this big are never shipped twice (vocabularies, weights). Smaller ones may coincide:
# two registered presets with the same tokenizer settings write the same tokenizer.json.
DUPLICATE_FLOOR = 4096
CAPTIONS = ["a red circle", "a blue square"]
# Calls a PEP 517 hook of the build backend (argv: the hook, the output folder) and prints its artefact's name.
HOOK = "import sys; from hatchling import build; print(getattr(build, sys.argv[1])(sys.argv[2]))"


def _images():
    """A red disc and a blue square on grey, 64 x 64, uint8: `(2, 64, 64, 3)`."""
    y, x = np.mgrid[:64, :64]
    images = np.full((2, 64, 64, 3), 128, np.uint8)
    images[0][(y - 32) ** 2 + (x - 32) ** 2 < 18 ** 2] = (220, 30, 30)
    images[1][16:48, 16:48] = (30, 30, 220)
    return images


def _similarities(model, images):
    return keras.ops.convert_to_numpy(model.similarity(model.preprocessor(images), model.tokenizer(CAPTIONS)))


SCORE = """
import json, sys
import numpy as np
import keras
import vlzoo
model = vlzoo.from_preset("clip_shapes")
images = np.load(sys.argv[1])
scores = model.similarity(model.preprocessor(images), model.tokenizer({captions!r}))
print(json.dumps({{"file": vlzoo.__file__, "scores": keras.ops.convert_to_numpy(scores).tolist()}}))
"""


def _run_hook(name, source, dist):
    """The path of the artefact the build hook `name` writes to `dist` from the project in `source`; the build
    prints nothing but the artefact's name."""
    done = subprocess.run([sys.executable, "-c", HOOK, name, str(dist)], cwd=source, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    artefact, = done.stdout.split()
    assert done.stderr == "", done.stderr[-3000:]
    return pathlib.Path(dist) / artefact


def _build(tmp_path):
    """`(sdist, wheel)` built from a copy of the checkout, the wheel from the unpacked sdist."""
    source, dist = tmp_path / "source", tmp_path / "dist"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES, symlinks=True)
    sdist = _run_hook("build_sdist", source, dist)
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    unpacked, = (tmp_path / "unpacked").iterdir()
    return sdist, _run_hook("build_wheel", unpacked, dist)


def _files(root):
    return {path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file()}


@run_once  # backend-independent: builds the editable wheel from the checkout
def test_the_editable_install_reads_vlzoo_and_presets_in_the_checkout(tmp_path):
    """The editable wheel puts the checkout on the path and copies nothing of it, so vlzoo/_paths.py finds no
    vlzoo/_presets/ and reads the checkout's presets/ (the wheel's mapping is checked in the test below)."""
    editable = _run_hook("build_editable", ROOT, tmp_path)
    with zipfile.ZipFile(editable) as archive:
        names = [name for name in archive.namelist() if ".dist-info/" not in name]
        pth, = names
        assert pth.endswith(".pth") and archive.read(pth).decode().split() == [str(ROOT)]
    assert _paths.PACKAGE_ROOT == ROOT / "vlzoo" and _paths.DATA_ROOT == ROOT / "presets"


@run_once  # builds and installs once; the commands run on torch, the backend of the pass
@pytest.mark.slow
def test_the_wheel_installed_outside_the_checkout_lists_loads_scores_and_evaluates(tmp_path):
    sdist, wheel = _build(tmp_path)

    # The wheel holds every module and every file of presets/ (as vlzoo/_presets/), nothing twice.
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name: archive.read(name) for name in archive.namelist() if not name.endswith("/")}
    modules = {f"vlzoo/{name}" for name in _files(ROOT / "vlzoo") if name.endswith(".py")}
    assert modules <= set(shipped), sorted(modules - set(shipped))
    data = {name.removeprefix("vlzoo/_presets/") for name in shipped if name.startswith("vlzoo/_presets/")}
    assert data == _files(ROOT / "presets")
    for required in ("registry.json", "pretrained.json", "_assets/clip_bpe/merges.txt",
                     "_assets/bert_uncased/vocab.txt", "clip_shapes/model.weights.h5"):
        assert required in data
    big = {}
    for name, content in shipped.items():
        if len(content) >= DUPLICATE_FLOOR:
            big.setdefault(hashlib.sha256(content).hexdigest(), []).append(name)
    assert [names for names in big.values() if len(names) > 1] == []
    with tarfile.open(sdist) as archive:  # the sdist carries the wheel's sources: presets/ and vlzoo/
        carried = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {f"presets/{name}" for name in data} <= carried and modules <= carried

    site, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target",
                    str(site), str(wheel)], check=True, timeout=300, capture_output=True)
    elsewhere.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in ("VLZOO_PRESETS_DIR", "PYTHONPATH")}
    env.update(PYTHONPATH=str(site), KERAS_BACKEND="torch", TF_CPP_MIN_LOG_LEVEL="3")

    def run(*argv):
        done = subprocess.run([str(a) for a in argv], cwd=elsewhere, env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, (argv, done.stderr[-3000:])
        return done.stdout

    command = site / "bin" / "vlzoo"
    listed = run(command, "list")
    assert all(name in listed for name in shipped_presets())
    info = json.loads(run(command, "info", "clip_shapes"))
    assert info["weights_available"] and pathlib.Path(info["directory"]) == site / "vlzoo" / "_presets" / "clip_shapes"

    # Two images against two captions: the installed copy gives the checkout's numbers.
    np.save(tmp_path / "images.npy", _images())
    (tmp_path / "score.py").write_text(SCORE.format(captions=CAPTIONS))
    scored = json.loads(run(sys.executable, tmp_path / "score.py", tmp_path / "images.npy").splitlines()[-1])
    assert pathlib.Path(scored["file"]).is_relative_to(site)
    want = _similarities(vlzoo.from_preset("clip_shapes"), _images())
    np.testing.assert_allclose(scored["scores"], want, rtol=1e-5, atol=1e-6)

    data_dir = _winoground(tmp_path)
    run(command, "eval", "--preset", "clip_shapes", "--benchmark", "winoground", "--data", data_dir,
        "--json", tmp_path / "wino.json")
    record, = json.loads((tmp_path / "wino.json").read_text())
    want = benchmarks.evaluate_selection(vlzoo.from_preset("clip_shapes"), benchmarks.winoground(data_dir))
    assert record["metrics"] == want["metrics"]
