"""`vlzoo eval`: a benchmark read from its published layout, scored by any family."""

import argparse

from vlzoo.cli._common import (
    UsageError, _add_command, _add_preset, _add_report_options, _add_ties, _check_file, _check_preset, _load_preset,
    _naming, _non_negative_int, _positive_int, _probability, _write_json,
)
from vlzoo.presets import catalogue

# --benchmark -> (what --images is to it: "unused", "optional" or "required", the task it runs)
BENCHMARKS = {
    "sugarcrepe": ("optional", "selection"),
    "winoground": ("unused", "selection"),
    "mmvp": ("unused", "selection"),
    "coco": ("required", "retrieval"),
    "flickr30k": ("required", "retrieval"),
    "cifar10": ("unused", "classification"),
    "cifar100": ("unused", "classification"),
    "imagenet1k": ("unused", "classification"),
    "imagenetv2": ("unused", "classification"),
    "imagenet_sketch": ("unused", "classification"),
    "imagenet-a": ("unused", "classification"),
    "imagenet-r": ("unused", "classification"),
    "image_folder": ("unused", "classification"),
    "vg_relation": ("unused", "aro"),
    "vg_attribution": ("unused", "aro"),
    "coco_order": ("optional", "aro"),
    "flickr30k_order": ("optional", "aro"),
    "voc2012": ("unused", "segmentation"),
    "shapes": ("unused", "shapes"),
    "shapes_grounding": ("unused", "shapes_grounding"),
    "flickr30k_entities": ("optional", "phrase_grounding"),
    "refcoco": ("optional", "phrase_grounding"),
    "refcoco+": ("optional", "phrase_grounding"),
    "refcocog": ("optional", "phrase_grounding"),
}


def _background(text):
    """An argparse `type`: `ignore`, `prompts` or a probability in (0, 1)."""
    if text in ("ignore", "prompts"):
        return text
    try:
        return _probability(closed=False)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected ignore, prompts or a number in (0, 1); got {text!r}") from None


def _slot_indices(text):
    """An argparse `type`: comma-separated distinct slot indices >= 0."""
    try:
        indices = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated slot indices such as 0,3,7; got {text!r}") from None
    if min(indices) < 0 or len(set(indices)) != len(indices):
        raise argparse.ArgumentTypeError(f"expected distinct slot indices >= 0; got {text!r}")
    return indices


def _alphas(text):
    """An argparse `type`: comma-separated numbers in [0, 1] (WiSE-FT's mixing coefficients)."""
    parse = _probability(closed=True)
    return [parse(part) for part in text.split(",")]


