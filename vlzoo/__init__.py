"""vlzoo: vision-language contrastive models in Keras 3, on JAX, TensorFlow and PyTorch.

>>> import vlzoo
>>> model = vlzoo.from_preset("clip_tiny")
>>> scores = model.similarity(images, model.tokenizer(["a red circle"]))
"""

import os as _os
import platform as _platform
import sys as _sys

# TensorFlow's oneDNN CPU kernels, on by default only on CPUs with AVX-512 VNNI or AMX, are turned on
# for every x86 CPU (the AVX2-only ones gain most; docs/workarounds.md). TensorFlow reads the switch
# once, when it is imported, so this only takes effect when vlzoo is imported before TensorFlow (or
# Keras on its TensorFlow backend); set TF_ENABLE_ONEDNN_OPTS yourself (1, or 0 to opt out).
if "tensorflow" not in _sys.modules and _platform.machine().lower() in ("x86_64", "amd64"):
    _os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

from vlzoo._lazy import lazy_names as _lazy_names
from vlzoo.version import __version__

# Names are imported on first use (PEP 562): `import vlzoo` loads no backend, so the command
# line lists and describes presets without one. A model class registers itself with Keras when
# `vlzoo.models` is first imported (by `vlzoo.from_preset`, `vlzoo.CLIP`, ...); before
# `keras.saving.load_model` of a `.keras` file, `import vlzoo.models`.
_NAMES = {
    **{name: "vlzoo.models" for name in ("CLIP", "FILIP", "FLAIR", "SPARC", "SPARO", "STAIR", "ContrastiveModel",
                                         "Llip", "PECore", "SigLIP", "TIPSv2")},
    "export": "vlzoo.serving",
    "from_preset": "vlzoo.presets.loading",
    "list_presets": "vlzoo.presets.catalogue",
    "preset_info": "vlzoo.presets.local",
    "save_to_preset": "vlzoo.presets.saving",
    "upload_preset": "vlzoo.presets.upload",
}
_SUBMODULES = (
    "convert", "data", "distribution", "evaluation", "families", "formats", "host", "layers", "losses", "models",
    "optimizers", "parallel", "preprocessing", "presets", "retrieval", "serving", "tokenizers", "training",
    "transfer", "viz",
)
__getattr__, __dir__, __all__ = _lazy_names(__name__, globals(), _NAMES, _SUBMODULES)
__all__ = [*__all__, "__version__"]
