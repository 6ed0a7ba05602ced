"""open_clip's timm image towers, read for `vlzoo.convert.open_clip`: timm `VisionTransformer` trunks (SigLIP's)
and the rotary `Eva` trunks of Perception Encoder (PE-Core), from the module or from a state dict and the
tower's timm name. Each returns the vlzoo `VisionTransformer` arguments and where the projection sits, or
raises `NotImplementedError` naming what vlzoo cannot express."""

import re

import numpy as np

from vlzoo.convert import _common as C

# Geometry that a timm SigLIP tower's state dict does not show: (num_heads, activation).
_TIMM_SIGLIP = {
    "vit_base": (12, "gelu"),
    "vit_large": (16, "gelu"),
    "vit_so400m": (16, "gelu"),
    "vit_giantopt": (16, "gelu_tanh"),
}

# timm's Perception Encoder towers (`vit_pe_core_<size>_patch<p>_<px>`): their head counts. Each has exact GELU,
# LayerNorm epsilon 1e-5, a 2D RoPE of base 10000 and an 8-head MAP head (timm/models/eva.py).
_TIMM_PE_CORE = {"tiny": 3, "small": 6, "base": 12, "large": 16, "gigantic": 16}


def is_identity(module):
    """Whether a torch submodule is absent or `nn.Identity` (read by class name: torch is not imported)."""
    return module is None or type(module).__name__ == "Identity"


def square(value, what, where):
    """`value` (an int or a pair) as one int; NotImplementedError naming `what` and `where` if not square."""
    value = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
    if value[0] != value[1]:
        raise NotImplementedError(f"{where}: non-square {what} {value} is not supported by vlzoo.")
    return int(value[0])


def _timm_activation(block, where):
    return C.torch_activation_name(block.mlp.act, where)


def _check_timm_block(block, where):
    """A timm ViT `Block`: no LayerScale, no qk_norm or inner norm, a biased fused qkv, a plain MLP."""
    if type(block).__name__ != "Block":
        raise NotImplementedError(f"{where}: block type {type(block).__name__} is not supported by vlzoo.")
    if not (is_identity(block.ls1) and is_identity(block.ls2)):
        raise NotImplementedError(f"{where}: LayerScale (`init_values`) is not supported by vlzoo.")
    _check_timm_attention(block.attn, where)
    _check_timm_mlp(block.mlp, where)


def _check_eva_block(block, prefix, where):
    """A timm `EvaBlock` with rotary attention (Perception Encoder): the same checks as `Block`'s, and its
    attention rotates every token after the `prefix` ones, by pairs of adjacent channels, one key per query head."""
    if type(block).__name__ != "EvaBlock" or type(block.attn).__name__ != "AttentionRope":
        raise NotImplementedError(f"{where}: block type {type(block).__name__} with attention "
                                  f"{type(block.attn).__name__} is not supported by vlzoo.")
    if block.gamma_1 is not None or block.gamma_2 is not None:
        raise NotImplementedError(f"{where}: LayerScale (`init_values`) is not supported by vlzoo.")
    attn = block.attn
    if attn.gate is not None or attn.rotate_half or attn.num_kv_heads != attn.num_heads:
        raise NotImplementedError(f"{where}: gated, half-rotated or grouped-query rotary attention is not supported.")
    if attn.num_prefix_tokens != prefix:
        raise NotImplementedError(f"{where}: rotary attention that skips {attn.num_prefix_tokens} tokens with "
                                  f"{prefix} prefix tokens is not supported.")
    _check_timm_attention(attn, where)
    _check_timm_mlp(block.mlp, where)


def _check_timm_attention(attn, where):
    if not (is_identity(getattr(attn, "q_norm", None)) and is_identity(getattr(attn, "k_norm", None))):
        raise NotImplementedError(f"{where}: qk_norm is not supported by vlzoo.")
    if not is_identity(getattr(attn, "norm", None)):
        raise NotImplementedError(f"{where}: an inner attention LayerNorm is not supported by vlzoo.")
    if getattr(attn, "qkv", None) is None or attn.qkv.bias is None:
        raise NotImplementedError(f"{where}: attention without a biased fused qkv is not supported by vlzoo.")


