"""The `vlzoo` command line.

    vlzoo list [--family F]
    vlzoo info NAME
    vlzoo zeroshot --preset P --images DIR_OR_CAPTIONFILE [--classes "a,b" | --classes-file F]
                   [--templates imagenet|simple|default|FILE] [--top-k 1 5] [--json OUT]
    vlzoo retrieve --preset P --data CAPTIONFILE_OR_SHARDS [--ks 1 5 10] [--query TEXT ...] [--json OUT]
    vlzoo train    --preset P --data SOURCE --out DIR [--epochs E] [--batch-size B] [--learning-rate LR] ...
    vlzoo convert  --from open_clip|transformers|keras_hub --source PATH --out DIR [--model NAME | --config F]
    vlzoo convert  --from llip|sparo --source PATH --preset P --out DIR
    vlzoo demo     [--preset sparc_shapes] [--steps N] [--second-backend B] [--out DIR]

`vlzoo COMMAND --help` documents every option, with examples. Also runs as
`python -m vlzoo.cli ...`. The backend is Keras's: set
`KERAS_BACKEND=jax|tensorflow|torch`. Nothing is downloaded.

* `zeroshot`: top-k zero-shot accuracy (`vlzoo.evaluation.zero_shot_accuracy`)
  on an image folder laid out as `DIR/<class>/*.jpg` (ImageNet style) or on a
  caption file whose caption (or `label`/`class`) column is the class.
* `retrieve`: image -> text and text -> image recall@K
  (`vlzoo.evaluation.retrieval_recall`) on the image-caption pairs of a caption
  file or tar shards, or the best images for `--query` texts.
* `train`: fine-tunes with `model.fit` on `vlzoo.data.image_text_dataset(...,
  training=True)`, then `save_to_preset(--out)`.
* `convert`: a local open_clip / transformers / keras-hub / Llip / SPARO checkpoint -> a preset
  directory (`vlzoo.convert.convert_checkpoint`).
* `demo`: the whole workflow on a bundled shapes model (`sparc_shapes`, trained
  on the synthetic `vlzoo.data.shapes` dataset): held-out zero-shot accuracy,
  retrieval recall and attribute-binding accuracy; a short `model.fit` that teaches
  it the prompt "a photo of a {}." with the metrics before and after; a
  token-to-patch alignment map (PNG); the model saved with `save_to_preset` and
  reloaded on this backend and on a second one, whose similarities must match.

Images are read with PIL and preprocessed with the preset's own preprocessor (the
evaluation transform), `--batch-size` at a time: a folder of any size is never
held in memory whole.

User mistakes (a missing file, an unknown preset, a bad value) end with a one-line
`vlzoo COMMAND: error: ...` naming the argument and exit status 2; a failed check
(`convert`'s parity, `demo`'s reload) exits with 1.
"""

import argparse
import json
import math
import os
import sys
import time
import warnings

