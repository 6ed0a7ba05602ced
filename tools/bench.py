"""vlzoo benchmarks: one subprocess per backend and case, medians after warm-up.

    python tools/bench.py                       # every entry, every backend
    python tools/bench.py --entries filip_loss --backends jax torch
    python tools/bench.py --quick               # tiny sizes (a smoke run, used by the tests)
    python tools/bench.py --markdown docs/benchmarks.md        # also the results into that page (make bench)
    python tools/bench.py --from-json out/bench/bench.json --markdown docs/benchmarks.md  # no runs

Each case runs in a fresh process so that its peak memory (the peak resident
memory of its calls above the resident set once its inputs are built) belongs
to it alone (a `--quick` smoke run shares one process among consecutive cases of
a backend, see `shares_process`, times each step once after its first call and asks
no device before its cases, see `cases`). Results go to `--out` as JSON and a Markdown table; `--markdown
PATH` also writes them into a Markdown page: between its marked lines when it has them (as
`docs/benchmarks.md`, whose prose stays), else as a whole page (`tools/bench_report.py`).

On a GPU (each backend is asked which device it computes on, `accelerator`), the cases run there:
vlzoo's and open_clip's inputs and open_clip's model go to the device first, repeats are timed until
their results are ready (`wait_for`), and each case also reports its peak accelerator memory
(`DevicePeakMemory`), shown in place of the host's. The roofline matmul grows to N = 8192, the
XLA:CPU option and retained-host-memory runs are left out, and the results go to the page's own
marked section for accelerator runs, leaving the CPU run's in place (a `--quick` run keeps its one
retained-host-memory case everywhere: its plan is the same on every device).

Entries:
  open_clip    vlzoo against open_clip on the same weights (open_clip's
               ViT-B-16-quickgelu, random init, converted with
               `vlzoo.convert.from_open_clip`), batch 16, float32:
               `encode_image`, `encode_text` (eager calls, both frameworks in their
               no-gradient mode: torch.no_grad / inference_mode on torch; JAX and TF
               record no gradients outside a transform or tape), `predict_images` /
               `predict_texts` (vlzoo's compiled `model.predict_on_batch` on one
               input kind, against the same open_clip calls) and a training step
               (vlzoo's `train_on_batch` with AdamW against open_clip's forward,
               ClipLoss, backward and AdamW step), alternated in one process per
               Keras backend: throughput ratio, compile time (first call above
               the median), agreement of the first outputs; peak memory of each
               framework alone, in processes of their own; the training step once
               more with `vlzoo.training.retain_host_memory()` in the process.
  host_overhead the open_clip entry's five tasks, batch 16, float32, on a CLIP with
               ViT-B/16's depth (12 + 12 blocks) but widths of 32 and 32 x 32 images
               (DEEP_NARROW_CLIP), where the arithmetic is negligible: each step's
               time is the framework's host work, which a GPU waits for. Time per
               call of vlzoo and of open_clip, alternated; target on PyTorch:
               within 1.3x of open_clip's time.
  precision    bfloat16 against float32: each backend's own N x N matmul in
               float32 and bfloat16 (N = 2048; the roofline, as GFLOP/s; on JAX also
               with the XLA:CPU options of JAX_CPU_FLAGS) and PyTorch's int8 product
               (`torch._int_mm`, int32 sums: the host's int8 roofline), then, on the open_clip
               entry's model and batch, vlzoo's `encode_image` (float32 and
               bfloat16 weights) and training step (float32 and mixed_bfloat16)
               alternated with open_clip's in float32 and under bfloat16 autocast:
               throughput, achieved model GFLOP/s and its share of the roofline of
               the same dtype, ratios to both open_clip precisions.
  filip_loss   FILIP loss forward + backward at B=256, P=196, T=77, D=256,
               unchunked vs chunked (16 or 8 captions per block, rematerialised): median
               time, peak memory.
  train_step   one `model.train_on_batch` (forward, family loss, backward, AdamW
               update) of each family in STEP_FAMILIES (SPARC, SPARO with
               L = V = 64, Llip with K = 32) on the towers of the clip_vit_b16
               preset, batch 8, timed alternately with CLIP's step in the same
               process: time relative to CLIP's.
  loss_memory  peak memory against batch size B (32, 64, 128, 256) of each loss,
               forward + backward w.r.t. its inputs, one timed call after the
               first: CLIP (D=512), FILIP chunked by 8 captions (P=196, T=77,
               D=256) and Llip chunked by 8 captions (K=64 mixture tokens, M=8
               heads, D=512): the chunked paths grow linearly in B, not with B^2.
  share_memory peak memory of one replica's share of each loss (its `rows=` form, what
               a device computes in a step over W replicas, vlzoo.parallel) against
               the world size W (1, 2, 4, 8) and the local batch b (16, 64), the
               global batch W * b: forward + backward w.r.t. its inputs, which are
               the gathered global batch's and this replica's own rows (the
               family's `replica_local_outputs`); CLIP (D=512), SigLIP (texts in
               W chunks of b), FILIP and Llip as in loss_memory, FLAIR with one
               caption per image (P=196, M=8 heads, D=512). PyTorch only.
  exchange     counted, not timed: megabytes one replica sends per training step
               of each family on the clip_vit_b16 towers (Llip K = 32, SPARO
               L = V = 64) at local batch 32, against the world size W (2, 8,
               64): the all-gather of the outputs the loss reads across
               replicas, the reduce-scatter of their gradients, and
               DistributedDataParallel's ring all-reduce of the weights'
               gradients (2 (W - 1) / W of their size).
  grad_caching one `train_on_batch` of CLIP on the clip_vit_b16 towers against the
               contrastive batch N (CPU: 16, 32, 64; accelerator: 64 ... 4096),
               without and with gradient caching (`micro_batch_size` 8 on the CPU,
               64 on an accelerator; without it only up to N = 1024 there): step
               time and peak memory, which with caching stays near one
               micro-batch's activations plus the N embeddings.
  serving      ViT-B/16 image embeddings per second, batch 16, on the open_clip entry's
               weights, for every serving path: each backend's compiled
               `predict_on_batch` of the image tower (`vlzoo.serving.ImageEncoder`) in
               float32, bfloat16 weights and Keras' int8 (`model.quantize("int8")`),
               and ONNX Runtime on the tower exported to ONNX (`vlzoo.export`, from the
               first backend that exports it) in float32 and in ONNX Runtime's own
               dynamic int8 (`vlzoo.serving.quantize_onnx`); each alternated with
               open_clip's `encode_image` in float32 and under bfloat16 autocast
               (inference mode): embeddings/s, ratios, the smallest cosine per
               embedding against open_clip's float32 embeddings of the same batch,
               and the path's achieved GFLOP/s as a share of the host's roofline for
               its products' dtype (the fastest matmul of the precision entry in that
               dtype over the backends; int8: PyTorch's `torch._int_mm`).
  distributed  PyTorch: CLIP's `train_on_batch` on the clip_vit_b16 towers with a global batch of 16,
               in 1 process and over 2 processes of 8 pairs each (torch.distributed with gloo on the
               CPU: DistributedDataParallel's all-reduce and the outputs' all-gather, `vlzoo.parallel`;
               the second process is a helper started by the case): time per step, peak memory of
               the measured process. Reported, not gated.
  stair_pool   STAIR's vocabulary-sized head pooled to (B, V), forward +
               backward, B=64 images of S=197 positions (ViT-B/16), V=30,522,
               D=768: all (B, S, V) logits at once vs 16 rematerialised
               vocabulary blocks: time, peak memory.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

from vlzoo.presets import catalogue

if os.path.dirname(os.path.abspath(__file__)) not in sys.path:  # tools/ is no package (loaded from a path)
    sys.path.append(os.path.dirname(os.path.abspath(__file__)))
from bench_device import DevicePeakMemory, accelerator, wait_for  # noqa: E402
from bench_steps import CASE_BUILDERS, CASE_COUNTS, block  # noqa: E402
from bench_report import (  # noqa: E402,F401  (the report tables; re-exported for scripts that read them here)
    BF16_USABLE, INFERENCE_TARGET, PEER_TARGETS, bf16_plan, describe, markdown, memory_table, not_run,
    open_clip_table, page, peer_target, precision_table, render_into, rooflines,
)

ENTRIES = ("open_clip", "host_overhead", "precision", "serving", "filip_loss", "train_step", "stair_pool",
           "loss_memory", "share_memory", "exchange", "grad_caching", "distributed")
# vlzoo's eager `encode_*` calls, its compiled `predict_on_batch` on one input kind, and a training step.
PEER_TASKS = ("encode_image", "encode_text", "predict_images", "predict_texts", "train_step")
MEMORY_LOSSES = ("clip", "filip", "llip")
SHARE_LOSSES = ("clip", "siglip", "filip", "llip", "flair")
WORLD_SIZES = (1, 2, 4, 8)  # share_memory
EXCHANGE_WORLD_SIZES = (2, 8, 64)
PRECISIONS = ("float32", "bfloat16")  # the matmul roofline's dtypes, and open_clip's (bfloat16: autocast)
# vlzoo's dtype policies per task: inference in bfloat16 weights, training with float32 master weights.
PRECISION_TASKS = {"encode_image": ("float32", "bfloat16"), "train_step": ("float32", "mixed_bfloat16")}
# The serving entry's paths: Keras' predict in each weight format, ONNX Runtime on the exported tower.
SERVING_PATHS = ("float32", "bfloat16", "int8", "onnx_float32", "onnx_int8")
# The backends whose ONNX export takes a fixed batch (JAX needs jax2onnx), the preferred first: PyTorch's
# exporter writes LayerNorm as one node, tf2onnx as reductions ONNX Runtime does not fuse (docs/benchmarks.md).
EXPORTERS = ("torch", "tensorflow")
# XLA:CPU options of jaxlib 0.10 tried on JAX's bfloat16 matmul: oneDNN's matmul (the route to AMX),
# its custom-call form, and XNNPACK (whole program, or its dot fusions only).
JAX_CPU_FLAGS = ("--xla_cpu_use_onednn=true", "--xla_cpu_experimental_onednn_custom_call=true",
                 "--xla_cpu_use_xnnpack=true", "--xla_cpu_experimental_xnn_fusion_type=dot")
GPU_MATMUL_SIZE = 8192  # the precision entry's roofline matmul on an accelerator (N = 2048 on the CPU)
STEP_FAMILIES = ("clip", "sparc", "sparo", "llip")  # each timed against the first
# Every family with registered presets, CLIP and Llip (the --quick pair) first.
EXCHANGE_FAMILIES = ("clip", "llip") + tuple(family for family in catalogue.families()
                                              if family not in ("clip", "llip"))
# The shapes of the loss_memory and share_memory losses (--quick: smaller token counts), and the rows per block of
# the chunked ones: `num_chunks = B / rows` of a batch of B, so that their memory grows linearly with B.
LOSS_SHAPES = {"clip": dict(D=512), "siglip": dict(D=512), "filip": dict(P=196, T=77, D=256),
               "llip": dict(K=64, M=8, D=512), "flair": dict(P=196, M=8, D=512)}
LOSS_BLOCK_ROWS = {"filip": 8, "llip": 8}
BACKENDS = ("jax", "tensorflow", "torch")
# host_overhead's CLIP: ViT-B/16's depth (12 + 12 blocks) at widths and sizes where the arithmetic is negligible, so
# that a step's time is the framework's host work (what a GPU waits for).
DEEP_NARROW_CLIP = dict(
    embed_dim=16, quick_gelu=True,
    vision_cfg=dict(image_size=32, patch_size=16, width=32, layers=12, head_width=8),
    text_cfg=dict(context_length=16, vocab_size=49408, width=32, heads=4, layers=12),
)
# open_clip config of the --quick peer runs (the full runs use open_clip's ViT-B-16-quickgelu).
TINY_OPEN_CLIP = dict(
    embed_dim=24, quick_gelu=True,
    vision_cfg=dict(image_size=32, patch_size=8, width=64, layers=2, head_width=32),
    text_cfg=dict(context_length=16, vocab_size=49408, width=32, heads=4, layers=2),
)


def _resident_mb():
    """`(current, high-water mark)` resident set of this process in MB, from one read of its status.

    Both come from the same kernel counters in the same read, so the high-water mark is never below
    the current value (`getrusage`'s `ru_maxrss` and `/proc/self/statm` are read at different times,
    and the kernel folds each thread's cached page counts into them lazily: one could read 0.1 MB
    below the other).
    """
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) / 1024  # kB
    return fields["VmRSS"], fields["VmHWM"]


def _reset_high_water_mark():
    """Sets the kernel's high-water mark of this process's resident set to its current size (Linux 4.0 and
    later: `5` written to `/proc/self/clear_refs`); nothing where that file cannot be written."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


