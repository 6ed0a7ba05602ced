"""The `vlzoo` command line: `list`, `info` and `demo`.

    vlzoo list [--family F]
    vlzoo info NAME
    vlzoo demo [--preset clip_tiny] [--steps N] [--epochs E] [--out DIR]

Also runs as `python -m vlzoo.cli ...`. The backend is Keras's: set
`KERAS_BACKEND=jax|tensorflow|torch`. Nothing is downloaded.

`demo` trains a tiny preset on a synthetic, deterministic "coloured shapes"
dataset (`vlzoo.data.shapes.classification`, generated in numpy) and prints
zero-shot classification accuracy and text-to-image retrieval R@1 on held-out
images before and after fine-tuning with `model.fit`, then saves the model with
`save_to_preset`, loads it back with `from_preset` and checks that the
similarities are unchanged.
"""

import argparse
import json
import math
import os
import sys
import time
import warnings

import numpy as np

# The demo's classes: 4 colours x 3 shapes of `vlzoo.data.shapes`.
DEMO_COLORS = ("red", "green", "blue", "yellow")
DEMO_SHAPES = ("circle", "square", "triangle")


def _format_metrics(metrics):
    return "  ".join(f"{k}={v:.3f}" for k, v in metrics.items())


# ---------------------------------------------------------------------- commands


def _format_params(n):
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    if n >= 1e3:
        return f"{n / 1e3:.1f}K"
    return str(n)


