"""tools/bench.py runs every entry (tiny sizes) and writes its table."""

import json
import mmap
import re
import subprocess
import sys

import numpy as np
import pytest

import vlzoo
from backend_utils import load_tool, run_once


@pytest.fixture
def bench():
    return load_tool("bench")


def _touched(mb):
    """`mb` MB of fresh anonymous memory, every page written: resident until `.close()` unmaps it.

    An `mmap` of its own, not a numpy array: the allocator of a long test process (many mappings, a fragmented
    heap) may serve an array from memory it never returned to the kernel, which raises no resident count.
    """
    memory = mmap.mmap(-1, mb * 2**20)
    np.frombuffer(memory, np.uint8)[:] = 1
    return memory


def test_peak_memory_is_measured_from_its_baseline(bench):
    # A block that only frees memory peaks at its baseline (the resident set at entry), never below it.
    held = _touched(256)
    with bench.PeakMemory() as freeing:
        held.close()
    assert freeing.peak_mb >= 0
    # A block that touches 384 MB raises the high-water mark, reset at entry to the resident set: the peak is
    # read from it (the block's own memory, whatever the process held before: here 512 MB more a moment ago).
    _touched(512).close()  # the process's mark stays 512 MB above its resident set without the reset
    with bench.PeakMemory() as growing:
        current, mark = bench._resident_mb()
        assert mark - current < 64, (current, mark)  # the mark was reset at entry, not left 512 MB above
        _touched(384).close()
    assert 384 - 16 <= growing.peak_mb <= 384 + 64, growing.peak_mb


def test_times_keep_their_significant_digits(bench):
    # A 256 x 256 int8 matmul on an AMX host takes ~20 us: four decimals of a second rounded it to 0.
    assert bench.significant(2.3456e-5) == pytest.approx(2.346e-5, rel=1e-12)
    assert bench.significant(1.23456) == 1.235 and bench.significant(0.0) == 0.0


def test_accelerator_cases_leave_out_the_cpu_runs(bench):
    # On a GPU: the roofline matmul at N = 8192 (2048 on the CPU), no XLA:CPU option or retained host memory.
    for on_gpu, size in ((False, 2048), (True, 8192)):
        todo = list(bench.cases(["open_clip", "precision"], False, on_gpu))
        assert {c["N"] for c in todo if c.get("task") == "matmul"} == {size}
        assert any(c.get("xla_flags") for c in todo) != on_gpu
        assert any(c.get("retain_host_memory") for c in todo) != on_gpu


def test_quick_plan_asks_no_device_and_shares_processes(bench):
    # The smoke run asks no probe process for the device before its cases: its plan is the same everywhere.
    assert list(bench.cases(bench.ENTRIES, True, False)) == list(bench.cases(bench.ENTRIES, True, True))
    # One process per backend's run of cases, the retained-memory case's too (set first in that process);
    # XLA flags keep a process of their own, and a case of several processes (a process group) ends its process.
    plain, other = dict(entry="filip_loss", backend="torch"), dict(entry="filip_loss", backend="jax")
    retained = dict(entry="open_clip", backend="torch", retain_host_memory=True)
    group, flagged = dict(entry="distributed", backend="torch", processes=2), dict(plain, xla_flags="--x")
    assert bench.shares_process(plain, retained) and bench.shares_process(retained, plain)
    assert bench.shares_process(plain, group) and not bench.shares_process(group, plain)
    assert not bench.shares_process(plain, other) and not bench.shares_process(plain, flagged)
    assert not bench.shares_process(flagged, plain)


def check_exchange_counts(rows):
    """The `exchange` entry's counts against the tiny towers' widths: CLIP gathers its two embeddings; Llip
    keeps each image's keys and folded values (K x M x (d_h + D) floats), mixture tokens and embedding local."""
    load_tool("bench")  # puts tools/ on the path
    import bench_steps

    config = bench_steps.same_towers_config("clip", "clip_tiny")
    width, batch, replicas = config["embed_dim"], 4, 2
    clip, llip = rows["clip"]["result"], rows["llip"]["result"]
    assert clip["gathered_per_row"] == 2 * width * 4 and clip["local_per_row"] == 0
    assert clip["outputs_w2"] == (replicas - 1) * batch * 2 * clip["gathered_per_row"]  # the rows, their gradients
    assert clip["gradients"] == vlzoo.CLIP(**config).count_params() * 4
    assert clip["sent_w2"] == clip["outputs_w2"] + clip["gradients"]  # a ring all-reduce: 2 (W - 1) / W = 1
    head = vlzoo.Llip(**bench_steps.same_towers_config("llip", "clip_tiny")).cross_attention
    keys_values = head.num_tokens * head.num_heads * (head.head_dim + head.embed_dim)
    mixture_tokens = head.num_tokens * head.vision_dim  # unread by the loss: kept local too, as the image embedding
    assert llip["local_per_row"] == (keys_values + mixture_tokens + head.embed_dim) * 4
    assert llip["outputs_w2"] == (replicas - 1) * batch * 2 * llip["gathered_per_row"]


