"""Generate the CLIP byte-pair-encoding assets shipped with vlzoo presets.

Reads OpenAI CLIP's ``bpe_simple_vocab_16e6.txt.gz`` (MIT licence; shipped inside the
``open_clip`` package, or given with ``--source``) and writes, into ``--out``
(default ``presets/_assets/clip_bpe/``):

- ``vocabulary.json``: ``{token: id}`` with 49,408 entries, in the order OpenAI CLIP and
  open_clip build it: the 256 byte-unicode symbols, the same 256 with ``</w>``, one token
  per merge (the first 48,894 merge lines after the header), then ``<|startoftext|>``
  (49406) and ``<|endoftext|>`` (49407).
- ``merges.txt``: a ``#version`` header then the same 48,894 merge rules, one per line.
- ``LICENSE_NOTE.md``: provenance and licence.

Both files are what ``keras_hub.models.CLIPTokenizer(vocabulary=..., merges=...)`` and
``vlzoo.tokenizers.CLIPTokenizer`` take. Run:

    python tools/build_clip_bpe_assets.py [--source PATH] [--out DIR]

``open_clip`` is only looked up, never imported, so its torch/torchvision imports do
not run.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import importlib.util
import json
import os
import sys

from vlzoo.tokenizers import bytes_to_unicode

NUM_MERGES = 49152 - 256 - 2  # 48,894: the merges OpenAI CLIP uses.
START_TOKEN = "<|startoftext|>"
END_TOKEN = "<|endoftext|>"
SOURCE_NAME = "bpe_simple_vocab_16e6.txt.gz"
DEFAULT_OUT = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    "presets",
    "_assets",
    "clip_bpe",
)


def find_open_clip_source():
    """Path of the BPE file inside the installed open_clip package (not imported)."""
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "open_clip is not installed, so its "
            f"{SOURCE_NAME} cannot be located; pass --source PATH "
            "(e.g. from github.com/openai/CLIP, clip/bpe_simple_vocab_16e6.txt.gz)."
        )
    for location in spec.submodule_search_locations:
        path = os.path.join(location, SOURCE_NAME)
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"{SOURCE_NAME} not found in the open_clip package at "
        f"{list(spec.submodule_search_locations)}; pass --source PATH."
    )


def build(source):
    """Returns (vocabulary dict, list of merge strings) from the gzip file."""
    with gzip.open(source, "rb") as f:
        lines = f.read().decode("utf-8").split("\n")
    merges = lines[1 : NUM_MERGES + 1]
    if len(merges) != NUM_MERGES:
        raise ValueError(
            f"{source} has only {len(merges)} merge lines after the header, "
            f"expected at least {NUM_MERGES}."
        )
    pairs = []
    for line in merges:
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"Malformed merge line in {source}: {line!r}")
        pairs.append(tuple(parts))
    symbols = list(bytes_to_unicode().values())
    tokens = symbols + [s + "</w>" for s in symbols]
    tokens += ["".join(p) for p in pairs]
    tokens += [START_TOKEN, END_TOKEN]
    vocabulary = {}
    for i, token in enumerate(tokens):
        # open_clip builds its encoder with dict(zip(vocab, range(...))): a repeated
        # token would keep its last id. Check there is none.
        if token in vocabulary:
            raise ValueError(f"Duplicate token {token!r} in generated vocabulary.")
        vocabulary[token] = i
    assert len(vocabulary) == 49408, len(vocabulary)
    assert vocabulary[START_TOKEN] == 49406 and vocabulary[END_TOKEN] == 49407
    return vocabulary, [" ".join(p) for p in pairs]


def _sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


LICENSE_TEMPLATE = """# CLIP BPE tokenizer assets

`vocabulary.json` ({n_vocab} tokens) and `merges.txt` ({n_merges} merge rules) are derived
from OpenAI CLIP's byte-pair-encoding file `bpe_simple_vocab_16e6.txt.gz`
(https://github.com/openai/CLIP, MIT License, Copyright (c) 2021 OpenAI), as redistributed
in the `open_clip` package (open-clip-torch, https://github.com/mlfoundations/open_clip,
MIT License).

Generated from: `{source_desc}` (sha256 `{src_sha}`)
Command: `python tools/build_clip_bpe_assets.py{cmd_args}`

Layout (identical to OpenAI CLIP / open_clip `SimpleTokenizer`): ids 0-255 are the
byte-unicode symbols, 256-511 the same with `</w>`, 512-49405 one token per merge (the
first {n_merges} merge lines after the header), 49406 `<|startoftext|>`, 49407
`<|endoftext|>`. With these files `keras_hub.models.CLIPTokenizer` and
`vlzoo.tokenizers.CLIPTokenizer` give the same ids as open_clip.

sha256:
- vocabulary.json `{vocab_sha}`
- merges.txt `{merges_sha}`

MIT License (OpenAI CLIP):

Copyright (c) 2021 OpenAI

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
"""


def write_assets(source, out_dir, cmd_args=""):
    vocabulary, merges = build(source)
    os.makedirs(out_dir, exist_ok=True)
    vocab_path = os.path.join(out_dir, "vocabulary.json")
    merges_path = os.path.join(out_dir, "merges.txt")
    with open(vocab_path, "w", encoding="utf-8") as f:
        json.dump(vocabulary, f, ensure_ascii=False, separators=(",", ":"))
    with open(merges_path, "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        f.write("\n".join(merges))
        f.write("\n")
    source_desc = source
    spec_dir = os.path.dirname(os.path.abspath(source))
    if os.path.basename(spec_dir) == "open_clip":
        version = _open_clip_version()
        source_desc = f"open_clip/{SOURCE_NAME} from open-clip-torch {version}"
    note = LICENSE_TEMPLATE.format(
        n_vocab=len(vocabulary),
        n_merges=len(merges),
        source_desc=source_desc,
        src_sha=_sha256(source),
        cmd_args=cmd_args,
        vocab_sha=_sha256(vocab_path),
        merges_sha=_sha256(merges_path),
    )
    with open(os.path.join(out_dir, "LICENSE_NOTE.md"), "w", encoding="utf-8") as f:
        f.write(note)
    return vocab_path, merges_path


def _open_clip_version():
    try:
        from importlib.metadata import version

        return version("open-clip-torch")
    except Exception:  # pragma: no cover - metadata missing
        return "(unknown version)"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--source",
        default=None,
        help=f"path to {SOURCE_NAME} (default: the one in the installed open_clip)",
    )
    parser.add_argument(
        "--out", default=DEFAULT_OUT, help="output directory (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    source = args.source or find_open_clip_source()
    cmd_args = ""
    if args.source:
        cmd_args += f" --source {args.source}"
    if os.path.abspath(args.out) != os.path.abspath(DEFAULT_OUT):
        cmd_args += f" --out {args.out}"
    vocab_path, merges_path = write_assets(source, args.out, cmd_args)
    print(f"wrote {vocab_path}, {merges_path} from {source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