import numpy as np

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

    if args.pretrained:
        rows = [("name", "family", "params", "download", "licence", "source")]
    else:
        rows = [("name", "family", "params", "weights")]
    for name in vlzoo.list_presets(family=args.family, pretrained=args.pretrained):
        info = vlzoo.preset_info(name)
        params = f"{info['params']:,} ({_format_params(info['params'])})"
        if args.pretrained:
            rows.append((name, info["family"], params, info["download_size"] or "not stated", info["licence"], info["handle"]))
        else:
            rows.append((name, str(info["family"]), params, "yes" if info["weights_available"] else "no"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for j, row in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip(), file=out)
        if j == 0:
            print("  ".join("-" * w for w in widths), file=out)
    return 0


def cmd_download(args, out):
    import vlzoo

    directory = vlzoo.loading.local_directory(args.handle)
    print(f"{args.handle}: ready in {directory}", file=out)
    return 0


def cmd_info(args, out):
    import vlzoo

    info = vlzoo.preset_info(args.name)
    print(json.dumps(info, indent=2), file=out)
    return 0


def _load(vlzoo, preset, out, family=None):
    """`vlzoo.from_preset(preset, family=family)`, printing its warnings as plain notes."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = vlzoo.from_preset(preset, family=family)
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
    # The small model's ops are far too small to gain from intra-op threads, and on a
    # busy machine torch's thread pool makes each op 10-100x slower; run single-threaded.
    previous_threads = _torch_threads(1)
    try:
        return _demo(args, out)
    finally:
        if previous_threads is not None:
            _torch_threads(previous_threads)


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


def _second_backend(choice, backend):
    if choice == "auto":
        return "torch" if backend != "torch" else "jax"
    return None if choice == "none" else choice


def _similarity_on(backend, preset_dir, inputs_path, result_path):
    """`model.similarity` of a saved preset on stored inputs, computed by a `backend` subprocess."""
    import subprocess

    env = dict(os.environ, KERAS_BACKEND=backend)
    done = subprocess.run([sys.executable, "-c", _SIMILARITY_SCRIPT, preset_dir, inputs_path, result_path],
                          env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {backend} process failed:\n{done.stderr[-2000:]}")
    return np.load(result_path)


def _demo_report(model, shapes, held_out, args):
    """The demo's metrics: the shapes benchmark and zero-shot accuracy with `DEMO_TEMPLATE`."""
    metrics = shapes.evaluate(model, num_pairs=args.eval_pairs, num_per_class=args.eval_per_label,
                              seed=args.seed)
    prompted = shapes.zero_shot_metrics(model, held_out["pixels"], held_out["labels"],
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


def _demo(args, out):
    import keras

    import vlzoo
    from vlzoo.data import shapes
    from vlzoo.training import training_optimizer

    start = time.perf_counter()
    backend = keras.backend.backend()
    print(f"vlzoo {vlzoo.__version__} demo | Keras {keras.__version__} | backend: {backend}", file=out)
    keras.utils.set_random_seed(args.seed)
    out_dir = os.path.abspath(args.out)
    os.makedirs(out_dir, exist_ok=True)

    model = _load(vlzoo, args.preset, out)
    info = vlzoo.preset_info(args.preset)
    print(f"1. preset {args.preset!r}: {type(model).__name__}, {model.count_params():,} parameters, "
          f"{model.vision.image_size} px, weights {'bundled' if info['weights_available'] else 'random'}",
          file=out)
    held = shapes.classification(args.eval_per_label, seed=args.seed + 1, image_size=model.vision.image_size)
    held_out = {"pixels": model.preprocessor(held["images"]), "labels": held["labels"],
                "class_names": held["class_names"]}
    print(f"2. held-out evaluation (vlzoo.data.shapes.evaluate): zero-shot over {len(held['class_names'])} "
          f"colour-shape classes (chance {1 / len(held['class_names']):.3f}), retrieval among 120 scenes of "
          "unseen compositions, attribute binding (true vs swapped caption, chance 0.5)", file=out)
    before = _demo_report(model, shapes, held_out, args)
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
    after = _demo_report(model, shapes, held_out, args)
    print(f"   after fine-tuning:  {_format_metrics(after)}", file=out)

    if hasattr(model, "alignment_weights") or hasattr(model, "token_alignment"):
        from vlzoo import viz

        scene = shapes.generate("test", 1, image_size=model.vision.image_size, seed=args.seed, num_objects=2)
        png = viz.draw_caption_alignment(model, model.preprocessor(scene["images"])[0], scene["captions"][0],
                                         os.path.join(out_dir, "alignment.png"))
        print(f"4. token-to-patch alignment of {scene['captions'][0]!r} drawn to {png}", file=out)
    else:
        print(f"4. no alignment map: {type(model).__name__} has no token-to-patch alignment "
              "(SPARC and FILIP do)", file=out)

    preset_dir = os.path.join(out_dir, "preset")
    model.save_to_preset(preset_dir)
    texts = model.tokenizer([DEMO_TEMPLATE.format(name) for name in held["class_names"]])
    probe = {"images": np.asarray(held_out["pixels"][:16]), **{k: np.asarray(v) for k, v in texts.items()}}
    inputs_path = os.path.join(out_dir, "probe_inputs.npz")
    np.savez(inputs_path, **probe)
    original = keras.ops.convert_to_numpy(model.similarity(probe["images"], texts))
    checks = [(backend, keras.ops.convert_to_numpy(_load(vlzoo, preset_dir, out).similarity(probe["images"],
                                                                                          texts)))]
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
        print(f"   on {name}: max abs diff of the similarities {diff:.3g} ({'OK' if ok else 'MISMATCH'})", file=out)
    print(f"demo finished in {time.perf_counter() - start:.1f} s on {backend}", file=out)
    return status


# ------------------------------------------------------------ shared helpers of the new commands


class UsageError(Exception):
    """A user mistake in the value of `argument`; printed as one line, exit status 2."""

    def __init__(self, argument, message):
        super().__init__(f"argument {argument}: {message}" if argument else message)


def _check_preset(preset):
    """Fails fast (before reading any data) on a `--preset` that is neither registered nor a directory.

    Handles and pretrained names pass: they are fetched, and a malformed handle refused, when loaded."""
    from vlzoo import loading, pretrained
    from vlzoo.presets import resolve_preset

    if loading.is_remote(preset) or pretrained.is_pretrained(preset):
        return
    try:
        resolve_preset(preset)
    except (ValueError, FileNotFoundError) as error:
        raise UsageError("--preset", str(error)) from None


def _load_preset(preset, out, family=None):
    """`_load`, with a bad `--preset` reported as a usage error naming it (from_preset's suggestions kept)."""
    import vlzoo

    try:
        return _load(vlzoo, preset, out, family=family)
    except (ValueError, FileNotFoundError) as error:
        raise UsageError("--preset", str(error)) from None


FOLDER_IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif")
TEMPLATE_SETS = ("imagenet", "simple", "default")
LABEL_KEYS = ("label", "class", "class_name", "classname")


class ImageFiles:
    """Preprocessed pixels of image files (or encoded image bytes), decoded only when sliced.

    Looks like a float32 `(N, H, W, 3)` array to `zero_shot_accuracy` and
    `retrieval_recall` (`shape`, `images[start:stop]`), so they read the images a
    batch at a time: memory is one batch, whatever `N`.

    Args:
        items: image paths or encoded image bytes.
        preprocessor: the preset's `ImagePreprocessor` (the evaluation transform).
        sources: names of the items for error messages (default: the paths).
    """

    def __init__(self, items, preprocessor, sources=None):
        from vlzoo.data import transforms

        self.items = list(items)
        self.sources = list(sources) if sources is not None else [str(item) for item in self.items]
        self.preprocessor = preprocessor
        self.shape = (len(self.items),) + tuple(transforms.output_size(preprocessor)) + (3,)
        self.dtype = np.dtype("float32")

    def __len__(self):
        return len(self.items)

    def _decode(self, index):
        from vlzoo.data import records

        item = self.items[index]
        try:
            if isinstance(item, (bytes, bytearray)):
                data = bytes(item)
            else:
                with open(item, "rb") as f:
                    data = f.read()
            return records.decode_image(data)
        except OSError as error:
            raise FileNotFoundError(f"{self.sources[index]}: cannot read image: {error}") from None
        except records.BadRecord as bad:
            raise ValueError(f"{self.sources[index]}: {bad}") from None

    def __getitem__(self, index):
        if isinstance(index, (int, np.integer)):
            return self[int(index):int(index) + 1][0]
        if not isinstance(index, slice):
            raise TypeError(f"ImageFiles supports ints and slices, not {type(index).__name__}.")
        indices = range(*index.indices(len(self.items)))
        if not indices:
            return np.zeros((0,) + self.shape[1:], np.float32)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1, len(indices)))) as pool:
            images = list(pool.map(self._decode, indices))  # PIL releases the GIL while decoding
        return np.asarray(self.preprocessor(images), np.float32)


