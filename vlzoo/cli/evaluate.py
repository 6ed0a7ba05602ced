"""`vlzoo eval`: a benchmark read from its published layout, scored by any family."""

from vlzoo import pretrained
from vlzoo.cli._common import (
    UsageError, _add_command, _add_preset, _add_report_options, _check_file, _check_preset, _load_preset,
    _naming, _positive_int, _write_json,
)

# --benchmark -> (what --images is to it: "unused", "optional" or "required", the task it runs)
BENCHMARKS = {
    "sugarcrepe": ("optional", "selection"),
    "winoground": ("unused", "selection"),
    "mmvp": ("unused", "selection"),
    "coco": ("required", "retrieval"),
    "flickr30k": ("required", "retrieval"),
    "cifar10": ("unused", "classification"),
    "cifar100": ("unused", "classification"),
}


def register(sub):
    p = _add_command(
        sub, "eval", "score a preset on SugarCrepe, Winoground, MMVP-VLM, COCO, Flickr30k or CIFAR from files on disk",
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
        "Prints a Markdown table; --json writes the records in clip_benchmark's result schema\n"
        "(dataset, model, pretrained, task, metrics, language) plus the metrics per group and the\n"
        "towers' dtype (--dtype bfloat16 runs them in bfloat16; scores stay float32).",
        ["vlzoo eval --preset clip_vit_b16_openai --benchmark sugarcrepe --data sugar-crepe/data "
         "--images coco/val2017",
         "vlzoo eval --preset sparc_shapes --benchmark winoground --data winoground/data --json wino.json"],
    )
    _add_preset(p)
    p.add_argument("--benchmark", required=True, choices=tuple(BENCHMARKS), help="which benchmark --data holds")
    p.add_argument("--data", required=True, metavar="DIR", help="the benchmark's folder (see above)")
    p.add_argument("--images", default=None, metavar="DIR",
                   help="sugarcrepe: the COCO val2017 images (default: DATA/val2017); coco, flickr30k: the "
                   "images' root (required)")
    p.add_argument("--templates", default="imagenet", metavar="imagenet|simple|default|FILE",
                   help="classification: prompt templates (default: CLIP's 80 ImageNet ones)")
    p.add_argument("--ties", default="expected", choices=("expected", "pessimistic", "optimistic"),
                   help="selection: tied scores count their expected value under a random order (default; "
                   "chance for a constant model), as failed (the benchmarks' own scripts) or as passed")
    p.add_argument("--batch-size", type=_positive_int, default=16, help="items per forward pass (default: 16)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="the towers' dtype policy (default: float32); scores are float32 either way")
    _add_report_options(p, "also write the records (clip_benchmark's schema) to this JSON file")
    p.set_defaults(func=run)


def _read(benchmarks, args):
    """The benchmarks `--data` (and `--images`) hold, as a list."""
    name = args.benchmark
    if name == "sugarcrepe":
        return benchmarks.sugarcrepe(args.data, args.images or f"{args.data}/val2017")
    if name in ("coco", "flickr30k"):
        return [benchmarks.karpathy(args.data, args.images, name=name)]
    if name.startswith("cifar"):
        chosen = benchmarks.cifar(args.data)
        if chosen.name != name:
            raise UsageError("--data", f"{args.data} holds {chosen.name}, not {name}")
        return [chosen]
    return [getattr(benchmarks, name)(args.data)]


def run(args, out):
    _check_preset(args.preset)
    _check_file(args.data, "--data", "folder")
    images, task = BENCHMARKS[args.benchmark]
    if args.images is not None and images == "unused":
        raise UsageError("--images", f"{args.benchmark} reads its images from --data")
    if args.images is None and images == "required":
        raise UsageError("--images", f"{args.benchmark} needs the folder of its images")
    # heavy: imports a backend
    from vlzoo.evaluation import benchmarks, results
    from vlzoo.evaluation.templates import read_templates

    with _naming("--data"):
        chosen = _read(benchmarks, args)
    if task == "classification":
        with _naming("--templates"):
            templates = read_templates(args.templates)
    model = _load_preset(args.preset, out, dtype=args.dtype)
    source = pretrained.catalogue().get(args.preset, {}).get("handle")
    options = dict(batch_size=args.batch_size, verbose=args.verbose)
    records = []
    for benchmark in chosen:
        if task == "classification":
            print(f"{benchmark.name}: {len(benchmark.labels)} images, {len(benchmark.class_names)} classes, "
                  f"{len(templates)} template(s)", file=out)
            result = benchmarks.evaluate_classification(model, benchmark, templates, **options)
        elif task == "retrieval":
            print(f"{benchmark.name}: {len(benchmark.images)} images, {len(benchmark.captions)} captions", file=out)
            result = benchmarks.evaluate_retrieval(model, benchmark, **options)
        else:
            print(f"{benchmark.name}: {len(benchmark.items)} items", file=out)
            result = benchmarks.evaluate_selection(model, benchmark, ties=args.ties, **options)
        records.append(results.benchmark_record(result, args.preset, pretrained=source, dtype=model.dtype_policy.name))
    print(results.markdown_table(records), file=out, end="")
    if args.json:
        _write_json(args.json, records, out)
    return 0
