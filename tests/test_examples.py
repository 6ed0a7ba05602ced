"""The notebooks and scripts of examples/ execute from top to bottom on the current backend.

Each notebook's code cells run in order, in one namespace, in a fresh Python
process (a notebook kernel would do the same; no Jupyter needed), with fewer
fine-tuning steps than a user gets (`VLZOO_EXAMPLE_STEPS`). Each runs once
(`backend_utils.run_once`): the cross-backend notebook starts a process per backend itself,
and the others call the public API that the rest of the suite tests on every backend (the
quick start's calls: `from_preset`, `preset_info`, the encoders and `score` in
test_family_contract, `zero_shot_accuracy` and `binding_accuracy` in test_evaluation and
test_shapes_presets, `fit` in test_family_contract, `save_to_preset` in test_presets). The
fine-tuning recipes script runs in its `--quick` mode, also once.
"""

import json
import os
import re
import subprocess
import sys

import keras

from backend_utils import run_once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")

# Runs the code cells of the notebook argv[1]; a failing cell is named in the traceback.
RUNNER = """
import json, sys
cells = [c for c in json.load(open(sys.argv[1]))["cells"] if c["cell_type"] == "code"]
namespace = {"__name__": "__main__"}
for number, cell in enumerate(cells, start=1):
    exec(compile("".join(cell["source"]), f"{sys.argv[1]} [cell {number}]", "exec"), namespace)
"""