class PeakMemory:
    """Peak resident memory above the resident set at entry, while the `with` block runs (MB).

    Every reading (the resident set sampled every millisecond, and the
    process's high-water mark at exit when the block raised it) is a lower
    bound of the block's true peak, and so is the resident set at entry: the
    peak is the largest of them, so it is never below the baseline. The
    high-water mark, reset to the resident set at entry where the kernel allows
    it (`_reset_high_water_mark`), makes it exact whenever the block grows
    past its entry, whatever the process held before; without the reset, only
    when the block grows past everything the process ever held.
    """

    def __enter__(self):
        _reset_high_water_mark()
        self.start, self.start_max = _resident_mb()
        self.sampled, self._done = self.start, threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._done.wait(0.001):
            self.sampled = max(self.sampled, _resident_mb()[0])

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()
        current, end_max = _resident_mb()
        peak = max(self.sampled, current, end_max if end_max > self.start_max else self.start)
        self.peak_mb = peak - self.start


def _timed(step, args, fetch=True):
    """`(seconds, outputs as numpy)` of one call, waiting for its results.

    `fetch=False` only waits for them on an accelerator (`wait_for`; outputs None): the time of the call,
    not of copying its outputs to the host.
    """
    start = time.perf_counter()
    outputs = block(step(*args)) if fetch else wait_for(step(*args))
    return time.perf_counter() - start, outputs


