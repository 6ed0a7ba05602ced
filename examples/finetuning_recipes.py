"""Fine-tuning recipes on the synthetic shapes data: full fine-tuning, LiT, LoRA and WiSE-FT.

The bundled `clip_shapes` preset was trained on coloured shapes drawn on a light
background. Here it meets a distribution shift, the same shapes on a dark background
("night mode", where its zero-shot accuracy falls to chance), and is fine-tuned on
shifted images with three recipes of `vlzoo.training`:

- full fine-tuning: every weight trains (`configure`);
- LiT: the image tower locked but for its last groups
  (`configure(..., lock_image=True, lock_image_unlocked_groups=2)`), the text tower trains;
- LoRA: rank-8 adapters on the query and value projections of both towers
  (`enable_lora`), everything else frozen; `merge_lora` folds them back in.

Each model is scored by zero-shot classification over the 24 colour-shape classes
("a red circle", ...) on held-out images with a light background (in distribution:
what the preset was good at) and on the same images with a dark background (shifted).
Then WiSE-FT (`interpolation_sweep`) mixes the zero-shot and the fully fine-tuned
weights, `(1 - alpha) * zero-shot + alpha * fine-tuned`, and traces both accuracies
along alpha.

It prints a Markdown table of the three recipes and one of the WiSE-FT curve, and
writes the curve as a PNG plot (and the numbers as JSON) to `--out`. Offline, seeded,
deterministic on one backend; the torch backend is the fastest on a CPU:

    KERAS_BACKEND=torch python examples/finetuning_recipes.py --out finetuning_out
    KERAS_BACKEND=torch python examples/finetuning_recipes.py --quick   # a smoke run: 4 steps, 24 images per set
"""

import argparse
import json
import os
import time

import keras
import numpy as np
from matplotlib.figure import Figure  # no pyplot: the figure renders with Agg, no display needed

import vlzoo
from vlzoo.data import shapes
from vlzoo.evaluation import zero_shot_classifier

PRESET = "clip_shapes"
DARK = (30, 30, 30)  # the shifted background
BATCH = len(shapes.class_names())  # 24: one image of each class per batch
ALPHAS = (0.0, 0.25, 0.5, 0.75, 1.0)
TEMPLATES = ["a {}"]  # the captions' own wording: "a red circle"


def on_dark_background(images):
    """The images of `shapes.classification` with their plain background made dark.

    Their background is exactly `shapes.BACKGROUND` (hard edges), so every other pixel is the shape's.
    """
    images = images.copy()
    images[(images == np.array(shapes.BACKGROUND, np.uint8)).all(axis=-1)] = DARK
    return images


def training_pairs(steps, seed):
    """`steps * 24` dark-background images and their captions, each batch of 24 holding every
    class once: a caption is never repeated within a batch, so no negative is a false one."""
    data = shapes.classification(steps, seed=seed)
    order = np.argsort(data["labels"], kind="stable").reshape(BATCH, steps).T.reshape(-1)
    return on_dark_background(data["images"][order]), [data["captions"][i] for i in order]