def _check_timm_mlp(mlp, where):
    if type(mlp).__name__ != "Mlp" or not is_identity(getattr(mlp, "norm", None)):
        raise NotImplementedError(f"{where}: MLP type {type(mlp).__name__} is not supported by vlzoo.")


def _eva_rotary_theta(trunk, prefix, grid, where):
    """The `rotary_theta` of an `Eva` trunk's RoPE, after checking it is the Perception Encoder's kind that
    `vlzoo.layers.rotary` computes: integer positions from 1 after a class token (else 0), x then y."""
    rope = getattr(trunk, "rope", None)
    if rope is None or type(rope).__name__ != "RotaryEmbeddingCat" or getattr(trunk, "rope_mixed", False):
        raise NotImplementedError(f"{where}: only Eva trunks with a 2D rotary embedding (Perception Encoder's "
                                  "`RotaryEmbeddingCat`) are supported by vlzoo.")
    reference = tuple(rope.ref_feat_shape) if rope.ref_feat_shape is not None else (grid, grid)
    if (rope.in_pixels or rope.grid_type != "index" or rope.grid_indexing != "xy" or rope.rotate_half
            or float(rope.grid_offset) != (1.0 if prefix else 0.0) or reference != (grid, grid)):
        raise NotImplementedError(f"{where}: a rotary embedding other than Perception Encoder's (integer (x, y) "
                                  "positions of the native grid, from 1 after a class token) is not supported.")
    return float(rope.temperature)