def baselines(case):
    """Names of the baseline steps that follow a case's measured step."""
    if case["entry"] == "train_step":
        return ["clip"]
    if case["entry"] in ("open_clip", "host_overhead"):
        return ["open_clip"]
    if case["entry"] in ("precision", "serving") and case["task"] != "matmul":
        return [f"open_clip_{precision}" for precision in case["peer_precisions"]]
    return []


def significant(seconds, digits=4):
    """`seconds` to `digits` significant digits: a fixed number of decimals would
    round a fast case (a small matmul on an AMX host takes tens of microseconds) to 0."""
    return float(f"{seconds:.{digits}g}")


def run_case(case):
    """Runs one case in this process; returns its measurements.

    A case is one step function, or that and its baselines (train_step:
    CLIP's step on the same towers; open_clip: open_clip's equivalent;
    precision: open_clip in float32 and in bfloat16). After a first call
    each, they run alternately `repeats` times, so that a load change on the
    machine hits all alike; each ratio (`vs_<baseline>`: time over the
    baseline's time) is the median over the repeats of the ratio of
    neighbouring calls. `compile_s` is the first call's time above the median
    (tracing and compilation). `peak_mb` is the peak resident memory of all
    the calls above the resident set once the inputs are built
    (`PeakMemory`): it is one framework's only in single-step cases. On an
    accelerator the repeats are timed until their results are ready on the
    device, and `device_peak_mb` is the same peak in accelerator memory
    (`DevicePeakMemory`).
    """
    if case["entry"] in CASE_COUNTS:  # figures counted, not timed
        return CASE_COUNTS[case["entry"]](case)
    if case["entry"] not in CASE_BUILDERS:
        raise ValueError(f"Unknown entry {case['entry']!r}; expected one of {ENTRIES}.")
    steps = CASE_BUILDERS[case["entry"]](case)
    # On the CPU the repeats copy their outputs too, as they always did, except a roofline matmul's: copying
    # (and on PyTorch converting bfloat16 to float32 for numpy) its N x N result took half its bfloat16 time.
    fetch = accelerator() is None and case.get("task") != "matmul"
    with PeakMemory() as memory, DevicePeakMemory() as device_memory:
        first = [_timed(step, args) for step, args in steps]
        times = [[] for _ in steps]
        for _ in range(case["repeats"]):
            for (step, args), record in zip(steps, times):
                record.append(_timed(step, args, fetch)[0])
    medians = [statistics.median(t) for t in times]
    result = {
        "first_call_s": round(first[0][0], 3),
        "compile_s": round(max(first[0][0] - medians[0], 0.0), 3),
        "median_s": significant(medians[0]),
        "peak_mb": round(memory.peak_mb, 1),
    }
    if device_memory.peak_mb is not None:
        result.update(device=accelerator(), device_peak_mb=round(device_memory.peak_mb, 1))
    for k, name in enumerate(baselines(case)[:len(steps) - 1], start=1):
        ratios = [a / b for a, b in zip(times[0], times[k])]
        result.update({
            f"{name}_median_s": significant(medians[k]),
            f"{name}_compile_s": round(max(first[k][0] - medians[k], 0.0), 3),
            f"vs_{name}": round(statistics.median(ratios), 3),
        })
    if case["entry"] in ("open_clip", "host_overhead", "precision") and len(steps) > 1:
        # Same weights and batch: the first outputs agree (to bfloat16 rounding in the precision runs).
        ours, theirs = (np.concatenate([np.ravel(x).astype(np.float32) for x in outputs]) for _, outputs in first[:2])
        result["max_abs_diff"] = float(np.max(np.abs(ours - theirs)))
    if case["entry"] in ("precision", "serving"):
        result["gflops"] = round(case["flops"] / medians[0] / 1e9, 1)
    if case["entry"] == "serving":  # each path's embeddings, and open_clip's bfloat16 ones, against its float32
        reference = first[1][1][0]
        result["cosine"] = round(smallest_cosine(first[0][1][0], reference), 6)
        if len(first) > 2:
            result["open_clip_bfloat16_cosine"] = round(smallest_cosine(first[2][1][0], reference), 6)
    return result


