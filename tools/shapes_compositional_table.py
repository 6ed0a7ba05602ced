"""Scores every bundled `*_shapes` preset on the shapes compositionality suite and writes the table.

The suite (`vlzoo.evaluation.shapes_compositional`) is SugarCrepe's seven and ARO's
three hard-negative types built from held-out `vlzoo.data.shapes` scenes; nothing is
downloaded. One row per model, one column per type (accuracy: the true caption
outscores the negative; chance 0.5) and their mean. Each model's time is printed
to stderr and, with `--json`, kept in the records (`seconds`).

    python tools/shapes_compositional_table.py                          # print the table
    python tools/shapes_compositional_table.py --markdown out/shapes_compositional.md \
        --json out/shapes_compositional.json
    python tools/shapes_compositional_table.py --models clip_shapes sparo_shapes --num-examples 100

Runs on the backend of `KERAS_BACKEND`.
"""

import argparse
import json
import pathlib
import sys
import time

import keras

import vlzoo
from vlzoo import presets
from vlzoo.evaluation import shapes_compositional
from vlzoo.evaluation.results import benchmark_record


def bundled_models():
    """The `*_shapes` presets that ship weights, in catalogue order."""
    return [name for name in presets.list_presets()
            if name.endswith("_shapes") and vlzoo.preset_info(name)["weights_available"]]


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", help="presets to score (default: every bundled *_shapes preset)")
    parser.add_argument("--num-examples", type=int, default=200, help="examples per negative type (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the scenes and negatives (default 0)")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per forward pass (default 64)")
    parser.add_argument("--ties", choices=("expected", "pessimistic", "optimistic"), default="expected",
                        help="how tied scores count (default: expected)")
    parser.add_argument("--markdown", type=pathlib.Path, help="also write the table to this file")
    parser.add_argument("--json", type=pathlib.Path, help="also write the records (one list) to this file")
    args = parser.parse_args(argv)
    for name, minimum in (("num_examples", 1), ("seed", 0), ("batch_size", 1)):
        if getattr(args, name) < minimum:
            parser.error(f"argument --{name.replace('_', '-')}: must be >= {minimum}")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    records = []
    for name in args.models or bundled_models():
        model = vlzoo.from_preset(name)
        start = time.perf_counter()
        results = shapes_compositional.evaluate(model, num_examples=args.num_examples, seed=args.seed,
                                                batch_size=args.batch_size, ties=args.ties)
        seconds = time.perf_counter() - start
        print(f"{name}: {seconds:.1f} s ({keras.backend.backend()})", file=sys.stderr, flush=True)
        records += [dict(benchmark_record(result, name), seconds=seconds) for result in results]
    table = shapes_compositional.table(records)
    print(table, end="")
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(table, encoding="utf-8")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    return records


if __name__ == "__main__":
    main()
