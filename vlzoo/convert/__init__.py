"""Converters from the checkpoints users already have to vlzoo models (and back, for CLIP).

- `from_open_clip(model)` / `from_open_clip_state_dict(state_dict, config)`:
  open_clip CLIP and SigLIP (timm ViT + MAP head) models.
- `from_transformers(model)` / `from_transformers_state_dict(state_dict, config)`:
  Hugging Face `CLIPModel` and `SiglipModel`.
- `from_keras_hub(backbone)`: keras-hub `CLIPBackbone` and `SigLIPBackbone`.
- `from_big_vision_checkpoint(path_or_arrays, preset)`: big_vision's SigLIP and
  SigLIP 2 `.npz` checkpoints (fixed-resolution and NaFlex) -> `siglip2_*` presets.
- `from_llip_checkpoint(path_or_state_dict, preset)`: the Llip authors'
  checkpoints (facebookresearch/Llip; released ViT-B/16 K=32 and ViT-bigG/14
  K=64 -> presets `llip_vit_b16`, `llip_vit_g14`).
- `from_flair_checkpoint(path_or_state_dict, preset="flair_vit_b16")`: the FLAIR
  authors' checkpoints (ExplainableML/flair; the four released ViT-B/16 models).
- `from_sparo_checkpoint(path_or_state_dict, preset)`: checkpoints of the SPARO
  authors' open_clip fork (ankitkv/sparo-clip) -> `sparo_clip_vit_b16/b32`.
- `to_open_clip_state_dict(model)`: vlzoo -> open_clip state dict (exact round
  trip); `open_clip_config(model)` describes the open_clip model to load it into.
- `parity(model, peer)`: max abs differences against the peer on random inputs.
- `register_converter(name, convert)`: the converter of a checkpoint format declared in
  `vlzoo.formats` whose checkpoints take a vlzoo preset for their architecture.
- `convert_checkpoint(source, checkpoint, out)`: a checkpoint file or directory
  on disk -> a preset directory (what `vlzoo convert` and `tools/convert.py`
  run; only its optional parity check imports a peer package);
  `load_state_dict(path)` reads `.pt`/`.bin`/`.safetensors` files
  (module `vlzoo.convert.state_dict`).

Nothing here downloads anything or imports the peers' packages: converters read
the objects, state dicts and config dicts you pass. Every converter checks that
each vlzoo variable receives exactly one tensor of the right shape and that
every checkpoint key is used, and raises `KeyError`/`ValueError` naming the key
otherwise (nothing is assigned until everything matched).

Example:
>>> import open_clip, vlzoo  # doctest: +SKIP
>>> peer = open_clip.create_model("ViT-B-32", pretrained="/path/to/local/weights.pt")  # doctest: +SKIP
>>> model = vlzoo.convert.from_open_clip(peer)  # doctest: +SKIP
>>> vlzoo.convert.parity(model, peer)  # max abs differences, see docs/parity.md  # doctest: +SKIP
{'image': 1e-07, 'text': 2e-07, 'logits': 1e-06}
>>> model.save_to_preset("clip_b32")  # doctest: +SKIP
"""

from vlzoo.convert import checkpoints
from vlzoo.convert._common import parity, peer_outputs, random_inputs, vlzoo_variables
from vlzoo.convert.big_vision import from_big_vision_checkpoint
from vlzoo.convert.flair import from_flair_checkpoint
from vlzoo.convert.keras_hub import from_keras_hub
from vlzoo.convert.llip import from_llip_checkpoint
from vlzoo.convert.open_clip import (
    from_open_clip,
    from_open_clip_state_dict,
    open_clip_config,
    to_open_clip_state_dict,
)
from vlzoo.convert.checkpoints import convert_checkpoint
from vlzoo.convert.converters import register_converter
from vlzoo.convert.sparo import from_sparo_checkpoint
from vlzoo.convert.state_dict import load_state_dict
from vlzoo.convert.transformers import from_transformers, from_transformers_state_dict

__all__ = [
    "from_open_clip",
    "from_open_clip_state_dict",
    "to_open_clip_state_dict",
    "open_clip_config",
    "from_transformers",
    "from_transformers_state_dict",
    "from_keras_hub",
    "from_llip_checkpoint",
    "from_flair_checkpoint",
    "from_big_vision_checkpoint",
    "from_sparo_checkpoint",
    "parity",
    "peer_outputs",
    "random_inputs",
    "vlzoo_variables",
    "checkpoints",
    "convert_checkpoint",
    "load_state_dict",
    "register_converter",
]