def _check_file(path, argument, what="file"):
    if not os.path.exists(path):
        raise UsageError(argument, f"{what} not found: {path}")
    return path


def _split_classes(text):
    return [name.strip() for name in text.split(",") if name.strip()]


def _read_classes_file(path):
    _check_file(path, "--classes-file")
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def _read_templates(spec):
    """Templates from a set name or a file (one template with `{}` a line)."""
    from vlzoo.evaluation import DEFAULT_TEMPLATES, IMAGENET_TEMPLATES, SIMPLE_TEMPLATES

    sets = {"imagenet": IMAGENET_TEMPLATES, "simple": SIMPLE_TEMPLATES, "default": DEFAULT_TEMPLATES}
    if spec in sets:
        return tuple(sets[spec])
    if not os.path.isfile(spec):
        raise UsageError("--templates", f"expected one of {', '.join(TEMPLATE_SETS)} or a template file; "
                                        f"{spec!r} is neither")
    with open(spec, encoding="utf-8") as f:
        templates = tuple(line.rstrip("\n") for line in f if line.strip())
    bad = [t for t in templates if t.count("{}") != 1]
    if not templates or bad:
        problem = f"bad line: {bad[0]!r}" if bad else "the file is empty"
        raise UsageError("--templates", f"{spec}: every line must be a template with exactly one '{{}}' "
                                        f"(e.g. 'a photo of a {{}}.'); {problem}")
    return templates


def _folder_labels(root):
    """(image paths, class-folder name of each, sorted folder names) of `root/<class>/**/*.jpg`."""
    folders = sorted(name for name in os.listdir(root) if os.path.isdir(os.path.join(root, name)))
    if not folders:
        raise UsageError("--images", f"{root} has no class sub-folders (expected DIR/<class>/*.jpg, "
                                     "or pass a caption file)")
    paths, labels = [], []
    for folder in folders:
        for directory, subdirs, files in os.walk(os.path.join(root, folder)):
            subdirs.sort()
            for name in sorted(files):
                if name.lower().endswith(FOLDER_IMAGE_EXTENSIONS):
                    paths.append(os.path.join(directory, name))
                    labels.append(folder)
    if not paths:
        raise UsageError("--images", f"no images ({', '.join(FOLDER_IMAGE_EXTENSIONS)}) in the class folders of {root}")
    return paths, labels, folders


def _peek_keys(path):
    """Field names of a caption file's header (CSV/TSV) or first object (JSONL)."""
    import csv

    with open(path, encoding="utf-8", newline="") as f:
        if path.lower().endswith(".jsonl"):
            for line in f:
                if line.strip():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        return []
                    return list(row) if isinstance(row, dict) else []
            return []
        return csv.DictReader(f, delimiter="\t" if path.lower().endswith(".tsv") else ",").fieldnames or []


def _caption_file_labels(path, image_key, label_key, on_error):
    from vlzoo.data import read_caption_file

    if label_key is None:
        keys = _peek_keys(path)
        label_key = next((k for k in LABEL_KEYS if k in keys), None)
    records = read_caption_file(path, image_key=image_key, caption_key=label_key, on_error=on_error)
    if not records:
        raise UsageError("--images", f"{path} has no usable rows")
    return [r.image for r in records], [r.caption.strip() for r in records]


def _label_indices(labels, class_names, folder_names, from_folders):
    """int labels `(N,)` in `[0, C)`: by name, or by sorted folder order / integer labels."""
    index = {name: i for i, name in enumerate(class_names)}
    if all(label in index for label in set(labels)):
        return np.array([index[label] for label in labels], np.int64), None
    if from_folders and len(folder_names) == len(class_names):
        order = {folder: i for i, folder in enumerate(folder_names)}
        note = (f"class folders matched to the class names by sorted order (ImageNet convention): "
                f"{folder_names[0]} -> {class_names[0]!r}, ...")
        return np.array([order[label] for label in labels], np.int64), note
    if not from_folders and all(label.isdigit() for label in set(labels)):
        ints = np.array([int(label) for label in labels], np.int64)
        if ints.max() < len(class_names):
            return ints, "integer labels read as indices into the class names"
    missing = sorted(set(labels) - set(index))
    where = "class folders" if from_folders else "labels"
    raise UsageError("--classes", f"{len(missing)} {where} are not among the {len(class_names)} class names: "
                                  f"{', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''}")


def _write_json(path, payload, out):
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
    print(f"wrote {path}", file=out)


# ----------------------------------------------------------------------------- zeroshot


def cmd_zeroshot(args, out):
    _check_preset(args.preset)
    import keras

    from vlzoo.evaluation import zero_shot_accuracy

    images_arg = args.images
    _check_file(images_arg, "--images", "image folder or caption file")
    templates = _read_templates(args.templates)
    from_folders = os.path.isdir(images_arg)
    if from_folders:
        paths, labels, folders = _folder_labels(images_arg)
        default_classes = [folder.replace("_", " ") for folder in folders]
        if args.classes is None and args.classes_file is None:
            labels = [label.replace("_", " ") for label in labels]
            folders = default_classes
    else:
        if not images_arg.lower().endswith((".csv", ".tsv", ".jsonl")):
            raise UsageError("--images", f"{images_arg} is neither a folder nor a caption file (.csv, .tsv, .jsonl)")
        paths, labels = _caption_file_labels(images_arg, args.image_key, args.label_key, args.on_error)
        folders = default_classes = sorted(set(labels))
    if args.classes is not None:
        class_names = _split_classes(args.classes)
        source = "--classes"
    elif args.classes_file is not None:
        class_names = _read_classes_file(args.classes_file)
        source = "--classes-file"
    else:
        class_names, source = default_classes, None
    if not class_names:
        raise UsageError(source or "--images", "no class names")
    duplicates = sorted({c for c in class_names if class_names.count(c) > 1})
    if duplicates:
        raise UsageError(source, f"duplicate class names: {', '.join(duplicates)}")
    label_ids, note = _label_indices(labels, class_names, folders, from_folders)
    if note:
        print(f"note: {note}", file=out)

    model = _load_preset(args.preset, out)
    images = ImageFiles(paths, model.preprocessor)
    print(f"zero-shot: {len(paths)} images, {len(class_names)} classes, {len(templates)} template(s) "
          f"({args.templates}), preset {args.preset}, backend {keras.backend.backend()}", file=out)
    metrics = zero_shot_accuracy(model, images, label_ids, class_names, templates, top_k=args.top_k,
                                 batch_size=args.batch_size, verbose=args.verbose)
    for name, value in metrics.items():
        print(f"{name}: {value:.4f}", file=out)
    if args.json:
        _write_json(args.json, {
            "command": "zeroshot", "preset": args.preset, "images": os.path.abspath(images_arg),
            "num_images": len(paths), "num_classes": len(class_names), "classes": class_names,
            "templates": args.templates, "num_templates": len(templates), "backend": keras.backend.backend(),
            "metrics": metrics,
        }, out)
    return 0


