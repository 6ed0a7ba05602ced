"""Writes (or checks) the registered preset directories under presets/.

`presets/registry.json` (read by `vlzoo.presets.catalogue`) is the source; this script
turns every entry into a keras-hub style directory (config.json, metadata.json,
tokenizer.json, preprocessor.json; metadata.json names the vocabulary in presets/_assets/ that
the tokenizer reads, which is not copied).
Models are built inside a `keras.StatelessScope` that never allocates their
weights, so the big presets cost nothing.

    python tools/build_presets.py            # write presets/
    python tools/build_presets.py --check    # exit 1 if presets/ is out of date

Add a preset by adding its entry to presets/registry.json, then run the script.
"""

import argparse
import filecmp
import pathlib
import sys
import tempfile

import keras

import vlzoo.models  # noqa: F401  (registers the model classes that the entries name)
from vlzoo import presets
from vlzoo.presets import catalogue
from vlzoo.presets.saving import write_registered_preset

SHAPES_WORDS_NOTE = """# The shapes WordPiece vocabulary

`vocab.txt` is `vlzoo.data.shapes.vocabulary()`, one token per line (line i = id i): the
WordPiece specials, every word of the `vlzoo.data.shapes` captions and a few common prompt
words. Written by `python tools/build_presets.py`. Part of vlzoo, Apache License 2.0.
"""


def shapes_words_files():
    """`{file name: text}` of the `shapes_words` tokenizer assets."""
    from vlzoo.data import shapes

    return {"vocab.txt": "\n".join(shapes.vocabulary()) + "\n", "LICENSE_NOTE.md": SHAPES_WORDS_NOTE}


def build(root):
    assets = pathlib.Path(root) / "_assets" / "shapes_words"
    assets.mkdir(parents=True, exist_ok=True)
    for file, text in shapes_words_files().items():
        (assets / file).write_text(text)
    for name, preset in sorted(catalogue.definitions().items()):
        if catalogue.defined_in_code(name):
            continue
        cls = keras.saving.get_registered_object(f"vlzoo>{preset['class_name']}")
        if cls is None:
            raise ValueError(
                f"presets/registry.json: {name!r} names class {preset['class_name']!r}, not a vlzoo model."
            )
        write_registered_preset(name, preset, cls, pathlib.Path(root) / name)
        print(f"wrote {pathlib.Path(root) / name}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare presets/ with the registry; exit 1 on drift")
    args = parser.parse_args(argv)
    root = presets.presets_root()
    if not args.check:
        build(root)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        build(tmp)
        words = root / "_assets" / "shapes_words"
        stale = [str(words / file) for file, text in shapes_words_files().items()
                 if not (words / file).is_file() or (words / file).read_text() != text]
        for name in presets.list_presets():
            for file in (presets.CONFIG_FILE, presets.METADATA_FILE, presets.TOKENIZER_FILE, presets.PREPROCESSOR_FILE):
                fresh, committed = pathlib.Path(tmp) / name / file, root / name / file
                if fresh.exists() != committed.exists() or (fresh.exists() and not filecmp.cmp(fresh, committed, shallow=False)):
                    stale.append(str(committed))
        if stale:
            print("Out of date (run `python tools/build_presets.py`):\n  " + "\n  ".join(stale))
            return 1
    print("presets/ matches the registry")
    return 0


if __name__ == "__main__":
    sys.exit(main())
