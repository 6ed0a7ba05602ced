"""The Llip authors' checkpoints (facebookresearch/Llip) -> `vlzoo.Llip`.

`from_llip_checkpoint` reads the authors' model (`CMP` in their open_clip fork): the towers under
open_clip's key names, and the head as bare matrices (`q_proj`, `k_proj`, `v_proj`,
`pred.out_proj`, the optional `Q_norm`/`K_norm`/`V_norm`), each applied as `x @ W` and mapped
one to one onto vlzoo's variables. The attention temperature tau, the head counts and the
activation are not in the checkpoint; the preset supplies them. The key layout:
docs/converting.md, *The authors' checkpoint layouts*.
"""

from vlzoo._backends.keras_internals import without_weights
from vlzoo.convert import _common as C
from vlzoo.convert.converters import register_converter
from vlzoo.convert.open_clip import text_tower_rules, vit_tower_rules
from vlzoo.convert.state_dict import read_state_dict
from vlzoo.presets.local import load_local_preset

_ALIASES = {"out_proj": "pred.out_proj"}  # some exports keep the head's output matrix at the top level


def from_llip_checkpoint(path_or_state_dict, preset, *, dtype=None, progress=None, **config_overrides):
    """Builds the vlzoo Llip preset `preset` holding the weights of an authors' checkpoint.

    Args:
        path_or_state_dict: a `.pt` / `.pth` / `.bin` / `.safetensors` file,
            or its contents: a training checkpoint
            `{"epoch", "state_dict", "optimizer", ...}` or a bare state dict
            `{key: torch tensor or numpy array}`. `module.` and `_orig_mod.`
            key prefixes (DDP, `torch.compile`), a top-level `out_proj` (for
            `pred.out_proj`) and a `(W_v,)` `visual.class_embedding` (K = 1)
            are accepted.
        preset: the vlzoo preset of the checkpoint's architecture, a name or
            a directory: `"llip_vit_b16"` for the released ViT-B/16 (K = 32),
            `"llip_vit_g14"` for the released ViT-bigG/14 (K = 64). It gives
            what the weights do not show: head counts, tau, the activation,
            and the tokenizer and preprocessor attached to the result.
        dtype: dtype policy of the model (default: the preset's, float32).
        progress: optional `progress(done, total)` callback while assigning.
        **config_overrides: constructor arguments replacing the preset's, as
            in `vlzoo.from_preset` (e.g. `temperature=1.0`, `vision=dict(...)`).

    Returns:
        A `vlzoo.Llip` whose `similarity(images, texts)` gives the authors'
        `logit_scale.exp() * cos(z_ij, t_j) + logit_bias` for images
        `(B, H, W, 3)` (channels last; the authors' are `(B, 3, H, W)`).

    Raises:
        ValueError: the checkpoint's geometry (K, widths, layer counts,
            vocabulary, context length, D, `qkv_norm`) differs from the
            preset's (every mismatch named with its key, shape and the
            preset), or a tensor's shape differs from its vlzoo variable's.
        KeyError: a key is missing or has no vlzoo counterpart (named).
        Nothing is assigned unless every key and variable matched.

    Example:
    >>> model = vlzoo.convert.from_llip_checkpoint("llip_b16_k32.pt", "llip_vit_b16")  # doctest: +SKIP
    >>> import numpy as np
    >>> images = np.zeros((4, 224, 224, 3), "float32")  # preprocessed pixels
    >>> tuple(model.similarity(images, ["a dog", "two dogs"]).shape)  # doctest: +SKIP
    (4, 2)
    """
    state_dict = _canonical(read_state_dict(path_or_state_dict))
    with without_weights():
        model = load_local_preset(preset, load_weights=False, dtype=dtype, **config_overrides)
    if getattr(model, "family", None) != "llip":
        raise ValueError(f"`preset` {preset!r} is a {type(model).__name__} preset; expected a Llip preset.")
    _check_geometry(state_dict, model, preset)
    C.load_rules(_rules(model), state_dict, model, progress=progress)
    C.warn_logit_scale(C.to_numpy(model.logit_scale), "Llip checkpoint")
    return model


# =============================================================================== keys


def _canonical(state_dict):
    """Renames the aliases (a top-level `out_proj` for `pred.out_proj`)."""
    for alias, key in _ALIASES.items():
        if alias in state_dict:
            if key in state_dict:
                raise KeyError(f"The checkpoint holds both {alias!r} and {key!r}, two names of the same matrix.")
            state_dict[key] = state_dict.pop(alias)
    return state_dict


def _rules(model):
    """The authors' keys -> the `vlzoo_variables` names of the vlzoo Llip `model`."""
    rules = vit_tower_rules(model.vision.get_config()) + text_tower_rules(model.text.get_config())
    rules += [
        C.copy("text_projection", "text_projection/kernel"),
        C.copy("q_proj", "cross_attention/q_proj"),
        C.copy("k_proj", "cross_attention/k_proj"),
        C.copy("v_proj", "cross_attention/v_proj"),
        C.copy("pred.out_proj", "cross_attention/out_proj"),
    ]
    if model.cross_attention.use_qkv_norm:
        for name in ("Q", "K", "V"):
            rules += C.torch_layer_norm(f"{name}_norm", f"cross_attention/{name.lower()}_norm")
    return rules + [C.scalar("logit_scale", "logit_scale"), C.scalar("logit_bias", "logit_bias")]


# =============================================================================== geometry


def _check_geometry(state_dict, model, preset):
    """Raises ValueError naming every architecture number where the checkpoint and the preset differ."""
    tokens = C.key_shape(state_dict, "visual.class_embedding")
    checks = [
        ("mixture tokens K", "visual.class_embedding",
         None if tokens is None else (1 if len(tokens) == 1 else tokens[0]), model.vision.num_prefix_tokens),
        *C.tower_geometry_checks(state_dict, model),
        ("embed dim D", "text_projection", C.key_dim(state_dict, "text_projection", -1), model.embed_dim),
        ("qkv_norm", "Q_norm.weight", "Q_norm.weight" in state_dict, model.cross_attention.use_qkv_norm),
    ]
    C.check_geometry(checks, state_dict, preset)


register_converter("llip", from_llip_checkpoint)
