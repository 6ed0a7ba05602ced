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
    assert {row["entry"] for row in rows} == {"filip_loss", "train_step", "stair_pool", "loss_memory"}
    memory = {(row["loss"], row["B"]) for row in rows if row["entry"] == "loss_memory"}
    assert memory == {(loss, b) for loss in ("clip", "filip", "llip") for b in (8, 16)}
    steps = {(row["family"], row["backend"]) for row in rows if row["entry"] == "train_step"}
    assert {family for family, _ in steps} == {"sparc", "sparo", "llip"}
    for row in rows:
        if row["entry"] == "train_step":
            r = row["result"]
            assert r["vs_clip"] > 0 and r["clip_median_s"] > 0
    table = (tmp_path / "bench.md").read_text()
    assert all(f"| {entry} |" in table for entry in ("filip_loss", "train_step", "stair_pool", "loss_memory"))
    ratios = [line.rsplit("|", 2)[-2].strip() for line in table.splitlines() if "| train_step |" in line]
    assert len(ratios) == 3 and all(float(r) > 0 for r in ratios)