def fine_tune(method, inputs, steps, learning_rate, seed):
    """`clip_shapes` fine-tuned on `inputs` (`model.fit`'s dict) by one recipe; returns
    (model, trainable parameters)."""
    keras.utils.set_random_seed(seed)
    model = vlzoo.from_preset(PRESET)
    options = {}
    if method == "LoRA (rank 8)":
        vlzoo.training.enable_lora(model, rank=8, targets=("query", "value"))
        learning_rate *= 10  # adapters start at zero and move a small subspace: a larger rate
    elif method == "LiT (image locked)":
        options = {"lock_image": True, "lock_image_unlocked_groups": 2}  # last block and projection train
    vlzoo.training.configure(model, learning_rate=learning_rate, total_steps=steps, warmup_steps=max(1, steps // 10),
                             weight_decay=0.1, **options)
    trainable = sum(int(np.prod(v.shape)) for v in model.trainable_weights)
    model.fit(inputs, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    if method == "LoRA (rank 8)":
        model = vlzoo.training.merge_lora(model)  # a plain CLIP with the same outputs
    return model, trainable


def make_evaluate(preprocessor, per_class, seed):
    """A function from a model to its in-distribution and shifted zero-shot top-1 accuracy.

    The held-out images are preprocessed once, by the preprocessor every model here shares.
    """
    held_out = shapes.classification(per_class, seed=seed)
    pixels = {"in_distribution": preprocessor(held_out["images"]),
              "shifted": preprocessor(on_dark_background(held_out["images"]))}

    def evaluate(model):
        classifier = zero_shot_classifier(model, held_out["class_names"], TEMPLATES)  # prompts encoded once
        return {name: classifier.accuracy(images, held_out["labels"], top_k=1)["top1"]
                for name, images in pixels.items()}

    return evaluate


def plot_curve(rows, zero_shot, recipes, path):
    """The WiSE-FT curve (in-distribution vs shifted accuracy, one point per alpha) with the recipes."""
    figure = Figure(figsize=(5.2, 4.2), dpi=120)
    axes = figure.subplots()
    axes.plot([r["shifted"] for r in rows], [r["in_distribution"] for r in rows], "o-", color="tab:blue",
              label="WiSE-FT (zero-shot to full fine-tune)")
    for row in rows:
        axes.annotate(f"α={row['alpha']:g}", (row["shifted"], row["in_distribution"]), textcoords="offset points",
                      xytext=(6, 4), fontsize=8)
    for (method, metrics), marker in zip(recipes.items(), "s^D"):
        axes.plot(metrics["shifted"], metrics["in_distribution"], marker, label=method)
    axes.plot(zero_shot["shifted"], zero_shot["in_distribution"], "k*", markersize=11, label="zero-shot")
    axes.set_xlabel("shifted accuracy (dark background)")
    axes.set_ylabel("in-distribution accuracy (light background)")
    axes.set_title(f"{PRESET}: zero-shot top-1 over 24 classes")
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8, loc="upper right")
    figure.tight_layout()
    figure.savefig(path)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="finetuning_out", help="directory for the plot and the numbers")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps of each fine-tune (batch 24)")
    parser.add_argument("--eval-per-class", type=int, default=10, help="held-out images per class")
    parser.add_argument("--learning-rate", type=float, default=3e-4, help="peak rate (LoRA's is 10x)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 4 steps, 1 image per class")
    args = parser.parse_args(argv)
    steps, per_class = (4, 1) if args.quick else (args.steps, args.eval_per_class)
    os.makedirs(args.out, exist_ok=True)
    start = time.time()
    print(f"backend: {keras.backend.backend()}; {steps} steps of {BATCH} pairs per recipe; "
          f"{per_class * BATCH} held-out images")

    zero_shot_model = vlzoo.from_preset(PRESET)
    evaluate = make_evaluate(zero_shot_model.preprocessor, per_class, seed=args.seed + 1)
    zero_shot = evaluate(zero_shot_model)
    params = zero_shot_model.count_params()
    inputs = shapes.model_inputs(*training_pairs(steps, seed=args.seed + 2), zero_shot_model.tokenizer,
                                 zero_shot_model.preprocessor)

    recipes, models, lines = {}, {}, []
    for method in ("full fine-tuning", "LiT (image locked)", "LoRA (rank 8)"):
        tic = time.time()
        models[method], trainable = fine_tune(method, inputs, steps, args.learning_rate, args.seed)
        recipes[method] = {"trainable": trainable, **evaluate(models[method])}
        print(f"{method}: {time.time() - tic:.1f} s")
    lines += ["| method | trainable parameters | in-distribution | shifted |", "|---|---:|---:|---:|",
              f"| zero-shot `{PRESET}` | 0 | {zero_shot['in_distribution']:.3f} | {zero_shot['shifted']:.3f} |"]
    lines += [f"| {method} | {m['trainable']:,} ({m['trainable'] / params:.1%}) | {m['in_distribution']:.3f} | "
              f"{m['shifted']:.3f} |" for method, m in recipes.items()]

    rows = vlzoo.training.interpolation_sweep(zero_shot_model, models["full fine-tuning"], ALPHAS, evaluate)
    lines += ["", "WiSE-FT, zero-shot to full fine-tuning:", "",
              "| alpha | in-distribution | shifted |", "|---:|---:|---:|"]
    lines += [f"| {r['alpha']:g} | {r['in_distribution']:.3f} | {r['shifted']:.3f} |" for r in rows]
    print("\n".join(lines))

    plot = os.path.join(args.out, "finetuning_wise_ft.png")
    plot_curve(rows, zero_shot, recipes, plot)
    with open(os.path.join(args.out, "finetuning_recipes.json"), "w") as f:
        json.dump({"backend": keras.backend.backend(), "steps": steps, "eval_images": per_class * BATCH,
                   "zero_shot": zero_shot, "recipes": recipes, "wise_ft": rows}, f, indent=1)
    print(f"wrote {plot}")
    print(f"total {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
