"""Trains the bundled `*_shapes` presets on `vlzoo.data.shapes` and evaluates them.

Every family's `<family>_shapes` preset (defined in presets/registry.json) is
trained from a seeded random initialisation with its own loss through `model.fit`:
AdamW (`vlzoo.training.training_optimizer`) with linear warm-up and cosine decay, on
two-object (80%) and one-object (20%) scenes of the `train` split. STAIR follows its
paper's three stages (text grounded to its own tokens, then the text side with the
image tower frozen, then both) over half, a quarter and a quarter of the steps.
FLAIR trains, as its paper does, on several captions of each image that describe
parts of it: the scene's caption and each object's phrase ("a red circle above a
blue square", "a red circle", "a blue square"; a one-object scene's caption three
times), K = 3.

The weights go to `presets/<name>/model.weights.h5`, the settings and the held-out
metrics of `vlzoo.evaluation.shapes_benchmark.evaluate` (on compositions never seen in training) to
`presets/<name>/training.json`; the shapes table of docs/presets.md is made from those files
(`--table`), and tests check both against the shipped weights.

    python tools/train_shapes.py                      # every family, one after another
    python tools/train_shapes.py --family sparc llip  # some of them
    python tools/train_shapes.py --table              # print the shapes table of docs/presets.md
    python tools/train_shapes.py --family clip --steps 50 --out /tmp/shapes   # a smoke run

Runs on the backend of `KERAS_BACKEND` (the shipped weights were trained on jax).
"""

import argparse
import json
import os
import pathlib
import platform
import sys
import time

from vlzoo.presets import catalogue  # reads presets/registry.json; imports no backend

# Every family with a `<family>_shapes` preset in the registry, sorted.
FAMILIES = tuple(family for family in catalogue.families() if f"{family}_shapes" in catalogue.definitions())
METRICS_FILE = "training.json"
# (column title, key of `shapes_benchmark.evaluate`) of the shapes table of docs/presets.md.
TABLE_COLUMNS = (
    ("i2t R@1", "i2t_r@1"), ("t2i R@1", "t2i_r@1"), ("binding: colour", "binding_color"),
    ("shape", "binding_shape"), ("relation", "binding_relation"), ("zero-shot (24 classes)", "zero_shot_accuracy"),
)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", nargs="+", choices=FAMILIES, default=list(FAMILIES),
                        help="families to train (default: all)")
    parser.add_argument("--steps", type=int, default=3000, help="optimizer steps per family (default 3000)")
    parser.add_argument("--batch-size", type=int, default=128, help="pairs per step (default 128)")
    parser.add_argument("--learning-rate", type=float, default=1e-3, help="peak learning rate (default 1e-3)")
    parser.add_argument("--weight-decay", type=float, default=0.1, help="AdamW decay (default 0.1)")
    parser.add_argument("--examples", type=int, default=48_000,
                        help="distinct training scenes, cycled over the steps (default 48000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the initialisation")
    parser.add_argument("--out", default=None, metavar="DIR",
                        help="where the preset directories go (default: the repository's presets/)")
    parser.add_argument("--table", action="store_true",
                        help="print the shapes table of docs/presets.md from training.json files")
    args = parser.parse_args(argv)
    for name in ("steps", "batch_size", "examples"):
        if getattr(args, name) < 1:
            parser.error(f"argument --{name.replace('_', '-')}: must be >= 1")
    return args


def sub_captions(caption):
    """FLAIR's captions of one scene: the caption, then each object's phrase (a one-object scene: its caption
    three times)."""
    from vlzoo.data import shapes

    phrases = [f"a {color} {shape}" for color, shape in shapes.parse_caption(caption)["objects"]]
    return [caption] + (phrases if len(phrases) == 2 else phrases * 2)


