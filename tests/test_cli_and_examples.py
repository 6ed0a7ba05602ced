"""The `vlzoo` command line (list, info, demo) and the runnable examples."""

import json
import os
import re
import runpy
import subprocess
import sys

import keras
import pytest

from vlzoo import cli
from vlzoo.data import shapes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


QUICKSTART = os.path.join(ROOT, "examples", "quickstart.py")
QUICKSTART_TEST = "test_quickstart_example_runs"


@pytest.fixture(scope="module", autouse=True)
def quickstart_process(request):
    """`examples/quickstart.py` on the current backend, started in a subprocess as soon as this
    module's tests begin (when its test is selected) so that it overlaps the in-process tests."""
    if not any(item.name == QUICKSTART_TEST for item in request.session.items):
        yield None
        return
    env = dict(os.environ, KERAS_BACKEND=keras.backend.backend())
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # The example's model is tiny: one intra-op thread each, so that it and the in-process
    # tests do not oversubscribe the cores they share.
    env["OMP_NUM_THREADS"] = "1"
    process = subprocess.Popen(
        [sys.executable, QUICKSTART], cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    yield process
    if process.poll() is None:
        process.kill()
        process.communicate()


def test_list_prints_every_preset(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    import vlzoo

    for name in vlzoo.list_presets():
        assert re.search(rf"^{re.escape(name)}\s", out, re.M), name
    assert "149,620,737" in out  # clip_vit_b16
    assert re.search(r"^clip_tiny\s+clip\s+.*\s(yes|no)$", out, re.M)


def test_list_family_filter(capsys):
    assert cli.main(["list", "--family", "siglip"]) == 0
    out = capsys.readouterr().out
    assert "siglip_vit_b16" in out and "203,155,970" in out
    assert "clip_vit_b16" not in out


def test_info_clip_vit_b16(capsys):
    assert cli.main(["info", "clip_vit_b16"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"149,?620,?737", out)
    info = json.loads(out)
    assert info["params"] == 149620737
    assert info["family"] == "clip"
    assert info["weights_available"] in (True, False)


def test_unknown_preset_is_a_clear_error(capsys):
    assert cli.main(["info", "clip_vit_b61"]) == 2
    err = capsys.readouterr().err
    assert "clip_vit_b61" in err and "clip_vit_b16" in err  # suggestion


@pytest.mark.parametrize("command", ["list", "info", "demo"])
def test_help_documents_every_option(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    for action in sub._actions:
        if action.dest == "help":
            continue
        assert action.help, f"{command}: option {action.dest} has no help"
        for flag in action.option_strings:
            assert flag in out


def test_demo_fast(tmp_path, capsys):
    out_dir = tmp_path / "demo_preset"
    code = cli.main([
        "demo", "--steps", "4", "--epochs", "2", "--batch-size", "8", "--eval-per-label", "1",
        "--verbose", "2", "--out", str(out_dir),
    ])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"backend: {keras.backend.backend()}" in out
    # The demo's data: the 12 colour-shape classes of `vlzoo.data.shapes.classification`.
    labels = shapes.class_names(cli.DEMO_COLORS, cli.DEMO_SHAPES)
    assert len(labels) == 12 and f"data: 12 labels ({', '.join(labels)}); 16 training pairs, 12 held-out" in out
    assert "(chance 0.083)" in out
    metrics = {}
    for when in ("before", "after"):
        match = re.search(rf"{when} fine-tuning:\s+zero_shot_accuracy=([\d.]+)\s+t2i_recall@1=([\d.]+)", out)
        assert match, out
        metrics[when] = tuple(float(v) for v in match.groups())
        assert all(0.0 <= v <= 1.0 for v in metrics[when])
    assert "Epoch 2/2" in out  # Keras's own fit logging
    assert re.search(r"max abs diff: \S+ \(OK\)", out)
    assert (out_dir / "config.json").is_file() and (out_dir / "model.weights.h5").is_file()


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")
def test_module_entry_point(monkeypatch, capsys):
    """`python -m vlzoo.cli list --family clip`, run in-process through runpy."""
    monkeypatch.setattr(sys, "argv", ["vlzoo", "list", "--family", "clip"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("vlzoo.cli", run_name="__main__")
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "clip_vit_l14" in out and "427,616,513" in out and "siglip" not in out


def test_quickstart_example_runs(quickstart_process):
    stdout, stderr = quickstart_process.communicate(timeout=300)
    assert quickstart_process.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert f"backend: {keras.backend.backend()}" in stdout
    assert re.search(r"^binding accuracy: [01]\.\d{3} \('a \w+ \w+ .+' vs 'a \w+ \w+ .+'\)$", stdout, re.M), stdout
    match = re.search(r"round trip max abs diff: (\S+)", stdout)
    assert match and float(match.group(1)) <= 1e-6, stdout
    assert stdout.rstrip().endswith("done")
