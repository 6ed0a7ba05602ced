"""The families the suite covers, derived from vlzoo's family registry (`vlzoo.families`): every
registered family, each with a `<family>_tiny` preset. The registry holds vlzoo's families and the one
`extension_family.py` defines outside vlzoo, so a family added by one registration is picked up by every
cross-cutting test (contract, preset round trip, fit, degenerate inputs, precision, gradient caching,
locking, quantization, serving, transfer, the multi-process launches, cross-backend conformance) without
editing them."""

import extension_family  # noqa: F401  (registers the family defined outside vlzoo)
from vlzoo.presets import catalogue
from vlzoo.models import registered_families
from vlzoo.models import transfer_families

FAMILIES = registered_families()
"""Every registered family, sorted: `("clip", "filip", "flair", "headwise_clip", ...)`."""

TINY_PRESETS = tuple(f"{family}_tiny" for family in FAMILIES)
"""Each family's tiny preset (32 px, two blocks per tower), what the cross-backend tests build."""

TRANSFER_FAMILIES = transfer_families()
"""The families that start from a CLIP checkpoint (`from_preset(..., family=...)`)."""

SHAPES_FAMILIES = tuple(family for family in FAMILIES if f"{family}_shapes" in catalogue.definitions())
"""The families with a preset trained on `vlzoo.data.shapes` (bundled with weights)."""

SHAPES_PRESETS = tuple(f"{family}_shapes" for family in SHAPES_FAMILIES)
"""Those presets: `("clip_shapes", ...)`."""

EXTENSION_FAMILY = extension_family.FAMILY
"""The family defined in the tests, outside vlzoo."""