# Every entry's tiny cases in PyTorch processes of their own, whatever the pass's backend: one pass runs it. What
# it checks is that each case runs and writes its rows, not its figures: its time is mostly each process's imports
# (Keras, PyTorch, open_clip), so it runs its cases in one process (and the distributed case's helper), times each
# step once after its first call, and asks no probe process for the device (tools/bench.py `cases`, `shares_process`).
@run_once
def test_bench_quick_run_writes_results(tmp_path, repo_root):
    result = subprocess.run(
        [sys.executable, "tools/bench.py", "--quick", "--backends", "torch", "--out", str(tmp_path)],
        cwd=repo_root, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert {row["backend"] for row in rows} == {"torch"}  # one backend keeps the smoke run short
    # Every case ran, except bfloat16 runs skipped for a slow bfloat16 matmul (checked below).
    assert all(row["result"]["median_s"] > 0 for row in rows
               if "skipped" not in row["result"] and row["entry"] != "exchange")
    assert {row["entry"] for row in rows} == {"open_clip", "host_overhead", "precision", "serving", "filip_loss",
                                              "train_step", "stair_pool", "loss_memory", "share_memory", "exchange",
                                              "grad_caching", "distributed"}
    overhead = {row["task"]: row["result"] for row in rows if row["entry"] == "host_overhead"}
    assert set(overhead) == {"encode_image", "encode_text", "predict_images", "predict_texts", "train_step"}
    for task, r in overhead.items():  # the same converted weights: the same outputs
        assert r["vs_open_clip"] > 0 and r["max_abs_diff"] < 1e-4, (task, r)
    caching = {(row["batch_size"], row["micro_batch_size"]) for row in rows if row["entry"] == "grad_caching"}
    assert caching == {(4, None), (4, 2), (8, None), (8, 2)}
    peer = {(row["task"], row.get("only")) + (("retained",) if row.get("retain_host_memory") else ()): row["result"]
            for row in rows if row["entry"] == "open_clip"}
    tasks = ("encode_image", "encode_text", "predict_images", "predict_texts", "train_step")
    assert set(peer) == {(task, None) for task in tasks} | {
        ("train_step", "vlzoo"), ("train_step", "open_clip"), ("train_step", None, "retained")}
    for (task, only, *_), r in peer.items():
        assert r["median_s"] > 0 and r["peak_mb"] >= 0
        if only is None:  # converted weights, same batch: both frameworks compute the same outputs
            assert r["vs_open_clip"] > 0 and r["open_clip_median_s"] > 0 and r["max_abs_diff"] < 1e-4, (task, r)
    memory = {(row["loss"], row["B"]) for row in rows if row["entry"] == "loss_memory"}
    assert memory == {(loss, b) for loss in ("clip", "filip", "llip") for b in (8, 16)}
    shares = {(row["loss"], row["replicas"], row["B"]) for row in rows if row["entry"] == "share_memory"}
    assert shares == {(loss, w, 4 * w) for loss in ("clip", "siglip", "filip", "llip", "flair") for w in (1, 2)}
    check_exchange_counts({row["family"]: row for row in rows if row["entry"] == "exchange"})
    distributed = {row["processes"]: row["result"] for row in rows if row["entry"] == "distributed"}
    assert set(distributed) == {1, 2} and all(r["median_s"] > 0 for r in distributed.values())
    steps = {(row["family"], row["backend"]) for row in rows if row["entry"] == "train_step"}
    assert {family for family, _ in steps} == {"sparc", "sparo", "llip"}
    for row in rows:
        if row["entry"] == "train_step":
            r = row["result"]
            assert r["vs_clip"] > 0 and r["clip_median_s"] > 0
    precision = {(row["task"], row["dtype"]): row["result"] for row in rows if row["entry"] == "precision"}
    assert set(precision) == {("matmul", "float32"), ("matmul", "bfloat16"), ("matmul", "int8"),
                              ("encode_image", "float32"), ("encode_image", "bfloat16"), ("train_step", "float32"),
                              ("train_step", "mixed_bfloat16")}
    roofline = {dtype: precision[("matmul", dtype)]["gflops"] for dtype in ("float32", "bfloat16", "int8")}
    assert min(roofline.values()) > 0
    bf16_usable = roofline["bfloat16"] >= 0.1 * roofline["float32"]  # not on CPUs without AVX512-BF16 / AMX
    for (task, dtype), r in precision.items():
        if task == "matmul":
            continue
        if dtype != "float32" and not bf16_usable:
            assert "torch's bfloat16 matmul runs at" in r["skipped"], r
            continue
        assert r["gflops"] > 0 and r["vs_open_clip_float32"] > 0, (task, dtype, r)
        assert ("vs_open_clip_bfloat16" in r) == bf16_usable, (task, dtype, r)
        # vlzoo's first output against open_clip float32's on the same weights and batch.
        assert r["max_abs_diff"] < (1e-4 if dtype == "float32" else 0.1), (task, dtype, r)
    serving = {row["path"]: row["result"] for row in rows if row["entry"] == "serving"}
    assert set(serving) == {"float32", "bfloat16", "int8", "onnx_float32", "onnx_int8"}
    for path, r in serving.items():
        if "skipped" in r:  # vlzoo's bfloat16 weights, on a CPU whose bfloat16 matmul is unusable
            assert path == "bfloat16" and not bf16_usable, (path, r)
            continue
        assert r["median_s"] > 0 and r["vs_open_clip_float32"] > 0 and r["gflops"] > 0, (path, r)
        # Same weights and batch as open_clip float32: the float32 paths agree to rounding (relative error of
        # float32 sums, ~1e-6); bfloat16 weights and Keras' int8 (per-channel weight scales, per-call
        # activation scales) carry relative errors near 2**-9 and 2**-8 per element: a cosine above 0.999
        # (measured 0.99993). ONNX Runtime's int8 has one weight scale per tensor, and its u8s8 kernels on
        # CPUs without VNNI may saturate 16-bit sums: the serving tests' bar, 0.99 (measured 0.99995).
        bar = 0.99999 if path.endswith("float32") else 0.99 if path == "onnx_int8" else 0.999
        assert r["cosine"] > bar, (path, r)
    table = (tmp_path / "bench.md").read_text()
    assert table.startswith("Machine: ") and "cores" in table.splitlines()[0]  # the ratios depend on the CPU
    assert "CPU flags: " in table.splitlines()[0]
    # The open_clip comparison's rows: task, backend, then vlzoo's items/s (a number; the precision
    # table's rows have a dtype there).
    peer_table = table.split("| host overhead (")[0]  # the host_overhead table follows with the same tasks
    assert sum(bool(re.match(rf"\| ({'|'.join(tasks)}) \| torch \| [0-9]", line))
               for line in peer_table.splitlines()) == len(tasks)
    assert sum(bool(re.match(r"\| train_step \(host memory retained\) \| torch \| [0-9]", line))
               for line in table.splitlines()) == 1
    assert "| matmul (roofline) | backend | GFLOP/s |" in table
    assert sum(line.startswith(("| float32 | torch | ", "| bfloat16 | torch | ", "| int8 | torch | ",
                                "| ONNX Runtime float32 (exported from torch) | - | ",
                                "| ONNX Runtime int8 (exported from torch) | - | "))
               for line in table.splitlines()) == len(serving)
    assert "Best path with a cosine of at least 0.99: " in table
    assert "| GFLOP/s | % of host roofline |" in table  # each path's share of the roofline of its products' dtype
    assert sum("% of bfloat16 |" in line or "% of float32 |" in line or "% of int8 |" in line
               for line in table.splitlines()) == sum("skipped" not in r for r in serving.values())
    assert sum(line.startswith(("| encode_image | torch | ", "| train_step | torch | ")) and "float" in line
               for line in table.splitlines()) == 4  # the precision table's rows
    assert all(f"| {entry} |" in table for entry in ("filip_loss", "train_step", "stair_pool", "loss_memory",
                                                     "grad_caching", "distributed"))
    overhead_rows = table.split("| host overhead (12 + 12 blocks, width 32, batch 16) |")[1].split("\n\n")[0]
    assert overhead_rows.count(" | torch | ") == 5 and overhead_rows.count("1.3x (") == 5  # met or short
    ratios = [line.rsplit("|", 2)[-2].strip() for line in table.splitlines()
              if line.startswith("| train_step |") and " towers, batch " in line]
    assert len(ratios) == 3 and all(float(r) > 0 for r in ratios)
