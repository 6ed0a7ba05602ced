"""The GPU checks (step time against open_clip, GPU busy share, MFU, bfloat16 attention), which `make bench`
does not run there: `python tools/bench_gpu.py --out DIR`.

Each backend runs in a fresh process of its own (PyTorch, then JAX), case after case, each
result printed as it comes and kept in `DIR/gpu_<backend>.json` (a failing case records its
traceback; the next still runs). ViT-B/16 (open_clip's `ViT-B-16-quickgelu`, random init,
converted to vlzoo), timed as `tools/bench.py` times it (`bench.run_case`: alternated with
open_clip's, results waited for on the device):

- PyTorch: the GPU's busy share of vlzoo's and open_clip's `mixed_bfloat16` / autocast step at
  batch 16 (`torch.profiler`'s kernel time over the wall time); the training step against
  open_clip with autocast at batch 16 and 128; eager `encode_image`, `encode_text` and
  `predict_*` in float32 at batch 16; `encode_image` in bfloat16; the float32 step at batch 16.
- JAX: attention forward and backward in bfloat16 through cuDNN on padded inputs
  (`vlzoo._backends.jax.kernels.padded_attention`) against XLA's (256 x 197 tokens x 12 heads; 256 x 77
  causal tokens x 8 heads); the `mixed_bfloat16` step at batch 256 with that attention (its model
  FLOP/s over the H100 SXM's dense bfloat16 peak, 989 TFLOP/s: MFU) and with XLA's; the step at
  batch 16; eager `encode_image` in float32 and bfloat16.

`--quick` runs every case on a tiny model and batches, on any device (a smoke run). On a lent
device machine, where Keras and open_clip travel as wheels: docs/benchmarks.md, *Running the
GPU checks*.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

import bench

PEAK_BF16_TFLOPS = 989  # the H100 SXM's dense bfloat16 peak: MFU's denominator
ATTENTION_SHAPES = {"vision_197": (256, 197, 12, False), "text_77": (256, 77, 8, True)}  # (B, N, heads, causal)


def _cases(backend, quick):
    """`[(name, case)]` of `backend`'s run; a case of None is the attention probe."""
    peer = bench.TINY_OPEN_CLIP if quick else "ViT-B-16-quickgelu"
    config = peer if quick else bench._open_clip_config(peer)

    def precision(task, dtype, batch, peers, repeats):
        batch = 4 if quick else batch
        return dict(entry="precision", task=task, dtype=dtype, peer=peer, batch_size=batch, peer_precisions=peers,
                    flops=bench.open_clip_flops(config, task, batch), repeats=repeats)

    def plain(task, repeats=20):
        return dict(entry="open_clip", task=task, peer=peer, batch_size=4 if quick else 16, repeats=repeats)

    if backend == "torch":
        return [
            ("busy_b16", precision("train_step", "mixed_bfloat16", 16, ["bfloat16"], 0)),
            ("train_b16_amp", precision("train_step", "mixed_bfloat16", 16, ["bfloat16"], 12)),
            ("train_b128_amp", precision("train_step", "mixed_bfloat16", 128, ["bfloat16"], 6)),
            ("encode_image_f32", plain("encode_image")),
            ("encode_text_f32", plain("encode_text")),
            ("predict_images_f32", plain("predict_images")),
            ("predict_texts_f32", plain("predict_texts")),
            ("encode_image_bf16", precision("encode_image", "bfloat16", 16, ["float32", "bfloat16"], 20)),
            ("train_b16_f32", plain("train_step", repeats=12)),
        ]
    return [
        ("attention", None),
        ("train_b256_amp", precision("train_step", "mixed_bfloat16", 256, ["bfloat16"], 6)),
        ("train_b256_amp_xla_attention", precision("train_step", "mixed_bfloat16", 256, [], 6)),
        ("train_b16_amp", precision("train_step", "mixed_bfloat16", 16, ["bfloat16"], 10)),
        ("encode_image_f32", plain("encode_image")),
        ("encode_image_bf16", precision("encode_image", "bfloat16", 16, ["float32", "bfloat16"], 20)),
    ]