def run_planned(case, rows):
    """Runs a `--quick` run's precision or serving model case that its process plans (`bf16_plan`) from
    the roofline rows its launcher had (`case["plan_from"]`, `[backend, dtype, GFLOP/s]` each) and `rows`,
    this process's rows before it: the planned case's result and the plan's note, or `{"skipped": reason}`."""
    known = {(backend, dtype): gflops for backend, dtype, gflops in case["plan_from"]}
    planned, note = bf16_plan(without_plan(case), os.environ["KERAS_BACKEND"], {**known, **rooflines(rows)})
    if planned is None:
        return {"skipped": note}
    return dict(run_case(planned), **({"note": note} if note else {}))


def without_plan(case):
    """`case` without the roofline rows it is planned from in its process (`run_planned`)."""
    return {key: value for key, value in case.items() if key != "plan_from"}


def smallest_cosine(got, want):
    """The smallest cosine between matching rows of `got` and `want` `(B, D)`."""
    got, want = (np.asarray(a, np.float64) for a in (got, want))
    return float(np.min((got * want).sum(-1) / (np.linalg.norm(got, axis=-1) * np.linalg.norm(want, axis=-1))))


def transformer_flops(width, layers, tokens, mlp_width):
    """Forward FLOPs of a pre-LN transformer stack on one sequence (a multiply-add counts 2).

    Per block: the four `width x width` projections and the two MLP matrices
    (`2 tokens (4 width^2 + 2 width mlp_width)`), and the attention scores and
    their weighted sum (`4 tokens^2 width`). Norms, softmax and activations
    are left out (a few percent).
    """
    return layers * (2 * tokens * (4 * width**2 + 2 * width * mlp_width) + 4 * tokens**2 * width)


