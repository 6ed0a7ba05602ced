"""open_clip <-> vlzoo.

Supports open_clip's `CLIP` and `CustomTextCLIP` with

- image towers: open_clip's own `VisionTransformer` (OpenAI / LAION CLIP ViTs,
  QuickGELU or GELU, class-token or average pooling, with or without `ln_pre`)
  and timm `VisionTransformer` trunks (SigLIP's MAP head, class-token or
  average pooling without `fc_norm`, with an optional linear projection), and
  timm's rotary `Eva` trunks of Perception Encoder (PE-Core: 2D RoPE, MAP head);
- text towers: open_clip's `TextTransformer` (causal or bidirectional,
  `argmax` / `last` / `first` pooling, projection as a matrix, a biased
  `Linear` or none).

Anything else (ResNet or ConvNeXt towers, Hugging Face text towers, CoCa's
attentional pooler, LayerScale, custom attention blocks, ...) is refused with
`NotImplementedError` naming the feature. Nothing here imports open_clip or
timm: `from_open_clip` reads the module you pass (duck-typed), and
`from_open_clip_state_dict` a bare state dict plus open_clip's model config
dict (the JSON of `open_clip/model_configs/<name>.json`).
"""

import numpy as np

from vlzoo.convert import _common as C
from vlzoo.convert.open_clip_timm import is_identity, square, state_shape
from vlzoo.convert.open_clip_timm import timm_spec_from_config, timm_spec_from_module
from vlzoo.convert.state_dict import numpy_state_dict
from vlzoo.convert.state_dict import strip_prefix

# Keys that OpenAI's original checkpoints carry besides the weights.
_METADATA_KEYS = ("input_resolution", "context_length", "vocab_size")

# The families whose open_clip models are `CustomTextCLIP` (text tower under `text.`).
_CUSTOM_TEXT_FAMILIES = ("siglip", "pe_core")

_CUSTOM_BLOCK_FLAGS = ("qk_norm", "scaled_cosine_attn", "scale_heads", "scale_attn_inner", "scale_attn", "scale_fc")


# =============================================================================== public API


def from_open_clip(model, *, dtype=None, tokenizer=None, preprocessor=None, progress=None):
    """Converts an open_clip `CLIP` / `CustomTextCLIP` module to the matching vlzoo model.

    Args:
        model: the open_clip model (e.g. from `open_clip.create_model(...)`).
        dtype: dtype policy of the vlzoo model (default float32).
        tokenizer: tokenizer to attach (default: vlzoo's CLIP BPE for CLIP
            models with CLIP's vocabulary, otherwise none).
        preprocessor: image preprocessor to attach (default: from the model's
            `visual.preprocess_cfg`, else the family's standard one).
        progress: optional `progress(done, total)` callback while assigning.

    Returns:
        A `vlzoo.CLIP` (no `logit_bias`) or `vlzoo.SigLIP` (with `logit_bias`)
        giving the same embeddings and logits as `model`.

    Raises:
        NotImplementedError: the model uses a feature vlzoo cannot express
            (named in the message).

    Example: `vlzoo.convert`'s.
    """
    spec = _spec_from_module(model)
    state_dict = dict(model.state_dict())
    return _build_and_load(spec, state_dict, dtype, tokenizer, preprocessor, progress)


def from_open_clip_state_dict(
    state_dict, config, *, dtype=None, tokenizer=None, preprocessor=None, progress=None, vision_overrides=None,
):
    """Converts an open_clip state dict plus its model config dict to a vlzoo model.

    Args:
        state_dict: `{key: tensor or array}` as saved by open_clip (a
            training checkpoint's `"state_dict"` entry is accepted too; DDP's
            `module.` prefixes are dropped).
        config: open_clip's model config dict (`embed_dim`, `vision_cfg`,
            `text_cfg`, optional `quick_gelu`, `init_logit_bias`, ...), i.e.
            the JSON of `open_clip/model_configs/<name>.json`.
        vision_overrides: vlzoo `VisionTransformer` arguments that replace the
            derived ones; needed only for timm towers whose head count and
            activation cannot be read from weights (`num_heads`,
            `activation`, `layer_norm_epsilon`).
        dtype, tokenizer, preprocessor, progress: as in `from_open_clip`.

    Raises:
        KeyError: a key is missing or unexpected (named).
        ValueError: a tensor's shape does not match the config (key and
            shapes named).
        NotImplementedError: the config uses a feature vlzoo cannot express.

    Example:
    >>> config = open_clip_model_config("ViT-B-32")  # doctest: +SKIP
    >>> model = from_open_clip_state_dict(load_state_dict("weights.pt"), config)  # doctest: +SKIP
    """
    state_dict = _unwrap(state_dict)
    spec = _spec_from_config(config, state_dict, vision_overrides)
    return _build_and_load(spec, state_dict, dtype, tokenizer, preprocessor, progress, ignore=_METADATA_KEYS)


