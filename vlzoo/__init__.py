"""vlzoo: vision-language contrastive models in Keras 3, on JAX, TensorFlow and PyTorch.

>>> import vlzoo
>>> model = vlzoo.from_preset("clip_tiny")
>>> scores = model.similarity(images, model.tokenizer(["a red circle"]))
"""

import os as _os
import platform as _platform
import sys as _sys

# TensorFlow turns its oneDNN CPU kernels on by default only on CPUs with AVX-512 VNNI, AMX and the
# like; on AVX2-only x86 hosts its own kernels are much slower (ViT-B/16 `encode_image`: 0.77x
# open_clip's throughput without oneDNN, 1.04x with it; matmul 130 -> 171 GFLOP/s on a 2-core AMD
# EPYC). TensorFlow reads the switch once, when it is imported, so this only takes effect when vlzoo
# is imported before TensorFlow (or Keras on its TensorFlow backend); set TF_ENABLE_ONEDNN_OPTS
# yourself (to 1, or to 0 to opt out) to decide either way.
if "tensorflow" not in _sys.modules and _platform.machine().lower() in ("x86_64", "amd64"):
    _os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

from vlzoo import (
    convert, data, distribution, evaluation, hub, layers, loading, losses, models, retrieval, training, transfer,
)
from vlzoo.models import CLIP, FILIP, SPARC, SPARO, STAIR, ContrastiveModel, Llip, SigLIP
from vlzoo.loading import from_preset
from vlzoo.presets import list_presets, preset_info, save_to_preset
from vlzoo.version import __version__