def open_clip_flops(config, task, batch_size):
    """Model FLOPs of `task` for an open_clip CLIP `config` and a batch: forward (x3 for a training step)."""
    v, t = config["vision_cfg"], config["text_cfg"]
    patches = (v["image_size"] // v["patch_size"]) ** 2
    width = v["width"]
    image = (2 * patches * 3 * v["patch_size"] ** 2 * width
             + transformer_flops(width, v["layers"], patches + 1, int(width * v.get("mlp_ratio", 4.0)))
             + 2 * width * config["embed_dim"])
    text = (transformer_flops(t["width"], t["layers"], t["context_length"], int(t["width"] * t.get("mlp_ratio", 4.0)))
            + 2 * t["width"] * config["embed_dim"])
    per_item = {"encode_image": image, "encode_text": text, "train_step": 3 * (image + text)}[task]
    return batch_size * per_item


def _loss_case(loss, batch_size, quick):
    """A loss case's shape and `num_chunks` (blocks of `LOSS_BLOCK_ROWS[loss]` rows of the batch, or None)."""
    shape = LOSS_SHAPES[loss]
    if quick:
        shape = {**shape, **{k: v for k, v in dict(P=16, T=12, K=4).items() if k in shape}}
    rows = LOSS_BLOCK_ROWS.get(loss)
    return dict(shape, num_chunks=None if rows is None else -(-batch_size // rows))


def cases(entries, quick, on_accelerator=False):
    """The cases of `entries`: tiny ones when `quick`, the accelerator's sizes when `on_accelerator`.

    A `--quick` run checks that every case runs and writes its rows, not its speed: each step is timed once
    after its first call (no extra repeats, except the roofline matmuls', milliseconds, whose rows plan the
    bfloat16 runs), and its plan asks no device (its sizes are the same everywhere, and it keeps the
    retained-host-memory run), so that it needs no probe process before its cases.
    """
    repeats = 1 if quick else 3

    def more(extra):  # the extra repeats of a full run's steadier figures
        return 0 if quick else extra

    for entry in entries:
        if entry == "open_clip":
            peer, batch_size = (TINY_OPEN_CLIP, 4) if quick else ("ViT-B-16-quickgelu", 16)
            for task in PEER_TASKS:
                common = dict(entry=entry, task=task, peer=peer, batch_size=batch_size)
                yield dict(common, repeats=repeats + more(0 if task == "train_step" else 2))
                # Each framework's memory alone: for images (the inference figure) and training; the smoke
                # run measures it for training only.
                if task == "train_step" or (task == "encode_image" and not quick):
                    yield dict(common, only="vlzoo", repeats=1)
                    yield dict(common, only="open_clip", repeats=1, once=True)
                if task == "train_step" and (quick or not on_accelerator):  # again, `retain_host_memory()` first
                    yield dict(common, repeats=repeats, retain_host_memory=True)
        elif entry == "host_overhead":
            for task in PEER_TASKS:
                yield dict(entry=entry, task=task, peer=DEEP_NARROW_CLIP, batch_size=16,
                           repeats=repeats + more(2 if task == "train_step" else 10))
        elif entry == "precision":
            size = 256 if quick else GPU_MATMUL_SIZE if on_accelerator else 2048
            for dtype in PRECISIONS:
                yield dict(entry=entry, task="matmul", N=size, dtype=dtype, flops=2 * size**3, repeats=repeats + 2)
            # The host's int8 roofline: PyTorch's own int8 product (int32 sums), which Keras' int8 does not reach.
            yield dict(entry=entry, task="matmul", N=size, dtype="int8", flops=2 * size**3, repeats=repeats + 2,
                       backends=("torch",))
            for flags in ([] if quick or on_accelerator else JAX_CPU_FLAGS):
                yield dict(entry=entry, task="matmul", N=size, dtype="bfloat16", flops=2 * size**3,
                           repeats=repeats + 2, xla_flags=flags, backends=("jax",))
            peer, batch_size = (TINY_OPEN_CLIP, 4) if quick else ("ViT-B-16-quickgelu", 16)
            config = peer if isinstance(peer, dict) else _open_clip_config(peer)
            for task, policies in PRECISION_TASKS.items():
                for dtype in policies:
                    yield dict(entry=entry, task=task, dtype=dtype, peer=peer, batch_size=batch_size,
                               peer_precisions=list(PRECISIONS), flops=open_clip_flops(config, task, batch_size),
                               repeats=repeats + more(0 if task == "train_step" else 2))
        elif entry == "serving":
            peer, batch_size = (TINY_OPEN_CLIP, 4) if quick else ("ViT-B-16-quickgelu", 16)
            for path in SERVING_PATHS:
                exported = path.startswith("onnx")  # ONNX Runtime's speed: the exporting backend is no matter
                yield dict(entry=entry, task="serve_image", path=path, dtype="bfloat16" if path == "bfloat16" else
                           "float32", peer=peer, batch_size=batch_size, peer_precisions=list(PRECISIONS),
                           flops=open_clip_flops(_open_clip_config(peer) if isinstance(peer, str) else peer,
                                                 "encode_image", batch_size),
                           repeats=repeats + more(2), **(dict(backends=EXPORTERS, once=True) if exported else {}))
        elif entry == "filip_loss":
            size = dict(B=8, P=16, T=12, D=32) if quick else dict(B=256, P=196, T=77, D=256)
            for num_chunks in (None, 2) if quick else (None, 16, 32):  # blocks of 4; of 16 and 8 captions
                yield dict(entry=entry, num_chunks=num_chunks, repeats=repeats, **size)
        elif entry == "train_step":
            towers, batch_size = ("clip_tiny", 4) if quick else ("clip_vit_b16", 8)
            for family in STEP_FAMILIES[1:]:
                yield dict(entry=entry, family=family, towers=towers, batch_size=batch_size, repeats=repeats + more(2))
        elif entry == "loss_memory":
            for loss in MEMORY_LOSSES:
                for b in (8, 16) if quick else (32, 64, 128, 256):
                    yield dict(entry=entry, loss=loss, B=b, repeats=1, **_loss_case(loss, b, quick))  # one timed call
        elif entry == "share_memory":
            for loss in SHARE_LOSSES:
                for local in (4,) if quick else (16, 64):
                    for replicas in WORLD_SIZES[:2] if quick else WORLD_SIZES:
                        yield dict(entry=entry, loss=loss, B=replicas * local, replicas=replicas, repeats=1,
                                   backends=("torch",), **_loss_case(loss, replicas * local, quick))
        elif entry == "exchange":
            towers, local = ("clip_tiny", 4) if quick else ("clip_vit_b16", 32)
            for family in EXCHANGE_FAMILIES[:2] if quick else EXCHANGE_FAMILIES:
                yield dict(entry=entry, family=family, towers=towers, batch_size=local, backends=("torch",),
                           world_sizes=EXCHANGE_WORLD_SIZES[:1] if quick else EXCHANGE_WORLD_SIZES)
        elif entry == "grad_caching":
            towers, micro = ("clip_tiny", 2) if quick else ("clip_vit_b16", 64 if on_accelerator else 8)
            sizes = (4, 8) if quick else (64, 256, 1024, 4096) if on_accelerator else (16, 32, 64)
            for n in sizes:
                for m in (None, micro):
                    if m is None and on_accelerator and n > 1024:
                        continue  # the whole batch's activations at once: past any one accelerator's memory
                    if m is None or m < n:
                        yield dict(entry=entry, towers=towers, batch_size=n, micro_batch_size=m, repeats=1)
        elif entry == "distributed":
            towers, batch_size = ("clip_tiny", 8) if quick else ("clip_vit_b16", 16)
            for processes in (1, 2):
                yield dict(entry=entry, towers=towers, batch_size=batch_size, processes=processes, repeats=repeats,
                           backends=("torch",), once=True)
        elif entry == "stair_pool":
            size = dict(B=4, S=17, V=512, D=32) if quick else dict(B=64, S=197, V=30522, D=768)
            for chunks in (None, 4 if quick else 16):
                yield dict(entry=entry, num_chunks=chunks, repeats=repeats, **size)


def _open_clip_config(name):
    from vlzoo.convert.checkpoints import open_clip_model_config

    return open_clip_model_config(name)


def _backend_env(backend):
    """A `backend` process's environment; JAX takes GPU memory as needed (not 75% at start: open_clip's too)."""
    return dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3",
                XLA_PYTHON_CLIENT_PREALLOCATE=os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "false"))


def accelerators(backends):
    """`{backend: accelerator name or None}`, each read in a fresh process of that backend (`accelerator`)."""
    found = {}
    for backend in backends:
        proc = subprocess.run([sys.executable, __file__, "--accelerator"], env=_backend_env(backend),
                              capture_output=True, text=True, timeout=600)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("ACCELERATOR ")]
        if not lines:
            raise RuntimeError(f"Could not ask the {backend} backend for its device: {proc.stderr.strip()[-2000:]}")
        found[backend] = json.loads(lines[-1][len("ACCELERATOR "):])
    return found


