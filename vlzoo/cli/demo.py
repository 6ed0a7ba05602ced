"""`vlzoo demo`: the whole workflow on a bundled shapes model (the `make demo` job)."""

import math
import os
import subprocess
import sys
import time

import numpy as np

from vlzoo.cli._common import _add_command, _format_metrics, _load

# `vlzoo demo` teaches the bundled shapes model a prompt wording it never saw in training.
DEMO_TEMPLATE = "a photo of a {}."
# The reload check on the second backend: similarity of the saved preset on stored inputs.
_SIMILARITY_SCRIPT = (
    "import sys, numpy as np, keras, vlzoo\n"
    "model = vlzoo.from_preset(sys.argv[1])\n"
    "data = np.load(sys.argv[2])\n"
    "texts = {'token_ids': data['token_ids'], 'padding_mask': data['padding_mask']}\n"
    "np.save(sys.argv[3], keras.ops.convert_to_numpy(model.similarity(data['images'], texts)))\n"
)


def register(sub):
    p = _add_command(
        sub, "demo", "the whole workflow on a bundled shapes model (the `make demo` job)",
        "Load a bundled *_shapes preset (trained on vlzoo.data.shapes, downloads nothing), measure\n"
        "zero-shot classification, retrieval and attribute binding on held-out generated images,\n"
        f"fine-tune it with model.fit to the prompt {DEMO_TEMPLATE!r}, measure again, draw each\n"
        "caption word's map over the patches and score where the words land (FILIP, SPARC, FLAIR,\n"
        "CLIP), save it as a preset, and reload the preset on this backend and on a second one to\n"
        "check that the similarities match. Seeded.",
        ["vlzoo demo", "KERAS_BACKEND=torch vlzoo demo --preset filip_shapes --steps 60 --out /tmp/filip_demo"],
    )
    p.add_argument("--preset", default="flair_shapes",
                   help="preset to fine-tune, a *_shapes preset or a directory (default: %(default)s)")
    p.add_argument("--steps", type=int, default=120,
                   help="total optimizer steps, split evenly across the epochs (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=3, help="training epochs (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="training batch size (default: %(default)s)")
    p.add_argument("--learning-rate", type=float, default=3e-4,
                   help="peak AdamW learning rate (default: %(default)s)")
    p.add_argument("--eval-per-label", type=int, default=10,
                   help="held-out images per class for zero-shot accuracy (default: %(default)s)")
    p.add_argument("--eval-pairs", type=int, default=200,
                   help="held-out scenes per swap for binding accuracy (default: %(default)s)")
    p.add_argument("--grounding-scenes", type=int, default=200,
                   help="held-out scenes the word maps are scored on (shapes_grounding; default: %(default)s)")
    p.add_argument("--second-backend", default="auto", choices=("auto", "none", "jax", "tensorflow", "torch"),
                   help="backend the saved preset is also reloaded on: auto = torch, or jax when running on "
                   "torch; none to skip (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed for data and weights (default: %(default)s)")
    p.add_argument("--verbose", type=int, default=None, choices=(0, 1, 2),
                   help="Keras fit verbosity: 0 silent, 1 progress bar, 2 one line per epoch "
                   "(default: 1 on a terminal, 2 when the output is redirected)")
    p.add_argument("--out", default=os.path.join("out", "demo"), metavar="DIR",
                   help="directory for the alignment map and the saved preset (default: %(default)s)")
    p.set_defaults(func=run, validate=validate)


def validate(parser, args):
    """The parser's error (exit status 2) on counts below 1."""
    if min(args.steps, args.epochs, args.batch_size, args.eval_per_label, args.eval_pairs, args.grounding_scenes) < 1:
        parser.error("--steps, --epochs, --batch-size, --eval-per-label, --eval-pairs and --grounding-scenes must "
                     "be at least 1")


def _second_backend(choice, backend):
    if choice == "auto":
        return "torch" if backend != "torch" else "jax"
    return None if choice == "none" else choice


def _similarity_on(backend, preset_dir, inputs_path, result_path):
    """`model.similarity` of a saved preset on stored inputs, computed by a `backend` subprocess."""
    env = dict(os.environ, KERAS_BACKEND=backend)  # with `vlzoo.cli`'s TF_CPP_MIN_LOG_LEVEL default
    done = subprocess.run([sys.executable, "-c", _SIMILARITY_SCRIPT, preset_dir, inputs_path, result_path],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {backend} process failed:\n{done.stderr[-2000:]}")
    return np.load(result_path)


def _demo_report(model, benchmark, held_out, args):
    """The demo's metrics: the shapes benchmark (module `benchmark`) and zero-shot accuracy with
    `DEMO_TEMPLATE`."""
    metrics = benchmark.evaluate(model, num_pairs=args.eval_pairs, num_per_class=args.eval_per_label,
                                 seed=args.seed)
    prompted = benchmark.zero_shot_metrics(model, held_out["pixels"], held_out["labels"],
                                           held_out["class_names"], template=DEMO_TEMPLATE)
    return {
        "zero_shot('a {}')": metrics["zero_shot_accuracy"],
        f"zero_shot('{DEMO_TEMPLATE}')": prompted["zero_shot_accuracy"],
        "i2t_r@1": metrics["i2t_r@1"], "t2i_r@1": metrics["t2i_r@1"], "binding": metrics["binding_mean"],
    }


def _demo_data(model, shapes, num_pairs, seed):
    """Fine-tuning pairs: half one-object images captioned with `DEMO_TEMPLATE`, half scenes
    of the training split with their usual captions (so the model keeps what it knew)."""
    size = model.vision.image_size
    names = shapes.class_names()
    prompted = shapes.classification(math.ceil(num_pairs / 2 / len(names)), seed=seed, image_size=size)
    scenes = shapes.generate("train", num_pairs - num_pairs // 2, image_size=size, seed=seed + 100)
    images = np.concatenate([prompted["images"][: num_pairs // 2], scenes["images"]])
    captions = [DEMO_TEMPLATE.format(names[label]) for label in prompted["labels"][: num_pairs // 2]]
    captions += scenes["captions"]
    order = np.random.default_rng(seed).permutation(num_pairs)
    return shapes.model_inputs(images[order], [captions[i] for i in order], model.tokenizer, model.preprocessor)


def _ground(model, args, out_dir, out):
    """Step 4: one scene's word maps drawn, and where the words land on held-out scenes."""
    from vlzoo import viz
    from vlzoo.data import shapes
    from vlzoo.evaluation import grounding, shapes_grounding

    try:
        method = grounding.grounding_method(model)
    except NotImplementedError as error:
        print(f"4. no word maps: {error}", file=out)
        return
    scene = shapes.generate("test", 1, image_size=model.vision.image_size, seed=args.seed, num_objects=2)
    png = viz.draw_word_maps(model, model.preprocessor(scene["images"])[0], scene["captions"][0],
                             os.path.join(out_dir, "alignment.png"))
    metrics = shapes_grounding.evaluate(model, num_scenes=args.grounding_scenes, seed=args.seed)["metrics"]
    print(f"4. word maps ({method.replace('_', ' ')}) of {scene['captions'][0]!r} drawn to {png}", file=out)
    print(f"   pointing game on {args.grounding_scenes} held-out scenes (vlzoo eval --benchmark shapes_grounding): "
          + ", ".join(f"{kind}s {metrics[f'pointing_{kind}']:.3f} (chance {metrics[f'chance_{kind}']:.3f})"
                      for kind in ("noun", "color")), file=out)
    print("   two objects, the word's own against the other: "
          + ", ".join(f"{kind}s {metrics[f'pair_{kind}']:.3f} against {metrics[f'distractor_{kind}']:.3f}"
                      for kind in ("noun", "color")), file=out)


def run(args, out):
    # heavy: imports a backend
    import keras

    import vlzoo
    from vlzoo._backends import switches
    from vlzoo.data import shapes
    from vlzoo.evaluation import shapes_benchmark
    from vlzoo.training import training_optimizer

    backend = keras.backend.backend()
    with switches.one_intra_op_thread():  # the small model's operations gain nothing from PyTorch's threads
        start = time.perf_counter()
        print(f"vlzoo {vlzoo.__version__} demo | Keras {keras.__version__} | backend: {backend}", file=out)
        keras.utils.set_random_seed(args.seed)
        out_dir = os.path.abspath(args.out)
        os.makedirs(out_dir, exist_ok=True)

        model = _load(args.preset, out)
        info = vlzoo.preset_info(args.preset)
        print(f"1. preset {args.preset!r}: {type(model).__name__}, {model.count_params():,} parameters, "
              f"{model.vision.image_size} px, weights {'bundled' if info['weights_available'] else 'random'}",
              file=out)
        held = shapes.classification(args.eval_per_label, seed=args.seed + 1, image_size=model.vision.image_size)
        held_out = {"pixels": model.preprocessor(held["images"]), "labels": held["labels"],
                    "class_names": held["class_names"]}
        print(f"2. held-out evaluation (vlzoo.evaluation.shapes_benchmark.evaluate): zero-shot over {len(held['class_names'])} "
              f"colour-shape classes (chance {1 / len(held['class_names']):.3f}), retrieval among 120 scenes of "
              "unseen compositions, attribute binding (true vs swapped caption, chance 0.5)", file=out)
        before = _demo_report(model, shapes_benchmark, held_out, args)
        print(f"   before fine-tuning: {_format_metrics(before)}", file=out)

        steps_per_epoch = max(1, math.ceil(args.steps / args.epochs))
        train = _demo_data(model, shapes, steps_per_epoch * args.batch_size, args.seed)
        total_steps = steps_per_epoch * args.epochs
        model.compile(optimizer=training_optimizer(
            args.learning_rate, total_steps=total_steps, warmup_steps=total_steps // 10, weight_decay=0.1))
        print(f"3. fine-tuning with model.fit to the prompt {DEMO_TEMPLATE!r}: {args.epochs} epochs x "
              f"{steps_per_epoch} steps, batch {args.batch_size}, peak lr {args.learning_rate} (AdamW, warm-up, "
              "cosine decay)", file=out)
        interactive = getattr(out, "isatty", lambda: False)()
        verbose = args.verbose if args.verbose is not None else (1 if interactive else 2)
        model.fit(train, batch_size=args.batch_size, epochs=args.epochs, shuffle=True, verbose=verbose)
        after = _demo_report(model, shapes_benchmark, held_out, args)
        print(f"   after fine-tuning:  {_format_metrics(after)}", file=out)

        _ground(model, args, out_dir, out)

        preset_dir = os.path.join(out_dir, "preset")
        model.save_to_preset(preset_dir)
        texts = model.tokenizer([DEMO_TEMPLATE.format(name) for name in held["class_names"]])
        probe = {"images": np.asarray(held_out["pixels"][:16]), **{k: np.asarray(v) for k, v in texts.items()}}
        inputs_path = os.path.join(out_dir, "probe_inputs.npz")
        np.savez(inputs_path, **probe)
        original = keras.ops.convert_to_numpy(model.similarity(probe["images"], texts))
        reloaded = _load(preset_dir, out)
        checks = [(backend, keras.ops.convert_to_numpy(reloaded.similarity(probe["images"], texts)))]
        second = _second_backend(args.second_backend, backend)
        if second is not None:
            checks.append((second, _similarity_on(second, preset_dir, inputs_path,
                                                  os.path.join(out_dir, f"similarity_{second}.npy"))))
        print(f"5. saved to {preset_dir}; reloaded and scored {len(probe['images'])} images x "
              f"{len(held['class_names'])} prompts:", file=out)
        status = 0
        for name, scores in checks:
            diff = float(np.max(np.abs(original - scores)))
            ok = diff <= 1e-4
            status = status or (0 if ok else 1)
            print(f"   on {name}: max abs diff of the similarities {diff:.3g} ({'OK' if ok else 'MISMATCH'})",
                  file=out)
        print(f"demo finished in {time.perf_counter() - start:.1f} s on {backend}", file=out)
        return status
