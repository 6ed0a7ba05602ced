"""Convert a local checkpoint (open_clip, transformers, keras-hub, Llip, SPARO) into a vlzoo preset directory.

    python tools/convert.py --from open_clip --checkpoint ViT-B-32.pt --model ViT-B-32 --out presets/my_b32
    python tools/convert.py --from open_clip --checkpoint ckpt.safetensors --config my_model.json --out DIR
    python tools/convert.py --from transformers --checkpoint ./clip-vit-base-patch32 --out DIR
    python tools/convert.py --from transformers --checkpoint model.safetensors --config config.json --out DIR
    python tools/convert.py --from keras_hub --checkpoint ./keras_hub_preset_dir --out DIR
    python tools/convert.py --from llip --checkpoint llip_b16_k32.pt --preset llip_vit_b16 --out DIR
    python tools/convert.py --from sparo --checkpoint epoch_25.pt --preset sparo_clip_vit_b32 --out DIR

The same command as `vlzoo convert` (vlzoo/cli/convert.py), with the same options: see
`vlzoo convert --help`. Nothing is downloaded. `--checkpoint` is a `.pt`/`.pth`/`.bin` file (read
with `torch.load(map_location="cpu", weights_only=True)`; OpenAI's TorchScript archives with
`torch.jit.load`), a `.safetensors` file, or a directory (transformers: `config.json` +
`model.safetensors` / `pytorch_model.bin`; keras-hub: a preset directory). The preset is written
with `model.save_to_preset(--out)`, then (unless `--no-check`) reloaded and compared with the peer
built from the same weights (exit status 1 above 1e-4 on the embeddings or 1e-3 on the logits). The
Keras backend is `KERAS_BACKEND`'s.
"""

import sys

from vlzoo.cli import main as vlzoo_main
from vlzoo.convert.checkpoints import (  # re-exported for tests and scripts
    TOLERANCES, load_state_dict, open_clip_model_config, transformers_files,
)

__all__ = ["TOLERANCES", "load_state_dict", "main", "open_clip_model_config", "transformers_files"]


def main(argv=None):
    """`vlzoo convert ARGV...`; returns the exit status."""
    return vlzoo_main(["convert", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
