"""The families the suite covers, derived from vlzoo's preset registry (`vlzoo.registry`): every family
with registered presets, each with a `<family>_tiny` preset. A family added to the registry is picked up
by every cross-cutting test (contract, degenerate inputs, precision, gradient caching, locking,
quantization, serving, the multi-process launches, cross-backend conformance) without editing them."""

from vlzoo import registry

FAMILIES = tuple(registry.families())
"""Every family with registered presets, sorted: `("clip", "filip", "flair", ...)`."""

TINY_PRESETS = tuple(f"{family}_tiny" for family in FAMILIES)
"""Each family's tiny preset (32 px, two blocks per tower), what the cross-backend tests build."""

SHAPES_PRESETS = tuple(f"{family}_shapes" for family in FAMILIES if f"{family}_shapes" in registry.definitions())
"""The families' presets trained on `vlzoo.data.shapes` (bundled with weights)."""
