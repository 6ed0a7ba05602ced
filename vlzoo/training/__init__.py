"""Training and fine-tuning recipes.

* `defaults`: the papers' training defaults in one call (`configure`: AdamW,
  `WarmupCosine`, weight-decay exclusions, accumulation, remat) and
  `retain_host_memory` for CPU training.
* `interpolation`: WiSE-FT weight-space ensembles of a zero-shot and a
  fine-tuned model (`interpolate`, `interpolation_sweep`).

Example:
>>> model = vlzoo.from_preset("clip_tiny")
>>> vlzoo.training.configure(model, learning_rate=5e-4, total_steps=1000, warmup_steps=100)
>>> model.fit(dataset)
>>> vlzoo.training.interpolate(vlzoo.from_preset("clip_tiny"), model, 0.5)
"""

from vlzoo.training.defaults import WarmupCosine, configure, retain_host_memory, training_optimizer
from vlzoo.training.interpolation import interpolate, interpolation_sweep

__all__ = ["WarmupCosine", "configure", "interpolate", "interpolation_sweep", "retain_host_memory",
           "training_optimizer"]
