"""The `vlzoo` command line: list, info, demo and the module entry point."""

import json
import os
import re
import runpy
import subprocess
import sys

import keras
import pytest

from backend_utils import run_once
from vlzoo import cli

# The catalogue commands, --help and the entry point import no backend (test_structure checks it): one pass
# checks them; the demo starts its own processes.
pytestmark = run_once


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


def test_demo_fast(tmp_path):
    """The `make demo` job, shortened, as `make demo` runs it (a new process): every step runs and reports,
    and the reloads match."""
    out_dir = tmp_path / "demo"
    done = subprocess.run([
        sys.executable, "-m", "vlzoo.cli",
        "demo", "--steps", "4", "--epochs", "2", "--batch-size", "16", "--eval-per-label", "2",
        "--eval-pairs", "16", "--grounding-scenes", "16", "--verbose", "2", "--second-backend", "jax",
        "--out", str(out_dir),
    ], capture_output=True, text=True, timeout=600, env=dict(os.environ, KERAS_BACKEND=keras.backend.backend()))
    out = done.stdout
    assert done.returncode == 0, out + done.stderr[-3000:]
    assert f"backend: {keras.backend.backend()}" in out
    assert "1. preset 'flair_shapes': FLAIR, 1,863,106 parameters, 32 px" in out
    metrics = {}
    for when in ("before", "after"):
        match = re.search(rf"{when} fine-tuning:\s+(.*)$", out, re.M)
        assert match, out
        metrics[when] = dict(item.split("=") for item in match.group(1).split("  "))  # cli._format_metrics
        assert set(metrics[when]) == {
            "zero_shot('a {}')", f"zero_shot('{cli.DEMO_TEMPLATE}')", "i2t_r@1", "t2i_r@1", "binding"}, out
        assert all(0.0 <= float(v) <= 1.0 for v in metrics[when].values())
    assert "Epoch 2/2" in out  # Keras's own fit logging
    assert (out_dir / "alignment.png").stat().st_size > 1000
    assert re.search(r"^4\. word maps \(text attention\) of '.+' drawn to .+alignment\.png$", out, re.M), out
    scores = re.search(r"pointing game on 16 held-out scenes .*: nouns (\S+) \(chance (\S+)\), colors (\S+) "
                       r"\(chance (\S+)\)$", out, re.M)
    assert scores and all(0.0 <= float(v) <= 1.0 for v in scores.groups()), out
    assert re.search(r"two objects, the word's own against the other: nouns \S+ against \S+, colors", out), out
    for backend in (keras.backend.backend(), "jax"):
        assert re.search(rf"on {backend}: max abs diff of the similarities \S+ \(OK\)", out), out
    assert (out_dir / "preset" / "config.json").is_file() and (out_dir / "preset" / "model.weights.h5").is_file()


@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")
def test_module_entry_point(monkeypatch, capsys):
    """`python -m vlzoo.cli list --family clip`, run in-process through runpy."""
    monkeypatch.setattr(sys, "argv", ["vlzoo", "list", "--family", "clip"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module("vlzoo.cli", run_name="__main__")
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "clip_vit_l14" in out and "427,616,513" in out and "siglip" not in out
