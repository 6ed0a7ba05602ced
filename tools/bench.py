"""vlzoo benchmarks: one subprocess per backend and case, medians after warm-up.

    python tools/bench.py                       # every entry, every backend
    python tools/bench.py --entries filip_loss --backends jax torch
    python tools/bench.py --quick               # tiny sizes (a smoke run, used by the tests)

Each case runs in a fresh process so that its peak memory (the process's
resident-set high-water mark, minus the mark after building the inputs)
belongs to it alone. Results go to `--out` as JSON and a Markdown table.

Entries:
  filip_loss   FILIP loss forward + backward at B=256, P=196, T=77, D=256,
               unchunked vs chunked (chunk 16, rematerialised): median time, peak memory.
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

ENTRIES = ("filip_loss",)
BACKENDS = ("jax", "tensorflow", "torch")


def _rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _grad_fn(loss, num_args):
    """`f(*arrays) -> (value, grads)` compiled by the active backend."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return jax.jit(jax.value_and_grad(loss, argnums=tuple(range(num_args))))
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=True)
        def step(*args):
            with tf.GradientTape() as tape:
                tape.watch(args)
                value = loss(*args)
            return value, tape.gradient(value, args)

        return step
    import torch

    def step(*args):
        args = [a.detach().requires_grad_(True) for a in args]
        value = loss(*args)
        return value, torch.autograd.grad(value, args)

    return step


def _block(result):
    import keras

    return [keras.ops.convert_to_numpy(x) for x in keras.tree.flatten(result)]


def run_case(case):
    """Runs one case in this process; returns its measurements."""
    import keras

    from vlzoo.losses import filip_loss

    if case["entry"] != "filip_loss":
        raise ValueError(f"Unknown entry {case['entry']!r}; expected one of {ENTRIES}.")
    b, p, t, d = case["B"], case["P"], case["T"], case["D"]
    rng = np.random.default_rng(0)
    image = keras.ops.convert_to_tensor(rng.normal(size=(b, p, d)).astype("float32"))
    text = keras.ops.convert_to_tensor(rng.normal(size=(b, t, d)).astype("float32"))
    lengths = rng.integers(5, t + 1, size=b)
    mask = keras.ops.convert_to_tensor(np.arange(t)[None] < lengths[:, None])
    chunk = case["chunk_size"]

    def loss(image_tokens, text_tokens):
        return filip_loss(image_tokens, text_tokens, mask, 100.0, chunk_size=chunk)

    step = _grad_fn(loss, 2)
    baseline = _rss_mb()
    start = time.perf_counter()
    _block(step(image, text))
    compile_s = time.perf_counter() - start
    times = []
    for _ in range(case["repeats"]):
        start = time.perf_counter()
        _block(step(image, text))
        times.append(time.perf_counter() - start)
    return {
        "first_call_s": round(compile_s, 3),
        "median_s": round(statistics.median(times), 4),
        "peak_mb": round(_rss_mb() - baseline, 1),
    }


def cases(entries, quick):
    size = dict(B=8, P=16, T=12, D=32) if quick else dict(B=256, P=196, T=77, D=256)
    repeats = 2 if quick else 3
    for entry in entries:
        if entry == "filip_loss":
            for chunk in (None, 4 if quick else 16):
                yield dict(entry=entry, chunk_size=chunk, repeats=repeats, **size)


def run_in_subprocess(case, backend, timeout):
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, __file__, "--case", json.dumps(case)],
        env=env, capture_output=True, text=True, timeout=timeout,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        return {"error": (proc.stderr or proc.stdout).strip().splitlines()[-1:]}
    return json.loads(lines[-1][len("RESULT "):])


def markdown(rows, machine):
    out = [f"Machine: {machine}", "", "| entry | backend | size | chunk | first call (s) | median (s) | peak memory (MB) |",
           "|---|---|---|---:|---:|---:|---:|"]
    for row in rows:
        r = row["result"]
        size = f"B={row['B']} P={row['P']} T={row['T']} D={row['D']}"
        if "error" in r:
            out.append(f"| {row['entry']} | {row['backend']} | {size} | {row['chunk_size'] or '-'} | error: {r['error']} | | |")
        else:
            out.append(
                f"| {row['entry']} | {row['backend']} | {size} | {row['chunk_size'] or '-'} | "
                f"{r['first_call_s']} | {r['median_s']} | {r['peak_mb']} |"
            )
    return "\n".join(out) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entries", nargs="+", default=list(ENTRIES), choices=ENTRIES)
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks that every entry runs")
    parser.add_argument("--out", default="out/bench", help="directory for bench.json and bench.md")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per case")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        print("RESULT " + json.dumps(run_case(json.loads(args.case))), flush=True)
        return 0
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.system()}"
    rows = []
    todo = [(case, backend) for case in cases(args.entries, args.quick) for backend in args.backends]
    for i, (case, backend) in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {case['entry']} {backend} chunk={case['chunk_size']} ...", flush=True)
        rows.append(dict(case, backend=backend, result=run_in_subprocess(case, backend, args.timeout)))
        print(f"    {rows[-1]['result']}", flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump({"machine": machine, "rows": rows}, f, indent=2)
    table = markdown(rows, machine)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(table)
    print(table)
    return 1 if any("error" in row["result"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
