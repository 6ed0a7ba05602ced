"""Checkpoints of the SPARO authors' open_clip fork (github.com/ankitkv/sparo-clip) -> vlzoo `SPARO`.

The fork's `CLIP(use_sparo=True, ...)` keeps open_clip's towers with `layers - reduce_depth`
blocks and replaces each tower's pooling and projection by a `SPARO` read-out: its state dict is
open_clip's minus `visual.proj` / `text_projection`, plus `visual.sparo.*` and `text_sparo.*`.
Checkpoints carry no architecture, so the vlzoo preset gives it; everything the weights show
(L, g, D, V, tower widths and depths) is checked against it before anything is assigned. The key
layout: docs/converting.md, *The authors' checkpoint layouts*.
"""

import re

import numpy as np

from vlzoo._backends.keras_internals import without_weights
from vlzoo.convert import _common as C
from vlzoo.convert.converters import register_converter
from vlzoo.convert.open_clip import text_tower_rules, vit_tower_rules
from vlzoo.convert.state_dict import read_state_dict
from vlzoo.presets.local import load_local_preset

# (checkpoint prefix of the read-out, of the tower's blocks; vlzoo tower, read-out)
_TOWERS = (("visual.sparo.", "visual.transformer.resblocks.", "vision", "vision_readout"),
           ("text_sparo.", "transformer.resblocks.", "text", "text_readout"))


def from_sparo_checkpoint(path_or_state_dict, preset, *, dtype=None, progress=None, **config_overrides):
    """Loads a checkpoint of the SPARO authors' open_clip fork into a vlzoo `SPARO` model.

    Args:
        path_or_state_dict: a `.pt`/`.pth`/`.bin`/`.safetensors` file (read
            with `vlzoo.convert.load_state_dict`) or a `{key: tensor or
            array}` dict: a bare `CLIP.state_dict()` or a training checkpoint
            `{"state_dict": ...}`; DDP's `module.` and `torch.compile`'s
            `_orig_mod.` prefixes (also both) are dropped. The tied value keys
            (`visual.sparo.v.*`, `text_sparo.v.*`) must equal their `k.*`
            and are then skipped; with `share_key_value=False` they load as
            the separate value projection (the authors' `share_kv=False`).
        preset: the vlzoo SPARO preset (name or directory) describing the
            architecture, e.g. `"sparo_clip_vit_b16"` for the authors'
            `ViT-B-16-SPARO`. Its tokenizer and preprocessor are kept.
        dtype: dtype policy of the model (default: the preset's, float32).
        progress: optional `progress(done, total)` callback while assigning.
        **config_overrides: `SPARO` arguments replacing the preset's, as in
            `vlzoo.from_preset` (e.g. `num_slots=128`).

    Returns:
        The `SPARO` model. Its log-scale `logit_scale` is the checkpoint's
        (both store the log; scores use `exp(logit_scale)`), and its outputs
        are the authors': `encode_image(x, normalize=True)["embeds"]` `(B, L V)` is
        their `encode_image(x, normalize=True)`, `image_attention(x)`
        `(B, L, 1 + P)` their `return_attn` maps, likewise for text.
        Only their released `sparo_type="cont:const"` is meant: a
        `"...:softmax"` checkpoint stores one extra channel per slot that
        vlzoo would read as slot width `V + 1`.

    Raises:
        ValueError: the checkpoint's geometry differs from the preset's
            (every mismatch listed with its key, shape and the override that
            fixes it), a tensor's shape does not match, a tied value key
            differs from its key projection, or `preset` is not a SPARO one.
        KeyError: a checkpoint key is missing or unexpected (named).
        NotImplementedError: the authors' `sparo_value_dim` differs from
            the key width (vlzoo's values have the key width).

    Example:
    >>> model = vlzoo.convert.from_sparo_checkpoint("epoch_25.pt", "sparo_clip_vit_b32")  # doctest: +SKIP
    >>> images = np.zeros((8, 224, 224, 3), "float32")  # preprocessed pixels
    >>> model.encode_image(images, normalize=True)["embeds"].shape  # doctest: +SKIP
    (8, 4096)
    >>> model.image_attention(images).shape  # L = 64 slots over CLS + 7 x 7 patches  # doctest: +SKIP
    (8, 64, 50)
    """
    state_dict = read_state_dict(path_or_state_dict)
    where = f"preset {str(preset)!r}" + (f" with overrides {config_overrides}" if config_overrides else "")
    with without_weights():
        model = load_local_preset(preset, load_weights=False, dtype=dtype, **config_overrides)
    if getattr(model, "family", None) != "sparo":
        raise ValueError(
            f"{where} builds a {type(model).__name__}, not a SPARO model; pass a SPARO preset "
            "(e.g. 'sparo_clip_vit_b16')."
        )
    _check_geometry(state_dict, model, where)
    aliases = _tied_aliases(state_dict, model, where)
    try:
        C.load_rules(_rules(model), state_dict, model, ignore=aliases, progress=progress)
    except (KeyError, ValueError) as error:
        raise type(error)(f"{error.args[0].rstrip('.')} ({where}).") from error
    C.warn_logit_scale(C.to_numpy(model.logit_scale), "SPARO checkpoint")
    return model