def run_in_subprocess(cases, backend, timeout, devices=None):
    """Runs `cases` (a list) one after another in one fresh process of `backend`: their results, in order.

    `timeout` is per case. A case that fails, and those after it, get `{"error": [line]}`: the
    exception's line in the process's output, else its last line. With a dict `devices`, the process
    also says which device it computes on (`accelerator`, as a probe process would), written to
    `devices[backend]` (a `--quick` run's probe).
    """
    env = _backend_env(backend)
    flags = {case.get("xla_flags") for case in cases} - {None}
    if flags:
        (flag,) = flags  # process-wide: cases with XLA flags run alone (`shares_process`)
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flag).strip()
    proc = subprocess.run(
        [sys.executable, __file__, "--cases", json.dumps(cases)] + (["--accelerator"] if devices is not None else []),
        env=env, capture_output=True, text=True, timeout=timeout * len(cases),
    )
    found = [line for line in proc.stdout.splitlines() if line.startswith("ACCELERATOR ")]
    if devices is not None and found:
        devices[backend] = json.loads(found[-1][len("ACCELERATOR "):])
    results = [json.loads(line[len("RESULT "):]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    # The exception's own line (Keras adds its call context after it), else the last line.
    raised = [line for line in lines if re.match(r"[\w.]*(Error|Exception)\b", line)]
    error = {"error": (raised or lines)[-1:]}
    return results + [error] * (len(cases) - len(results))


def case_backends(case, backends):
    """The backends of `backends` that run `case`: those its `backends` allow (all by default), and of
    them only the first when it is marked `once` (open_clip alone, ONNX Runtime: no Keras backend's
    speed; the first in the case's own order when it has one)."""
    allowed = [backend for backend in case.get("backends", backends) if backend in backends]
    return allowed[:1] if case.get("once") else allowed


def shares_process(case, other):
    """Whether a `--quick` run may run `other` in the process that runs `case` (the case before it there).

    The smoke run starts one process per backend and run of consecutive cases rather than one
    per case (seconds of imports each); their peak memory and times are then not theirs alone,
    which is not what a smoke run checks. Cases with XLA flags (process-wide, read at start) still
    get a process of their own. Retained host memory is set first in a process that runs a case
    asking for it (before any computation, as its case needs), so the smoke run's other cases in
    that process run with it too: it changes where freed memory goes, not what they compute. A case
    of several processes joins a process group that stays for the rest of its process: no case
    follows it there.
    """
    def flags(c):
        return bool(c.get("xla_flags"))

    return (case["backend"] == other["backend"] and not flags(case) and not flags(other)
            and case.get("processes", 1) == 1)


def write_text(path, text):
    """Writes `text` to `path`, creating its directory."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def write_markdown(path, results):
    """`results` into the Markdown page `path` (`bench_report.render_into`: its marked section only)."""
    existing = open(path).read() if os.path.isfile(path) else None
    write_text(path, render_into(existing, results))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", nargs="+", default=list(ENTRIES), choices=ENTRIES)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks that every entry runs")
    parser.add_argument("--out", default="out/bench", help="directory for bench.json and bench.md")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per case")
    parser.add_argument("--markdown", metavar="PATH",
                        help="also write the results into the Markdown page PATH (between its marked lines, "
                        "or as a whole page)")
    parser.add_argument("--from-json", metavar="BENCH_JSON",
                        help="run nothing: render this bench.json (to --markdown PATH, or print it)")
    parser.add_argument("--cases", help=argparse.SUPPRESS)
    parser.add_argument("--accelerator", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # This process only plans and reports (each case runs in a process of its own backend), but it imports Keras,
    # whose default backend, TensorFlow, a GPU machine may lack: default to the first backend asked for.
    os.environ.setdefault("KERAS_BACKEND", args.backends[0])
    if args.accelerator and not args.cases:
        import vlzoo  # noqa: F401  (as in a case's process)

        print("ACCELERATOR " + json.dumps(accelerator()), flush=True)
        return 0
    if args.from_json:
        with open(args.from_json) as f:
            results = json.load(f)
        if args.markdown:
            write_markdown(args.markdown, results)
        else:
            print(page(results), end="")
        return 0
    if args.cases:
        import vlzoo  # first, as in a user's program: it sets TensorFlow's CPU defaults

        cases_here = json.loads(args.cases)
        if any(case.get("retain_host_memory") for case in cases_here):  # before the first computation
            vlzoo.training.retain_host_memory()
        if args.accelerator:  # the probe's answer first (`run_in_subprocess(devices=...)`)
            print("ACCELERATOR " + json.dumps(accelerator()), flush=True)
        here = []  # this process's rows so far, whose roofline matmuls the cases planned here read
        for case in cases_here:
            result = run_planned(case, here) if "plan_from" in case else run_case(case)
            here.append(dict(case, backend=os.environ["KERAS_BACKEND"], result=result))
            print("RESULT " + json.dumps(result), flush=True)
        return 0
    from vlzoo.host import describe_host  # imports Keras and its backend: not for --from-json

    # A --quick run's plan asks no device (`cases`): the first process of each backend says which it computes on.
    found = {} if args.quick else accelerators(args.backends)
    host = describe_host()

    def machine():
        if any(found.values()):
            on = ", ".join(f"{found[b]} ({b})" for b in args.backends if b in found)
            return f"{on}; host: {host}"
        return host

    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = []
    todo = [(case, backend) for case in cases(args.entries, args.quick, any(found.values()))
            for backend in case_backends(case, args.backends)]
    # (row, case) waiting for their process: one case, or a --quick run of several; a skipped row (case None)
    # waits with them to keep its place among the rows.
    pending = []
    results = {"machine": machine(), "accelerators": found, "date": started, "rows": rows}
    os.makedirs(args.out, exist_ok=True)

    def run_pending():  # then bench.json as it stands, which a run stopped before its end leaves behind
        measured = [(row, case) for row, case in pending if case is not None]
        if measured:
            backend = measured[0][0]["backend"]
            done = iter(run_in_subprocess([case for _, case in measured], backend, args.timeout,
                                          devices=found if args.quick and backend not in found else None))
            for row, case in pending:
                if case is not None and "plan_from" in case:  # planned in its process: the same plan here, from
                    # the same rows (those before it, this process's now among them)
                    planned, note = bf16_plan(without_plan(case), row["backend"], rooflines(rows))
                    row.update(planned or {}, result={"note": note} if note and planned else {})
                if case is not None:
                    row["result"] = dict(next(done), **row["result"])
                    print(f"    {row['entry']} {row['backend']}: {row['result']}", flush=True)
                rows.append(row)
        else:
            rows.extend(row for row, _ in pending)
        pending.clear()
        results.update(machine=machine(), accelerators={b: found[b] for b in args.backends if b in found})
        write_text(os.path.join(args.out, "bench.json"), json.dumps(results, indent=2))

    def last_measured():  # the row of the last case waiting for its process, None if none
        return next((row for row, case in reversed(pending) if case is not None), None)

    for i, (case, backend) in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {case['entry']} {backend}: {describe(case)} ...", flush=True)
        note = None
        if case["entry"] in ("precision", "serving") and case["task"] != "matmul":
            if any(c is not None and c.get("task") == "matmul" for _, c in pending):
                # The plan reads the matmul rows, which run first: a --quick run's process that runs them plans
                # the case itself, once they have run there (`run_planned`), from the rows here now and its own.
                if args.quick and shares_process(last_measured(), dict(case, backend=backend)):
                    pending.append((dict(case, backend=backend, result={}),
                                    dict(case, plan_from=[[*key, gflops] for key, gflops in rooflines(rows).items()])))
                    continue
                run_pending()
            case, note = bf16_plan(case, backend, rooflines(rows))
        row = dict(case or todo[i - 1][0], backend=backend, result={"note": note} if note else {})
        if case is None:
            print(f"    skipped: {note}", flush=True)
            pending.append((dict(row, result={"skipped": note}), None))  # a --quick run's process goes on
            if not args.quick:
                run_pending()
            continue
        if last_measured() and not shares_process(last_measured(), row):
            run_pending()
        pending.append((row, case))
        if not args.quick:  # a fresh process per case
            run_pending()
    run_pending()
    table = markdown(rows, results["machine"])
    write_text(os.path.join(args.out, "bench.md"), table)
    if args.markdown:
        write_markdown(args.markdown, results)
    print(table)
    if not_run(rows):
        print(not_run(rows))
    return 1 if any("error" in row["result"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
