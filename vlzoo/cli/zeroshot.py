"""`vlzoo zeroshot`: top-k zero-shot accuracy on an image folder or a labelled caption file."""

import os

from vlzoo.cli._common import (
    UsageError, _add_command, _add_image_key, _add_preset, _add_report_options, _check_file, _check_preset,
    _load_preset, _naming, _positive_int, _write_json,
)


def register(sub):
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
    _add_image_key(p)
    p.add_argument("--label-key", default=None, metavar="KEY",
                   help="caption files: column/key of the class label (default: the first present of "
                   "label, class, class_name, classname, else caption, text, title)")
    p.add_argument("--on-error", default="raise", choices=("raise", "skip"),
                   help="caption files: a bad row (missing image, empty label) raises an error naming the "
                   "line, or is skipped (default: %(default)s)")
    _add_report_options(p, "also write the metrics, class names and settings to this JSON file")
    p.set_defaults(func=run)


def run(args, out):
    _check_preset(args.preset)
    # heavy: imports a backend
    import keras

    from vlzoo.data import labels
    from vlzoo.evaluation import zero_shot_accuracy
    from vlzoo.evaluation.templates import read_templates

    images_arg = args.images
    _check_file(images_arg, "--images", "image folder or caption file")
    with _naming("--templates"):
        templates = read_templates(args.templates)
    from_folders = os.path.isdir(images_arg)
    if from_folders:
        with _naming("--images"):
            paths, image_labels, folders = labels.folder_labels(images_arg)
        default_classes = [folder.replace("_", " ") for folder in folders]
        if args.classes is None and args.classes_file is None:
            image_labels = [label.replace("_", " ") for label in image_labels]
            folders = default_classes
    else:
        if not images_arg.lower().endswith((".csv", ".tsv", ".jsonl")):
            raise UsageError("--images", f"{images_arg} is neither a folder nor a caption file (.csv, .tsv, .jsonl)")
        with _naming("--images"):
            paths, image_labels = labels.caption_file_labels(images_arg, args.image_key, args.label_key,
                                                             args.on_error)
        folders = default_classes = sorted(set(image_labels))
    if args.classes is not None:
        class_names, source = labels.split_classes(args.classes), "--classes"
    elif args.classes_file is not None:
        source = "--classes-file"
        with _naming(source):
            class_names = labels.read_classes_file(args.classes_file)
    else:
        class_names, source = default_classes, None
    if not class_names:
        raise UsageError(source or "--images", "no class names")
    duplicates = sorted({c for c in class_names if class_names.count(c) > 1})
    if duplicates:
        raise UsageError(source, f"duplicate class names: {', '.join(duplicates)}")
    with _naming("--classes"):
        label_ids, note = labels.label_indices(image_labels, class_names, folders, from_folders)
    if note:
        print(f"note: {note}", file=out)

    model = _load_preset(args.preset, out)
    images = labels.ImageFiles(paths, model.preprocessor)
    backend = keras.backend.backend()
    print(f"zero-shot: {len(paths)} images, {len(class_names)} classes, {len(templates)} template(s) "
          f"({args.templates}), preset {args.preset}, backend {backend}", file=out)
    metrics = zero_shot_accuracy(model, images, label_ids, class_names, templates, top_k=args.top_k,
                                 batch_size=args.batch_size, verbose=args.verbose)
    for name, value in metrics.items():
        print(f"{name}: {value:.4f}", file=out)
    if args.json:
        _write_json(args.json, {
            "command": "zeroshot", "preset": args.preset, "images": os.path.abspath(images_arg),
            "num_images": len(paths), "num_classes": len(class_names), "classes": class_names,
            "templates": args.templates, "num_templates": len(templates), "backend": backend,
            "metrics": metrics,
        }, out)
    return 0