def cmd_list(args, out):
    import vlzoo

    rows = [("name", "family", "params", "weights")]
    for name in vlzoo.list_presets(family=args.family):
        info = vlzoo.preset_info(name)
        rows.append((
            name, str(info["family"]), f"{info['params']:,} ({_format_params(info['params'])})",
            "yes" if info["weights_available"] else "no",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for j, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip(), file=out)
        if j == 0:
            print("  ".join("-" * w for w in widths), file=out)
    return 0


def cmd_info(args, out):
    import vlzoo

    info = vlzoo.preset_info(args.name)
    print(json.dumps(info, indent=2), file=out)
    return 0


def _load(vlzoo, preset, out):
    """`vlzoo.from_preset(preset)`, printing its warnings as plain notes."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = vlzoo.from_preset(preset)
    for warning in caught:
        print(f"note: {warning.message}", file=out)
    return model


def _torch_threads(num_threads):
    """Sets torch's intra-op threads; returns the previous count (None off torch)."""
    import keras

    if keras.backend.backend() != "torch":
        return None
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    return previous


def cmd_demo(args, out):
    # The tiny model's ops are far too small to gain from intra-op threads, and on a
    # busy machine torch's thread pool makes each op 10-100x slower; run single-threaded.
    previous_threads = _torch_threads(1)
    try:
        return _demo(args, out)
    finally:
        if previous_threads is not None:
            _torch_threads(previous_threads)


def _demo(args, out):
    import keras

    import vlzoo
    from vlzoo.data import shapes

    start = time.perf_counter()
    backend = keras.backend.backend()
    print(f"vlzoo {vlzoo.__version__} demo | Keras {keras.__version__} | backend: {backend}", file=out)
    keras.utils.set_random_seed(args.seed)

    model = _load(vlzoo, args.preset, out)
    size = model.vision.image_size
    print(f"preset {args.preset!r}: {type(model).__name__}, {model.count_params():,} parameters, "
          f"{size} px", file=out)

    steps_per_epoch = max(1, math.ceil(args.steps / args.epochs))
    labels = shapes.class_names(DEMO_COLORS, DEMO_SHAPES)
    train_per_label = math.ceil(steps_per_epoch * args.batch_size / len(labels))
    train_data = shapes.classification(train_per_label, seed=args.seed, image_size=size,
                                       colors=DEMO_COLORS, shapes=DEMO_SHAPES)
    eval_data = shapes.classification(args.eval_per_label, seed=args.seed + 1, image_size=size,
                                      colors=DEMO_COLORS, shapes=DEMO_SHAPES)
    n_train = steps_per_epoch * args.batch_size
    print(f"data: {len(labels)} labels ({', '.join(labels)}); {n_train} training pairs, "
          f"{len(eval_data['images'])} held-out images", file=out)

    train = shapes.model_inputs(train_data["images"][:n_train], train_data["captions"][:n_train],
                                model.tokenizer, model.preprocessor)
    eval_pixels, eval_labels = model.preprocessor(eval_data["images"]), eval_data["labels"]

    before = shapes.zero_shot_metrics(model, eval_pixels, eval_labels, labels)
    print(f"before fine-tuning: {_format_metrics(before)}  (chance {1 / len(labels):.3f})", file=out)

    total_steps = steps_per_epoch * args.epochs
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, decay_steps=max(1, total_steps - total_steps // 10), alpha=0.05,
        warmup_target=args.learning_rate, warmup_steps=total_steps // 10,
    )
    model.compile(optimizer=keras.optimizers.AdamW(learning_rate=schedule, weight_decay=1e-4))
    print(f"fine-tuning: {args.epochs} epochs x {steps_per_epoch} steps, batch {args.batch_size}, "
          f"peak lr {args.learning_rate} (warm-up, cosine decay)", file=out)
    interactive = getattr(out, "isatty", lambda: False)()
    verbose = args.verbose if args.verbose is not None else (1 if interactive else 2)
    model.fit(train, batch_size=args.batch_size, epochs=args.epochs, shuffle=True, verbose=verbose)

    after = shapes.zero_shot_metrics(model, eval_pixels, eval_labels, labels)
    print(f"after fine-tuning:  {_format_metrics(after)}", file=out)

    preset_dir = os.path.abspath(args.out)
    model.save_to_preset(preset_dir)
    reloaded = _load(vlzoo, preset_dir, out)
    probe_pixels = eval_pixels[:16]
    probe_text = reloaded.tokenizer([f"a {label}" for label in labels])
    original = keras.ops.convert_to_numpy(model.similarity(probe_pixels, probe_text))
    again = keras.ops.convert_to_numpy(reloaded.similarity(probe_pixels, probe_text))
    diff = float(np.max(np.abs(original - again)))
    status = "OK" if diff <= 1e-5 else "MISMATCH"
    print(f"saved to {preset_dir}; reloaded similarity max abs diff: {diff:.3g} ({status})", file=out)
    print(f"demo finished in {time.perf_counter() - start:.1f} s on {backend}", file=out)
    return 0 if status == "OK" else 1


# ------------------------------------------------------------------------ parser


def build_parser():
    parser = argparse.ArgumentParser(
        prog="vlzoo",
        description="vlzoo: Keras 3 vision-language contrastive models (CLIP, SigLIP, ...). "
        "The backend is chosen by the KERAS_BACKEND environment variable (jax, tensorflow, torch).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("list", help="table of registered presets",
                       description="Print every registered preset: name, family, parameter count "
                       "(computed without allocating weights) and whether weights are bundled.")
    p.add_argument("--family", default=None, metavar="F",
                   help="only presets of this family, e.g. clip or siglip (default: all)")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("info", help="details of one preset",
                       description="Print vlzoo.preset_info(NAME) as JSON: name, family, params, "
                       "paper, weights_available, description, directory.")
    p.add_argument("name", metavar="NAME", help="a registered preset name or a preset directory")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser(
        "demo", help="fine-tune a tiny preset on synthetic coloured shapes (the `make demo` job)",
        description="Generate deterministic coloured-shape images with captions ('a red circle'), "
        "print zero-shot accuracy and text-to-image R@1 on held-out images, fine-tune with "
        "model.fit, print the metrics again, then save the model as a preset, reload it and "
        "check the similarities match. Seeded: the same run gives the same numbers.",
    )
    p.add_argument("--preset", default="clip_tiny",
                   help="tiny preset to train, clip_tiny or siglip_tiny (default: %(default)s)")
    p.add_argument("--steps", type=int, default=600,
                   help="total optimizer steps, split evenly across the epochs (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=6, help="training epochs (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=32, help="training batch size (default: %(default)s)")
    p.add_argument("--learning-rate", type=float, default=5e-3,
                   help="AdamW learning rate (default: %(default)s)")
    p.add_argument("--eval-per-label", type=int, default=8,
                   help="held-out images per label for the metrics (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed for data and weights (default: %(default)s)")
    p.add_argument("--verbose", type=int, default=None, choices=(0, 1, 2),
                   help="Keras fit verbosity: 0 silent, 1 progress bar, 2 one line per epoch "
                   "(default: 1 on a terminal, 2 when the output is redirected)")
    p.add_argument("--out", default=os.path.join("out", "demo_preset"), metavar="DIR",
                   help="directory the fine-tuned preset is saved to (default: %(default)s)")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv=None):
    """Entry point of the `vlzoo` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "steps", 1) < 1 or getattr(args, "epochs", 1) < 1:
        parser.error("--steps and --epochs must be at least 1")
    try:
        return args.func(args, sys.stdout)
    except (ValueError, FileNotFoundError) as error:
        print(f"vlzoo {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
