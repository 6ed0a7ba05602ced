"""vlzoo: vision-language contrastive models in Keras 3, on JAX, TensorFlow and PyTorch.

>>> import vlzoo
>>> model = vlzoo.from_preset("clip_tiny")
>>> scores = model.similarity(images, model.tokenizer(["a red circle"]))
"""

from vlzoo import convert, data, distribution, evaluation, layers, losses, models, retrieval, training
from vlzoo.models import CLIP, FILIP, SPARC, SPARO, STAIR, ContrastiveModel, Llip, SigLIP
from vlzoo.presets import from_preset, list_presets, preset_info, save_to_preset
from vlzoo.version import __version__
