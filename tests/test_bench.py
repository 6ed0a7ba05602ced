"""tools/bench.py runs every entry (tiny sizes) and writes its table."""

import json
import os
import subprocess
import sys

import keras
import pytest


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="starts its own per-backend subprocesses; run once")
def test_bench_quick_run_writes_results(tmp_path, repo_root):
    result = subprocess.run(
        [sys.executable, "tools/bench.py", "--quick", "--backends", "jax", "torch", "--out", str(tmp_path)],
        cwd=repo_root, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert {row["backend"] for row in rows} == {"jax", "torch"}
    assert all(row["result"]["median_s"] > 0 for row in rows)
    assert "| filip_loss |" in (tmp_path / "bench.md").read_text()
    assert os.path.getsize(tmp_path / "bench.md") > 0