def to_open_clip_state_dict(model, custom_text=None):
    """Exports a vlzoo model's weights with open_clip's key names and layouts.

    CLIP-style image towers (class token, `ln_pre`, no patch bias) export as
    open_clip's `VisionTransformer` (`visual.conv1.weight`, ...); towers with
    a MAP head export as open_clip's timm trunk (`visual.trunk.*`).

    Args:
        model: a vlzoo `CLIP`, `SigLIP` or `PECore` model.
        custom_text: key layout of the text tower: `False` for open_clip's
            `CLIP` (`transformer.*`, `token_embedding.weight`, ...), `True`
            for `CustomTextCLIP` (`text.*`). Default: `True` for SigLIP and
            PE-Core.

    Returns:
        `{key: numpy array}`, loadable with `load_state_dict(..., strict=True)`
        into the matching open_clip model (wrap values with
        `torch.from_numpy`).

    Example:
    >>> peer = open_clip.CLIP(**open_clip_config(model))  # doctest: +SKIP
    >>> peer.load_state_dict({k: torch.from_numpy(v)
    ...                       for k, v in to_open_clip_state_dict(model).items()})  # doctest: +SKIP
    """
    if custom_text is None:
        custom_text = getattr(model, "family", None) in _CUSTOM_TEXT_FAMILIES
    spec = _spec_from_vlzoo(model, custom_text)
    return C.export_rules(_rules(spec), model)


def open_clip_config(model, custom_text=None):
    """open_clip's model config dict describing a vlzoo model (for `open_clip.CLIP(**config)`).

    Only models that `to_open_clip_state_dict` exports with open_clip's own
    towers (not timm trunks) are described: `open_clip.CLIP` keyword arguments (`embed_dim`,
    `vision_cfg`, `text_cfg`, ...); NotImplementedError for a tower with a MAP head (a timm trunk in
    open_clip) or QuickGELU on one tower only. Example: `to_open_clip_state_dict`'s.
    """
    if custom_text is None:
        custom_text = getattr(model, "family", None) in _CUSTOM_TEXT_FAMILIES
    spec = _spec_from_vlzoo(model, custom_text)
    if spec["vision_layout"] != "vit":
        raise NotImplementedError(
            "open_clip_config: towers with a MAP head are timm trunks in open_clip; build the open_clip "
            "model from its own config (e.g. 'ViT-B-16-SigLIP') and load `to_open_clip_state_dict(model)`."
        )
    v, t = spec["vision"], spec["text"]
    act = {"quick_gelu": None, "gelu": None, "gelu_tanh": {"approximate": "tanh"}}
    if v["activation"] != t["activation"] and "quick_gelu" in (v["activation"], t["activation"]):
        raise NotImplementedError("open_clip sets QuickGELU for both towers at once (`quick_gelu`).")
    config = dict(
        embed_dim=int(t["output_dim"] or t["hidden_dim"]),
        quick_gelu=v["activation"] == "quick_gelu",
        vision_cfg=dict(
            image_size=v["image_size"], patch_size=v["patch_size"], width=v["hidden_dim"],
            layers=v["num_layers"], head_width=v["hidden_dim"] // v["num_heads"],
            mlp_ratio=v["intermediate_dim"] / v["hidden_dim"], no_ln_pre=not v["use_pre_norm"],
            pool_type={"cls": "tok", "mean": "avg"}[v["pooling"]],
            norm_kwargs={"eps": v["layer_norm_epsilon"]}, act_kwargs=act[v["activation"]],
        ),
        text_cfg=dict(
            context_length=t["sequence_length"], vocab_size=t["vocabulary_size"], width=t["hidden_dim"],
            heads=t["num_heads"], layers=t["num_layers"], mlp_ratio=t["intermediate_dim"] / t["hidden_dim"],
            no_causal_mask=not t["causal"], pool_type={"eot": "argmax"}.get(t["pooling"], t["pooling"]),
            proj_bias=bool(t["projection_bias"]), proj_type="none" if t["output_dim"] is None else "linear",
            norm_kwargs={"eps": t["layer_norm_epsilon"]}, act_kwargs=act[t["activation"]],
        ),
    )
    if spec["logit_bias"] is not None:
        config["init_logit_bias"] = float(spec["logit_bias"])
    if custom_text:
        config["custom_text"] = True
    return config


