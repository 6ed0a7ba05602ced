"""Training and fine-tuning recipes.

* `defaults`: the papers' training defaults in one call (`configure`: AdamW,
  `WarmupCosine`, weight-decay exclusions, accumulation, remat) and
  `retain_host_memory` for CPU training.
* `locking`: locked towers (LiT): `lock_tower(model, "image", unlocked_groups=N)`,
  also `configure(..., lock_image=True)`.
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
from vlzoo.training.locking import lock_tower, tower_groups

__all__ = ["WarmupCosine", "configure", "interpolate", "interpolation_sweep", "lock_tower", "retain_host_memory",
           "tower_groups", "training_optimizer"]
