"""The `vlzoo` command line: `list`, `info` and `demo`.

    vlzoo list [--family F]
    vlzoo info NAME
    vlzoo demo [--preset clip_tiny] [--steps N] [--epochs E] [--out DIR]

Also runs as `python -m vlzoo.cli ...`. The backend is Keras's: set
`KERAS_BACKEND=jax|tensorflow|torch`. Nothing is downloaded.

`demo` trains a tiny preset on a synthetic, deterministic "coloured shapes"
dataset (generated in numpy) and prints zero-shot classification accuracy and
text-to-image retrieval R@1 on held-out images before and after fine-tuning
with `model.fit`, then saves the model with `save_to_preset`, loads it back
with `from_preset` and checks that the similarities are unchanged.
"""

import argparse
import json
import math
import os
import sys
import time
import warnings

import numpy as np

# ----------------------------------------------------------------------------- data

COLORS = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (40, 70, 220),
    "yellow": (235, 210, 40),
}
SHAPES = ("circle", "square", "triangle")
LABELS = tuple(f"{color} {shape}" for color in COLORS for shape in SHAPES)
BACKGROUND = (245, 245, 245)


def _shape_mask(shape, size, cy, cx, radius):
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    if shape == "circle":
        return (yy - cy) ** 2 + (xx - cx) ** 2 <= radius**2
    if shape == "square":
        half = radius * 0.85
        return (np.abs(yy - cy) <= half) & (np.abs(xx - cx) <= half)
    if shape == "triangle":  # apex up, base at cy + radius
        top, bottom = cy - radius, cy + radius
        t = np.clip((yy - top) / (bottom - top), 0.0, None)
        return (yy >= top) & (yy <= bottom) & (np.abs(xx - cx) <= t * radius)
    raise ValueError(f"Unknown `shape` {shape!r}; expected one of {SHAPES}.")


def make_shapes(num_per_label, seed, image_size=32):
    """Deterministic synthetic image-caption pairs of coloured shapes.

    Every label of `LABELS` ("red circle", ..., 4 colours x 3 shapes) gets
    `num_per_label` images: one shape of random size and position (and a
    slightly jittered colour) on a light grey background.

    Args:
        num_per_label: images per label.
        seed: seed of the numpy generator; same seed, same images.
        image_size: side of the square uint8 images.

    Returns:
        `(images, labels, captions)`: uint8 `(N, S, S, 3)`, int `(N,)` indices
        into `LABELS`, and the captions `"a red circle"`, ...; shuffled.
    """
    rng = np.random.default_rng(seed)
    n = num_per_label * len(LABELS)
    labels = np.repeat(np.arange(len(LABELS)), num_per_label)
    labels = labels[rng.permutation(n)]
    images = np.empty((n, image_size, image_size, 3), np.uint8)
    for i, label in enumerate(labels):
        color, shape = LABELS[label].split()
        radius = rng.uniform(0.22, 0.36) * image_size
        cy, cx = rng.uniform(radius, image_size - radius, size=2)
        rgb = np.clip(np.array(COLORS[color]) + rng.integers(-15, 16, size=3), 0, 255)
        image = np.empty((image_size, image_size, 3), np.uint8)
        image[...] = BACKGROUND
        image[_shape_mask(shape, image_size, cy, cx, radius)] = rgb
        images[i] = image
    captions = [f"a {LABELS[label]}" for label in labels]
    return images, labels, captions


# ----------------------------------------------------------------------- metrics


def shape_metrics(model, pixels, labels):
    """Zero-shot accuracy and text-to-image R@1 over `LABELS` on preprocessed images.

    Zero-shot: each image is assigned the label whose prompt ("a red circle")
    scores highest. Retrieval: each label prompt retrieves its best-scoring
    image; a hit when that image has the label.
    """
    import keras

    prompts = model.tokenizer([f"a {label}" for label in LABELS])
    scores = keras.ops.convert_to_numpy(model.similarity(pixels, prompts))  # (N_img, N_labels)
    zero_shot = float(np.mean(np.argmax(scores, axis=1) == labels))
    top_image = np.argmax(scores, axis=0)  # best image per label prompt
    recall_at_1 = float(np.mean(labels[top_image] == np.arange(len(LABELS))))
    return {"zero_shot_accuracy": zero_shot, "t2i_recall@1": recall_at_1}


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

    start = time.perf_counter()
    backend = keras.backend.backend()
    print(f"vlzoo {vlzoo.__version__} demo | Keras {keras.__version__} | backend: {backend}", file=out)
    keras.utils.set_random_seed(args.seed)

    model = _load(vlzoo, args.preset, out)
    size = model.vision.image_size
    print(f"preset {args.preset!r}: {type(model).__name__}, {model.count_params():,} parameters, "
          f"{size} px", file=out)

    steps_per_epoch = max(1, math.ceil(args.steps / args.epochs))
    train_per_label = math.ceil(steps_per_epoch * args.batch_size / len(LABELS))
    train_images, _, train_captions = make_shapes(train_per_label, seed=args.seed, image_size=size)
    eval_images, eval_labels, _ = make_shapes(args.eval_per_label, seed=args.seed + 1, image_size=size)
    n_train = steps_per_epoch * args.batch_size
    train_images, train_captions = train_images[:n_train], train_captions[:n_train]
    print(f"data: {len(LABELS)} labels ({', '.join(LABELS)}); {n_train} training pairs, "
          f"{len(eval_images)} held-out images", file=out)

    # Tokenise the few distinct captions once and gather their rows.
    distinct = sorted(set(train_captions))
    tokens = model.tokenizer(distinct)
    rows = np.array([distinct.index(c) for c in train_captions])
    train = {key: np.asarray(value)[rows] for key, value in tokens.items()}
    train["images"] = model.preprocessor(train_images)
    eval_pixels = model.preprocessor(eval_images)

    before = shape_metrics(model, eval_pixels, eval_labels)
    print(f"before fine-tuning: {_format_metrics(before)}  (chance {1 / len(LABELS):.3f})", file=out)

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

    after = shape_metrics(model, eval_pixels, eval_labels)
    print(f"after fine-tuning:  {_format_metrics(after)}", file=out)

    preset_dir = os.path.abspath(args.out)
    model.save_to_preset(preset_dir)
    reloaded = _load(vlzoo, preset_dir, out)
    probe_pixels = eval_pixels[:16]
    probe_text = reloaded.tokenizer([f"a {label}" for label in LABELS])
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