# =============================================================================== shared


def _unwrap(state_dict):
    if hasattr(state_dict, "keys") and "state_dict" in state_dict and hasattr(state_dict["state_dict"], "keys"):
        state_dict = state_dict["state_dict"]
    return strip_prefix(numpy_state_dict(state_dict))


def _build_and_load(spec, state_dict, dtype, tokenizer, preprocessor, progress, ignore=()):
    if spec["logit_scale"] is not None:
        C.warn_logit_scale(spec["logit_scale"], "open_clip checkpoint")
    model = C.build_model(
        spec["family"], spec["vision"], spec["text"],
        logit_scale=spec["logit_scale"] if spec["logit_scale"] is not None else 0.0,
        logit_bias=spec["logit_bias"], dtype=dtype,
    )
    C.load_rules(_rules(spec), state_dict, model, ignore=ignore, progress=progress)
    return C.attach_processing(
        model, spec["family"], spec["vision"]["image_size"], spec.get("preprocess"),
        tokenizer=tokenizer, preprocessor=preprocessor,
    )


def _scalar_value(state_dict, key):
    if key not in state_dict:
        return None
    value = C.to_numpy(state_dict[key])
    return float(np.reshape(value, -1)[0]) if value.size == 1 else None


# =============================================================================== rules


def _block_rules(src, dst, timm):
    if timm:
        return [
            *C.torch_layer_norm(f"{src}.norm1", f"{dst}/ln_1"),
            *C.fused_qkv(f"{src}.attn.qkv.weight", f"{src}.attn.qkv.bias", f"{dst}/attention"),
            *C.torch_linear(f"{src}.attn.proj", f"{dst}/attention/output"),
            *C.torch_layer_norm(f"{src}.norm2", f"{dst}/ln_2"),
            *C.torch_linear(f"{src}.mlp.fc1", f"{dst}/mlp/fc1"),
            *C.torch_linear(f"{src}.mlp.fc2", f"{dst}/mlp/fc2"),
        ]
    return [
        *C.torch_layer_norm(f"{src}.ln_1", f"{dst}/ln_1"),
        *C.fused_qkv(f"{src}.attn.in_proj_weight", f"{src}.attn.in_proj_bias", f"{dst}/attention"),
        *C.torch_linear(f"{src}.attn.out_proj", f"{dst}/attention/output"),
        *C.torch_layer_norm(f"{src}.ln_2", f"{dst}/ln_2"),
        *C.torch_linear(f"{src}.mlp.c_fc", f"{dst}/mlp/fc1"),
        *C.torch_linear(f"{src}.mlp.c_proj", f"{dst}/mlp/fc2"),
    ]


