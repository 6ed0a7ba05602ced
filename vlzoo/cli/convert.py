"""`vlzoo convert --from FORMAT --checkpoint PATH --out DIR`: a local checkpoint -> a preset directory
(also `python tools/convert.py`, which runs this command)."""

import argparse
import collections.abc
import time

from vlzoo import formats
from vlzoo import plugins
from vlzoo.cli._common import UsageError, _add_command, _check_file, _positive_int
from vlzoo.cli._logs import import_tensorflow_quietly


class _Renamed(argparse.Action):
    """`--source PATH`, the former name of `--checkpoint`: a one-line error naming it, exit status 2."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.exit(2, f"{parser.prog}: error: argument --source: renamed; use --from FORMAT --checkpoint PATH\n")


class _Formats(collections.abc.Sequence):
    """The choices of `--from`: the formats `vlzoo convert` reads (`vlzoo.formats.converted_formats()`). A name that
    is none of them first imports the installed plugins' families, whose modules register their formats."""

    def __getitem__(self, index):
        return formats.converted_formats()[index]

    def __len__(self):
        return len(formats.converted_formats())

    def __contains__(self, name):
        if name not in formats.converted_formats() and plugins.plugin_families():
            import_tensorflow_quietly()  # a plugin's module imports Keras
            plugins.load_families()
        return name in formats.converted_formats()


def register(sub):
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
        "  * llip, sparo, flair: a checkpoint of the authors' code (facebookresearch/Llip,\n"
        "    ankitkv/sparo-clip, ExplainableML/flair), with the architecture from --preset (a vlzoo preset);\n"
        "  * big_vision: a SigLIP / SigLIP 2 .npz of google-research/big_vision, with --preset.\n"
        "The weights are assigned with a progress bar and saved with save_to_preset. The preset is\n"
        "then reloaded and its embeddings checked to be identical, and, when the peer package\n"
        "imports, compared with the peer built from the same weights on random inputs (exit\n"
        "status 1 above 1e-4 on embeddings or 1e-3 on logits; the Llip and SPARO authors' code is\n"
        "not a package, so their parity is what vlzoo's test fixtures check; FLAIR's likewise).",
        ["vlzoo convert --from open_clip --checkpoint ViT-B-32.pt --model ViT-B-32 --out presets/my_b32",
         "vlzoo convert --from open_clip --checkpoint ckpt.safetensors --config my_model.json --out my_preset",
         "vlzoo convert --from transformers --checkpoint ./clip-vit-base-patch32 --out my_hf_clip",
         "vlzoo convert --from transformers --checkpoint model.safetensors --config config.json --out my_hf_clip",
         "vlzoo convert --from keras_hub --checkpoint ./keras_hub_siglip --out my_siglip",
         "vlzoo convert --from llip --checkpoint llip_b16_k32.pt --preset llip_vit_b16 --out my_llip",
         "vlzoo convert --from sparo --checkpoint epoch_25.pt --preset sparo_clip_vit_b32 --out my_sparo",
         "vlzoo convert --from flair --checkpoint flair-merged30m.pt --preset flair_vit_b16 --out my_flair",
         "vlzoo convert --from big_vision --checkpoint siglip2_b16_224.npz --preset siglip2_vit_b16 --out my_siglip2"],
    )
    p.add_argument("--from", dest="from_", required=True, choices=_Formats(),
                   help="the checkpoint's library or format (or one that an installed plugin registers)")
    p.add_argument("--checkpoint", required=True, metavar="PATH",
                   help="checkpoint file or directory (see above for each library; formerly --source)")
    p.add_argument("--source", nargs="?", action=_Renamed, help=argparse.SUPPRESS)
    p.add_argument("--out", required=True, metavar="DIR", help="preset directory to write")
    p.add_argument("--model", default=None, metavar="NAME",
                   help="open_clip: model name whose installed config describes the architecture "
                   "(e.g. ViT-B-32, ViT-B-16-SigLIP)")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="open_clip: model config JSON (instead of --model); transformers: config.json "
                   "(default: next to the weights)")
    p.add_argument("--preset", default=None, metavar="NAME",
                   help="llip, sparo, flair, big_vision: the vlzoo preset (name or directory) of the checkpoint's "
                   "architecture, e.g. llip_vit_b16, llip_vit_g14, sparo_clip_vit_b32, flair_vit_b16, siglip2_vit_b16")
    p.add_argument("--dtype", default=None, metavar="POLICY",
                   help="dtype policy of the converted model, e.g. float32, bfloat16 (default: float32)")
    p.add_argument("--batch-size", type=_positive_int, default=2,
                   help="random inputs of the reload and parity checks (default: %(default)s)")
    p.add_argument("--no-check", action="store_true", help="skip the reload and parity checks")
    p.add_argument("--no-peer-check", action="store_true",
                   help="check the reloaded preset but do not build the peer model for the parity check")
    p.add_argument("--quiet", action="store_true", help="no progress bar while assigning the weights")
    p.set_defaults(func=run)


def run(args, out):
    # heavy: imports a backend
    import keras

    from vlzoo.convert.checkpoints import convert_checkpoint

    architectures = formats.architecture_formats()
    if args.from_ in architectures:
        if args.model or args.config:
            raise UsageError("--config" if args.config else "--model", f"does not apply to --from {args.from_}; "
                             "name the architecture with --preset")
        if not args.preset:
            raise UsageError("--preset", f"--from {args.from_} needs --preset NAME, the vlzoo preset of the "
                                         f"checkpoint's architecture (e.g. {architectures[args.from_]})")
    elif args.preset:
        raise UsageError("--preset", f"applies to --from {', '.join(architectures)} only")
    if args.from_ == "open_clip" and not (args.model or args.config):
        raise UsageError("--model", "--from open_clip needs --model NAME (open_clip's model config) "
                                    "or --config model.json")
    if args.from_ == "keras_hub" and (args.model or args.config):
        raise UsageError("--config" if args.config else "--model", "does not apply to --from keras_hub")
    if args.from_ == "transformers" and args.model:
        raise UsageError("--model", "applies to --from open_clip only")
    _check_file(args.checkpoint, "--checkpoint", "checkpoint")
    if args.config:
        _check_file(args.config, "--config", "config file")

    def log(message):
        print(message, file=out)

    start = time.perf_counter()
    status = convert_checkpoint(
        args.from_, args.checkpoint, args.out, model_name=args.model, config=args.config, preset=args.preset,
        dtype=args.dtype, check=not args.no_check, peer_check=not args.no_peer_check, batch_size=args.batch_size,
        log=log, progress=not args.quiet,
    )
    log(f"done in {time.perf_counter() - start:.1f} s (Keras backend: {keras.backend.backend()})")
    return status

