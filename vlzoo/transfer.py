"""Any fine-grained family started from a CLIP checkpoint: `from_preset(..., family=...)`.

`from_clip(clip, family)` builds a registered family (FILIP, SPARC, SPARO, Llip, STAIR, FLAIR, or
any with a `CLIPTransfer`) on the towers of a CLIP model. The target keeps CLIP's tower geometry
and numerics (width, depth, heads, activation, LayerNorm epsilon, CLS token, causal text
attention); every weight with the same role is copied (the towers: patch, class and position
embeddings, `ln_pre`, the blocks and final LayerNorms, the token embedding; per family some
projections and the logit scale), and the family's own parameters keep the initialisation of its
paper or authors' code. `transfer_config` gives the target's constructor arguments,
`new_variables` the parameters that start fresh. What transfers per family, and why:
docs/transfer.md.

Example:
>>> clip = vlzoo.from_preset("clip_tiny")  # doctest: +SKIP
>>> sparc, report = vlzoo.transfer.from_clip(clip, "sparc")  # doctest: +SKIP
sparc from CLIP: 78 weights transferred; 2 new (vision_head); 0 left out (none).
>>> sparc = vlzoo.from_preset("clip_vit_b16_openai", family="sparc")  # doctest: +SKIP
"""

import dataclasses

import keras
import numpy as np

from vlzoo import families
from vlzoo.models import CLIP
from vlzoo.models.llip import LLIP_MIXTURE_TOKENS  # noqa: F401  (a public name of this module)
from vlzoo.models.stair import CLIP_BPE_SPECIAL_IDS  # noqa: F401
from vlzoo.presets.local import merge_config

_POSITIONS = "vision/position_embedding/embeddings"
_PREFIX = "vision/prefix_tokens"


def _groups(paths):
    """Paths shortened to their layer (`vision/block_11/...` -> `vision/block_11`, `vision_head/kernel` ->
    `vision_head`), in order, once each."""
    def layer(path):
        parts = path.split("/")
        return "/".join(parts[:2] if parts[0] in ("vision", "text") else parts[:1])

    return list(dict.fromkeys(layer(path) for path in paths))


@dataclasses.dataclass
class TransferReport:
    """What `from_clip` did, by variable path.

    Attributes:
        transferred: `{target path: source path}` of the copied weights.
        new: target paths that keep the family's initialisation.
        left_out: source paths the target has no use for.
    """

    transferred: dict
    new: list
    left_out: list

    def summary(self, family):
        """One line for the user: counts, and the new and left-out layers by name."""
        return (f"{family} from CLIP: {len(self.transferred)} weights transferred; {len(self.new)} new "
                f"({', '.join(_groups(self.new)) or 'none'}); {len(self.left_out)} left out "
                f"({', '.join(_groups(self.left_out)) or 'none'}).")


def new_variables(model, report):
    """The trainable variables of `model` that `report` (`from_clip`'s) lists as new, in model order.

    `vlzoo train --family` trains them alone first, the rest held (docs/transfer.md).

    Args:
        model: the model `from_clip` returned.
        report: its `TransferReport`.

    Returns:
        list of `keras.Variable`.

    Example:
    >>> sparc, report = vlzoo.transfer.from_clip(vlzoo.from_preset("clip_tiny"), "sparc")  # doctest: +SKIP
    >>> [v.path for v in new_variables(sparc, report)]  # doctest: +SKIP
    ['vision_head/kernel', 'vision_head/bias']
    """
    new = set(report.new)
    return [variable for path, variable in _variables(model).items() if path in new and variable.trainable]


def transfer_config(clip, family):
    """The constructor arguments of `family` on `clip`'s towers (before any override).

    The towers keep every argument of the CLIP model's towers. A tower keeps CLIP's projection
    (its `output_dim`) when the family's own defaults project it to `embed_dim`, as CLIP's do (its
    `vision_defaults` / `text_defaults` set no `output_dim`); the model then keeps CLIP's
    `embed_dim`, so that the projection is copied. A family whose defaults set `output_dim`
    (None: FILIP, SPARC, SPARO, Llip, STAIR, FLAIR project tokens themselves) drops it. A family
    whose `CLIPTransfer` has `embed_dim` keeps CLIP's, and its `configure` edits the rest (Llip's
    `LLIP_MIXTURE_TOKENS` mixture tokens in place of the CLS token; STAIR leaving CLIP BPE's start
    and end tokens out of its vectors).

    Args:
        clip: a `vlzoo.CLIP`.
        family: a family name with a `CLIPTransfer`.

    Returns:
        dict of constructor arguments, tower configs under `"vision"` and `"text"`.

    Raises:
        ValueError: `family` has no `CLIPTransfer`.

    Example:
    >>> transfer_config(vlzoo.from_preset("clip_tiny"), "sparc")["vision"]["output_dim"]  # doctest: +SKIP
    """
    rules = _rules(family)
    model_class = families.get_family(family).model_class
    config = {}
    for tower, clip_config in (("vision", clip.vision_config), ("text", clip.text_config)):
        projects = "output_dim" not in getattr(model_class, f"{tower}_defaults")  # to `embed_dim`, as CLIP's
        config[tower] = {**clip_config, "output_dim": clip_config["output_dim"] if projects else None}
    if rules.embed_dim or any(config[tower]["output_dim"] is not None for tower in ("vision", "text")):
        config["embed_dim"] = clip.embed_dim
    if rules.configure is not None:
        rules.configure(config, clip)
    return config