def timm_spec_from_module(visual):
    """`(vlzoo vision arguments, projection kind)` of open_clip's `TimmModel` `visual`; the kind is `"trunk_head"`
    (the trunk's classifier is the projection, PE-Core), `"head_proj"` (open_clip's `head.proj`, SigLIP) or None."""
    trunk = visual.trunk
    kind = type(trunk).__name__
    where = f"timm tower {kind}"
    if kind not in ("VisionTransformer", "Eva"):
        raise NotImplementedError(f"{where}: only timm VisionTransformer and (rotary) Eva trunks are supported by "
                                  "vlzoo.")
    pe = trunk.patch_embed
    if not is_identity(getattr(pe, "norm", None)):
        raise NotImplementedError(f"{where}: a normalised patch embedding is not supported by vlzoo.")
    conv = pe.proj
    patch = square(conv.kernel_size, "patch", where)
    if square(conv.stride, "stride", where) != patch:
        raise NotImplementedError(f"{where}: overlapping patches are not supported by vlzoo.")
    grid = square(pe.grid_size, "patch grid", where)
    if getattr(trunk, "reg_token", None) is not None:
        raise NotImplementedError(f"{where}: register tokens are not supported by vlzoo.")
    prefix = 0 if getattr(trunk, "cls_token", None) is None else 1
    if prefix and getattr(trunk, "no_embed_class", False):
        raise NotImplementedError(f"{where}: `no_embed_class=True` (class token without position) is not supported.")
    if getattr(trunk, "pos_embed", None) is None:
        raise NotImplementedError(f"{where}: towers without learned position embeddings are not supported.")
    blocks = list(trunk.blocks)
    for i, block in enumerate(blocks):
        if kind == "Eva":
            _check_eva_block(block, prefix, f"{where} block {i}")
        else:
            _check_timm_block(block, f"{where} block {i}")
    eps = float(trunk.norm.eps) if not is_identity(trunk.norm) else None
    if eps is None:
        raise NotImplementedError(f"{where}: `fc_norm` (LayerNorm after pooling) is not supported by vlzoo.")
    first = blocks[0]
    vision = dict(
        image_size=grid * patch, patch_size=patch, hidden_dim=int(conv.out_channels),
        num_layers=len(blocks), num_heads=int(first.attn.num_heads),
        intermediate_dim=int(first.mlp.fc1.out_features), activation=_timm_activation(first, where),
        layer_norm_epsilon=eps, num_prefix_tokens=prefix,
        use_pre_norm=not is_identity(getattr(trunk, "norm_pre", None)),
        patch_bias=conv.bias is not None,
    )
    if kind == "Eva":
        vision["rotary_theta"] = _eva_rotary_theta(trunk, prefix, grid, where)
    attn_pool = getattr(trunk, "attn_pool", None)
    if attn_pool is not None:
        if type(attn_pool).__name__ != "AttentionPoolLatent":
            raise NotImplementedError(f"{where}: pooling {type(attn_pool).__name__} is not supported by vlzoo.")
        problems = []
        if attn_pool.latent.shape[1] != 1:
            problems.append("several latent queries")
        if getattr(attn_pool, "pos_embed", None) is not None:
            problems.append("a pooling position embedding")
        if not is_identity(getattr(attn_pool, "q_norm", None)):
            problems.append("qk_norm")
        if getattr(attn_pool, "mlp", None) is None:
            problems.append("no MLP")
        if problems:
            raise NotImplementedError(f"{where}: MAP head with {', '.join(problems)} is not supported by vlzoo.")
        vision["pooling"] = "map"
        if int(attn_pool.num_heads) != vision["num_heads"]:
            vision["map_num_heads"] = int(attn_pool.num_heads)
        if int(attn_pool.mlp.fc1.out_features) != vision["intermediate_dim"]:
            vision["map_intermediate_dim"] = int(attn_pool.mlp.fc1.out_features)
    else:
        global_pool = getattr(trunk, "global_pool", "")
        if global_pool == "token" and prefix:
            vision["pooling"] = "cls"
        elif global_pool == "avg" and not getattr(trunk, "pool_include_prefix", False):
            vision["pooling"] = "mean"
        else:
            raise NotImplementedError(f"{where}: `global_pool={global_pool!r}` is not supported by vlzoo.")
    if not is_identity(getattr(trunk, "fc_norm", None)):
        raise NotImplementedError(f"{where}: `fc_norm` (LayerNorm after pooling) is not supported by vlzoo.")

    head = getattr(visual, "head", None)
    head_layers = dict(head.named_children()) if head is not None else {}
    unsupported = set(head_layers) - {"drop", "proj"}
    if unsupported:
        raise NotImplementedError(f"{where}: open_clip timm head {sorted(unsupported)} is not supported by vlzoo.")
    trunk_head = getattr(trunk, "head", None)
    if "proj" in head_layers:
        if not is_identity(trunk_head):
            raise NotImplementedError(f"{where}: two output projections are not supported.")
        proj, kind = head_layers["proj"], "head_proj"
    elif not is_identity(trunk_head):
        proj, kind = trunk_head, "trunk_head"
    else:
        proj, kind = None, None
    vision["output_dim"] = int(proj.out_features) if proj is not None else None
    vision["projection_bias"] = proj is not None and proj.bias is not None
    return vision, kind


def count_indices(state_dict, pattern):
    """How many distinct first groups of `pattern` (a regex, e.g. `blocks\\.(\\d+)\\.`) the keys match."""
    regex = re.compile(pattern)
    return len({m.group(1) for k in state_dict for m in [regex.match(k)] if m})


def state_shape(state_dict, key):
    """The shape of `state_dict[key]`; KeyError naming the key when it is missing."""
    if key not in state_dict:
        raise KeyError(f"Checkpoint key {key!r} is missing (needed to read the tower's geometry).")
    return tuple(np.shape(C.to_numpy(state_dict[key])))


