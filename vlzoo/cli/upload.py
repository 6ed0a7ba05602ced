"""`vlzoo upload`: publish a preset directory on the Hugging Face Hub or Kaggle Models."""

from vlzoo.cli._common import _add_command


def register(sub):
    p = _add_command(
        sub, "upload", "publish a preset directory on the Hugging Face Hub or Kaggle Models",
        "Checks that PRESET_DIR loads as a vlzoo preset (config.json, metadata.json, model.weights.h5\n"
        "whose arrays fit the config, the tokenizer's assets) before anything is sent, then uploads it\n"
        "(vlzoo.upload_preset): to hf://user/name[@branch] as one commit (the repository is created when\n"
        "absent; a failed upload leaves it as it was), or to kaggle://user/model/keras/variant as a new\n"
        "version. A model card (README.md) is added when neither PRESET_DIR nor the repository has one:\n"
        "family, paper, parameters, the preset the weights started from and its licence, training data\n"
        "and steps, and the results of `vlzoo eval --json` files in PRESET_DIR. Credentials: HF_TOKEN or\n"
        "`hf auth login`; KAGGLE_USERNAME and KAGGLE_KEY (or ~/.kaggle/kaggle.json). Prints the commit\n"
        "or the version number.",
        ["vlzoo upload hf://me/clip-tiny-shapes runs/tiny",
         "vlzoo upload hf://me/clip-tiny-shapes@experiments runs/tiny --message 'lr 1e-5, 2 epochs'",
         "vlzoo upload kaggle://me/clip-tiny/keras/shapes runs/tiny"],
    )
    p.add_argument("handle", metavar="HANDLE",
                   help="hf://user/name[@branch] or kaggle://user/model/framework/variation")
    p.add_argument("preset_dir", metavar="PRESET_DIR", help="a directory written by save_to_preset (vlzoo train --out)")
    p.add_argument("--message", default=None, metavar="TEXT",
                   help="commit message (Hub) or version notes (Kaggle); default: 'Upload vlzoo preset'")
    p.set_defaults(func=run)


def run(args, out):
    from vlzoo.presets import upload  # heavy: imports a backend (the preset is loaded to check it)

    result = upload.upload_preset(args.handle, args.preset_dir, message=args.message)
    if args.handle.startswith("hf://"):
        print(f"{args.handle}: uploaded {args.preset_dir} as commit {result}", file=out)
    else:
        version = f"version {result}" if result is not None else "a new version (Kaggle has not listed it yet)"
        print(f"{args.handle}: uploaded {args.preset_dir} as {version}", file=out)
    return 0