# ----------------------------------------------------------------------------- retrieve


def _data_source(data):
    """`("captions" | "shards", location)` of a `--data` argument; a usage error names it."""
    from vlzoo.data.pipeline import resolve_source

    try:
        return resolve_source(data)
    except (ValueError, FileNotFoundError, TypeError) as error:
        raise UsageError("--data", str(error)) from None


def _retrieval_pairs(data, image_key, caption_key, on_error):
    """(image items, their sources, captions, image id of every caption) of a caption file or tar shards."""
    from vlzoo.data import DatasetStats, read_caption_file, read_tar_samples
    kind, location = _data_source(data)
    stats = DatasetStats()
    if kind == "captions":
        records = read_caption_file(location, image_key=image_key, caption_key=caption_key, on_error=on_error,
                                    stats=stats)
        first = {}
        items, sources, captions, image_ids = [], [], [], []
        for record in records:
            if record.image not in first:
                first[record.image] = len(items)
                items.append(record.image)
                sources.append(f"{record.source} ({record.image})")
            captions.append(record.caption)
            image_ids.append(first[record.image])
    else:
        if image_key is not None:
            raise UsageError("--image-key", "applies to caption files, not tar shards")
        items, sources, captions = [], [], []
        for shard in location:
            for record in read_tar_samples(shard, caption_key=caption_key, on_error=on_error, stats=stats):
                items.append(record.image)
                sources.append(record.source)
                captions.append(record.caption)
        image_ids = list(range(len(items)))
    if not items:
        raise UsageError("--data", f"{data} holds no usable image-caption pairs ({stats.summary()})")
    return items, sources, captions, np.array(image_ids, np.int64), stats


def _query_scores(model, images, queries, batch_size, verbose):
    """`(N_images, Q)` numpy scores of every image against every query text (text -> image direction)."""
    import inspect

    from keras import ops

    from vlzoo.evaluation._common import batches

    text_embeds = model.encode_text(model.tokenizer(list(queries)))
    kwargs = {"direction": "t2i"} if "direction" in inspect.signature(model.score).parameters else {}
    parts = [
        ops.convert_to_numpy(model.score(model.encode_image(images[start:stop]), text_embeds, **kwargs))
        for start, stop in batches(len(images), batch_size, verbose)
    ]
    return np.concatenate(parts, axis=0)


def cmd_retrieve(args, out):
    _check_preset(args.preset)
    import keras

    from vlzoo.evaluation import retrieval_recall

    items, sources, captions, image_ids, stats = _retrieval_pairs(args.data, args.image_key, args.caption_key,
                                                                  args.on_error)
    if stats.num_skipped:
        print(f"note: {stats.summary()}", file=out)
    model = _load_preset(args.preset, out)
    images = ImageFiles(items, model.preprocessor, sources)
    payload = {"command": "retrieve", "preset": args.preset, "data": args.data, "num_images": len(items),
               "num_captions": len(captions), "backend": keras.backend.backend()}
    if args.query:
        scores = _query_scores(model, images, args.query, args.batch_size, args.verbose)
        top = min(args.top, len(items))
        first_caption = {}
        for caption, image in zip(captions, image_ids):
            first_caption.setdefault(int(image), caption)
        results = []
        for q, query in enumerate(args.query):
            order = np.argsort(-scores[:, q], kind="stable")[:top]
            print(f"query {query!r}: top {top} of {len(items)} images", file=out)
            hits = []
            for rank, i in enumerate(order, start=1):
                name = items[i] if isinstance(items[i], str) else sources[i]
                print(f"  {rank:>3}. {scores[i, q]:9.4f}  {name}  ({first_caption[int(i)]!r})", file=out)
                hits.append({"rank": rank, "score": float(scores[i, q]), "image": name,
                             "caption": first_caption[int(i)]})
            results.append({"query": query, "results": hits})
        payload["queries"] = results
    else:
        print(f"retrieval: {len(items)} images, {len(captions)} captions, preset {args.preset}, "
              f"backend {keras.backend.backend()}", file=out)
        metrics = retrieval_recall(model, images, captions, image_ids=image_ids, ks=args.ks,
                                   batch_size=args.batch_size, verbose=args.verbose)
        for name, value in metrics.items():
            print(f"{name}: {value:.4f}", file=out)
        payload["metrics"] = metrics
    if args.json:
        _write_json(args.json, payload, out)
    return 0


# ----------------------------------------------------------------------------- train


def _count_pairs(data, image_key, caption_key, on_error):
    """Records of a caption file (None for tar shards, whose length is only known by reading them)."""
    from vlzoo.data import read_caption_file
    kind, location = _data_source(data)
    if kind != "captions":
        return None
    return len(read_caption_file(location, image_key=image_key, caption_key=caption_key, on_error=on_error))