def _rules(family):
    """The `CLIPTransfer` of `family`; ValueError naming the families that have one otherwise."""
    if family not in families.transfer_families():
        raise ValueError(
            f"`family` must be one of {list(families.transfer_families())} (or 'clip'); received {family!r}."
        )
    return families.get_family(family).from_clip


def _variables(model):
    """`{path below the model, e.g. "vision/block_0/ln_1/gamma": variable}` of every variable of `model`."""
    return {variable.path.split("/", 1)[1] if variable.path.startswith(f"{model.name}/") else variable.path: variable
            for variable in model.variables}


def _position_rows(source, num_prefix):
    """CLIP's position table `(1 + P, W)` for `num_prefix` prefix positions: the CLS row for each."""
    rows = keras.ops.convert_to_numpy(source)
    return np.concatenate([np.repeat(rows[:1], num_prefix, axis=0), rows[1:]], axis=0)


def _plan(clip, model, family):
    """`(target variable, value)` pairs to assign, and the report."""
    source, target = _variables(clip), _variables(model)
    towers = [path for path in target if path.startswith(("vision/", "text/"))]
    pairs, transferred, new = [], {}, []
    rules = _rules(family)
    pairs_for = dict(rules.projections)
    if rules.logit_scale:
        pairs_for["logit_scale"] = "logit_scale"
    for path in towers:
        pairs_for.setdefault(path, path)
    for path, variable in target.items():
        origin = pairs_for.get(path)
        value = source[origin] if origin in source else None
        if value is None or (path == _PREFIX and tuple(value.shape) != tuple(variable.shape)):
            if variable.trainable:  # counters (STAIR's steps) are state, not parameters
                new.append(path)
            continue
        if path == _POSITIONS and tuple(value.shape) != tuple(variable.shape):
            value = _position_rows(value, model.vision.num_prefix_tokens)
        if tuple(value.shape) != tuple(variable.shape):
            raise ValueError(
                f"Cannot start {family} from this CLIP model: `{path}` has shape {tuple(variable.shape)} but "
                f"CLIP's `{origin}` has {tuple(value.shape)}. The towers keep the checkpoint's geometry; "
                "override only the family's own arguments (and tower options that add no weights)."
            )
        pairs.append((variable, value))
        transferred[path] = origin
    used = set(transferred.values())
    left_out = [path for path in source if path not in used]
    return pairs, TransferReport(transferred, new, left_out)


def from_clip(clip, family, verbose=True, **config_overrides):
    """Builds `family` on the towers and weights of the CLIP model `clip`.

    Args:
        clip: a `vlzoo.CLIP` (any CLIP preset, converted checkpoint or hub
            handle, loaded with its weights).
        family: a registered family with a `CLIPTransfer`
            (`vlzoo.families.transfer_families()`: "filip", "sparc", "sparo",
            "llip", "stair", "flair" and any family registered so).
        verbose: print what was transferred and what is new.
        **config_overrides: the family's constructor arguments replacing
            `transfer_config`'s (e.g. `num_slots=32`, `lambda_fine=2.0`,
            `vision=dict(num_prefix_tokens=64)` for Llip's K); tower dicts
            merge key by key. Arguments that resize a transferred weight are
            refused.

    Returns:
        `(model, report)`: the family's model, in `clip`'s dtype policy, with
        CLIP's tokenizer and preprocessor attached, and a `TransferReport`.

    Raises:
        ValueError: `clip` is not a CLIP model, `family` is unknown, or an
            override changes a transferred weight's shape (named).

    Example:
    >>> model, report = vlzoo.transfer.from_clip(vlzoo.from_preset("clip_tiny"), "filip")  # doctest: +SKIP
    filip from CLIP: ...
    >>> sorted(report.new)  # doctest: +SKIP
    []
    """
    if not isinstance(clip, CLIP):
        raise ValueError(
            f"`family=` starts a family from a CLIP checkpoint; received a {type(clip).__name__} model "
            f"(family {getattr(clip, 'family', None)!r}). Load a CLIP preset, handle or directory."
        )
    config = merge_config(transfer_config(clip, family), config_overrides)
    model = families.get_family(family).model_class(**config, dtype=clip.dtype_policy.name)
    pairs, report = _plan(clip, model, family)
    for variable, value in pairs:
        variable.assign(keras.ops.cast(value, variable.dtype))
    model.tokenizer = clip.tokenizer
    model.preprocessor = clip.preprocessor
    if clip.preset_origin:  # what the weights started from (`vlzoo.from_preset`), for `save_to_preset`
        model.preset_origin = {**clip.preset_origin, "family": family, "from_family": clip.family,
                               "family_transfer": True}
    if verbose:
        print(report.summary(family))
    return model, report
