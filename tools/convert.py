"""Convert a local checkpoint (open_clip, transformers, keras-hub, Llip, SPARO) into a vlzoo preset directory.

    python tools/convert.py --source open_clip --checkpoint ViT-B-32.pt --model ViT-B-32 --out presets/my_b32
    python tools/convert.py --source open_clip --checkpoint ckpt.safetensors --config my_model.json --out DIR
    python tools/convert.py --source transformers --checkpoint ./clip-vit-base-patch32 --out DIR
    python tools/convert.py --source transformers --checkpoint model.safetensors --config config.json --out DIR
    python tools/convert.py --source keras_hub --checkpoint ./keras_hub_preset_dir --out DIR
    python tools/convert.py --source llip --checkpoint llip_b16_k32.pt --preset llip_vit_b16 --out DIR
    python tools/convert.py --source sparo --checkpoint epoch_25.pt --preset sparo_clip_vit_b32 --out DIR

Nothing is downloaded. `--checkpoint` is a `.pt`/`.pth`/`.bin` file (read with
`torch.load(map_location="cpu", weights_only=True)`; OpenAI's TorchScript
archives are read with `torch.jit.load`), a `.safetensors` file, or a
directory (transformers: `config.json` + `model.safetensors` /
`pytorch_model.bin`; keras-hub: a preset directory). For open_clip the
architecture comes from `--model` (open_clip's `model_configs/<name>.json`,
found without importing open_clip) or `--config` (that JSON); for the Llip
and SPARO authors' checkpoints from `--preset`, a vlzoo preset (their
checkpoints hold no architecture; the preset also gives Llip's tau).

The weights are assigned with a progress bar and saved with
`model.save_to_preset(--out)`. Unless `--no-check`, the preset is reloaded
and, when the peer package is importable, the peer is built from the same
weights and both run on random inputs: the max abs differences of the
normalised image and text embeddings and of the logits are printed (exit
status 1 if they exceed 1e-4 / 1e-4 / 1e-3; the Llip and SPARO authors' code is
not a package, so their parity is what the test fixtures check). The Keras backend is
`KERAS_BACKEND`'s.

A thin wrapper of `vlzoo.convert.checkpoints.convert_checkpoint` (also `vlzoo convert
--from SOURCE --source CHECKPOINT --out DIR`).
"""

import argparse
import os
import sys
import time

from vlzoo.convert.checkpoints import (  # re-exported for tests and scripts
    AUTHOR_SOURCES, SOURCES, TOLERANCES, convert_checkpoint, load_state_dict, open_clip_model_config,
    transformers_files,
)


__all__ = ["TOLERANCES", "convert", "load_state_dict", "main", "open_clip_model_config", "transformers_files"]


# ----------------------------------------------------------------------------- main


def convert(args):
    return convert_checkpoint(
        args.source, args.checkpoint, args.out, model_name=args.model, config=args.config, preset=args.preset,
        dtype=args.dtype, check=not args.no_check, batch_size=args.batch_size,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", required=True, choices=SOURCES)
    parser.add_argument("--checkpoint", required=True, help="weights file or directory")
    parser.add_argument("--model", help="open_clip model name (e.g. ViT-B-32, ViT-B-16-SigLIP)")
    parser.add_argument("--config", help="open_clip model config JSON, or transformers config.json")
    parser.add_argument("--preset", help="llip, sparo: vlzoo preset of the architecture (e.g. llip_vit_b16)")
    parser.add_argument("--out", required=True, help="preset directory to write")
    parser.add_argument("--dtype", default=None, help="dtype policy of the vlzoo model (default float32)")
    parser.add_argument("--batch-size", type=int, default=2, help="random inputs for the parity check")
    parser.add_argument("--no-check", action="store_true", help="skip the reload and parity checks")
    args = parser.parse_args(argv)
    if args.source == "open_clip" and not (args.model or args.config):
        parser.error("--source open_clip needs --model NAME or --config model.json.")
    if (args.source in AUTHOR_SOURCES) != (args.preset is not None):
        parser.error("--preset is needed by, and only by, --source llip and --source sparo.")
    start = time.time()
    status = convert(args)
    print(f"done in {time.time() - start:.1f} s (Keras backend: {os.environ.get('KERAS_BACKEND', 'default')})")
    return status


if __name__ == "__main__":
    sys.exit(main())
