"""Training and fine-tuning recipes.

`defaults` (`configure`, `training_optimizer`, `WarmupCosine`, `retain_host_memory`), `locking`
(LiT: `lock_tower`, `tower_groups`, `cache_tower`), `lora` (`enable_lora`, `merge_lora`,
`save_lora_weights`, `load_lora_weights`), `backup` (`BackupAndRestore` for multi-process runs)
and `interpolation` (WiSE-FT: `interpolate`, `interpolation_sweep`). Guide: docs/finetuning.md.

Example:
>>> model = vlzoo.from_preset("clip_tiny")  # doctest: +SKIP
>>> vlzoo.training.configure(model, learning_rate=5e-4, total_steps=1000, warmup_steps=100)  # doctest: +SKIP
>>> model.fit(dataset)  # doctest: +SKIP
>>> vlzoo.training.interpolate(vlzoo.from_preset("clip_tiny"), model, 0.5)  # doctest: +SKIP
"""

from vlzoo.training.backup import BackupAndRestore
from vlzoo.training.defaults import WarmupCosine, configure, retain_host_memory, training_optimizer
from vlzoo.training.interpolation import interpolate, interpolation_sweep
from vlzoo.training.locking import cache_tower, lock_tower, tower_groups
from vlzoo.training.lora import enable_lora, load_lora_weights, merge_lora, save_lora_weights

__all__ = ["BackupAndRestore", "WarmupCosine", "cache_tower", "configure", "enable_lora", "interpolate", "interpolation_sweep",
           "load_lora_weights", "lock_tower", "merge_lora", "retain_host_memory", "save_lora_weights",
           "tower_groups", "training_optimizer"]
