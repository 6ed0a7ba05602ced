"""The family registry: what a model family tells the rest of the zoo, declared once in its own module.

A family module ends with one `register_family(Family(...))`: its name, its model class, how it
starts from a CLIP checkpoint (`CLIPTransfer`, for `from_preset(..., family=...)`) and any
presets it defines in code. Everything that enumerates families (the `--family` choices of
`vlzoo train`, `vlzoo.transfer`, the dense-feature benchmarks, the test suites) reads this
registry, so a family defined outside vlzoo is one registration like the built-in ones.
The built-in families register when `vlzoo.models` is imported, which re-exports this module's
names: read the registry through `vlzoo.models` and it is complete. A family that an installed
package declares as a plugin (`vlzoo.plugins`) registers when its module is imported, which
`get_family` does when it is looked up and `registered_families` when the families are enumerated.

Example:
>>> from vlzoo.models import get_family, registered_families
>>> get_family("sparc").model_class.__name__
'SPARC'
>>> registered_families()[:3]
('clip', 'filip', 'flair')
"""

import dataclasses
import types

from vlzoo import plugins
from vlzoo.presets import catalogue

_FAMILIES = {}
SCORE_LOSSES = ("softmax", "sigmoid", None)

# CLIP's tower projections into the joint space, as `(target path, CLIP path)` pairs of `CLIPTransfer`.
IMAGE_PROJECTION = ("image_projection/kernel", "vision/projection/kernel")
TEXT_PROJECTION = ("text_projection/kernel", "text/projection/kernel")


@dataclasses.dataclass(frozen=True)
class CLIPTransfer:
    """How a family is built on a CLIP model's towers and weights (`vlzoo.transfer.from_clip`).

    The towers (every `vision/...` and `text/...` variable of the same path and shape) are
    always copied; these fields say what else carries over.

    Attributes:
        projections: `((target path, CLIP path), ...)` of CLIP weights reused elsewhere, e.g.
            `(("image_projection/kernel", "vision/projection/kernel"),)`.
        logit_scale: the family's loss is softmax InfoNCE on `exp(logit_scale) * cos`, so
            CLIP's learned scale keeps its role and is copied.
        embed_dim: the family keeps CLIP's `embed_dim`.
        configure: optional `configure(config, clip) -> None` that edits the family's
            constructor arguments in place (e.g. Llip's mixture tokens) before overrides.
    """

    projections: tuple = ()
    logit_scale: bool = False
    embed_dim: bool = False
    configure: object = None


@dataclasses.dataclass(frozen=True)
class Family:
    """One model family, as the zoo sees it.

    Attributes:
        name: the family name, also the model class's `family` attribute ("sparc").
        model_class: the `vlzoo.models.ContrastiveModel` subclass.
        from_clip: a `CLIPTransfer` when the family can start from a CLIP checkpoint, else None.
        score_loss: what the loss is at the first training step, as a function of `similarity`'s
            `(B, B)` scores of the batch alone: `"softmax"` (CLIP's symmetric InfoNCE: CLIP, FILIP,
            SPARO, STAIR before its FLOPs weights ramp up), `"sigmoid"` (the pairwise sigmoid loss
            with its bias: SigLIP, Llip; FLAIR averages two), or None (other terms too: SPARC's
            token-level loss). What a constant or a single-pair batch must give follows from it.
        presets: `{preset name: registry entry}` of presets defined in code (the same fields as
            an entry of `presets/registry.json`, see `vlzoo.presets.catalogue`); their directories are
            written when first loaded.
    """

    name: str
    model_class: type
    from_clip: CLIPTransfer = None
    score_loss: str = None
    presets: types.MappingProxyType = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ValueError(f"`name` must be an identifier string such as 'sparc'; received {self.name!r}.")
        if getattr(self.model_class, "family", None) != self.name:
            raise ValueError(
                f"`model_class` {getattr(self.model_class, '__name__', self.model_class)!r} has `family` "
                f"{getattr(self.model_class, 'family', None)!r}; set its class attribute `family = {self.name!r}`."
            )
        if self.from_clip is not None and not isinstance(self.from_clip, CLIPTransfer):
            raise TypeError(f"`from_clip` must be a CLIPTransfer or None; received {type(self.from_clip).__name__}.")
        if self.score_loss not in SCORE_LOSSES:
            raise ValueError(f"`score_loss` must be one of {SCORE_LOSSES}; received {self.score_loss!r}.")
        object.__setattr__(self, "presets", types.MappingProxyType(dict(self.presets)))


def register_family(family):
    """Adds `family` (a `Family`) to the registry, and its presets to `vlzoo.presets.catalogue`; returns it.

    Registering the same class again (a reloaded module) replaces the entry.

    Raises:
        ValueError: another class is registered under the same name, or a preset name is taken
            or its entry names another family.
    """
    if not isinstance(family, Family):
        raise TypeError(f"`family` must be a vlzoo.families.Family; received {type(family).__name__}.")
    known = _FAMILIES.get(family.name)
    if known is not None and _class_name(known.model_class) != _class_name(family.model_class):
        raise ValueError(
            f"Family {family.name!r} is already registered with {_class_name(known.model_class)}; "
            "choose another name."
        )
    for name, entry in family.presets.items():
        if entry.get("family") != family.name:
            raise ValueError(f"Preset {name!r} of family {family.name!r} has `family` {entry.get('family')!r}.")
        catalogue.register(name, entry)
    _FAMILIES[family.name] = family
    return family


def _class_name(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def get_family(name):
    """The registered `Family` called `name`, importing the installed plugin that declares it when it is one
    (`vlzoo.plugins.load_family`); KeyError naming the registered ones otherwise."""
    if name not in _FAMILIES and plugins.load_family(name) and name not in _FAMILIES:
        raise KeyError(f"The vlzoo plugin family {name!r} was imported but registered no family of that name.")
    if name not in _FAMILIES:
        raise KeyError(f"{name!r} is not a registered family; registered: {', '.join(registered_families())}.")
    return _FAMILIES[name]


def registered_families():
    """The names of the registered families, sorted, the installed plugins' imported first
    (`vlzoo.plugins.load_families`)."""
    plugins.load_families()
    return tuple(sorted(_FAMILIES))


def transfer_families():
    """The names of the families that can start from a CLIP checkpoint (`from_clip` set), sorted."""
    return tuple(name for name in registered_families() if _FAMILIES[name].from_clip is not None)
