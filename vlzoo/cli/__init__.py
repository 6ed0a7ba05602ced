"""The `vlzoo` command line.

    vlzoo list     [--family F] [--pretrained]
    vlzoo download NAME_OR_HANDLE
    vlzoo info     NAME
    vlzoo zeroshot --preset P --images DIR_OR_CAPTIONFILE [--classes "a,b" | --classes-file F]
                   [--templates imagenet|simple|default|FILE] [--top-k 1 5] [--json OUT]
    vlzoo retrieve --preset P --data CAPTIONFILE_OR_SHARDS [--ks 1 5 10] [--query TEXT ...] [--json OUT]
    vlzoo eval     --preset P --benchmark sugarcrepe|winoground|mmvp|coco|imagenet1k|vg_relation|voc2012|... --data PATH
    vlzoo train    --preset P --data SOURCE --out DIR [--epochs E] [--batch-size B] [--learning-rate LR] ...
    vlzoo interpolate --zero-shot P --finetuned P --alpha A --out DIR
    vlzoo export   --preset P --format onnx|tf_saved_model|litert --out DIR [--tower image|text|both]
    vlzoo convert  --from open_clip|transformers|keras_hub --checkpoint PATH --out DIR [--model NAME | --config F]
    vlzoo convert  --from llip|sparo --checkpoint PATH --preset P --out DIR
    vlzoo demo     [--preset sparc_shapes] [--steps N] [--second-backend B] [--out DIR]
    vlzoo upload   HANDLE PRESET_DIR [--message TEXT]

`vlzoo COMMAND --help` documents every option, with examples. Also runs as
`python -m vlzoo.cli ...` (`convert` also as `python tools/convert.py ...`). The
backend is Keras's: set `KERAS_BACKEND=jax|tensorflow|torch`. Nothing is downloaded
but by `download` and by the pretrained presets and hub handles `--preset` names.

* `list`, `download`, `info`: the preset catalogue; `download` fetches a pretrained
  preset or hub handle into the cache.
* `zeroshot`: top-k zero-shot accuracy (`vlzoo.evaluation.zero_shot_accuracy`)
  on an image folder laid out as `DIR/<class>/*.jpg` (ImageNet style) or on a
  caption file whose caption (or `label`/`class`) column is the class.
* `retrieve`: image -> text and text -> image recall@K
  (`vlzoo.evaluation.retrieval_recall`) on the image-caption pairs of a caption
  file or tar shards, or the best images for `--query` texts.
* `eval`: SugarCrepe, Winoground, MMVP-VLM, ARO, COCO, Flickr30k, CIFAR, ImageNet and its variants
  or VOC 2012 segmentation read from their published layouts (`vlzoo.evaluation`), a Markdown
  table and clip_benchmark-schema JSON.
* `train`: fine-tunes with `model.fit` on `vlzoo.data.image_text_dataset(...,
  training=True)`, then `save_to_preset(--out)`.
* `interpolate`: WiSE-FT, the weights `(1 - alpha) * zero-shot + alpha * fine-tuned` of two
  presets of one geometry (`vlzoo.training.interpolate`), saved as a preset.
* `export`: each tower as a serving artefact (`vlzoo.export`), checked with its format's runtime.
* `convert`: a local open_clip / transformers / keras-hub / Llip / SPARO checkpoint -> a preset
  directory (`vlzoo.convert.convert_checkpoint`), reloaded and checked against the peer.
* `demo`: the whole workflow on a bundled shapes model (`sparc_shapes`, trained
  on the synthetic `vlzoo.data.shapes` dataset): held-out zero-shot accuracy,
  retrieval recall and attribute-binding accuracy; a short `model.fit` that teaches
  it the prompt "a photo of a {}." with the metrics before and after; a
  token-to-patch alignment map (PNG); the model saved with `save_to_preset` and
  reloaded on this backend and on a second one, whose similarities must match.
* `upload`: a preset directory to `hf://user/name` (one commit) or `kaggle://user/model/keras/variant`
  (a new version), checked to load first, with a model card (`vlzoo.upload_preset`).

Images are read with PIL and preprocessed with the preset's own preprocessor (the
evaluation transform), `--batch-size` at a time: a folder of any size is never
held in memory whole.

User mistakes (a missing file, an unknown preset, a bad value) end with a one-line
`vlzoo COMMAND: error: ...` naming the argument and exit status 2; a failed check
(`convert`'s parity, `demo`'s reload) exits with 1.

One module per command (`catalogue`: list, download, info; `zeroshot`, `retrieve`, `evaluate` (eval), `train`,
`interpolate`, `export`, `convert`, `demo`, `upload`), each with `register(subparsers)` and `run(args, out)`;
shared helpers in `_common`, the readers of labelled images and pairs in `vlzoo.data.labels`. The command modules
import no backend at module level: each `run` imports what it needs.

Framework C++ logs that read as errors but are not ("failed call to cuInit", "oneDNN custom
operations are on", "Could not find cuda drivers") stay hidden unless `VLZOO_VERBOSE=1` or the
user's own `TF_CPP_MIN_LOG_LEVEL` is set (`_logs`): every command but `list` and `info` imports
TensorFlow first with its load-time lines filtered out of stderr.
"""

import argparse
import sys

from vlzoo.cli._logs import QUIET_NATIVE_LOGS, import_tensorflow_quietly  # first: the C++ log level
from vlzoo.cli import catalogue, convert, demo, evaluate, export, interpolate, retrieve, train, upload, zeroshot
from vlzoo.cli._common import UsageError
from vlzoo.cli.demo import DEMO_TEMPLATE

__all__ = ["COMMANDS", "DEMO_TEMPLATE", "QUIET_NATIVE_LOGS", "UsageError", "build_parser", "main"]

COMMANDS = (catalogue, zeroshot, retrieve, evaluate, train, interpolate, export, convert, demo, upload)

# User mistakes reported as one line (exit status 2) rather than a traceback.
_USER_ERRORS = (UsageError, ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError,
                KeyError, NotImplementedError)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="vlzoo",
        description="vlzoo: Keras 3 vision-language contrastive models (CLIP, SigLIP, ...). "
        "The backend is chosen by the KERAS_BACKEND environment variable (jax, tensorflow, torch).",
        epilog="Run `vlzoo COMMAND --help` for the options and examples of a command.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv=None):
    """Entry point of the `vlzoo` command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    validate = getattr(args, "validate", None)
    if validate is not None:
        validate(parser, args)
    if getattr(args, "loads_frameworks", True):
        import_tensorflow_quietly()
    try:
        return args.func(args, sys.stdout)
    except _USER_ERRORS as error:
        message = error.args[0] if isinstance(error, KeyError) and error.args else str(error)
        message = " ".join(str(message).split())  # one line
        print(f"vlzoo {args.command}: error: {message}", file=sys.stderr)
        return 2