def _shape(state_dict, key):
    if key not in state_dict:
        raise KeyError(f"Checkpoint key {key!r} is missing (needed to read the SPARO checkpoint's geometry).")
    return tuple(np.shape(C.to_numpy(state_dict[key])))


def _check_geometry(state_dict, model, where):
    """Compares what the checkpoint's shapes show with `model`; raises listing every mismatch."""
    problems = []

    def compare(source, what, found, name, expected, fix):
        if found != expected:
            problems.append(f"{source}: {what} = {found}, but the model has {name}={expected}; override {fix}")

    for readout_prefix, blocks_prefix, tower_name, readout_name in _TOWERS:
        tower, readout = getattr(model, tower_name), getattr(model, readout_name)
        key = f"{readout_prefix}q_emb"
        q = _shape(state_dict, key)
        if len(q) != 5 or q[0] != 1 or q[3] != 1:
            raise ValueError(
                f"Checkpoint key {key!r} has shape {q}; the authors' SPARO stores (1, L/g, g, 1, D) ({where})."
            )
        slots, group, key_dim = q[1] * q[2], q[2], q[4]
        source = f"{key!r} {q}"
        compare(source, "L", slots, "num_slots", model.num_slots, f"num_slots={slots}")
        compare(source, "g", group, "group_size", model.group_size, f"group_size={group}")
        compare(
            source, "D", key_dim, f"{tower_name} read-out key_dim", readout.key_dim,
            f"key_dim={key_dim} (or {tower_name}['num_heads'] when D is the tower's head width)",
        )
        key = f"{readout_prefix}proj.weight"
        proj = _shape(state_dict, key)
        if len(proj) == 2 and proj[1] != key_dim:
            raise NotImplementedError(
                f"Checkpoint key {key!r} {proj} reads values of width {proj[1]}, not the key width D={key_dim} "
                f"of {readout_prefix}q_emb: the authors' `sparo_value_dim` != `sparo_attn_dim` is not supported "
                "by vlzoo."
            )
        compare(f"{key!r} {proj}", "V", proj[0], "slot_dim", model.slot_dim, f"slot_dim={proj[0]}")
        key = f"{readout_prefix}k.weight"
        k = _shape(state_dict, key)
        compare(
            f"{key!r} {k}", "d", k[-1], f"{tower_name} hidden_dim", tower.hidden_dim,
            f"{tower_name}={{'hidden_dim': {k[-1]}}}",
        )
        pattern = re.compile(re.escape(blocks_prefix) + r"(\d+)\.")
        depth = len({m.group(1) for m in map(pattern.match, state_dict) if m})
        compare(
            f"'{blocks_prefix}*'", "blocks", depth, f"{tower_name} blocks", len(tower.blocks),
            f"{tower_name}={{'num_layers': {depth + model.reduce_depth}}} (with reduce_depth={model.reduce_depth})",
        )
    if problems:
        raise ValueError(f"The SPARO checkpoint does not match {where}:\n- " + "\n- ".join(problems))


def _tied_aliases(state_dict, model, where):
    """The tied value keys to skip; each must equal the key projection it aliases."""
    if not model.share_key_value:
        return []
    aliases = []
    for readout_prefix, *_ in _TOWERS:
        for part in ("weight", "bias"):
            alias, key = f"{readout_prefix}v.{part}", f"{readout_prefix}k.{part}"
            if alias not in state_dict or key not in state_dict:  # a missing `k.*` is reported with the others
                continue
            value, tied = C.to_numpy(state_dict[alias]), C.to_numpy(state_dict[key])
            if not np.array_equal(value, tied):
                raise ValueError(
                    f"Checkpoint key {alias!r} {value.shape} differs from {key!r} {tied.shape}, but {where} ties "
                    "values to keys (share_key_value=True, the authors' share_kv=True). A checkpoint trained "
                    "with share_kv=False needs share_key_value=False."
                )
            aliases.append(alias)
    return aliases


def _rules(model):
    """Every checkpoint key -> vlzoo variable, for `model`'s geometry."""
    rules = vit_tower_rules(model.vision.get_config()) + text_tower_rules(model.text.get_config())
    for readout_prefix, _, _, readout_name in _TOWERS:
        readout, p = getattr(model, readout_name), readout_prefix[:-1]
        slots, group, key_dim = readout.num_slots, readout.group_size, readout.key_dim
        rules.append(C.reshape(f"{p}.q_emb", f"{readout_name}/queries", (slots, key_dim),
                               (1, slots // group, group, 1, key_dim)))
        rules += C.torch_linear(f"{p}.k", f"{readout_name}/key")
        if readout.value is not None:
            rules += C.torch_linear(f"{p}.v", f"{readout_name}/value")
        rules += C.torch_linear(f"{p}.proj", f"{readout_name}/output")
    rules.append(C.scalar("logit_scale", "logit_scale"))
    return rules


register_converter("sparo", from_sparo_checkpoint)
