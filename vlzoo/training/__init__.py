"""Training and fine-tuning recipes.

* `defaults`: the papers' training defaults in one call (`configure`: AdamW,
  `WarmupCosine`, weight-decay exclusions, accumulation, remat) and
  `retain_host_memory` for CPU training.
* `locking`: locked towers (LiT): `lock_tower(model, "image", unlocked_groups=N)`,
  also `configure(..., lock_image=True)`; `cache_tower` computes a locked
  tower's outputs once per dataset.
* `lora`: LoRA adapters through Keras' `enable_lora` (`enable_lora`, `merge_lora`,
  `save_lora_weights`, `load_lora_weights`).
* `backup`: `BackupAndRestore`, Keras' resumable training written by one process
  of a multi-process run and read by all.
* `interpolation`: WiSE-FT weight-space ensembles of a zero-shot and a
  fine-tuned model (`interpolate`, `interpolation_sweep`).

Example:
>>> model = vlzoo.from_preset("clip_tiny")
>>> vlzoo.training.configure(model, learning_rate=5e-4, total_steps=1000, warmup_steps=100)
>>> model.fit(dataset)
>>> vlzoo.training.interpolate(vlzoo.from_preset("clip_tiny"), model, 0.5)
"""

from vlzoo.training.backup import BackupAndRestore
from vlzoo.training.defaults import WarmupCosine, configure, retain_host_memory, training_optimizer
from vlzoo.training.interpolation import interpolate, interpolation_sweep
from vlzoo.training.locking import cache_tower, lock_tower, tower_groups
from vlzoo.training.lora import enable_lora, load_lora_weights, merge_lora, save_lora_weights

__all__ = ["BackupAndRestore", "WarmupCosine", "cache_tower", "configure", "enable_lora", "interpolate", "interpolation_sweep",
           "load_lora_weights", "lock_tower", "merge_lora", "retain_host_memory", "save_lora_weights",
           "tower_groups", "training_optimizer"]
