"""Report tables of tools/bench.py: `bench.json` rows rendered as Markdown.

    python tools/bench.py --from-json out/bench/bench.json --markdown docs/benchmarks.md

`markdown(rows, machine)` is the table that `tools/bench.py` prints and writes to `bench.md`;
`page(results)` is a whole Markdown page of one `bench.json` (`{"machine": ..., "date": ..., "rows":
[...]}`), and `render_into(text, results)` rewrites only the marked section of an existing page (how
`make bench` keeps `docs/benchmarks.md`'s latest run current under its hand-written prose).
A run on an accelerator (`bench.json`'s `accelerators`) shows each case's peak accelerator memory
(`device_peak_mb`) in place of the host's and goes to the page's own marked section
(`GPU_SECTION_BEGIN` / `GPU_SECTION_END`), so the CPU run's section stays.
`bf16_plan` reads the measured matmul rooflines (`rooflines`) to decide which bfloat16 runs are worth
running. Nothing here runs a benchmark or imports a framework.
"""

# Throughput targets on the CPU machine, as vlzoo's images/s over open_clip's, per (task, backend).
PEER_TARGETS = {"train_step": {"jax": 1.0, "tensorflow": 0.9, "torch": 0.9}}
INFERENCE_TARGET = 0.95
BF16_ROOFLINE_TARGET = 0.5  # serving: vlzoo's best bfloat16 path at half the host's bfloat16 matmul rate
BF16_COSINE = 0.999  # ... at this cosine to open_clip's float32 embeddings
HOST_OVERHEAD_TARGET = 1.3  # host_overhead on PyTorch: vlzoo's time within 1.3x open_clip's
# The serving entry's target: the best vlzoo path's embeddings/s over open_clip float32's, at a smallest
# cosine to open_clip's float32 embeddings of at least SERVING_COSINE (on a CPU with AVX-512 BF16).
SERVING_TARGET, SERVING_COSINE = 4.0, 0.99


# A framework whose bfloat16 matmul runs below this share of its float32 speed (a CPU without
# AVX512-BF16 or AMX: PyTorch's falls back to a kernel at ~1 GFLOP/s) gets no bfloat16 model runs.
BF16_USABLE = 0.1


def bf16_plan(case, backend, roofline):
    """`(case to run, reason)` for a precision model case given the measured matmul rooflines.

    open_clip runs in PyTorch whatever the Keras backend: its bfloat16 run is dropped when
    PyTorch's bfloat16 matmul is unusable; the case is skipped (None) when vlzoo's own backend's is.
    """
    def unusable(framework):
        f32, bf16 = roofline.get((framework, "float32")), roofline.get((framework, "bfloat16"))
        if f32 and bf16 is not None and bf16 < BF16_USABLE * f32:
            return f"{framework}'s bfloat16 matmul runs at {bf16} GFLOP/s against {f32} in float32"
        return None

    if case["dtype"] != "float32" and unusable(backend):
        return None, unusable(backend)
    reason = unusable("torch")
    if reason and "bfloat16" in case["peer_precisions"]:
        return dict(case, peer_precisions=[p for p in case["peer_precisions"] if p != "bfloat16"]), reason
    return case, None


def _dims(row):
    """A loss case's dimensions, e.g. `P=196, T=77, D=256`."""
    return ", ".join(f"{k}={row[k]}" for k in ("P", "T", "K", "M", "D") if k in row)


