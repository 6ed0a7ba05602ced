"""`vlzoo interpolate`: a WiSE-FT weight-space ensemble of two presets, saved as a preset."""

from vlzoo.cli._common import _add_command, _check_preset, _load_preset, _probability


def register(sub):
    p = _add_command(
        sub, "interpolate", "mix a zero-shot and a fine-tuned preset's weights (WiSE-FT) into a new preset",
        "Writes the preset whose weights are (1 - alpha) * zero-shot + alpha * fine-tuned\n"
        "(vlzoo.training.interpolate; Wortsman et al., CVPR 2022). Both presets must be one family\n"
        "and geometry, e.g. a pretrained preset and the directory `vlzoo train --out` wrote from it.\n"
        "alpha 0 is the zero-shot model and 1 the fine-tuned one, exactly; 0.5 is the paper's usual\n"
        "choice. The tokenizer and preprocessor are the fine-tuned preset's.",
        ["vlzoo interpolate --zero-shot clip_shapes --finetuned runs/clip_ft --alpha 0.5 --out runs/clip_wise"],
    )
    p.add_argument("--zero-shot", required=True, metavar="NAME_OR_DIR", help="the preset before fine-tuning")
    p.add_argument("--finetuned", required=True, metavar="NAME_OR_DIR", help="the same preset after fine-tuning")
    p.add_argument("--alpha", required=True, type=_probability(closed=True), metavar="A", help="the fine-tuned weights' share, in [0, 1]")
    p.add_argument("--out", required=True, metavar="DIR", help="preset directory to write")
    p.set_defaults(func=run)


def run(args, out):
    _check_preset(args.zero_shot, "--zero-shot")
    _check_preset(args.finetuned, "--finetuned")
    # heavy: imports a backend
    from vlzoo.training import interpolate

    zero_shot = _load_preset(args.zero_shot, out, argument="--zero-shot")
    finetuned = _load_preset(args.finetuned, out, argument="--finetuned")
    mixed = interpolate(zero_shot, finetuned, args.alpha)
    mixed.save_to_preset(args.out)
    print(f"wrote {args.out}: {args.alpha:g} x {args.finetuned} + {1 - args.alpha:g} x {args.zero_shot}", file=out)
    return 0