def training_data(model, num_examples, seed, family=None):
    """Model inputs of `num_examples` train-split scenes: 80% with two objects, 20% with one; FLAIR's
    `token_ids` and `padding_mask` `(N, 3, T)`, each scene's `sub_captions`."""
    import numpy as np

    from vlzoo.data import shapes

    size = model.vision.image_size
    two = shapes.generate("train", num_examples - num_examples // 5, image_size=size, seed=seed, num_objects=2)
    one = shapes.generate("train", num_examples // 5, image_size=size, seed=seed, num_objects=1)
    images = np.concatenate([two["images"], one["images"]])
    captions = two["captions"] + one["captions"]
    order = np.random.default_rng(seed).permutation(len(captions))
    captions = [captions[i] for i in order]
    if family == "flair":
        captions = [sub_captions(caption) for caption in captions]
    return shapes.model_inputs(images[order], captions, model.tokenizer, model.preprocessor)


def stages(family, steps):
    """`[(stage, steps)]`: STAIR's three stages, or one run for the other families."""
    if family != "stair":
        return [(None, steps)]
    first, second = steps // 2, steps // 4
    return [(1, first), (2, second), (3, steps - first - second)]


def fit(model, family, data, args):
    from vlzoo.training import training_optimizer

    num_examples = len(data["images"])
    steps_per_epoch = num_examples // args.batch_size
    seconds = 0.0
    for stage, steps in stages(family, args.steps):
        optimizer = training_optimizer(
            args.learning_rate, total_steps=steps, warmup_steps=max(1, steps // 10), alpha=0.02,
            weight_decay=args.weight_decay,
        )
        if stage is None or not model.compiled:
            model.compile(optimizer=optimizer)
        if stage is not None:
            print(f"  STAIR stage {stage}: {steps} steps", flush=True)
            model.set_stage(stage, optimizer=optimizer)
        epochs = max(1, -(-steps // steps_per_epoch))
        start = time.perf_counter()
        model.fit(data, batch_size=args.batch_size, epochs=epochs, steps_per_epoch=min(steps, steps_per_epoch),
                  shuffle=True, verbose=1 if sys.stdout.isatty() else 2)
        seconds += time.perf_counter() - start
    return seconds


def train(family, args, root):
    import keras

    import vlzoo
    from vlzoo.evaluation import shapes_benchmark

    name = f"{family}_shapes"
    keras.utils.set_random_seed(args.seed)
    model = vlzoo.from_preset(vlzoo.presets.resolve_preset(name), load_weights=False)
    print(f"{name}: {type(model).__name__}, {model.count_params():,} parameters, backend "
          f"{keras.backend.backend()}", flush=True)
    data = training_data(model, args.examples - args.examples % args.batch_size, args.seed, family)
    seconds = fit(model, family, data, args)
    start = time.perf_counter()
    metrics = shapes_benchmark.evaluate(model)
    print(f"  trained in {seconds:.0f} s; held-out: "
          + "  ".join(f"{key}={value:.3f}" for key, value in metrics.items()), flush=True)
    directory = pathlib.Path(root) / name
    directory.mkdir(parents=True, exist_ok=True)
    if directory.resolve() != vlzoo.presets.resolve_preset(name).resolve():
        model.save_to_preset(directory)
    else:
        vlzoo.presets.save_model_weights(model, directory / vlzoo.presets.WEIGHTS_FILE)
    record = {
        "preset": name,
        "metrics": metrics,
        "settings": {key: getattr(args, key) for key in
                     ("steps", "batch_size", "learning_rate", "weight_decay", "examples", "seed")},
        "stages": [list(item) for item in stages(family, args.steps)],
        "train_seconds": round(seconds, 1),
        "eval_seconds": round(time.perf_counter() - start, 1),
        "backend": keras.backend.backend(),
        "keras": keras.__version__,
        "vlzoo": vlzoo.__version__,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "cores": len(os.sched_getaffinity(0)),
    }
    (directory / METRICS_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    print(f"  wrote {directory}", flush=True)


def table(root):
    """The shapes presets' held-out metrics as the Markdown table of docs/presets.md."""
    lines = [
        "| preset | " + " | ".join(title for title, _ in TABLE_COLUMNS) + " | training |",
        "|---" * (len(TABLE_COLUMNS) + 2) + "|",
    ]
    for family in FAMILIES:
        path = pathlib.Path(root) / f"{family}_shapes" / METRICS_FILE
        if not path.is_file():
            continue
        record = json.loads(path.read_text())
        cells = [f"{record['metrics'][key]:.3f}" for _, key in TABLE_COLUMNS]
        settings = record["settings"]
        run = f"{settings['steps']} steps of {settings['batch_size']}, {record['train_seconds'] / 60:.1f} min"
        lines.append(f"| `{record['preset']}` | " + " | ".join(cells) + f" | {run} |")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    from vlzoo import presets

    root = args.out or presets.presets_root()
    if args.table:
        print(table(root))
        return 0
    for family in args.family:
        train(family, args, root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