def run_notebook(name, scratch, **env):
    """The notebook's output; its temporary files (a user's notebook leaves them to the system) go to `scratch`."""
    path = os.path.join(EXAMPLES, name)
    environment = dict(os.environ, KERAS_BACKEND=keras.backend.backend(), TF_CPP_MIN_LOG_LEVEL="2",
                       MPLBACKEND="Agg", VLZOO_EXAMPLE_STEPS="8", TMPDIR=str(scratch), **env)
    done = subprocess.run([sys.executable, "-c", RUNNER, path], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout


def test_every_notebook_is_tested_and_clean():
    """A notebook added to examples/ needs a test here; outputs are not committed."""
    names = sorted(name for name in os.listdir(EXAMPLES) if name.endswith(".ipynb"))
    tested = sorted(name[len("test_"):] + ".ipynb" for name in globals() if name.startswith("test_")
                    and os.path.exists(os.path.join(EXAMPLES, name[len("test_"):] + ".ipynb")))
    assert names == tested
    for name in names:
        notebook = json.load(open(os.path.join(EXAMPLES, name)))
        assert notebook["nbformat"] == 4
        for cell in notebook["cells"]:
            if cell["cell_type"] == "code":
                assert cell["outputs"] == [] and cell["execution_count"] is None, name


@run_once
def test_quickstart(tmp_path):
    out = run_notebook("quickstart.ipynb", tmp_path)
    assert f"backend: {keras.backend.backend()}" in out
    assert re.search(r"^CLIP: 1,846,081 parameters, weights bundled: True$", out, re.M), out
    assert re.search(r"^zero-shot over 24 classes \(chance 0\.042\): \{'top1': [01]\.\d+, 'top5': [01]\.\d+\}$",
                     out, re.M), out
    assert re.search(r"^binding accuracy [01]\.\d{3}: 'a \w+ \w+ .+' vs 'a \w+ \w+ .+'$", out, re.M), out
    match = re.search(r"round trip max abs diff: (\S+)", out)
    assert match and float(match.group(1)) <= 1e-6, out


@run_once
def test_finetune_sparc(tmp_path):
    out = run_notebook("finetune_sparc.ipynb", tmp_path)
    before = re.search(r"binding accuracy on 'and' captions before: ([01]\.\d{3})", out)
    after = re.search(r"binding accuracy on 'and' captions after: ([01]\.\d{3})", out)
    assert before and after, out
    # The callbacks' metrics are in the history, one value per epoch.
    for key in ("loss", "val_zeroshot_top1", "val_i2t_r@1", "val_t2i_r@5"):
        assert re.search(rf"^{re.escape(key)}\s+\[[\d.]+, [\d.]+\]$", out, re.M), (key, out)
    assert re.search(r"^wrote .*alignment\.png$", out, re.M), out
    assert "model.weights.h5" in out


@run_once
def test_cross_backend(tmp_path):
    out = run_notebook("cross_backend.ipynb", tmp_path)
    for backend in ("jax", "tensorflow", "torch"):
        assert f"{backend} done" in out
    assert re.search(r"^encode_image/embeds\s+\S+\s+\S+$", out, re.M), out  # SPARC's dict entries
    assert re.search(r"^loss on jax: \d+\.\d+", out, re.M), out


@run_once
def test_zero_shot_evaluation(tmp_path):
    out = run_notebook("zero_shot_evaluation.ipynb", tmp_path)
    assert "80 ImageNet templates" in out
    table = dict(re.findall(r"^(\w+_shapes)\s+(\w+)(?:\s+[01]\.\d{3}){4}$", out, re.M))
    assert table == {"clip_shapes": "EmbeddingMean", "filip_shapes": "TokenSimilarityMean",
                     "sparo_shapes": "EmbeddingMean", "llip_shapes": "ClassTextsMethod"}, out
    assert re.search(r"^all 8 slots top1 [01]\.\d{3}$", out, re.M), out
    assert re.search(r"^slots \[\d, \d, \d, \d\] top1 [01]\.\d{3}$", out, re.M), out


@run_once
def test_finetuning_recipes(tmp_path):
    """The script prints the recipes' table and the WiSE-FT curve, and writes the plot and the numbers."""
    environment = dict(os.environ, KERAS_BACKEND=keras.backend.backend(), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run([sys.executable, os.path.join(EXAMPLES, "finetuning_recipes.py"), "--quick",
                           "--out", str(tmp_path)], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    out = done.stdout
    accuracy = r"([01]\.\d{3})"
    rows = {name: (in_distribution, shifted) for name, in_distribution, shifted in re.findall(
        rf"^\| ([^|]+?) \| [\d,]+(?: \([\d.]+%\))? \| {accuracy} \| {accuracy} \|$", out, re.M)}
    assert list(rows) == ["zero-shot `clip_shapes`", "full fine-tuning", "LiT (image locked)", "LoRA (rank 8)"], out
    trainable = dict(re.findall(r"^\| ([^|]+?) \| ([\d,]+)(?: \([\d.]+%\))? \| [01]\.", out, re.M))
    # clip_shapes has 1,846,081 parameters. LiT locks the image tower's first 4 of 6 groups: patch embedding
    # 4 * 4 * 3 * 64, class token 64, position embedding 65 * 64, pre-norm 2 * 64, then 3 blocks of width 64,
    # MLP 256 (attention 4 * (64 * 64 + 64), 2 norms 4 * 64, MLP 64 * 256 + 256 + 256 * 64 + 64). LoRA rank 8
    # on query and value of 4 image blocks and 4 text blocks (width 32): 4 * 2 * 8 * (64 + 64 + 32 + 32).
    locked = 4 * 4 * 3 * 64 + 64 + 65 * 64 + 2 * 64 + 3 * (4 * (64 * 64 + 64) + 4 * 64 + 2 * 64 * 256 + 256 + 64)
    assert trainable == {"zero-shot `clip_shapes`": "0", "full fine-tuning": "1,846,081",
                         "LiT (image locked)": f"{1_846_081 - locked:,}", "LoRA (rank 8)": "12,288"}, out
    curve = re.findall(rf"^\| (0|0\.25|0\.5|0\.75|1) \| {accuracy} \| {accuracy} \|$", out, re.M)
    assert [alpha for alpha, _, _ in curve] == ["0", "0.25", "0.5", "0.75", "1"], out
    # WiSE-FT's ends are the zero-shot and the fully fine-tuned models, bit for bit.
    assert curve[0][1:] == rows["zero-shot `clip_shapes`"], out
    assert curve[-1][1:] == rows["full fine-tuning"], out
    results = json.load(open(tmp_path / "finetuning_recipes.json"))
    assert [row["alpha"] for row in results["wise_ft"]] == [0.0, 0.25, 0.5, 0.75, 1.0]
    with open(tmp_path / "finetuning_wise_ft.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
