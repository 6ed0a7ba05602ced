"""Cross-backend conformance: the tiny family models give the same numbers on JAX, TensorFlow and PyTorch.

`tests/conformance_worker.py` runs once per backend in a subprocess (all three
at once); each sets every weight of every tiny family model (`FAMILIES`) to
the same fixed values, feeds the same inputs and records
embeddings (token embeddings too for FILIP and SPARC), similarities,
losses, gradients (by the backend's own autodiff) and the weights after one
AdamW step. Each worker also saves the `clip_tiny` model as a preset and loads
the presets saved by all three backends (its own included).

Checked (float32, CPU or GPU with TF32 off):

* every quantity agrees across each backend pair within `TOLERANCE` (1e-5);
* a preset saved under any backend loads under every backend with
  bit-identical weights and outputs within `PRESET_TOLERANCE` (1e-6) of what
  the loading backend computes for the in-memory model (and within
  `TOLERANCE` of the saving backend's outputs).

The test starts all three backends itself, so it runs once, in the PyTorch
pass of `make test` (`backend_utils.run_once`). The max differences
are printed (`pytest -s`) and, when `$VLZOO_CONFORMANCE_REPORT` names a file,
written there as JSON.
"""

import itertools
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
from backend_utils import run_once
from conformance_worker import FAMILIES
from margins import DECISION_MARGIN

BACKENDS = ("jax", "tensorflow", "torch")
PAIRS = list(itertools.combinations(BACKENDS, 2))
TOLERANCE = 1e-5
# The optimizer step is fed identical seeded gradients on every backend (see
# conformance_worker.step_gradients), so its result must agree far more tightly.
QUANTITY_TOLERANCE = {"post_step_weights": 1e-6}
PRESET_TOLERANCE = 1e-6
TIMEOUT_S = float(os.environ.get("VLZOO_CONFORMANCE_TIMEOUT", 480))
WORKER = pathlib.Path(__file__).resolve().with_name("conformance_worker.py")
REPO_ROOT = WORKER.parent.parent

# Quantity -> the worker keys (under `<family>/`) it covers; a key ending in "/"
# is a prefix (one array per weight).
QUANTITIES = {
    "embeddings": ("encode/", "call/"),
    "similarity": ("similarity",),
    "loss": ("loss", "grad_loss", "loss_chunked", "loss_eval"),
    "gradients": ("grad/",),
    "post_step_weights": ("step/",),
}
PRESET_OUTPUTS = ("encode/image/embeds", "encode/text/embeds", "similarity")

pytestmark = [
    pytest.mark.conformance,
    run_once,
]


# ------------------------------------------------------------------ running


def _tail(path, lines=40):
    try:
        return "\n".join(pathlib.Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _run_workers(tmp):
    """Starts one worker per backend, waits for all (killing the rest when one fails)."""
    presets = {b: tmp / f"preset_{b}" for b in BACKENDS}
    loads = [arg for b in BACKENDS for arg in ("--load-preset", str(presets[b]))]
    procs, logs = {}, {}
    start = time.monotonic()
    for b in BACKENDS:
        env = dict(os.environ, KERAS_BACKEND=b, TF_CPP_MIN_LOG_LEVEL="2")
        cmd = [
            sys.executable, str(WORKER), "--out", str(tmp / f"{b}.npz"),
            "--save-preset", str(presets[b]), *loads, "--wait-presets", str(TIMEOUT_S),
        ]
        logs[b] = tmp / f"{b}.log"
        with open(logs[b], "w") as log:
            procs[b] = subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    failure = None
    while failure is None and any(p.poll() is None for p in procs.values()):
        for b, p in procs.items():
            if p.poll() not in (None, 0):
                failure = f"the {b} worker exited with status {p.returncode}"
        if failure is None and time.monotonic() - start > TIMEOUT_S:
            failure = f"the workers did not finish within {TIMEOUT_S:.0f}s"
        time.sleep(0.1)
    if failure is None:
        failure = next((f"the {b} worker exited with status {p.returncode}"
                        for b, p in procs.items() if p.returncode), None)
    if failure:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        details = "\n".join(f"--- {b} worker log (tail) ---\n{_tail(logs[b])}" for b in BACKENDS)
        pytest.fail(f"Conformance workers failed: {failure}.\n{details}", pytrace=False)
    wall = time.monotonic() - start
    results = {}
    for b in BACKENDS:
        with np.load(tmp / f"{b}.npz") as data:
            results[b] = {key: data[key] for key in data.files}
    for b in BACKENDS:  # ~60 MB each; the logs stay
        (tmp / f"{b}.npz").unlink()
        shutil.rmtree(presets[b], ignore_errors=True)
    return results, wall


# -------------------------------------------------------------- comparisons


def _max_abs(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return float("inf")
    if a.size == 0:
        return 0.0
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))


