"""tools/bench.py runs every entry (tiny sizes) and writes its table."""

import json
import subprocess
import sys

from backend_utils import run_once


@run_once
def test_bench_quick_run_writes_results(tmp_path, repo_root):
    result = subprocess.run(
        [sys.executable, "tools/bench.py", "--quick", "--backends", "torch", "--out", str(tmp_path)],
        cwd=repo_root, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert {row["backend"] for row in rows} == {"torch"}  # one backend keeps the smoke run short
    assert all(row["result"]["median_s"] > 0 for row in rows)
    assert {row["entry"] for row in rows} == {"open_clip", "filip_loss", "train_step", "stair_pool", "loss_memory"}
    peer = {(row["task"], row.get("only")): row["result"] for row in rows if row["entry"] == "open_clip"}
    tasks = ("encode_image", "encode_text", "predict_images", "predict_texts", "train_step")
    assert set(peer) == {(task, None) for task in tasks} | {
        ("train_step", "vlzoo"), ("train_step", "open_clip")}
    for (task, only), r in peer.items():
        assert r["median_s"] > 0 and r["peak_mb"] >= 0
        if only is None:  # converted weights, same batch: both frameworks compute the same outputs
            assert r["vs_open_clip"] > 0 and r["open_clip_median_s"] > 0 and r["max_abs_diff"] < 1e-4, (task, r)
    memory = {(row["loss"], row["B"]) for row in rows if row["entry"] == "loss_memory"}
    assert memory == {(loss, b) for loss in ("clip", "filip", "llip") for b in (8, 16)}
    steps = {(row["family"], row["backend"]) for row in rows if row["entry"] == "train_step"}
    assert {family for family, _ in steps} == {"sparc", "sparo", "llip"}
    for row in rows:
        if row["entry"] == "train_step":
            r = row["result"]
            assert r["vs_clip"] > 0 and r["clip_median_s"] > 0
    table = (tmp_path / "bench.md").read_text()
    assert sum(line.startswith(tuple(f"| {task} | torch |" for task in tasks)) and " towers, batch " not in line
               for line in table.splitlines()) == len(tasks)  # the open_clip comparison's rows
    assert all(f"| {entry} |" in table for entry in ("filip_loss", "train_step", "stair_pool", "loss_memory"))
    ratios = [line.rsplit("|", 2)[-2].strip() for line in table.splitlines()
              if line.startswith("| train_step |") and " towers, batch " in line]
    assert len(ratios) == 3 and all(float(r) > 0 for r in ratios)