def _chunk(row):
    """Rows per block of a loss case chunked in `num_chunks` blocks of its batch `B`; `-` for one block."""
    return "-" if row["num_chunks"] is None else -(-row["B"] // row["num_chunks"])


def describe(row):
    """Short human label of a case."""
    if row["entry"] == "open_clip":
        peer = row["peer"] if isinstance(row["peer"], str) else "tiny CLIP"
        return (f"{row['task']}, {peer}, batch {row['batch_size']}" + (f", {row['only']} alone" if "only" in row else "")
                + (", host memory retained" if row.get("retain_host_memory") else ""))
    if row["entry"] == "filip_loss":
        return f"B={row['B']} P={row['P']} T={row['T']} D={row['D']}, chunk {_chunk(row)}"
    if row["entry"] in ("loss_memory", "share_memory"):
        share = f"one of {row['replicas']} replicas' share, " if row["entry"] == "share_memory" else ""
        return f"{row['loss']} loss, {share}B={row['B']} ({_dims(row)}), chunk {_chunk(row)}"
    if row["entry"] == "host_overhead":
        return f"{row['task']}, 12 + 12 blocks of width 32, batch {row['batch_size']}"
    if row["entry"] == "exchange":
        return f"{row['family']} on {row['towers']} towers, local batch {row['batch_size']}"
    if row["entry"] == "precision":
        if row["task"] == "matmul":
            return f"matmul {row['N']}x{row['N']}, {row['dtype']}" + (f", {row['xla_flags']}" if row.get("xla_flags") else "")
        return f"{row['task']}, {row['peer'] if isinstance(row['peer'], str) else 'tiny CLIP'}, batch " \
               f"{row['batch_size']}, vlzoo {row['dtype']}"
    if row["entry"] == "serving":
        peer = row["peer"] if isinstance(row["peer"], str) else "tiny CLIP"
        return f"image embeddings, {peer}, batch {row['batch_size']}, {row['path']}"
    if row["entry"] == "distributed":
        return (f"clip on {row['towers']} towers, global batch {row['batch_size']}, {row['processes']} "
                f"process{'es' if row['processes'] > 1 else ''} x {row['batch_size'] // row['processes']}")
    if row["entry"] == "stair_pool":
        return f"B={row['B']} S={row['S']} V={row['V']} D={row['D']}, chunks {row['num_chunks'] or '-'}"
    if row["entry"] == "grad_caching":
        return (f"clip on {row['towers']} towers, contrastive batch {row['batch_size']}, "
                f"micro-batch {row['micro_batch_size'] or '-'}")
    return f"{row['family']} on {row['towers']} towers, batch {row['batch_size']}"


def peak_mb(result):
    """A case's peak memory in MB: the accelerator's where it ran on one, else the host's ("" if unmeasured)."""
    return result.get("device_peak_mb", result.get("peak_mb", ""))


def memory_kind(rows):
    """`"accelerator "` when the rows' peak memory is the accelerator's (`peak_mb`), else `""`: for the headers."""
    return "accelerator " if any("device_peak_mb" in row["result"] for row in rows) else ""


def peer_target(task, backend):
    """vlzoo's required throughput over open_clip's for `task` on `backend` (the CPU targets)."""
    return PEER_TARGETS.get(task, {}).get(backend, INFERENCE_TARGET)


def open_clip_table(rows):
    """Markdown rows of the open_clip comparison: throughput, ratio, compile time, memory, agreement."""
    paired = [row for row in rows if row["entry"] == "open_clip" and "only" not in row]
    if not paired:
        return []
    # Keyed by (task, framework, backend); open_clip alone ran once, whatever the Keras backend.
    alone = {(row["task"], row["only"], row["backend"] if row["only"] == "vlzoo" else None): row["result"]
             for row in rows if row["entry"] == "open_clip" and "only" in row}
    out = ["| task | backend | vlzoo items/s | open_clip items/s | vlzoo / open_clip | target | compile (s) "
           f"| peak {memory_kind(rows)}MB: vlzoo | open_clip | max abs diff |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in paired:
        r, b = row["result"], row["batch_size"]
        retained = row.get("retain_host_memory", False)
        task = row["task"] + (" (host memory retained)" if retained else "")
        if "error" in r:
            out.append(f"| {task} | {row['backend']} | error: {r['error']} | | | | | | | |")
            continue
        # Memory alone was measured with the default allocator settings only.
        memory = [peak_mb(alone.get((row["task"], side, key), {})) if not retained else ""
                  for side, key in (("vlzoo", row["backend"]), ("open_clip", None))]
        ratio = 1 / r["vs_open_clip"]
        target = peer_target(row["task"], row["backend"])
        out.append(
            f"| {task} | {row['backend']} | {b / r['median_s']:.2f} | {b / r['open_clip_median_s']:.2f} "
            f"| {ratio:.2f}x {'(met)' if ratio >= target else '(short)'} | {target}x | {r['compile_s']} "
            f"| {memory[0]} | {memory[1]} | {r['max_abs_diff']:.1e} |"
        )
    return out + [""]


def memory_table(rows):
    """Markdown rows of `loss_memory`: peak MB per loss and backend (rows) against batch size (columns)."""
    memory = [row for row in rows if row["entry"] == "loss_memory" and "error" not in row["result"]]
    sizes = sorted({row["B"] for row in memory})
    if not memory:
        return []
    out = [f"| loss (forward + backward), peak {memory_kind(memory)}memory | backend | "
           + " | ".join(f"B={b}" for b in sizes) + " |",
           "|---|---|" + "---:|" * len(sizes)]
    for key in dict.fromkeys((row["loss"], row["backend"]) for row in memory):
        peaks = {row["B"]: peak_mb(row["result"]) for row in memory if (row["loss"], row["backend"]) == key}
        first = next(row for row in memory if (row["loss"], row["backend"]) == key)
        label = describe(first).replace(f", B={first['B']}", "")
        out.append(f"| {label} | {key[1]} | " + " | ".join(f"{peaks.get(b, '')} MB" for b in sizes) + " |")
    return out + [""]


def rooflines(rows):
    """`{(backend, dtype): GFLOP/s}` of the plain matmul rows (no XLA flags) that ran among `rows`."""
    return {(row["backend"], row["dtype"]): row["result"]["gflops"] for row in rows
            if row["entry"] == "precision" and row["task"] == "matmul" and not row.get("xla_flags")
            and "gflops" in row["result"]}


def host_rooflines(rows):
    """`{dtype: GFLOP/s}`: the host's roofline per dtype, the fastest plain matmul in that dtype over the backends."""
    best = {}
    for (_, dtype), gflops in rooflines(rows).items():
        best[dtype] = max(best.get(dtype, 0.0), gflops)
    return best


# The dtype of a serving path's matrix products, whose host roofline its share is taken of.
SERVING_PRODUCT_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "int8": "int8", "onnx_float32": "float32",
                          "onnx_int8": "int8"}


def precision_table(rows):
    """Markdown rows of `precision`: the matmul roofline per backend and dtype, then vlzoo's encode_image
    and training step in each precision against open_clip in float32 and in bfloat16 (autocast)."""
    done = [row for row in rows if row["entry"] == "precision"]
    if not done:
        return []
    roofline = rooflines(done)
    out = ["| matmul (roofline) | backend | GFLOP/s |", "|---|---|---:|"]
    for row in (row for row in done if row["task"] == "matmul"):
        value = "error" if "error" in row["result"] else row["result"]["gflops"]
        out.append(f"| {describe(row)} | {row['backend']} | {value} |")
    out += ["", "| task | backend | vlzoo dtype | vlzoo items/s | GFLOP/s | % of matmul roofline "
                "| / open_clip float32 | / open_clip bfloat16 | max abs diff vs open_clip float32 |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for row in (row for row in done if row["task"] != "matmul"):
        r = row["result"]
        if "error" in r or "skipped" in r:
            what = f"error: {r['error']}" if "error" in r else f"not run: {r['skipped']}"
            out.append(f"| {row['task']} | {row['backend']} | {row['dtype']} | {what} | | | | | |")
            continue
        peak = roofline.get((row["backend"], "float32" if row["dtype"] == "float32" else "bfloat16"))
        share = f"{100 * r['gflops'] / peak:.0f}%" if peak else ""
        bf16 = f"{1 / r['vs_open_clip_bfloat16']:.2f}x" if "vs_open_clip_bfloat16" in r else "not run"
        out.append(
            f"| {row['task']} | {row['backend']} | {row['dtype']} | {row['batch_size'] / r['median_s']:.2f} "
            f"| {r['gflops']} | {share} | {1 / r['vs_open_clip_float32']:.2f}x | {bf16} | {r['max_abs_diff']:.1e} |"
        )
    return out + [""]


def serving_table(rows):
    """Markdown rows of `serving`: embeddings/s of each path against open_clip float32 and bfloat16 autocast
    measured beside it, the path's GFLOP/s and its share of the host's roofline for its products' dtype
    (`host_rooflines`, from the precision entry's matmul rows of the same run), the smallest cosine to
    open_clip float32's embeddings, the best path that keeps a cosine of `SERVING_COSINE` against
    `SERVING_TARGET`, and each backend's bfloat16 share against `BF16_ROOFLINE_TARGET`."""
    done = [row for row in rows if row["entry"] == "serving"]
    if not done:
        return []
    host = host_rooflines(rows)
    out = ["| path | backend | vlzoo embeddings/s | open_clip float32 /s | open_clip bf16 autocast /s "
           "| / open_clip float32 | / open_clip bf16 | GFLOP/s | % of host roofline | smallest cosine | compile (s) |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    best, peer_cosine, bf16_shares = None, [], {}
    for row in done:
        r, b = row["result"], row["batch_size"]
        path = ("ONNX Runtime " + row["path"][len("onnx_"):] + f" (exported from {row['backend']})"
                if row["path"].startswith("onnx") else row["path"])
        backend = "-" if row["path"].startswith("onnx") else row["backend"]
        if "error" in r or "skipped" in r:
            what = f"error: {r['error']}" if "error" in r else f"not run: {r['skipped']}"
            out.append(f"| {path} | {backend} | {what} | | | | | | | | |")
            continue
        bf16 = f"{b / r['open_clip_bfloat16_median_s']:.2f}" if "open_clip_bfloat16_median_s" in r else "not run"
        dtype = SERVING_PRODUCT_DTYPES[row["path"]]
        share = f"{100 * r['gflops'] / host[dtype]:.0f}% of {dtype}" if "gflops" in r and host.get(dtype) else ""
        vs_bf16 = f"{1 / r['vs_open_clip_bfloat16']:.2f}x" if "vs_open_clip_bfloat16" in r else ""
        ratio = 1 / r["vs_open_clip_float32"]
        out.append(f"| {path} | {backend} | {b / r['median_s']:.2f} | {b / r['open_clip_float32_median_s']:.2f} "
                   f"| {bf16} | {ratio:.2f}x | {vs_bf16} | {r.get('gflops', '')} | {share} | {r['cosine']:.4f} "
                   f"| {r['compile_s']} |")
        if dtype == "bfloat16" and share and r["cosine"] >= BF16_COSINE:
            bf16_shares[backend] = max(bf16_shares.get(backend, 0.0), r["gflops"] / host[dtype])
        if r["cosine"] >= SERVING_COSINE and (best is None or ratio > best[0]):
            best = (ratio, f"{path}{'' if backend == '-' else ' on ' + backend}")
        if "open_clip_bfloat16_cosine" in r:
            peer_cosine.append(r["open_clip_bfloat16_cosine"])
    out.append("")
    if best:
        met = "met" if best[0] >= SERVING_TARGET else "short"
        out.append(f"Best path with a cosine of at least {SERVING_COSINE}: {best[1]}, {best[0]:.2f}x open_clip "
                   f"float32 (target {SERVING_TARGET}x: {met}).")
    if bf16_shares:
        shares = ", ".join(f"{backend} {100 * share:.0f}% ({'met' if share >= BF16_ROOFLINE_TARGET else 'short'})"
                           for backend, share in bf16_shares.items())
        out.append(f"bfloat16 weights with a cosine of at least {BF16_COSINE}, share of the host's bfloat16 roofline "
                   f"(target {100 * BF16_ROOFLINE_TARGET:.0f}% on each backend): {shares}.")
    if peer_cosine:
        out.append(f"open_clip's bfloat16 autocast embeddings against its float32 ones: smallest cosine "
                   f"{min(peer_cosine):.4f}.")
    return out + [""]


def share_table(rows):
    """Markdown rows of `share_memory`: peak MB of one replica's share per loss, backend and local batch (rows)
    against the world size (columns)."""
    shares = [row for row in rows if row["entry"] == "share_memory" and "error" not in row["result"]]
    if not shares:
        return []
    sizes = sorted({row["replicas"] for row in shares})
    out = [f"| one replica's share of the loss (forward + backward), peak {memory_kind(shares)}memory | backend "
           "| local batch | " + " | ".join(f"W={w}" for w in sizes) + " |", "|---|---|---:|" + "---:|" * len(sizes)]
    for key in dict.fromkeys((row["loss"], row["backend"], row["B"] // row["replicas"]) for row in shares):
        group = [row for row in shares if (row["loss"], row["backend"], row["B"] // row["replicas"]) == key]
        peaks = {row["replicas"]: peak_mb(row["result"]) for row in group}
        label = f"{key[0]} loss ({_dims(group[0])}), chunk {_chunk(group[0])}"
        out.append(f"| {label} | {key[1]} | {key[2]} | " + " | ".join(f"{peaks.get(w, '')} MB" for w in sizes) + " |")
    return out + [""]


def host_overhead_table(rows):
    """Markdown rows of `host_overhead`: per task and backend, vlzoo's and open_clip's time per call, their ratio
    and, on PyTorch, the target ratio."""
    overhead = [row for row in rows if row["entry"] == "host_overhead"]
    if not overhead:
        return []
    out = ["| host overhead (12 + 12 blocks, width 32, batch 16) | backend | vlzoo ms | open_clip ms "
           "| vlzoo time / open_clip's | target |", "|---|---|---:|---:|---:|---:|"]
    for row in overhead:
        r = row["result"]
        if "error" in r:
            out.append(f"| {row['task']} | {row['backend']} | error: {r['error']} | | | |")
            continue
        ratio = r["vs_open_clip"]
        target = HOST_OVERHEAD_TARGET
        goal = f"{target}x {'(met)' if ratio <= target else '(short)'}" if row["backend"] == "torch" else ""
        out.append(f"| {row['task']} | {row['backend']} | {1e3 * r['median_s']:.1f} | "
                   f"{1e3 * r['open_clip_median_s']:.1f} | {ratio:.2f}x | {goal} |")
    return out + [""]


def exchange_table(rows):
    """Markdown rows of `exchange`: what one replica sends per step, per family (rows) and world size (columns)."""
    counted = [row for row in rows if row["entry"] == "exchange"]
    if not counted:
        return []
    sizes = sorted({w for row in counted for w in row["world_sizes"]})
    out = ["| sent by one replica per step (MB): outputs gathered + their gradients / with the weights' gradients "
           "| gathered kB per row | not gathered kB per row | "
           + " | ".join(f"W={w}" for w in sizes) + " |", "|---|---:|---:|" + "---:|" * len(sizes)]
    for row in counted:
        r = row["result"]
        if "error" in r:
            out.append(f"| {describe(row)} | error: {r['error']} | |" + " |" * len(sizes))
            continue
        cells = [f"{r[f'outputs_w{w}'] / 1e6:.2f} / {r[f'sent_w{w}'] / 1e6:.1f}" if f"sent_w{w}" in r else ""
                 for w in sizes]
        out.append(f"| {describe(row)} | {r['gathered_per_row'] / 1e3:.1f} | {r['local_per_row'] / 1e3:.1f} | "
                   + " | ".join(cells) + " |")
    return out + [""]


def markdown(rows, machine):
    out = ([f"Machine: {machine}", ""] + open_clip_table(rows) + host_overhead_table(rows)
           + precision_table(rows) + serving_table(rows) + memory_table(rows) + share_table(rows)
           + exchange_table(rows))
    others = [row for row in rows if row["entry"] not in ("open_clip", "host_overhead", "precision", "serving",
                                                          "share_memory", "exchange")]
    if others:
        out += [f"| entry | backend | case | first call (s) | median (s) | peak {memory_kind(others)}memory (MB) "
                "| CLIP median (s) | time / CLIP |",
                "|---|---|---|---:|---:|---:|---:|---:|"]
    for row in others:
        r = row["result"]
        head = f"| {row['entry']} | {row['backend']} | {describe(row)} |"
        if "error" in r:
            out.append(f"{head} error: {r['error']} | | | | |")
        else:
            out.append(f"{head} {r['first_call_s']} | {r['median_s']} | {peak_mb(r)} | "
                       f"{r.get('clip_median_s', '')} | {r.get('vs_clip', '')} |")
    return "\n".join(out) + "\n"


def not_run(rows):
    """The line naming the bfloat16 runs that were dropped and why, or None when every run ran."""
    notes = sorted({row["result"]["note"] for row in rows if "note" in row["result"]})
    if notes:
        return "Not run: open_clip's bfloat16 (autocast) steps, since " + "; ".join(notes)
    return None


# `docs/benchmarks.md` keeps its prose; the tool rewrites only what lies between these lines (a CPU
# run's, or an accelerator run's).
SECTION_BEGIN = "<!-- written by tools/bench.py from bench.json: begin -->"
SECTION_END = "<!-- written by tools/bench.py from bench.json: end -->"
GPU_SECTION_BEGIN = "<!-- written by tools/bench.py from an accelerator run's bench.json: begin -->"
GPU_SECTION_END = "<!-- written by tools/bench.py from an accelerator run's bench.json: end -->"


def markers(results):
    """`(begin, end)`: the marked lines of `results`' section, the accelerator run's when it ran on one."""
    if any((results.get("accelerators") or {}).values()):
        return GPU_SECTION_BEGIN, GPU_SECTION_END
    return SECTION_BEGIN, SECTION_END


def section(results):
    """The Markdown of one `bench.json`'s `results`: where and when it ran, the tables of `markdown`,
    and the runs that were not run (the same tables as `bench.md`)."""
    rows = results["rows"]
    errors = sum("error" in row["result"] for row in rows)
    when = f" on {results['date']}" if results.get("date") else ""
    out = [f"Written by `tools/bench.py` (`make bench`) from its `bench.json`{when}: "
           f"{len(rows)} cases" + (f", {errors} failed." if errors else "."), "",
           markdown(rows, results["machine"]).rstrip("\n")]
    note = not_run(rows)
    return "\n".join(out + (["", note] if note else [])) + "\n"


def page(results, title="vlzoo benchmarks"):
    """A whole Markdown page of one `bench.json`'s `results`: a title and `section`."""
    return f"# {title}\n\n" + section(results)


def render_into(text, results):
    """`text` (a Markdown page) with `section(results)` between its `markers(results)` (a CPU run's
    `SECTION_BEGIN` / `SECTION_END`, an accelerator run's `GPU_SECTION_BEGIN` / `GPU_SECTION_END`);
    the whole `page(results)` when `text` is None or has no such lines."""
    begin, end = markers(results)
    if text is None or begin not in text or end not in text:
        return page(results)
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    return f"{head}{begin}\n{section(results)}{end}{tail}"