def register(sub):
    p = _add_command(
        sub, "eval", "score a preset on a zero-shot, retrieval or compositionality benchmark from files on disk",
        "Reads a benchmark in its published layout (nothing is downloaded) and scores it with the\n"
        "family's own scores (vlzoo.evaluation.benchmarks):\n"
        "  sugarcrepe  --data: the repository's data/ (add_att.json, ..., swap_obj.json);\n"
        "              --images: COCO val2017 (default: DATA/val2017)\n"
        "  winoground  --data: the folder of examples.jsonl and images/\n"
        "  mmvp        --data: the folder of Questions.csv and 'MLLM_VLM Images/'\n"
        "  coco, flickr30k  --data: Karpathy's split file (dataset_coco.json, dataset_flickr30k.json);\n"
        "              --images: the images' root (COCO: the folder of val2014/); the test split,\n"
        "              recall@1, 5, 10 both ways\n"
        "  cifar10, cifar100  --data: cifar-10-batches-py/ or cifar-100-python/ (the python pickles);\n"
        "              zero-shot acc1, acc5 and mean per-class recall with --templates\n"
        "  imagenet1k, imagenetv2, imagenet_sketch, imagenet-a, imagenet-r  --data: the folder of class\n"
        "              folders (val/<wnid>/, imagenetv2-*-format-val/<0..999>/, sketch/<wnid>/,\n"
        "              imagenet-a/<wnid>/, imagenet-r/<wnid>/); as cifar (vlzoo.evaluation.imagenet)\n"
        "  vg_relation, vg_attribution  --data: ARO's folder of visual_genome_{relation,attribution}.json\n"
        "              and images/; acc and the authors' macro_acc (vlzoo.evaluation.aro)\n"
        "  coco_order, flickr30k_order  --data: the folder of BLIP's coco_karpathy_test.json /\n"
        "              flickr30k_test.json; --images: the images' root (default: DATA); needs spaCy's\n"
        "              en_core_web_sm for two of the four shuffles; --seed (default 1, as the authors)\n"
        "  voc2012     --data: VOCdevkit/VOC2012 (JPEGImages/, SegmentationClass/, ImageSets/); zero-shot\n"
        "              segmentation mIoU of the patch embeddings (FILIP, SPARC), --background, --candidates\n"
        "  shapes      no --data: SugarCrepe's and ARO's hard-negative types on held-out synthetic\n"
        "              shapes scenes (vlzoo.evaluation.shapes_compositional; --seed, default 0)\n"
        "  shapes_grounding  no --data: where each caption word's map over the patches lands on\n"
        "              held-out shapes scenes with exact object masks: the pointing game and the mass\n"
        "              inside per kind of word (noun, color, relation) with chance beside them, and\n"
        "              on two-object scenes a noun's or colour's own object against the other one\n"
        "              (pair_*, distractor_*)\n"
        "              (vlzoo.evaluation.shapes_grounding; FILIP and SPARC by their token alignment,\n"
        "              FLAIR by its text-conditioned attention, CLIP by its patch-text cosine; --seed,\n"
        "              default 0)\n"
        "  flickr30k_entities  --data: the folder of Annotations/, Sentences/ and <split>.txt; --images:\n"
        "              the Flickr30k images (default: DATA/flickr30k-images); --split (default test): the\n"
        "              pointing game of each phrase with boxes (vlzoo.evaluation.phrase_grounding)\n"
        "  refcoco, refcoco+, refcocog  --data: the refer folder (<dataset>/refs(unc|umd).p and\n"
        "              instances.json); --images: COCO train2014 (default:\n"
        "              DATA/images/mscoco/images/train2014); --split (default val): each expression's\n"
        "              pointing game on its referent's box\n"
        "Prints a Markdown table; --json writes the records in clip_benchmark's result schema\n"
        "(dataset, model, pretrained, task, metrics, language) plus the metrics per group and the\n"
        "towers' dtype (--dtype bfloat16 runs them in bfloat16; scores stay float32).\n"
        "WiSE-FT sweep: with --finetuned, --preset is the zero-shot model and each of --alphas\n"
        "scores the weight-space ensemble (1 - alpha) * zero-shot + alpha * fine-tuned\n"
        "(vlzoo.training.interpolate), one row per alpha; the records hold the alpha.",
        ["vlzoo eval --preset clip_vit_b16_openai --benchmark sugarcrepe --data sugar-crepe/data "
         "--images coco/val2017",
         "vlzoo eval --preset sparc_shapes --benchmark winoground --data winoground/data --json wino.json",
         "vlzoo eval --preset sparo_shapes --benchmark shapes",
         "vlzoo eval --preset sparc_shapes --benchmark shapes_grounding",
         "vlzoo eval --preset clip_shapes --finetuned runs/clip_ft --alphas 0,0.5,1 --benchmark shapes"],
    )
    _add_preset(p)
    p.add_argument("--benchmark", required=True, choices=tuple(BENCHMARKS), help="which benchmark --data holds")
    p.add_argument("--data", default=None, metavar="DIR", help="the benchmark's folder (see above; all but shapes and shapes_grounding)")
    p.add_argument("--images", default=None, metavar="DIR",
                   help="sugarcrepe: the COCO val2017 images (default: DATA/val2017); coco, flickr30k: the "
                   "images' root (required); coco_order, flickr30k_order: the images' root (default: DATA); "
                   "flickr30k_entities, refcoco*: the images' folder (see above)")
    p.add_argument("--classes", default=None, metavar="FILE",
                   help="image_folder: the class names, one per line in the folders' sorted order "
                   "(default: the folder names, underscores read as spaces)")
    p.add_argument("--templates", default="imagenet", metavar="imagenet|simple|default|FILE",
                   help="classification and voc2012: prompt templates (default: CLIP's 80 ImageNet ones)")
    _add_ties(p, "selection, retrieval, ARO, shapes: ")
    p.add_argument("--background", default="ignore", type=_background, metavar="ignore|prompts|P",
                   help="voc2012: background pixels ignored (default; 20 classes, SPARC's protocol), scored "
                   "with background prompts, or where no class's probability reaches P (both 21 classes)")
    p.add_argument("--candidates", default="all", choices=("all", "present"),
                   help="voc2012: each pixel chooses among all classes (default) or its image's own ones "
                   "(SPARC's 'given a text label')")
    p.add_argument("--split", default=None, metavar="SPLIT",
                   help="flickr30k_entities: train, val or test (default: test); refcoco, refcoco+, refcocog: a "
                   "split of the refs file, e.g. val, testA, testB, test (default: val)")
    p.add_argument("--seed", type=_non_negative_int, default=None,
                   help="coco_order, flickr30k_order: the seed of the caption shuffles (default: 1, the authors'); "
                   "shapes, shapes_grounding: of the scenes (and negatives) (default: 0)")
    p.add_argument("--slots", default=None, type=_slot_indices, metavar="I,J,...",
                   help="SPARO: score with these slots only (indices, e.g. 0,3,7; default: all)")
    p.add_argument("--batch-size", type=_positive_int, default=16, help="items per forward pass (default: 16)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="the towers' dtype policy (default: float32); scores are float32 either way")
    p.add_argument("--finetuned", default=None, metavar="NAME_OR_DIR",
                   help="WiSE-FT sweep: --preset after fine-tuning (same family and geometry); scores the mixes "
                   "of --alphas")
    p.add_argument("--alphas", default=None, type=_alphas, metavar="A,B,...",
                   help="with --finetuned: the fine-tuned weights' shares to score, each in [0, 1] "
                   "(default: 0,0.25,0.5,0.75,1)")
    _add_report_options(p, "also write the records (clip_benchmark's schema) to this JSON file")
    p.set_defaults(func=run)


def _read(args):
    """The benchmarks `--data` (and `--images`) hold, as a list."""
    # heavy: imports a backend
    from vlzoo.evaluation import aro, benchmarks, imagenet, phrase_grounding, segmentation

    name = args.benchmark
    if name == "flickr30k_entities":
        return [phrase_grounding.flickr30k_entities(args.data, split=args.split or "test", images=args.images)]
    if name in phrase_grounding.SPLITS_BY:
        return [phrase_grounding.refcoco(args.data, dataset=name, split=args.split or "val", images=args.images)]
    if name == "voc2012":
        return [segmentation.voc2012(args.data)]
    if name in imagenet.IMAGENET_BENCHMARKS:
        return [imagenet.IMAGENET_BENCHMARKS[name](args.data)]
    if name in ("vg_relation", "vg_attribution"):
        return [getattr(aro, name)(args.data)]
    if name in aro.ORDER_FILES:
        try:
            return [getattr(aro, name)(args.data, images=args.images, seed=1 if args.seed is None else args.seed)]
        except ImportError as error:
            raise UsageError("--benchmark", str(error)) from None
    if name == "sugarcrepe":
        return benchmarks.sugarcrepe(args.data, args.images or f"{args.data}/val2017")
    if name in ("coco", "flickr30k"):
        return [benchmarks.karpathy(args.data, args.images, name=name)]
    if name == "image_folder":
        benchmark = benchmarks.image_folder(args.data)  # the folder's own errors name --data
        if args.classes is not None:
            with _naming("--classes"):
                benchmark = benchmarks.image_folder(args.data, classes=args.classes)
        return [benchmark]
    if name.startswith("cifar"):
        chosen = benchmarks.cifar(args.data)
        if chosen.name != name:
            raise UsageError("--data", f"{args.data} holds {chosen.name}, not {name}")
        return [chosen]
    return [getattr(benchmarks, name)(args.data)]


def run(args, out):
    _check_preset(args.preset)
    if args.finetuned is not None:
        _check_preset(args.finetuned, "--finetuned")
    elif args.alphas is not None:
        raise UsageError("--alphas", "the WiSE-FT shares need --finetuned")
    images, task = BENCHMARKS[args.benchmark]
    if task.startswith("shapes"):
        if args.data is not None:
            raise UsageError("--data", f"{args.benchmark} builds its scenes itself; it reads no files")
    elif args.data is None:
        raise UsageError("--data", f"{args.benchmark} needs the folder of its files")
    else:
        _check_file(args.data, "--data", "folder")
    if args.images is not None and images == "unused":
        raise UsageError("--images", f"{args.benchmark} reads its images from --data")
    if args.images is None and images == "required":
        raise UsageError("--images", f"{args.benchmark} needs the folder of its images")
    if args.classes is not None and args.benchmark != "image_folder":
        raise UsageError("--classes", f"{args.benchmark} names its own classes; --classes is for image_folder")
    if args.classes is not None:
        _check_file(args.classes, "--classes")
    for argument, given, readers in (
            ("--templates", args.templates != "imagenet", task in ("classification", "segmentation")),
            ("--background", args.background != "ignore", task == "segmentation"),
            ("--candidates", args.candidates != "all", task == "segmentation"),
            ("--seed", args.seed is not None, task.startswith("shapes") or args.benchmark.endswith("_order")),
            ("--split", args.split is not None, task == "phrase_grounding")):
        if given and not readers:
            raise UsageError(argument, f"{args.benchmark} does not use it")
    with _naming("--data"):
        chosen = [None] if task.startswith("shapes") else _read(args)
    # heavy: imports a backend
    from vlzoo.evaluation import grounding, results, segmentation
    from vlzoo.evaluation.templates import read_templates
    from vlzoo.models.sparo import SPARO

    templates = None
    if task in ("classification", "segmentation"):
        with _naming("--templates"):
            templates = read_templates(args.templates)
    model = _load_preset(args.preset, out, dtype=args.dtype)
    if task == "segmentation":
        try:
            segmentation.check_family(model)
        except TypeError as error:
            raise UsageError("--preset", str(error)) from None
    if task in ("shapes_grounding", "phrase_grounding"):
        try:
            grounding.grounding_method(model)
        except NotImplementedError as error:
            raise UsageError("--preset", str(error)) from None
    source = catalogue.pretrained_presets().get(args.preset, {}).get("handle")
    options = dict(batch_size=args.batch_size, verbose=args.verbose)
    if args.slots is not None:
        if not isinstance(model, SPARO):
            raise UsageError("--slots", f"{args.preset} has no slots to choose (SPARO presets have)")
        if max(args.slots) >= model.num_slots:
            raise UsageError("--slots", f"{args.preset} has {model.num_slots} slots (0 to {model.num_slots - 1}); "
                             f"received {args.slots}")
        options["slots"] = args.slots
    records = []
    for index, (name, alpha, scored) in enumerate(_models(args, model, out)):
        for benchmark in chosen:  # each benchmark's size is printed once
            for result in _score(scored, benchmark, task, templates, args, options, None if index else out):
                record = results.benchmark_record(result, name, pretrained=source, dtype=scored.dtype_policy.name)
                records.append(record if alpha is None else dict(record, alpha=alpha))
    print(results.markdown_table(records), file=out, end="")
    if args.json:
        _write_json(args.json, records, out)
    return 0


def _models(args, model, out):
    """`(name, alpha, model)` to score: the preset (alpha None), or with --finetuned its WiSE-FT mixes, one at a
    time."""
    if args.finetuned is None:
        yield args.preset, None, model
        return
    # heavy: imports a backend
    from vlzoo.training import interpolate

    finetuned = _load_preset(args.finetuned, out, dtype=args.dtype, argument="--finetuned")
    for alpha in args.alphas or (0.0, 0.25, 0.5, 0.75, 1.0):
        with _naming("--finetuned"):
            mixed = interpolate(model, finetuned, alpha)
        yield f"{args.preset} + {args.finetuned} (alpha {alpha:g})", alpha, mixed


def _score(model, benchmark, task, templates, args, options, out):
    """The results of `model` on `benchmark` (a list: shapes gives one per group); the benchmark's size is
    printed to `out` unless it is None."""
    # heavy: imports a backend
    from vlzoo.evaluation import (
        aro, benchmarks, phrase_grounding, segmentation, shapes_compositional, shapes_grounding,
    )

    def say(text):
        if out is not None:
            print(text, file=out)

    if task == "shapes":
        return shapes_compositional.evaluate(model, seed=args.seed or 0, ties=args.ties, **options)
    if task == "shapes_grounding":
        result = shapes_grounding.evaluate(model, seed=args.seed or 0, **options)
        say(f"{result['dataset']}: words mapped by {result['method']}")
        return [result]
    if task == "phrase_grounding":
        say(f"{benchmark.name}: {len(benchmark)} phrases in {len(benchmark.captions)} captions")
        return [phrase_grounding.evaluate_phrase_grounding(model, benchmark, **options)]
    if task == "classification":
        say(f"{benchmark.name}: {len(benchmark.labels)} images of {len(set(benchmark.labels.tolist()))} of "
            f"{len(benchmark.class_names)} classes, {len(templates)} template(s)")
        return [benchmarks.evaluate_classification(model, benchmark, templates, **options)]
    if task == "retrieval":
        say(f"{benchmark.name}: {len(benchmark.images)} images, {len(benchmark.captions)} captions")
        return [benchmarks.evaluate_retrieval(model, benchmark, ties=args.ties, **options)]
    if task == "segmentation":
        say(f"{benchmark.name}: {len(benchmark.images)} images, {len(benchmark.class_names)} classes, "
            f"{len(templates)} template(s)")
        return [segmentation.evaluate_segmentation(
            model, benchmark, templates, background=args.background, candidates=args.candidates, **options)]
    if task == "aro":
        say(f"{benchmark.name}: {len(benchmark.items)} items")
        return [aro.evaluate_aro(model, benchmark, ties=args.ties, **options)]
    say(f"{benchmark.name}: {len(benchmark.items)} items")
    return [benchmarks.evaluate_selection(model, benchmark, ties=args.ties, **options)]
