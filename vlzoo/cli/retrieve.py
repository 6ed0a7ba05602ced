"""`vlzoo retrieve`: image-text retrieval recall@K, or the best images for text queries."""

import numpy as np

from vlzoo.cli._common import (
    UsageError, _add_caption_keys, _add_command, _add_preset, _add_report_options, _add_ties, _check_preset,
    _load_preset, _naming, _positive_int, _write_json,
)


def register(sub):
    p = _add_command(
        sub, "retrieve", "image-text retrieval recall@K, or the best images for a text query",
        "Image -> text and text -> image retrieval recall@K (vlzoo.evaluation.retrieval_recall,\n"
        "--ties, expected by default as in `vlzoo eval`) on the image-caption pairs of\n"
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
    _add_ties(p)
    _add_caption_keys(p, "column/key of the caption (caption files), or field of a tar sample's .json when it "
                         "has no .txt (default: the first present of caption, text, title)")
    _add_report_options(p, "also write the metrics (or the query results) to this JSON file")
    p.set_defaults(func=run)


def _print_queries(queries, scores, top, items, sources, captions, image_ids, out):
    """Prints the `top` images of each query by `scores` `(N_images, Q)`; returns them for the JSON report."""
    top = min(top, len(items))
    first_caption = {}
    for caption, image in zip(captions, image_ids):
        first_caption.setdefault(int(image), caption)
    results = []
    for q, query in enumerate(queries):
        order = np.argsort(-scores[:, q], kind="stable")[:top]
        print(f"query {query!r}: top {top} of {len(items)} images", file=out)
        hits = []
        for rank, i in enumerate(order, start=1):
            name = items[i] if isinstance(items[i], str) else sources[i]
            print(f"  {rank:>3}. {scores[i, q]:9.4f}  {name}  ({first_caption[int(i)]!r})", file=out)
            hits.append({"rank": rank, "score": float(scores[i, q]), "image": name,
                         "caption": first_caption[int(i)]})
        results.append({"query": query, "results": hits})
    return results


def run(args, out):
    _check_preset(args.preset)
    # heavy: imports a backend
    import keras

    from vlzoo.data import labels
    from vlzoo.evaluation import retrieval_recall
    from vlzoo.evaluation._common import batches

    with _naming("--data"):
        kind, _ = labels.data_source(args.data)
    if kind != "captions" and args.image_key is not None:
        raise UsageError("--image-key", "applies to caption files, not tar shards")
    with _naming("--data"):
        items, sources, captions, image_ids, stats = labels.retrieval_pairs(
            args.data, args.image_key, args.caption_key, args.on_error)
    if stats.num_skipped:
        print(f"note: {stats.summary()}", file=out)
    model = _load_preset(args.preset, out)
    images = labels.ImageFiles(items, model.preprocessor, sources)
    backend = keras.backend.backend()
    payload = {"command": "retrieve", "preset": args.preset, "data": args.data, "num_images": len(items),
               "num_captions": len(captions), "backend": backend}
    if args.query:
        # (N_images, Q) scores of every image against every query text, in the text -> image direction.
        text_embeds = model.encode_text(model.tokenizer(list(args.query)))
        kwargs = {} if model.symmetric_score else {"direction": "t2i"}
        scores = np.concatenate([
            keras.ops.convert_to_numpy(model.score(model.encode_image(images[start:stop]), text_embeds, **kwargs))
            for start, stop in batches(len(images), args.batch_size, args.verbose)
        ], axis=0)
        payload["queries"] = _print_queries(args.query, scores, args.top, items, sources, captions, image_ids, out)
    else:
        print(f"retrieval: {len(items)} images, {len(captions)} captions, preset {args.preset}, "
              f"backend {backend}, {args.ties} ties", file=out)
        payload["ties"] = args.ties
        metrics = retrieval_recall(model, images, captions, image_ids=image_ids, ks=args.ks,
                                   batch_size=args.batch_size, ties=args.ties, verbose=args.verbose)
        for name, value in metrics.items():
            print(f"{name}: {value:.4f}", file=out)
        payload["metrics"] = metrics
    if args.json:
        _write_json(args.json, payload, out)
    return 0
