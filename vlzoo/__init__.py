"""vlzoo: vision-language contrastive models in Keras 3, on JAX, TensorFlow and PyTorch.

>>> import vlzoo
>>> model = vlzoo.from_preset("clip_tiny")
>>> scores = model.similarity(images, model.tokenizer(["a red circle"]))
"""

import importlib as _importlib
import os as _os
import platform as _platform
import sys as _sys

# TensorFlow's oneDNN CPU kernels, on by default only on CPUs with AVX-512 VNNI or AMX, are turned on
# for every x86 CPU (the AVX2-only ones gain most; docs/workarounds.md). TensorFlow reads the switch
# once, when it is imported, so this only takes effect when vlzoo is imported before TensorFlow (or
# Keras on its TensorFlow backend); set TF_ENABLE_ONEDNN_OPTS yourself (1, or 0 to opt out).
if "tensorflow" not in _sys.modules and _platform.machine().lower() in ("x86_64", "amd64"):
    _os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

from vlzoo.version import __version__

# Names are imported on first use (PEP 562): `import vlzoo` loads no backend, so the command
# line lists and describes presets without one. A model class registers itself with Keras when
# `vlzoo.models` is first imported (by `vlzoo.from_preset`, `vlzoo.CLIP`, ...); before
# `keras.saving.load_model` of a `.keras` file, `import vlzoo.models`.
_NAMES = {
    **{name: "vlzoo.models" for name in ("CLIP", "FILIP", "FLAIR", "SPARC", "SPARO", "STAIR", "ContrastiveModel",
                                         "Llip", "SigLIP")},
    "export": "vlzoo.serving",
    "from_preset": "vlzoo.loading",
    "list_presets": "vlzoo.catalogue",
    "preset_info": "vlzoo.presets",
    "save_to_preset": "vlzoo.preset_files",
    "upload_preset": "vlzoo.upload",
}
_SUBMODULES = (
    "catalogue", "convert", "data", "distribution", "evaluation", "families", "formats", "host", "hub", "kaggle",
    "layers", "loading", "losses", "models", "optimizers", "parallel", "preprocessing", "preset_files", "presets",
    "pretrained", "registry", "retrieval", "serving", "tokenizers", "training", "transfer", "upload", "viz",
)
__all__ = sorted(_NAMES) + list(_SUBMODULES) + ["__version__"]


def __getattr__(name):
    if name in _NAMES:
        value = getattr(_importlib.import_module(_NAMES[name]), name)
    elif name in _SUBMODULES:
        value = _importlib.import_module(f"vlzoo.{name}")
    else:
        raise AttributeError(f"module 'vlzoo' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