def cmd_train(args, out):
    _check_preset(args.preset)
    import keras

    import vlzoo

    if args.family is not None and args.family not in vlzoo.transfer.FAMILIES:
        raise UsageError("--family", f"{args.family!r} is not one of {', '.join(vlzoo.transfer.FAMILIES)}")
    steps = args.steps_per_epoch
    if steps is None:
        count = _count_pairs(args.data, args.image_key, args.caption_key, args.on_error)
        if count is None:
            raise UsageError("--steps-per-epoch", "required with tar shards (their length is unknown up front)")
        steps = count // args.batch_size
        if steps < 1:
            raise UsageError("--batch-size", f"{args.data} has {count} usable pairs, fewer than one batch of "
                                             f"{args.batch_size}")
    total_steps = steps * args.epochs
    if args.warmup_steps >= total_steps and args.warmup_steps > 0:
        raise UsageError("--warmup-steps", f"{args.warmup_steps} is not below the {total_steps} training steps")

    keras.utils.set_random_seed(args.seed)
    model = _load_preset(args.preset, out, family=args.family)
    train = vlzoo.data.image_text_dataset(
        args.data, model.tokenizer, model.preprocessor, args.batch_size, training=True, seed=args.seed,
        image_key=args.image_key, caption_key=args.caption_key, repeat=args.steps_per_epoch is not None,
        on_error=args.on_error,
    )
    stats = train.stats
    from vlzoo.training import configure

    # "constant" is the warm-up followed by a flat rate: a cosine whose floor is the peak.
    configure(model, learning_rate=args.learning_rate, total_steps=total_steps, warmup_steps=args.warmup_steps,
              alpha=0.0 if args.schedule == "cosine" else 1.0, weight_decay=args.weight_decay,
              gradient_accumulation_steps=args.gradient_accumulation_steps, remat=args.remat or None)
    print(f"training {args.preset} ({type(model).__name__}, {model.count_params():,} parameters) on {args.data}: "
          f"{args.epochs} epoch(s) x {steps} steps, batch {args.batch_size}, lr {args.learning_rate} "
          f"({args.schedule}, warm-up {args.warmup_steps}), weight decay {args.weight_decay}, "
          f"gradient accumulation {args.gradient_accumulation_steps or 1}, remat {args.remat}, "
          f"seed {args.seed}, backend {keras.backend.backend()}", file=out)
    history = model.fit(train, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch, shuffle=False,
                        verbose=args.verbose)  # the dataset shuffles itself
    if stats.num_skipped:
        print(f"note: {stats.summary()}", file=out)
    losses = history.history.get("loss", [])
    if losses:
        print(f"final loss: {losses[-1]:.4f}", file=out)
    model.save_to_preset(os.path.abspath(args.out))
    print(f"saved to {os.path.abspath(args.out)}", file=out)
    return 0


# ----------------------------------------------------------------------------- convert


def cmd_convert(args, out):
    from vlzoo.convert.checkpoints import AUTHOR_SOURCES, convert_checkpoint

    if args.from_ in AUTHOR_SOURCES:
        if args.model or args.config:
            raise UsageError("--config" if args.config else "--model", f"does not apply to --from {args.from_}; "
                             "name the architecture with --preset")
        if not args.preset:
            raise UsageError("--preset", f"--from {args.from_} needs --preset NAME, the vlzoo preset of the "
                                         f"checkpoint's architecture (e.g. {AUTHOR_SOURCES[args.from_]})")
    elif args.preset:
        raise UsageError("--preset", "applies to --from llip and --from sparo only")
    if args.from_ == "open_clip" and not (args.model or args.config):
        raise UsageError("--model", "--from open_clip needs --model NAME (open_clip's model config) "
                                    "or --config model.json")
    if args.from_ == "keras_hub" and (args.model or args.config):
        raise UsageError("--config" if args.config else "--model", "does not apply to --from keras_hub")
    if args.from_ == "transformers" and args.model:
        raise UsageError("--model", "applies to --from open_clip only")
    _check_file(args.source, "--source", "checkpoint")
    if args.config:
        _check_file(args.config, "--config", "config file")

    def log(message):
        print(message, file=out)

    start = time.perf_counter()
    status = convert_checkpoint(
        args.from_, args.source, args.out, model_name=args.model, config=args.config, preset=args.preset,
        dtype=args.dtype, check=not args.no_check, peer_check=not args.no_peer_check, batch_size=args.batch_size, log=log,
        progress=not args.quiet,
    )
    log(f"done in {time.perf_counter() - start:.1f} s")
    return status


# ------------------------------------------------------------------------ parser


def _number(kind, allow_zero):
    """An argparse `type`: `kind` (int or float) that is > 0, or >= 0 with `allow_zero`, and finite."""
    expected = f"{'an integer' if kind is int else 'a number'} >= 0" if allow_zero else (
        f"a positive {'integer' if kind is int else 'number'}")

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}")
        return value

    return parse


_positive_int = _number(int, allow_zero=False)
_non_negative_int = _number(int, allow_zero=True)
_positive_float = _number(float, allow_zero=False)
_non_negative_float = _number(float, allow_zero=True)


def _add_command(sub, name, help, description, examples):
    return sub.add_parser(
        name, help=help, description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n" + "\n".join(f"  {line}" for line in examples),
    )


def _add_report_options(p, json_help):
    p.add_argument("--json", default=None, metavar="OUT", help=json_help)
    p.add_argument("--verbose", action="store_true", help="show progress bars while encoding")


def _add_preset(p, required=True):
    p.add_argument("--preset", required=required, metavar="NAME_OR_DIR",
                   help="a registered or pretrained preset name (see `vlzoo list [--pretrained]`), a "
                   "preset directory written by save_to_preset / `vlzoo train` / `vlzoo convert`, or "
                   "a hub handle hf://org/name[@revision] or kaggle://owner/model/framework/variation[/version]")