def attention_times(quick):
    """Median ms of 20 forward + backward passes of bfloat16 attention, XLA's against padded cuDNN's."""
    import jax
    import jax.numpy as jnp

    from vlzoo._backends.jax import kernels as _jax

    on_gpu = jax.devices()[0].platform == "gpu"
    results = {}
    for name, (batch, length, heads, causal) in ATTENTION_SHAPES.items():
        keys = jax.random.split(jax.random.PRNGKey(0), 4)
        q, k, v, w = (jax.random.normal(key, (2 if quick else batch, length, heads, 64), jnp.bfloat16) for key in keys)
        for route in ("xla", "padded_cudnn"):
            def loss(q, k, v, route=route):
                if route == "xla":
                    out = jax.nn.dot_product_attention(q, k, v, scale=0.125, is_causal=causal, implementation="xla")
                else:
                    out = _jax.padded_attention(q, k, v, 0.125, is_causal=causal,
                                                implementation="cudnn" if on_gpu else "xla")
                return jnp.sum(out.astype(jnp.float32) * w.astype(jnp.float32))

            step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
            value, _ = jax.block_until_ready(step(q, k, v))
            times = []
            for _ in range(20):
                start = time.perf_counter()
                jax.block_until_ready(step(q, k, v))
                times.append(time.perf_counter() - start)
            results[f"{name}_{route}_ms"] = round(1e3 * sorted(times)[10], 3)
            results[f"{name}_{route}_loss"] = float(value)
    return results


def busy_share(case):
    """Per side (vlzoo, open_clip with autocast): wall ms, CUDA kernel ms and their ratio over 5 profiled steps."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from bench_steps import CASE_BUILDERS

    found = {}
    for side, (step, args) in zip(("vlzoo", "open_clip_autocast"), CASE_BUILDERS[case["entry"]](case)):
        for _ in range(3):
            step(*args)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            for _ in range(5):
                step(*args)
            torch.cuda.synchronize()
            wall = (time.perf_counter() - start) / 5
        kernels = sum(event.self_device_time_total for event in prof.key_averages()) / 5 / 1e3
        found[side] = dict(wall_ms=round(1e3 * wall, 2), kernel_ms=round(kernels, 2),
                           busy_pct=round(100 * kernels / (1e3 * wall), 1))
    return found


def run_backend(backend, out, quick):
    """Runs `backend`'s cases in this process (its Keras backend), writing `out/gpu_<backend>.json` after each."""
    import vlzoo  # noqa: F401  (first, as in a bench case's process)

    results = {"backend": backend, "device": bench.accelerator()}
    for name, case in _cases(backend, quick):
        start = time.time()
        try:
            if case is None:
                results[name] = attention_times(quick)
            elif name.startswith("busy"):
                results[name] = busy_share(case) if results["device"] else {"skipped": "no GPU"}
            else:
                if name.endswith("xla_attention"):  # the route vlzoo took before: Keras' attention, XLA's kernels
                    from vlzoo._backends.jax import kernels as _jax

                    _jax.padding_helps = lambda *args: False
                results[name] = bench.run_case(case)
                if "gflops" in results[name] and results["device"]:
                    results[name]["mfu_pct"] = round(100 * results[name]["gflops"] / (PEAK_BF16_TFLOPS * 1e3), 2)
        except Exception:
            results[name] = {"error": traceback.format_exc()[-3000:]}
        results[name]["wall_s"] = round(time.time() - start, 1)
        print(name, json.dumps(results[name]), flush=True)
        with open(os.path.join(out, f"gpu_{backend}.json"), "w") as f:
            json.dump(results, f, indent=1)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["torch", "jax"], choices=["torch", "jax"])
    parser.add_argument("--out", default="out/bench_gpu", help="directory for gpu_<backend>.json")
    parser.add_argument("--quick", action="store_true", help="tiny model and batches: checks that every case runs")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per backend")
    parser.add_argument("--run", choices=["torch", "jax"], help=argparse.SUPPRESS)  # one backend, in this process
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.run:
        return run_backend(args.run, args.out, args.quick)
    failed = 0
    for backend in args.backends:
        print(f"=== {backend} ===", flush=True)
        command = [sys.executable, __file__, "--run", backend, "--out", args.out] + (["--quick"] if args.quick else [])
        try:
            failed |= subprocess.run(command, env=bench._backend_env(backend), timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            print(f"{backend}: stopped after {args.timeout} s (the cases done are in {args.out})", flush=True)
            failed = 1
    return failed


if __name__ == "__main__":
    sys.exit(main())