def vit_tower_rules(v, p="visual."):
    """Rules for an open_clip `VisionTransformer` under key prefix `p` -> vlzoo's `vision/*` (no projection).

    The class embedding may hold several prefix tokens (`(K, width)`; `(width,)` when K = 1), as in
    the Llip fork.
    """
    width, prefix = v["hidden_dim"], v["num_prefix_tokens"]
    source_shape = (width,) if prefix == 1 else (prefix, width)
    rules = [
        C.transpose(f"{p}conv1.weight", "vision/patch_embedding/conv/kernel", (2, 3, 1, 0)),
        C.reshape(f"{p}class_embedding", "vision/prefix_tokens", (prefix, width), source_shape),
        C.copy(f"{p}positional_embedding", "vision/position_embedding/embeddings"),
    ]
    if v["use_pre_norm"]:
        rules += C.torch_layer_norm(f"{p}ln_pre", "vision/pre_norm")
    for i in range(v["num_layers"]):
        rules += _block_rules(f"{p}transformer.resblocks.{i}", f"vision/block_{i}", timm=False)
    rules += C.torch_layer_norm(f"{p}ln_post", "vision/post_norm")
    return rules


def text_tower_rules(t, q=""):
    """Rules for open_clip's causal text tower under key prefix `q` -> vlzoo's `text/*` (no projection)."""
    rules = [
        C.copy(f"{q}token_embedding.weight", "text/token_embedding/embeddings"),
        C.copy(f"{q}positional_embedding", "text/position_embedding/embeddings"),
    ]
    for i in range(t["num_layers"]):
        rules += _block_rules(f"{q}transformer.resblocks.{i}", f"text/block_{i}", timm=False)
    rules += C.torch_layer_norm(f"{q}ln_final", "text/post_norm")
    return rules