def _add_caption_keys(p, caption_help):
    p.add_argument("--image-key", default=None, metavar="KEY",
                   help="caption files: column/key of the image path (default: the first present of image, "
                   "file_name, filename, filepath, image_path, path)")
    p.add_argument("--caption-key", default=None, metavar="KEY", help=caption_help)
    p.add_argument("--on-error", default="raise", choices=("raise", "skip"),
                   help="bad records (missing or undecodable image, empty caption, malformed row): raise an "
                   "error naming the file and line, or skip and count them (default: %(default)s)")


def build_parser():
    parser = argparse.ArgumentParser(
        prog="vlzoo",
        description="vlzoo: Keras 3 vision-language contrastive models (CLIP, SigLIP, ...). "
        "The backend is chosen by the KERAS_BACKEND environment variable (jax, tensorflow, torch).",
        epilog="Run `vlzoo COMMAND --help` for the options and examples of a command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = _add_command(sub, "list", "table of registered presets",
                     "Print every registered preset: name, family, parameter count\n"
                     "(computed without allocating weights) and whether weights are bundled;\n"
                     "with --pretrained, the presets of real public weights instead.",
                     ["vlzoo list", "vlzoo list --family siglip", "vlzoo list --pretrained"])
    p.add_argument("--family", default=None, metavar="F",
                   help="only presets of this family, e.g. clip or siglip (default: all)")
    p.add_argument("--pretrained", action="store_true",
                   help="list the pretrained presets: their source, licence and download size")
    p.set_defaults(func=cmd_list)

    p = _add_command(sub, "download", "fetch and convert weights into the cache",
                     "Download a pretrained preset or a hub handle, check every file, convert it\n"
                     "to a vlzoo preset in the cache and print where; later loads need no network\n"
                     "(HF_HUB_OFFLINE=1 works).",
                     ["vlzoo download clip_vit_b16_openai", "vlzoo download hf://openai/clip-vit-base-patch32"])
    p.add_argument("handle", metavar="NAME_OR_HANDLE",
                   help="a pretrained preset (see `vlzoo list --pretrained`), hf://org/name[@revision] or "
                   "kaggle://owner/model/framework/variation[/version]")
    p.set_defaults(func=cmd_download)

    p = _add_command(sub, "info", "details of one preset",
                     "Print vlzoo.preset_info(NAME) as JSON: name, family, params, paper,\n"
                     "weights_available, description, directory.",
                     ["vlzoo info clip_vit_b16", "vlzoo info ./my_preset"])
    p.add_argument("name", metavar="NAME", help="a registered preset name or a preset directory")
    p.set_defaults(func=cmd_info)

    # ------------------------------------------------------------------ zeroshot
    p = _add_command(
        sub, "zeroshot", "zero-shot classification accuracy on an image folder or a labelled caption file",
        "Zero-shot classification with prompt templates (vlzoo.evaluation.zero_shot_accuracy,\n"
        "with the family's own prompt ensembling). Images come from\n"
        "  * a folder laid out as DIR/<class>/*.jpg|png|... (ImageNet style): the class of an\n"
        "    image is its sub-folder; without --classes/--classes-file the folder names are the\n"
        "    class names (underscores read as spaces); with them, folders equal to class names\n"
        "    match by name, otherwise the sorted folders map to the class list in order (as\n"
        "    torchvision's ImageFolder: n01440764 -> the first class, ...);\n"
        "  * a caption file (.csv/.tsv with a header, or .jsonl) whose rows name an image and its\n"
        "    class: the column --label-key (default: label, class, class_name, classname, else the\n"
        "    caption column); integer labels index the class list.\n"
        "Images are preprocessed with the preset's preprocessor, --batch-size at a time.\n"
        "Prints top-k accuracies; --json also writes them to a file.",
        ["vlzoo zeroshot --preset clip_vit_b32 --images imagenet/val --classes-file classnames.txt "
         "--templates imagenet",
         "vlzoo zeroshot --preset ./my_preset --images shapes/ --templates simple --top-k 1 3 --json acc.json",
         "vlzoo zeroshot --preset clip_tiny --images labels.csv --classes 'red circle,blue square'"],
    )
    _add_preset(p)
    p.add_argument("--images", required=True, metavar="DIR_OR_CAPTIONFILE",
                   help="image folder DIR/<class>/*.jpg, or a caption file (.csv, .tsv, .jsonl) of image "
                   "paths (relative to its folder) and labels")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--classes", default=None, metavar='"a,b,c"',
                       help="comma-separated class names, in label order (default: the class folders, or "
                       "the sorted distinct labels of the caption file)")
    group.add_argument("--classes-file", default=None, metavar="FILE",
                       help="text file with one class name per line (blank lines ignored), instead of --classes")
    p.add_argument("--templates", default="default", metavar="imagenet|simple|default|FILE",
                   help="prompt templates: imagenet (CLIP's 80), simple (CLIP's 7), default "
                   "('a photo of a {}.'), or a file with one template containing {} per line "
                   "(default: %(default)s)")
    p.add_argument("--top-k", type=_positive_int, nargs="+", default=[1, 5], metavar="K",
                   help="accuracies to report, top-K for each K (default: 1 5)")
    p.add_argument("--batch-size", type=_positive_int, default=64,
                   help="images (and prompts) per forward pass (default: %(default)s)")
    p.add_argument("--image-key", default=None, metavar="KEY",
                   help="caption files: column/key of the image path (default: the first present of image, "
                   "file_name, filename, filepath, image_path, path)")
    p.add_argument("--label-key", default=None, metavar="KEY",
                   help="caption files: column/key of the class label (default: the first present of "
                   f"{', '.join(LABEL_KEYS)}, else caption, text, title)")
    p.add_argument("--on-error", default="raise", choices=("raise", "skip"),
                   help="caption files: a bad row (missing image, empty label) raises an error naming the "
                   "line, or is skipped (default: %(default)s)")
    _add_report_options(p, "also write the metrics, class names and settings to this JSON file")
    p.set_defaults(func=cmd_zeroshot)

    # ------------------------------------------------------------------ retrieve
    p = _add_command(
        sub, "retrieve", "image-text retrieval recall@K, or the best images for a text query",
        "Image -> text and text -> image retrieval recall@K (vlzoo.evaluation.retrieval_recall,\n"
        "pessimistic ties) on the image-caption pairs of\n"
        "  * a caption file (.csv/.tsv/.jsonl, read with vlzoo.data.read_caption_file): rows\n"
        "    naming the same image are several captions of that image;\n"
        "  * webdataset tar shards (one .tar, a glob, a {000..009} brace range or a directory of\n"
        "    shards; KEY.jpg + KEY.txt members): one caption per image.\n"
        "Images are preprocessed with the preset's preprocessor (evaluation transform) and\n"
        "captions tokenised with its tokenizer. With --query, prints instead the --top images\n"
        "whose scores against each query text are highest.",
        ["vlzoo retrieve --preset clip_vit_b32 --data coco/val_captions.csv --ks 1 5 10",
         "vlzoo retrieve --preset ./my_preset --data 'shards/val-{000..003}.tar' --json recall.json",
         "vlzoo retrieve --preset ./my_preset --data photos.csv --query 'a dog on a beach' --top 3"],
    )
    _add_preset(p)
    p.add_argument("--data", required=True, metavar="CAPTIONFILE_OR_SHARDS",
                   help="caption file (.csv, .tsv, .jsonl), a directory holding one, or tar shards "
                   "(path, glob, brace range or directory)")
    p.add_argument("--ks", type=_positive_int, nargs="+", default=[1, 5, 10], metavar="K",
                   help="recall@K to report, for each K (default: 1 5 10)")
    p.add_argument("--batch-size", type=_positive_int, default=64,
                   help="images (and captions) per forward pass (default: %(default)s)")
    p.add_argument("--query", action="append", default=None, metavar="TEXT",
                   help="print the best-matching images for this text instead of recall (repeatable)")
    p.add_argument("--top", type=_positive_int, default=5, metavar="N",
                   help="with --query: how many images to print per query (default: %(default)s)")
    _add_caption_keys(p, "column/key of the caption (caption files), or field of a tar sample's .json when it "
                         "has no .txt (default: the first present of caption, text, title)")
    _add_report_options(p, "also write the metrics (or the query results) to this JSON file")
    p.set_defaults(func=cmd_retrieve)

    # ------------------------------------------------------------------ train
    p = _add_command(
        sub, "train", "fine-tune a preset on image-caption pairs and save it as a preset",
        "Fine-tune with model.fit (the family's own contrastive loss, AdamW without weight decay\n"
        "on biases, norms, embeddings and the logit scale) on\n"
        "vlzoo.data.image_text_dataset(--data, ..., training=True): random resized crops, shuffled,\n"
        "seeded. An epoch is --steps-per-epoch batches (the data repeats), or one pass over a\n"
        "caption file. Then save_to_preset(--out); load it with vlzoo.from_preset(--out) or\n"
        "--preset OUT in the other commands.",
        ["vlzoo train --preset clip_vit_b32 --data train.csv --epochs 2 --batch-size 64 "
         "--learning-rate 1e-5 --out runs/b32_ft",
         "vlzoo train --preset clip_vit_b16_openai --family sparc --data train.csv --out runs/sparc_openai",
         "vlzoo train --preset clip_tiny --data 'shards/{000..009}.tar' --steps-per-epoch 500 "
         "--warmup-steps 100 --out runs/tiny"],
    )
    _add_preset(p)
    p.add_argument("--family", default=None, metavar="FAMILY",
                   help="train this family (filip, sparc, sparo, llip or stair) built on the towers of "
                   "--preset, a CLIP model (vlzoo.from_preset(..., family=...); docs/transfer.md)")
    p.add_argument("--data", required=True, metavar="SOURCE",
                   help="caption file (.csv, .tsv, .jsonl), a directory holding one, or tar shards "
                   "(path, glob, brace range or directory)")
    p.add_argument("--out", required=True, metavar="DIR", help="preset directory the fine-tuned model is saved to")
    p.add_argument("--epochs", type=_positive_int, default=1, help="training epochs (default: %(default)s)")
    p.add_argument("--batch-size", type=_positive_int, default=32,
                   help="pairs per step; the last partial batch is dropped (default: %(default)s)")
    p.add_argument("--learning-rate", type=_positive_float, default=1e-5,
                   help="peak AdamW learning rate (default: %(default)s)")
    p.add_argument("--weight-decay", type=_non_negative_float, default=0.1,
                   help="AdamW decoupled weight decay (default: %(default)s)")
    p.add_argument("--steps-per-epoch", type=_positive_int, default=None,
                   help="batches per epoch, the data repeating as needed; required for tar shards "
                   "(default: one pass over the caption file)")
    p.add_argument("--schedule", default="cosine", choices=("cosine", "constant"),
                   help="learning-rate schedule after the warm-up: cosine decay to 0 over the run, or "
                   "constant (default: %(default)s)")
    p.add_argument("--warmup-steps", type=_non_negative_int, default=0,
                   help="linear warm-up steps from 0 to --learning-rate (default: %(default)s)")
    p.add_argument("--gradient-accumulation-steps", type=_positive_int, default=None, metavar="N",
                   help="average the gradients of N batches per optimizer update (less memory, but each "
                   "batch's loss only contrasts its own pairs; default: no accumulation)")
    p.add_argument("--remat", action="store_true",
                   help="recompute the towers' activations in the backward pass (less memory, more time)")
    p.add_argument("--seed", type=_non_negative_int, default=0,
                   help="seed of the data order, the crops and any random initialisation "
                   "(default: %(default)s)")
    _add_caption_keys(p, "column/key of the caption (caption files), or field of a tar sample's .json when it "
                         "has no .txt (default: the first present of caption, text, title)")
    p.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                   help="Keras fit verbosity: 0 silent, 1 progress bar, 2 one line per epoch "
                   "(default: %(default)s)")
    p.set_defaults(func=cmd_train)

    # ------------------------------------------------------------------ convert
    p = _add_command(
        sub, "convert", "convert a local open_clip / transformers / keras-hub / Llip / SPARO checkpoint to a preset",
        "Convert a checkpoint you have on disk to a vlzoo preset directory (nothing is\n"
        "downloaded; vlzoo.convert.convert_checkpoint):\n"
        "  * open_clip: a .pt/.pth/.bin/.safetensors state dict (a training checkpoint's\n"
        "    state_dict is unwrapped, DDP prefixes dropped; OpenAI's TorchScript archives work),\n"
        "    with the architecture from --model NAME (open_clip's model_configs/NAME.json; open_clip\n"
        "    must be installed) or --config model.json;\n"
        "  * transformers: a CLIPModel / SiglipModel directory (config.json + model.safetensors or\n"
        "    pytorch_model.bin), or a weights file with --config config.json;\n"
        "  * keras_hub: a local keras-hub CLIPBackbone / SigLIPBackbone preset directory;\n"
        "  * llip, sparo: a checkpoint of the authors' code (facebookresearch/Llip,\n"
        "    ankitkv/sparo-clip), with the architecture from --preset (a vlzoo preset).\n"
        "The preset is then reloaded and its embeddings checked to be identical, and, when the\n"
        "peer package imports, compared with the peer built from the same weights on random\n"
        "inputs (exit status 1 above 1e-4 on embeddings or 1e-3 on logits).",
        ["vlzoo convert --from open_clip --source ViT-B-32.pt --model ViT-B-32 --out presets/my_b32",
         "vlzoo convert --from open_clip --source ckpt.safetensors --config my_model.json --out my_preset",
         "vlzoo convert --from transformers --source ./clip-vit-base-patch32 --out my_hf_clip",
         "vlzoo convert --from keras_hub --source ./keras_hub_siglip --out my_siglip",
         "vlzoo convert --from llip --source llip_b16_k32.pt --preset llip_vit_b16 --out my_llip"],
    )
    p.add_argument("--from", dest="from_", required=True,
                   choices=("open_clip", "transformers", "keras_hub", "llip", "sparo"),
                   help="the checkpoint's library")
    p.add_argument("--source", required=True, metavar="PATH",
                   help="checkpoint file or directory (see above for each library)")
    p.add_argument("--out", required=True, metavar="DIR", help="preset directory to write")
    p.add_argument("--model", default=None, metavar="NAME",
                   help="open_clip: model name whose installed config describes the architecture "
                   "(e.g. ViT-B-32, ViT-B-16-SigLIP)")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="open_clip: model config JSON (instead of --model); transformers: config.json "
                   "(default: next to the weights)")
    p.add_argument("--preset", default=None, metavar="NAME",
                   help="llip, sparo: the vlzoo preset (name or directory) of the checkpoint's architecture, "
                   "e.g. llip_vit_b16, llip_vit_g14, sparo_clip_vit_b32")
    p.add_argument("--dtype", default=None, metavar="POLICY",
                   help="dtype policy of the converted model, e.g. float32, bfloat16 (default: float32)")
    p.add_argument("--batch-size", type=_positive_int, default=2,
                   help="random inputs of the reload and parity checks (default: %(default)s)")
    p.add_argument("--no-check", action="store_true", help="skip the reload and parity checks")
    p.add_argument("--no-peer-check", action="store_true",
                   help="check the reloaded preset but do not build the peer model for the parity check")
    p.add_argument("--quiet", action="store_true", help="no progress bar while assigning the weights")
    p.set_defaults(func=cmd_convert)

    # ------------------------------------------------------------------ demo
    p = _add_command(
        sub, "demo", "the whole workflow on a bundled shapes model (the `make demo` job)",
        "Load a bundled *_shapes preset (trained on vlzoo.data.shapes, downloads nothing), measure\n"
        "zero-shot classification, retrieval and attribute binding on held-out generated images,\n"
        f"fine-tune it with model.fit to the prompt {DEMO_TEMPLATE!r}, measure again, draw a\n"
        "token-to-patch alignment map (SPARC, FILIP), save it as a preset, and reload the preset on\n"
        "this backend and on a second one to check that the similarities match. Seeded.",
        ["vlzoo demo", "KERAS_BACKEND=torch vlzoo demo --preset filip_shapes --steps 60 --out /tmp/filip_demo"],
    )
    p.add_argument("--preset", default="sparc_shapes",
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
    p.add_argument("--second-backend", default="auto", choices=("auto", "none", "jax", "tensorflow", "torch"),
                   help="backend the saved preset is also reloaded on: auto = torch, or jax when running on "
                   "torch; none to skip (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed for data and weights (default: %(default)s)")
    p.add_argument("--verbose", type=int, default=None, choices=(0, 1, 2),
                   help="Keras fit verbosity: 0 silent, 1 progress bar, 2 one line per epoch "
                   "(default: 1 on a terminal, 2 when the output is redirected)")
    p.add_argument("--out", default=os.path.join("out", "demo"), metavar="DIR",
                   help="directory for the alignment map and the saved preset (default: %(default)s)")
    p.set_defaults(func=cmd_demo)
    return parser


# User mistakes reported as one line (exit status 2) rather than a traceback.
_USER_ERRORS = (UsageError, ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError,
                KeyError, NotImplementedError)


def main(argv=None):
    """Entry point of the `vlzoo` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "demo" and min(args.steps, args.epochs, args.batch_size, args.eval_per_label,
                                      args.eval_pairs) < 1:
        parser.error("--steps, --epochs, --batch-size, --eval-per-label and --eval-pairs must be at least 1")
    try:
        return args.func(args, sys.stdout)
    except _USER_ERRORS as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
        message = " ".join(str(message).split())  # one line
        print(f"vlzoo {args.command}: error: {message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