def timm_spec_from_config(cfg, state_dict, overrides):
    """`timm_spec_from_module`'s result from open_clip's `vision_cfg` with a `timm_model_name` and the state dict:
    widths, depth and prefix tokens are read from the weights; head counts and activation from the known timm
    names (SigLIP's, PE-Core's) or from `overrides`."""
    name = cfg["timm_model_name"]
    where = f"timm tower {name!r}"
    p = "visual.trunk."
    pool = cfg.get("timm_pool", "avg")
    if pool in ("abs_attn", "rot_attn"):
        raise NotImplementedError(f"{where}: `timm_pool={pool!r}` is not supported by vlzoo.")
    if f"{p}reg_token" in state_dict:
        raise NotImplementedError(f"{where}: register tokens are not supported by vlzoo.")
    if f"{p}fc_norm.weight" in state_dict:
        raise NotImplementedError(f"{where}: `fc_norm` (LayerNorm after pooling) is not supported by vlzoo.")
    if "visual.head.mlp.fc1.weight" in state_dict:
        raise NotImplementedError(f"{where}: `timm_proj='mlp'` is not supported by vlzoo.")
    conv = state_shape(state_dict, f"{p}patch_embed.proj.weight")
    width, patch = conv[0], conv[2]
    prefix = 1 if f"{p}cls_token" in state_dict else 0
    positions = state_shape(state_dict, f"{p}pos_embed")[1]
    grid = int(round((positions - prefix) ** 0.5))
    if grid * grid + prefix != positions:
        raise NotImplementedError(f"{where}: a non-square patch grid ({positions} positions) is not supported.")
    depth = count_indices(state_dict, re.escape(p) + r"blocks\.(\d+)\.")
    if f"{p}attn_pool.latent" in state_dict:
        pooling = "map"
    elif pool == "token" and prefix:
        pooling = "cls"
    elif pool == "avg":
        pooling = "mean"
    else:
        raise NotImplementedError(f"{where}: `timm_pool={pool!r}` is not supported by vlzoo.")
    match = re.match(r"(vit_(?:base|large|so400m|giantopt))_patch\d+_siglip", name)
    known = _TIMM_SIGLIP.get(match.group(1)) if match else None
    pe_core = re.match(r"vit_pe_core_(tiny|small|base|large|gigantic)_patch\d+_\d+$", name)
    if pe_core:
        known = (_TIMM_PE_CORE[pe_core.group(1)], "gelu")
    overrides = dict(overrides or {})
    if known is None and not {"num_heads", "activation"} <= set(overrides):
        raise NotImplementedError(
            f"{where}: its head count and activation cannot be read from a state dict; convert the open_clip "
            "model object with `from_open_clip(model)`, or pass "
            "`vision_overrides=dict(num_heads=..., activation=..., layer_norm_epsilon=...)`."
        )
    heads, activation = known or (None, None)
    if "visual.head.proj.weight" in state_dict:
        kind, bias = "head_proj", "visual.head.proj.bias" in state_dict
        output_dim = state_shape(state_dict, "visual.head.proj.weight")[0]
    elif f"{p}head.weight" in state_dict:
        kind, bias, output_dim = "trunk_head", f"{p}head.bias" in state_dict, state_shape(state_dict, f"{p}head.weight")[0]
    else:
        kind, bias, output_dim = None, False, None
    vision = dict(
        image_size=grid * patch, patch_size=patch, hidden_dim=width, num_layers=depth, num_heads=heads,
        intermediate_dim=state_shape(state_dict, f"{p}blocks.0.mlp.fc1.weight")[0], activation=activation,
        layer_norm_epsilon=1e-6, output_dim=output_dim, num_prefix_tokens=prefix, pooling=pooling,
        use_pre_norm=f"{p}norm_pre.weight" in state_dict, patch_bias=f"{p}patch_embed.proj.bias" in state_dict,
        projection_bias=bias,
    )
    if pe_core:
        vision.update(layer_norm_epsilon=1e-5, rotary_theta=10000.0, map_num_heads=8)
    if pooling == "map" and state_shape(state_dict, f"{p}attn_pool.mlp.fc1.weight")[0] != vision["intermediate_dim"]:
        vision["map_intermediate_dim"] = state_shape(state_dict, f"{p}attn_pool.mlp.fc1.weight")[0]
    vision.update(overrides)
    return vision, kind