def _rules(spec):
    v, t = spec["vision"], spec["text"]
    width, prefix = v["hidden_dim"], v["num_prefix_tokens"]
    grid = (v["image_size"] // v["patch_size"]) ** 2
    if spec["vision_layout"] == "vit":
        rules = vit_tower_rules(v)
        if spec["vision_proj"] == "param":
            rules.append(C.copy("visual.proj", "vision/projection/kernel"))
    else:
        rules = []
        p = "visual.trunk."
        rules.append(C.transpose(f"{p}patch_embed.proj.weight", "vision/patch_embedding/conv/kernel", (2, 3, 1, 0)))
        if v["patch_bias"]:
            rules.append(C.copy(f"{p}patch_embed.proj.bias", "vision/patch_embedding/conv/bias"))
        if prefix:
            rules.append(C.reshape(f"{p}cls_token", "vision/prefix_tokens", (1, width), (1, 1, width)))
        rules.append(
            C.reshape(f"{p}pos_embed", "vision/position_embedding/embeddings", (prefix + grid, width), (1, prefix + grid, width))
        )
        if v["use_pre_norm"]:
            rules += C.torch_layer_norm(f"{p}norm_pre", "vision/pre_norm")
        for i in range(v["num_layers"]):
            rules += _block_rules(f"{p}blocks.{i}", f"vision/block_{i}", timm=True)
        rules += C.torch_layer_norm(f"{p}norm", "vision/post_norm")
        if v["pooling"] == "map":
            a, d = f"{p}attn_pool", "vision/map_head"
            rules.append(C.copy(f"{a}.latent", f"{d}/latent"))
            rules += C.torch_linear(f"{a}.q", f"{d}/attention/query")
            rules += C.fused_qkv(f"{a}.kv.weight", f"{a}.kv.bias", f"{d}/attention", num_parts=2)
            rules += C.torch_linear(f"{a}.proj", f"{d}/attention/output")
            rules += C.torch_layer_norm(f"{a}.norm", f"{d}/norm")
            rules += C.torch_linear(f"{a}.mlp.fc1", f"{d}/mlp/fc1")
            rules += C.torch_linear(f"{a}.mlp.fc2", f"{d}/mlp/fc2")
        if spec["vision_proj"] == "trunk_head":
            rules += C.torch_linear(f"{p}head", "vision/projection", bias=v["projection_bias"])
        elif spec["vision_proj"] == "head_proj":
            rules += C.torch_linear("visual.head.proj", "vision/projection", bias=v["projection_bias"])

    q = spec["text_prefix"]
    rules += text_tower_rules(t, q)
    if spec["text_proj"] == "param":
        rules.append(C.copy(f"{q}text_projection", "text/projection/kernel"))
    elif spec["text_proj"] == "linear":
        rules += C.torch_linear(f"{q}text_projection", "text/projection", bias=t["projection_bias"])
    rules.append(C.scalar("logit_scale", "logit_scale", spec.get("logit_shape", ())))
    if spec["family"] == "siglip":
        rules.append(C.scalar("logit_bias", "logit_bias", spec.get("logit_shape", ())))
    return rules


# =============================================================================== spec from a module


def _check_block(block, where):
    name = type(block).__name__
    if name != "ResidualAttentionBlock":
        raise NotImplementedError(
            f"{where}: block type {name} (open_clip's `block_type='custom'`: qk_norm, scaled cosine attention, "
            "head scaling, inner LayerNorms) is not supported by vlzoo."
        )
    for attr in ("ls_1", "ls_2"):
        if not is_identity(getattr(block, attr, None)):
            raise NotImplementedError(f"{where}: LayerScale (`ls_init_value`) is not supported by vlzoo.")
    if hasattr(block, "ln_1_kv"):
        raise NotImplementedError(f"{where}: cross-attention blocks are not supported by vlzoo.")
    attn = block.attn
    if getattr(attn, "in_proj_bias", None) is None or getattr(attn.out_proj, "bias", None) is None:
        raise NotImplementedError(f"{where}: attention without biases is not supported by vlzoo.")
    if getattr(attn, "in_proj_weight", None) is None:
        raise NotImplementedError(f"{where}: attention with separate k/v dimensions is not supported by vlzoo.")


def _transformer_geometry(resblocks, where):
    if len(resblocks) == 0:
        raise NotImplementedError(f"{where}: a transformer without blocks is not supported.")
    for i, block in enumerate(resblocks):
        _check_block(block, f"{where} block {i}")
    first = resblocks[0]
    return dict(
        num_layers=len(resblocks),
        num_heads=int(first.attn.num_heads),
        intermediate_dim=int(first.mlp.c_fc.out_features),
        activation=C.torch_activation_name(first.mlp.gelu, where),
        layer_norm_epsilon=float(first.ln_1.eps),
    )


def _vit_from_module(visual):
    where = "open_clip VisionTransformer"
    if getattr(visual, "attn_pool", None) is not None:
        raise NotImplementedError(f"{where}: `attentional_pool` (CoCa's attentional pooler) is not supported by vlzoo.")
    pool_type = getattr(visual, "pool_type", "tok")
    pooling = {"tok": "cls", "avg": "mean"}.get(pool_type)
    if pooling is None:
        raise NotImplementedError(f"{where}: `pool_type={pool_type!r}` is not supported by vlzoo.")
    if getattr(visual, "final_ln_after_pool", False) and pooling == "mean":
        raise NotImplementedError(
            f"{where}: `final_ln_after_pool=True` with `pool_type='avg'` (LayerNorm after averaging) is not supported "
            "by vlzoo."
        )
    conv = visual.conv1
    if conv.bias is not None:
        raise NotImplementedError(f"{where}: a patch embedding with bias is not an open_clip layout.")
    patch = square(conv.kernel_size, "patch", where)
    if square(conv.stride, "stride", where) != patch:
        raise NotImplementedError(f"{where}: overlapping patches (stride != patch size) are not supported by vlzoo.")
    grid = square(visual.grid_size, "patch grid", where)
    width = int(conv.out_channels)
    blocks = _transformer_geometry(visual.transformer.resblocks, where)
    eps = float(visual.ln_post.eps)
    if abs(eps - blocks["layer_norm_epsilon"]) > 0:
        raise NotImplementedError(f"{where}: LayerNorms with different epsilons are not supported by vlzoo.")
    proj = getattr(visual, "proj", None)
    vision = dict(
        image_size=grid * patch, patch_size=patch, hidden_dim=width, **blocks,
        output_dim=int(proj.shape[1]) if proj is not None else None, num_prefix_tokens=1, pooling=pooling,
        use_pre_norm=not is_identity(visual.ln_pre), patch_bias=False, projection_bias=False,
    )
    return vision, "param" if proj is not None else None


def _text_from_module(model):
    """(vlzoo text args, key prefix, projection kind) of `model`'s text tower."""
    if hasattr(model, "text"):
        tower, prefix = model.text, "text."
        where = f"open_clip text tower {type(tower).__name__}"
        if type(tower).__name__ != "TextTransformer":
            raise NotImplementedError(f"{where}: only open_clip's TextTransformer is supported by vlzoo.")
        if getattr(tower, "cls_emb", None) is not None:
            raise NotImplementedError(f"{where}: `embed_cls` (CoCa's text class token) is not supported by vlzoo.")
        pool_type, use_pad_mask = tower.pool_type, bool(getattr(tower, "use_pad_mask", False))
        attn_mask, pad_id = tower.attn_mask, getattr(tower, "pad_id", 0)
    else:
        tower, prefix, where = model, "", "open_clip CLIP text tower"
        pool_type, use_pad_mask = getattr(model, "text_pool_type", "argmax"), False
        attn_mask, pad_id = getattr(model, "attn_mask", None), 0
    pooling = {"argmax": "eot", "last": "last", "first": "first"}.get(pool_type)
    if pooling is None:
        raise NotImplementedError(
            f"{where}: `pool_type={pool_type!r}` is not supported by vlzoo (supported: argmax, last, first)."
        )
    if use_pad_mask and pad_id != 0:
        raise NotImplementedError(f"{where}: a padding mask with `pad_id={pad_id}` is not supported by vlzoo.")
    blocks = _transformer_geometry(tower.transformer.resblocks, where)
    if abs(float(tower.ln_final.eps) - blocks["layer_norm_epsilon"]) > 0:
        raise NotImplementedError(f"{where}: LayerNorms with different epsilons are not supported by vlzoo.")
    proj = tower.text_projection
    if proj is None:
        kind, output_dim, bias = None, None, False
    elif hasattr(proj, "out_features"):
        kind, output_dim, bias = "linear", int(proj.out_features), proj.bias is not None
    else:
        kind, output_dim, bias = "param", int(proj.shape[1]), False
    text = dict(
        vocabulary_size=int(tower.token_embedding.num_embeddings),
        sequence_length=int(tower.positional_embedding.shape[0]),
        hidden_dim=int(tower.token_embedding.embedding_dim), **blocks, output_dim=output_dim,
        causal=attn_mask is not None, pooling=pooling, use_padding_mask=use_pad_mask, projection_bias=bias,
    )
    return text, prefix, kind


def _family(vision, has_logit_bias):
    """The vlzoo family of an open_clip model: SigLIP with a logit bias, PE-Core with a rotary tower, else CLIP."""
    if has_logit_bias:
        return "siglip"
    return "pe_core" if vision.get("rotary_theta") is not None else "clip"


def _spec_from_module(model):
    if not hasattr(model, "visual") or not hasattr(model, "logit_scale"):
        raise TypeError(
            f"from_open_clip expects an open_clip CLIP / CustomTextCLIP model; received {type(model).__name__}."
        )
    visual = model.visual
    if hasattr(visual, "trunk"):
        vision, vision_proj = timm_spec_from_module(visual)
        layout = "timm"
    elif hasattr(visual, "conv1") and hasattr(visual, "transformer"):
        vision, vision_proj = _vit_from_module(visual)
        layout = "vit"
    else:
        raise NotImplementedError(
            f"open_clip image tower {type(visual).__name__} (ResNet, ConvNeXt, ...) is not supported by vlzoo; "
            "only ViT towers are."
        )
    text, text_prefix, text_proj = _text_from_module(model)
    logit_bias = getattr(model, "logit_bias", None)
    logit_scale = C.to_numpy(model.logit_scale)
    return dict(
        family=_family(vision, logit_bias is not None),
        vision=vision, text=text, vision_layout=layout, vision_proj=vision_proj,
        text_prefix=text_prefix, text_proj=text_proj,
        logit_scale=float(np.reshape(logit_scale, -1)[0]),
        logit_bias=None if logit_bias is None else float(np.reshape(C.to_numpy(logit_bias), -1)[0]),
        logit_shape=tuple(logit_scale.shape),
        preprocess=C.open_clip_preprocess(getattr(visual, "preprocess_cfg", None)),
    )


# =============================================================================== spec from a config dict


def _refuse_custom(cfg, where):
    if cfg.get("ls_init_value") is not None:
        raise NotImplementedError(f"{where}: LayerScale (`ls_init_value`) is not supported by vlzoo.")
    if cfg.get("block_type") not in (None, "default"):
        raise NotImplementedError(f"{where}: `block_type={cfg['block_type']!r}` is not supported by vlzoo.")
    for flag in _CUSTOM_BLOCK_FLAGS:
        if cfg.get(flag):
            raise NotImplementedError(f"{where}: `{flag}` is not supported by vlzoo.")


def _config_activation(cfg, quick_gelu, where):
    if quick_gelu:
        return "quick_gelu"
    approximate = (cfg.get("act_kwargs") or {}).get("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise NotImplementedError(f"{where}: GELU `approximate={approximate!r}` is not supported by vlzoo.")
    return "gelu_tanh" if approximate == "tanh" else "gelu"


def _config_eps(cfg, default=1e-5):
    return float((cfg.get("norm_kwargs") or {}).get("eps", default))


def _vit_from_config(cfg, embed_dim, quick_gelu):
    where = "open_clip vision_cfg"
    layers = cfg.get("layers", 12)
    if isinstance(layers, (list, tuple)):
        raise NotImplementedError(f"{where}: ModifiedResNet image towers are not supported by vlzoo.")
    _refuse_custom(cfg, where)
    if cfg.get("attentional_pool"):
        raise NotImplementedError(f"{where}: `attentional_pool` (CoCa's attentional pooler) is not supported by vlzoo.")
    pool_type = cfg.get("pool_type", "tok")
    pooling = {"tok": "cls", "avg": "mean"}.get(pool_type)
    if pooling is None:
        raise NotImplementedError(f"{where}: `pool_type={pool_type!r}` is not supported by vlzoo.")
    if cfg.get("final_ln_after_pool") and pooling == "mean":
        raise NotImplementedError(f"{where}: `final_ln_after_pool` with `pool_type='avg'` is not supported by vlzoo.")
    width = int(cfg.get("width", 768))
    patch = square(cfg.get("patch_size", 16), "patch", where)
    image = square(cfg.get("image_size", 224), "image size", where)
    return dict(
        image_size=image - image % patch, patch_size=patch, hidden_dim=width, num_layers=int(layers),
        num_heads=width // int(cfg.get("head_width", 64)),
        intermediate_dim=int(width * float(cfg.get("mlp_ratio", 4.0))),
        activation=_config_activation(cfg, quick_gelu, where), layer_norm_epsilon=_config_eps(cfg),
        output_dim=int(embed_dim), num_prefix_tokens=1, pooling=pooling,
        use_pre_norm=not cfg.get("no_ln_pre", False), patch_bias=False, projection_bias=False,
    )


def _text_from_config(cfg, embed_dim, quick_gelu):
    where = "open_clip text_cfg"
    if cfg.get("hf_model_name"):
        raise NotImplementedError(f"{where}: Hugging Face text towers (`hf_model_name`) are not supported by vlzoo.")
    _refuse_custom(cfg, where)
    if cfg.get("embed_cls"):
        raise NotImplementedError(f"{where}: `embed_cls` (CoCa's text class token) is not supported by vlzoo.")
    pool_type = cfg.get("pool_type", "argmax")
    pooling = {"argmax": "eot", "last": "last", "first": "first"}.get(pool_type)
    if pooling is None:
        raise NotImplementedError(
            f"{where}: `pool_type={pool_type!r}` is not supported by vlzoo (supported: argmax, last, first)."
        )
    width = int(cfg.get("width", 512))
    projected = cfg.get("proj_type", "linear") != "none" and bool(embed_dim)
    bias = bool(cfg.get("proj_bias", False)) and projected
    text = dict(
        vocabulary_size=int(cfg.get("vocab_size", 49408)), sequence_length=int(cfg.get("context_length", 77)),
        hidden_dim=width, num_layers=int(cfg.get("layers", 12)), num_heads=int(cfg.get("heads", 8)),
        intermediate_dim=int(width * float(cfg.get("mlp_ratio", 4.0))),
        activation=_config_activation(cfg, quick_gelu, where), layer_norm_epsilon=_config_eps(cfg),
        output_dim=int(embed_dim) if projected else None, causal=not cfg.get("no_causal_mask", False),
        pooling=pooling, use_padding_mask=False, projection_bias=bias,
    )
    return text, (("linear" if bias else "param") if projected else None)


def _spec_from_config(config, state_dict, vision_overrides):
    if not isinstance(config, dict) or "vision_cfg" not in config or "text_cfg" not in config:
        raise ValueError(
            "`config` must be open_clip's model config dict with `embed_dim`, `vision_cfg` and `text_cfg` "
            "(the JSON of open_clip/model_configs/<name>.json)."
        )
    embed_dim = config.get("embed_dim", 512)
    quick_gelu = bool(config.get("quick_gelu", False))
    vision_cfg, text_cfg = dict(config["vision_cfg"]), dict(config["text_cfg"])
    if vision_cfg.get("timm_model_name"):
        vision, vision_proj = timm_spec_from_config(vision_cfg, state_dict, vision_overrides)
        layout = "timm"
    else:
        vision = _vit_from_config(vision_cfg, embed_dim, quick_gelu)
        vision.update(vision_overrides or {})
        vision_proj, layout = "param", "vit"
    text, text_proj = _text_from_config(text_cfg, embed_dim, quick_gelu)
    has_bias = config.get("init_logit_bias") is not None
    text_prefix = "text." if "text.token_embedding.weight" in state_dict else ""
    logit_shape = state_shape(state_dict, "logit_scale") if "logit_scale" in state_dict else ()
    return dict(
        family=_family(vision, has_bias), vision=vision, text=text, vision_layout=layout,
        vision_proj=vision_proj, text_prefix=text_prefix, text_proj=text_proj,
        logit_scale=_scalar_value(state_dict, "logit_scale"),
        logit_bias=(_scalar_value(state_dict, "logit_bias") or 0.0) if has_bias else None,
        logit_shape=logit_shape,
        preprocess=C.open_clip_preprocess(config.get("preprocess_cfg")),
    )


# =============================================================================== spec from vlzoo


def _spec_from_vlzoo(model, custom_text):
    v, t = model.vision.get_config(), model.text.get_config()
    if v["pooling"] == "map":
        layout = "timm"
        # PE-Core's open_clip configs project with the timm trunk's own head (`timm_proj: null`), SigLIP's
        # with open_clip's (`timm_proj: "linear"`).
        projection = "trunk_head" if v.get("rotary_theta") is not None else "head_proj"
        vision_proj = projection if v.get("output_dim") is not None else None
    else:
        layout = "vit"
        problems = []
        if v["num_prefix_tokens"] != 1:
            problems.append(f"num_prefix_tokens={v['num_prefix_tokens']}")
        if v["patch_bias"]:
            problems.append("patch_bias=True")
        if v.get("output_dim") is None:
            problems.append("no projection")
        elif v["projection_bias"]:
            problems.append("projection_bias=True")
        if problems:
            raise NotImplementedError(
                f"to_open_clip_state_dict: an image tower with {', '.join(problems)} has no open_clip "
                "VisionTransformer layout."
            )
        vision_proj = "param"
    if t.get("pooling") == "mean":
        raise NotImplementedError("to_open_clip_state_dict: open_clip text towers have no mean pooling.")
    if t.get("output_dim") is None:
        text_proj = None
    else:
        text_proj = "linear" if t.get("projection_bias") else "param"
    family = getattr(model, "family", "clip")
    return dict(
        family=family, vision=v, text=t, vision_layout=layout, vision_proj=vision_proj,
        text_prefix="text." if custom_text else "", text_proj=text_proj,
        logit_scale=float(C.to_numpy(model.logit_scale)),
        logit_bias=float(C.to_numpy(model.logit_bias)) if family == "siglip" else None,
        logit_shape=(),
    )