def _bit_identical(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _keys(result, family, spec):
    prefix = f"{family}/{spec}"
    if spec.endswith("/"):
        return sorted(k for k in result if k.startswith(prefix))
    return [prefix] if prefix in result else []


def _label(result, family, key):
    """`grad/003` -> `grad/text/block_0/...` (the weight's path) for messages."""
    names = result[f"{family}/weight_names"]
    kind, _, index = key[len(family) + 1:].partition("/")
    if kind == "step":
        return f"step/{names[int(index)]}"
    if kind == "grad":
        return f"grad/{names[result[f'{family}/trainable_index'][int(index)]]}"
    return key[len(family) + 1:]


def _compare_families(results):
    """`{quantity: {family: {"a-b": (max_abs_diff, where)}}}`."""
    table = {}
    for quantity, specs in QUANTITIES.items():
        for family in FAMILIES:
            for a, b in PAIRS:
                worst, where = 0.0, None
                for spec in specs:
                    keys_a, keys_b = _keys(results[a], family, spec), _keys(results[b], family, spec)
                    if keys_a != keys_b:
                        worst, where = float("inf"), f"{spec}: different keys"
                        continue
                    for key in keys_a:
                        diff = _max_abs(results[a][key], results[b][key])
                        if where is None or diff > worst:
                            worst, where = diff, _label(results[a], family, key)
                table.setdefault(quantity, {}).setdefault(family, {})[f"{a}-{b}"] = (worst, where)
    return table


def _compare_presets(results):
    """`{"saver->loader": {...}}` for every saving and loading backend."""
    table = {}
    for loader in BACKENDS:
        res = results[loader]
        for k in range(int(res["meta/num_presets"])):
            directory = str(res[f"preset{k}/dir"])
            saver = next(b for b in BACKENDS if directory.endswith(f"preset_{b}"))
            saved = results[saver]
            names_equal = np.array_equal(res[f"preset{k}/weight_names"], saved["clip_tiny/weight_names"])
            weight_keys = sorted(key for key in res if key.startswith(f"preset{k}/weights/"))
            bit_identical = names_equal and len(weight_keys) == len(saved["clip_tiny/weight_names"])
            weight_diff = 0.0
            for key in weight_keys:
                index = key.rsplit("/", 1)[1]
                loaded, original = res[key], saved.get(f"clip_tiny/init/{index}")
                same = original is not None and _bit_identical(loaded, original)
                bit_identical &= bool(same)
                weight_diff = max(weight_diff, _max_abs(loaded, original) if original is not None else float("inf"))
            tokens_equal = all(
                np.array_equal(res[f"preset{k}/{name}"], saved[f"clip_tiny/{name}"])
                for name in ("token_ids", "padding_mask")
            )
            table[f"{saver}->{loader}"] = {
                "weights_bit_identical": bool(bit_identical),
                "weights_max_abs_diff": weight_diff,
                "tokens_identical": bool(tokens_equal),
                # The loaded model against the in-memory model, both in the loading backend.
                "outputs_vs_loader_backend": {
                    name: _max_abs(res[f"preset{k}/{name}"], res[f"clip_tiny/{name}"]) for name in PRESET_OUTPUTS
                },
                # The loaded model against the saving backend's in-memory model.
                "outputs_vs_saver_backend": {
                    name: _max_abs(res[f"preset{k}/{name}"], saved[f"clip_tiny/{name}"]) for name in PRESET_OUTPUTS
                },
            }
    return table


def _format_families(table, quantities=None):
    lines = []
    for quantity in quantities or table:
        for family, pairs in table[quantity].items():
            cells = "  ".join(f"{pair}: {diff:.2e} ({where})" for pair, (diff, where) in pairs.items())
            lines.append(f"  {quantity:18s} {family:12s} {cells}")
    return "\n".join(lines)


def _format_presets(table):
    lines = []
    for pair, row in table.items():
        own = max(row["outputs_vs_loader_backend"].values())
        cross = max(row["outputs_vs_saver_backend"].values())
        lines.append(
            f"  preset {pair:22s} weights bit-identical: {row['weights_bit_identical']}  "
            f"tokens identical: {row['tokens_identical']}  outputs vs loader backend: {own:.2e}  "
            f"vs saver backend: {cross:.2e}"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def conformance(tmp_path_factory):
    results, wall = _run_workers(tmp_path_factory.mktemp("conformance"))
    families = _compare_families(results)
    preset_table = _compare_presets(results)
    onednn = {b: str(results[b]["meta/tf_enable_onednn_opts"]) or "default" for b in BACKENDS}
    seconds = ", ".join(f"{b} {float(results[b]['meta/seconds']):.1f}s" for b in BACKENDS)
    print(f"\nCross-backend conformance (max abs differences; tolerance {TOLERANCE:g}, presets "
          f"{PRESET_TOLERANCE:g}); workers ran in parallel in {wall:.1f}s "
          f"({seconds}); "
          f"TF_ENABLE_ONEDNN_OPTS={onednn['tensorflow']}")
    print(_format_families(families))
    print(_format_presets(preset_table))
    report_path = os.environ.get("VLZOO_CONFORMANCE_REPORT")
    if report_path:
        report = {
            "tolerance": TOLERANCE,
            "preset_tolerance": PRESET_TOLERANCE,
            "backends": list(BACKENDS),
            "keras_version": str(results["jax"]["meta/keras_version"]),
            "tf_enable_onednn_opts": onednn["tensorflow"],
            "wall_seconds": round(wall, 2),
            "worker_seconds": {b: round(float(results[b]["meta/seconds"]), 2) for b in BACKENDS},
            "max_abs_diff": {
                quantity: {
                    family: {pair: {"max_abs_diff": diff, "where": where} for pair, (diff, where) in pairs.items()}
                    for family, pairs in per_family.items()
                }
                for quantity, per_family in families.items()
            },
            "presets": preset_table,
        }
        pathlib.Path(report_path).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return {"results": results, "families": families, "presets": preset_table}


# --------------------------------------------------------------------- tests


def test_workers_start_from_identical_weights_and_inputs(conformance):
    results = conformance["results"]
    for family in FAMILIES:
        for b in BACKENDS[1:]:
            for suffix in ("weight_names", "trainable_index", "images", "token_ids", "padding_mask"):
                key = f"{family}/{suffix}"
                assert np.array_equal(results["jax"][key], results[b][key]), f"{key} differs between jax and {b}"
            init_keys = sorted(k for k in results["jax"] if k.startswith(f"{family}/init/"))
            assert init_keys == sorted(k for k in results[b] if k.startswith(f"{family}/init/"))
            for key in init_keys:
                assert np.array_equal(results["jax"][key], results[b][key]), f"{key} differs between jax and {b}"


def test_the_inputs_keep_every_discrete_choice_from_a_tie(conformance):
    """FILIP's, SPARC's and STAIR's losses and gradients go through maxima, a top-k and thresholds: the backends'
    other summation orders decide them alike only with a margin (`tests/margins.py`), which the fixed weights
    and inputs keep on every backend."""
    results = conformance["results"]
    checked = set()
    for backend, family in itertools.product(BACKENDS, FAMILIES):
        for key in (k for k in results[backend] if k.startswith(f"{family}/margin/")):
            checked.add(family)
            assert float(results[backend][key]) >= DECISION_MARGIN, f"{backend}: {key} = {results[backend][key]:.2e}"
    assert checked == {"filip_tiny", "sparc_tiny", "stair_tiny"}


@pytest.mark.parametrize("quantity", list(QUANTITIES))
def test_backends_agree(conformance, quantity):
    table = conformance["families"][quantity]
    tolerance = QUANTITY_TOLERANCE.get(quantity, TOLERANCE)
    bad = [
        f"{family} {pair}: {diff:.3e} at {where}"
        for family, pairs in table.items() for pair, (diff, where) in pairs.items()
        if not diff <= tolerance
    ]
    assert not bad, (
        f"{quantity}: max abs difference above {tolerance:g} for " + "; ".join(bad)
        + "\nAll pairs:\n" + _format_families(conformance["families"], [quantity])
    )


@pytest.mark.parametrize("saver", BACKENDS)
def test_preset_loads_on_every_backend(conformance, saver):
    rows = {pair: row for pair, row in conformance["presets"].items() if pair.startswith(f"{saver}->")}
    loaders = {pair.split("->")[1] for pair in rows}
    assert loaders == set(BACKENDS), f"missing loads of the {saver} preset: {sorted(rows)}"
    problems = []
    for pair, row in rows.items():
        if not row["weights_bit_identical"]:
            problems.append(f"{pair}: weights not bit-identical (max abs diff {row['weights_max_abs_diff']:.3e})")
        if not row["tokens_identical"]:
            problems.append(f"{pair}: the saved tokenizer gives different token ids")
        for name, diff in row["outputs_vs_loader_backend"].items():
            if not diff <= PRESET_TOLERANCE:
                problems.append(f"{pair}: {name} differs from the in-memory model by {diff:.3e}")
        for name, diff in row["outputs_vs_saver_backend"].items():
            if not diff <= TOLERANCE:
                problems.append(f"{pair}: {name} differs from the saving backend's by {diff:.3e}")
    assert not problems, "; ".join(problems) + "\n" + _format_presets(rows)
