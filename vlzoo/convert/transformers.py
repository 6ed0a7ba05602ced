"""Hugging Face transformers (`CLIPModel`, `MetaClip2Model`, `SiglipModel`, `Siglip2Model`, `Tipsv2Model`) -> vlzoo.

Reads the model you pass (its `state_dict()` and `config`) or a bare state
dict plus the `config.json` dict; never imports or downloads anything.

Each `model_type` converts through what `register_model_type` registered for it
(`TransformersModelType`): "clip", "metaclip_2", "siglip", "siglip2" and "tipsv2" here; a family whose
weights are published for transformers registers its own beside its model.
"""

import functools
import re
import typing
import warnings

import numpy as np

from vlzoo.convert import _common as C
from vlzoo.convert import repository_tokenizers
from vlzoo.convert.converters import architecture
from vlzoo.convert.converters import architectures
from vlzoo.convert.converters import register_architecture
from vlzoo.convert.state_dict import numpy_state_dict
from vlzoo.convert.state_dict import strip_prefix

# Hugging Face defaults for keys a config.json may leave out.
_CLIP_TEXT = dict(
    vocab_size=49408, hidden_size=512, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=8,
    max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5, eos_token_id=49407,
)
_CLIP_VISION = dict(
    hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, num_channels=3,
    image_size=224, patch_size=32, hidden_act="quick_gelu", layer_norm_eps=1e-5,
)
_SIGLIP_TEXT = dict(
    vocab_size=32000, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
    max_position_embeddings=64, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, projection_size=None,
)
_SIGLIP_VISION = dict(
    hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12, num_channels=3,
    image_size=224, patch_size=16, hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6, vision_use_head=True,
)
# SigLIP 2's NaFlex vision config: a patch budget in place of an image size (its position table is a
# square grid of `num_patches` rows, resized to each image's grid).
_SIGLIP2_VISION = {**{k: v for k, v in _SIGLIP_VISION.items() if k != "image_size"}, "num_patches": 256}


def from_transformers(model, *, dtype=None, tokenizer=None, preprocessor=None, progress=None):
    """Converts a transformers `CLIPModel`, `MetaClip2Model`, `SiglipModel` or `Siglip2Model` to the matching
    vlzoo model.

    A `MetaClip2Model` (MetaCLIP 2) is CLIP's network with its text pooled at the first end token
    (`eos_token_id`, XLM-V's `</s>`): it becomes a `vlzoo.CLIP` whose text tower has that `end_token_id`.

    A `Siglip2Model` (SigLIP 2's NaFlex checkpoints) becomes a `vlzoo.SigLIP`
    whose tower takes NaFlex batches (`vlzoo.preprocessing.NaFlexPreprocessor`)
    as well as square images at `patch_size * sqrt(num_patches)` pixels: its
    linear patch projection is the same map as a convolution's kernel.

    Args:
        model: the transformers model (any weights; e.g. `from_pretrained`
            on a local directory, or `from_config`).
        dtype: dtype policy of the vlzoo model (default float32).
        tokenizer: tokenizer to attach (default: vlzoo's CLIP BPE for CLIP
            with CLIP's vocabulary; none for SigLIP, whose SentencePiece model
            is not bundled).
        preprocessor: image preprocessor to attach (default: the family's
            standard one at the model's resolution).
        progress: optional `progress(done, total)` callback while assigning.

    Returns:
        `vlzoo.CLIP` for `CLIPModel` and `MetaClip2Model`, `vlzoo.SigLIP` for `SiglipModel` and `Siglip2Model`.

    Raises:
        TypeError: `model` is not a transformers model.
        NotImplementedError: a transformers class or feature vlzoo does not convert (named).
        KeyError, ValueError: a weight without a vlzoo counterpart, or of another shape (named).

    Example:
    >>> model = vlzoo.convert.from_transformers(transformers.CLIPModel.from_pretrained("dir"))  # doctest: +SKIP
    """
    if not hasattr(model, "state_dict") or not hasattr(model, "config"):
        raise TypeError(f"from_transformers expects a transformers model; received {type(model).__name__}.")
    name = type(model).__name__
    classes = [cls for key in architectures("transformers") for cls in architecture("transformers", key).model_classes]
    if name not in classes:
        raise NotImplementedError(
            f"from_transformers: {name} is not supported; pass one of {', '.join(classes)} (the dual encoder)."
        )
    return from_transformers_state_dict(
        dict(model.state_dict()), model.config, dtype=dtype, tokenizer=tokenizer, preprocessor=preprocessor,
        progress=progress,
    )


def from_transformers_state_dict(state_dict, config, *, dtype=None, tokenizer=None, preprocessor=None, progress=None):
    """Converts a transformers CLIP/SigLIP state dict plus its config to a vlzoo model.

    Args:
        state_dict: `{key: tensor or array}` (e.g. read from
            `model.safetensors` or `pytorch_model.bin`).
        config: the `config.json` dict (or a transformers config object);
            its `model_type` one that `register_model_type` registered (`"clip"`, `"siglip"`,
            `"siglip2"`, ...).
        dtype, tokenizer, preprocessor, progress: as in `from_transformers`.

    Raises:
        KeyError: a key is missing or unexpected (named).
        ValueError: a tensor's shape does not match the config (named).
        NotImplementedError: an unsupported model type or feature.

    Example:
    >>> state_dict = load_state_dict("model.safetensors")  # doctest: +SKIP
    >>> model = from_transformers_state_dict(state_dict, read_json("config.json"))  # doctest: +SKIP
    """
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    if not isinstance(config, dict):
        raise TypeError(f"`config` must be a dict (config.json) or a transformers config; received {type(config).__name__}.")
    state_dict = strip_prefix(numpy_state_dict(state_dict))
    model_type = config.get("model_type")
    spec = architecture("transformers", model_type).spec(config, state_dict)
    state_dict = spec.get("state_dict", state_dict)  # a spec that renames the checkpoint's keys returns them
    C.warn_logit_scale(spec["logit_scale"], f"transformers {model_type} checkpoint", spec["family"])
    model = C.build_model(
        spec["family"], spec["vision"], spec["text"], spec["logit_scale"], spec["logit_bias"], dtype=dtype,
    )
    ignore = [k for k in state_dict if k.endswith("position_ids")] + list(spec.get("ignore", ()))
    C.load_rules(spec["rules"], state_dict, model, ignore=ignore, progress=progress)
    return C.attach_processing(
        model, spec["family"], spec["vision"]["image_size"], tokenizer=tokenizer, preprocessor=preprocessor,
    )


class TransformersModelType(typing.NamedTuple):
    """How one transformers `model_type` converts (`register_model_type`).

    Attributes:
        spec: `spec(config, state_dict)` -> `{"family", "vision", "text", "logit_scale", "logit_bias",
            "rules"}`: the vlzoo family and tower arguments, the scalars, and the assignment rules of
            `vlzoo.convert._common.load_rules` (raises naming a missing, unexpected or misshaped key);
            optionally `"ignore"`, checkpoint keys without a vlzoo weight, and `"state_dict"`, the checkpoint
            under the names the rules read when the spec renames them (TIPSv2's released names).
        model_classes: the transformers class names `from_transformers` accepts for it.
        tokenizer: `tokenizer(directory, config)` -> the tokenizer a repository of this type ships, read
            from its files (`vlzoo.convert.repository_tokenizers`), or None.
    """

    spec: typing.Callable
    model_classes: tuple
    tokenizer: typing.Callable = None


def register_model_type(model_type, spec, model_classes, tokenizer=None):
    """Registers the conversion of transformers' `model_type` (see `TransformersModelType`).

    Example:
    >>> register_model_type("my_clip", my_spec, ("MyClipModel",), repository_tokenizers.clip_bpe_tokenizer)  # doctest: +SKIP
    """
    register_architecture("transformers", model_type, TransformersModelType(spec, tuple(model_classes), tokenizer))


# ----------------------------------------------------------------------------- helpers


def _sub_config(config, key, defaults):
    sub = config.get(key) or config.get(f"{key}_dict") or {}
    if hasattr(sub, "to_dict"):
        sub = sub.to_dict()
    return {**defaults, **{k: v for k, v in sub.items() if k in defaults and v is not None}}


def _scalar(state_dict, key, default):
    if key not in state_dict:
        return default
    return float(np.reshape(C.to_numpy(state_dict[key]), -1)[0])


def _geometry(cfg, where):
    if cfg["hidden_size"] % cfg["num_attention_heads"]:
        raise ValueError(f"{where}: `num_attention_heads` must divide `hidden_size`.")
    return dict(
        hidden_dim=int(cfg["hidden_size"]), num_layers=int(cfg["num_hidden_layers"]),
        num_heads=int(cfg["num_attention_heads"]), intermediate_dim=int(cfg["intermediate_size"]),
        activation=C.hf_activation_name(cfg["hidden_act"], where), layer_norm_epsilon=float(cfg["layer_norm_eps"]),
    )


def _vision_image(cfg, where):
    if cfg["num_channels"] != 3:
        raise NotImplementedError(f"{where}: {cfg['num_channels']} input channels are not supported (RGB only).")
    image, patch = int(cfg["image_size"]), int(cfg["patch_size"])
    return dict(image_size=image - image % patch, patch_size=patch)


def _encoder_rules(src, dst, num_layers):
    rules = []
    for i in range(num_layers):
        s, d = f"{src}.layers.{i}", f"{dst}/block_{i}"
        rules += C.torch_layer_norm(f"{s}.layer_norm1", f"{d}/ln_1")
        for hf, ours in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value"), ("out_proj", "output")):
            rules += C.torch_linear(f"{s}.self_attn.{hf}", f"{d}/attention/{ours}")
        rules += C.torch_layer_norm(f"{s}.layer_norm2", f"{d}/ln_2")
        rules += C.torch_linear(f"{s}.mlp.fc1", f"{d}/mlp/fc1")
        rules += C.torch_linear(f"{s}.mlp.fc2", f"{d}/mlp/fc2")
    return rules


# ----------------------------------------------------------------------------- CLIP


def _clip_spec(config, state_dict, pool_at_eos=False):
    """CLIP's spec; `pool_at_eos`: the text is pooled at the first `eos_token_id` (MetaCLIP 2), else at the
    largest id, as transformers' CLIP does for its released configs."""
    vcfg = _sub_config(config, "vision_config", _CLIP_VISION)
    tcfg = _sub_config(config, "text_config", _CLIP_TEXT)
    projection_dim = int(config.get("projection_dim") or 512)
    vision = dict(
        **_vision_image(vcfg, "CLIP vision_config"), **_geometry(vcfg, "CLIP vision_config"),
        output_dim=projection_dim, num_prefix_tokens=1, pooling="cls", use_pre_norm=True,
        patch_bias=False, projection_bias=False,
    )
    vocab = int(tcfg["vocab_size"])
    eos = tcfg.get("eos_token_id")
    end_token = {}
    if pool_at_eos:
        if not isinstance(eos, int) or not 0 <= eos < vocab:
            raise ValueError(f"transformers MetaCLIP 2 text_config: `eos_token_id` must be one token id below "
                             f"`vocab_size` ({vocab}); received {eos!r}.")
        end_token = dict(end_token_id=eos)
    elif eos not in (2, vocab - 1):
        warnings.warn(
            f"transformers CLIP: `eos_token_id={eos}` is not the largest token id ({vocab - 1}); vlzoo pools at "
            "the position of the largest id (argmax), which differs when the end token is not the largest id.",
            stacklevel=3,
        )
    text = dict(
        vocabulary_size=vocab, sequence_length=int(tcfg["max_position_embeddings"]),
        **_geometry(tcfg, "CLIP text_config"), output_dim=projection_dim, causal=True, pooling="eot",
        use_padding_mask=False, projection_bias=False, **end_token,
    )
    width = vision["hidden_dim"]
    v, t = "vision_model", "text_model"
    rules = [
        C.transpose(f"{v}.embeddings.patch_embedding.weight", "vision/patch_embedding/conv/kernel", (2, 3, 1, 0)),
        C.reshape(f"{v}.embeddings.class_embedding", "vision/prefix_tokens", (1, width), (width,)),
        C.copy(f"{v}.embeddings.position_embedding.weight", "vision/position_embedding/embeddings"),
        *C.torch_layer_norm(f"{v}.pre_layrnorm", "vision/pre_norm"),
        *_encoder_rules(f"{v}.encoder", "vision", vision["num_layers"]),
        *C.torch_layer_norm(f"{v}.post_layernorm", "vision/post_norm"),
        *C.torch_linear("visual_projection", "vision/projection", bias=False),
        C.copy(f"{t}.embeddings.token_embedding.weight", "text/token_embedding/embeddings"),
        C.copy(f"{t}.embeddings.position_embedding.weight", "text/position_embedding/embeddings"),
        *_encoder_rules(f"{t}.encoder", "text", text["num_layers"]),
        *C.torch_layer_norm(f"{t}.final_layer_norm", "text/post_norm"),
        *C.torch_linear("text_projection", "text/projection", bias=False),
        C.scalar("logit_scale", "logit_scale"),
    ]
    return dict(
        family="clip", vision=vision, text=text, rules=rules,
        logit_scale=_scalar(state_dict, "logit_scale", float(config.get("logit_scale_init_value", 2.6592))),
        logit_bias=None,
    )


# ----------------------------------------------------------------------------- SigLIP


def _naflex_image(cfg, where):
    """A NaFlex vision config's square training geometry: `num_patches` a square grid of patches."""
    grid = int(round(int(cfg["num_patches"]) ** 0.5))
    if grid * grid != int(cfg["num_patches"]):
        raise NotImplementedError(f"{where}: `num_patches` ({cfg['num_patches']}) must be a square number; the "
                                  "position table is a square grid.")
    if cfg["num_channels"] != 3:
        raise NotImplementedError(f"{where}: {cfg['num_channels']} input channels are not supported (RGB only).")
    return dict(image_size=grid * int(cfg["patch_size"]), patch_size=int(cfg["patch_size"]))


def _linear_patch_rule(src, dst, patch_size, channels=3):
    """SigLIP 2's `Linear(p * p * C, D)` on flattened patches (row, column, channel order) as the Keras
    convolution kernel `(p, p, C, D)` that computes the same map."""
    def forward(a):
        weight = a[0]
        if weight.ndim != 2 or weight.shape[1] != patch_size * patch_size * channels:
            raise ValueError(f"Checkpoint key {src!r} has shape {tuple(weight.shape)}; expected "
                             f"(D, {patch_size * patch_size * channels}).")
        return [np.reshape(weight.T, (patch_size, patch_size, channels, weight.shape[0]))]

    return C.Rule([src], [dst], forward, lambda a: [np.reshape(a[0], (-1, a[0].shape[-1])).T])


def _siglip_spec(config, state_dict, naflex=False):
    vcfg = _sub_config(config, "vision_config", _SIGLIP2_VISION if naflex else _SIGLIP_VISION)
    tcfg = _sub_config(config, "text_config", _SIGLIP_TEXT)
    if not vcfg["vision_use_head"]:
        raise NotImplementedError(
            "transformers SigLIP: `vision_use_head=False` (no MAP head, no pooled image embedding) is not supported."
        )
    image = _naflex_image(vcfg, "SigLIP 2 vision_config") if naflex else _vision_image(vcfg, "SigLIP vision_config")
    vision = dict(
        **image, **_geometry(vcfg, "SigLIP vision_config"),
        output_dim=None, num_prefix_tokens=0, pooling="map", use_pre_norm=False, patch_bias=True,
        projection_bias=False,
    )
    text_geometry = _geometry(tcfg, "SigLIP text_config")
    text = dict(
        vocabulary_size=int(tcfg["vocab_size"]), sequence_length=int(tcfg["max_position_embeddings"]),
        **text_geometry, output_dim=int(tcfg["projection_size"] or text_geometry["hidden_dim"]),
        causal=False, pooling="last", use_padding_mask=False, projection_bias=True,
    )
    v, t, h = "vision_model", "text_model", "vision_model.head"
    rules = [
        (_linear_patch_rule(f"{v}.embeddings.patch_embedding.weight", "vision/patch_embedding/conv/kernel",
                            vision["patch_size"]) if naflex else
         C.transpose(f"{v}.embeddings.patch_embedding.weight", "vision/patch_embedding/conv/kernel", (2, 3, 1, 0))),
        C.copy(f"{v}.embeddings.patch_embedding.bias", "vision/patch_embedding/conv/bias"),
        C.copy(f"{v}.embeddings.position_embedding.weight", "vision/position_embedding/embeddings"),
        *_encoder_rules(f"{v}.encoder", "vision", vision["num_layers"]),
        *C.torch_layer_norm(f"{v}.post_layernorm", "vision/post_norm"),
        C.copy(f"{h}.probe", "vision/map_head/latent"),
        *C.fused_qkv(f"{h}.attention.in_proj_weight", f"{h}.attention.in_proj_bias", "vision/map_head/attention"),
        *C.torch_linear(f"{h}.attention.out_proj", "vision/map_head/attention/output"),
        *C.torch_layer_norm(f"{h}.layernorm", "vision/map_head/norm"),
        *C.torch_linear(f"{h}.mlp.fc1", "vision/map_head/mlp/fc1"),
        *C.torch_linear(f"{h}.mlp.fc2", "vision/map_head/mlp/fc2"),
        C.copy(f"{t}.embeddings.token_embedding.weight", "text/token_embedding/embeddings"),
        C.copy(f"{t}.embeddings.position_embedding.weight", "text/position_embedding/embeddings"),
        *_encoder_rules(f"{t}.encoder", "text", text["num_layers"]),
        *C.torch_layer_norm(f"{t}.final_layer_norm", "text/post_norm"),
        *C.torch_linear(f"{t}.head", "text/projection", bias=True),
        C.scalar("logit_scale", "logit_scale", (1,)),
        C.scalar("logit_bias", "logit_bias", (1,)),
    ]
    return dict(
        family="siglip", vision=vision, text=text, rules=rules,
        logit_scale=_scalar(state_dict, "logit_scale", 0.0), logit_bias=_scalar(state_dict, "logit_bias", 0.0),
    )


# ----------------------------------------------------------------------------- TIPSv2

_TIPSV2_VISION = dict(
    hidden_size=768, num_hidden_layers=12, num_attention_heads=12, hidden_act="gelu", layer_norm_eps=1e-6,
    image_size=448, patch_size=14, num_channels=3, qkv_bias=True, layerscale_value=1.0, use_swiglu_ffn=False,
    num_register_tokens=1,
)
_TIPSV2_TEXT = dict(
    vocab_size=32000, hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
    max_position_embeddings=64, hidden_act="relu", layer_norm_eps=1e-5, scale_sqrt_depth=True,
)


# The released checkpoints keep the authors' names (`vision_encoder.blocks.0.attn.qkv`, `text_encoder.
# transformer.resblocks.0.attn.in_proj_weight`, ...), which transformers renames and splits as it loads them
# (its conversion mapping for "tipsv2"): the same here, in its order, so one set of rules reads both.
_TIPSV2_RENAMES = (
    (r"^text_encoder\.ln_final\.", "text_model.final_layer_norm."),
    (r"^text_encoder\.token_embedding\.", "text_model.embeddings.token_embedding."),
    (r"^text_encoder\.transformer\.resblocks\.", "text_model.encoder.layers."),
    (r"^(text_model\.encoder\.layers\.\d+)\.ln_([12])\.", r"\1.layer_norm\2."),
    (r"^(text_model\.encoder\.layers\.\d+)\.attn\.", r"\1.self_attn."),
    (r"^vision_encoder\.patch_embed\.proj\.", "vision_model.embeddings.patch_embeddings.projection."),
    (r"^vision_encoder\.(cls_token|mask_token|register_tokens)$", r"vision_model.embeddings.\1"),
    (r"^vision_encoder\.pos_embed$", "vision_model.embeddings.position_embeddings"),
    (r"^vision_encoder\.norm\.", "vision_model.layernorm."),
    (r"^vision_encoder\.blocks\.", "vision_model.encoder.layer."),
    (r"\.attn\.proj\.", ".attention.o_proj."),
    (r"\.ls([12])\.gamma$", r".layer_scale\1.lambda1"),
    (r"\.mlp\.c_fc\.", ".mlp.fc1."),
    (r"\.mlp\.c_proj\.", ".mlp.fc2."),
    (r"\.mlp\.w3\.", ".mlp.down_proj."),
)
# Packed projections of the released names, split along their first axis into transformers' (after the renames).
_TIPSV2_SPLITS = (
    (r"\.self_attn\.in_proj_(weight|bias)$", (".self_attn.q_proj.{}", ".self_attn.k_proj.{}", ".self_attn.v_proj.{}")),
    (r"\.attn\.qkv\.(weight|bias)$", (".attention.q_proj.{}", ".attention.k_proj.{}", ".attention.v_proj.{}")),
    (r"\.mlp\.w12\.(weight|bias)$", (".mlp.gate_proj.{}", ".mlp.up_proj.{}")),
)


def _tipsv2_transformers_names(state_dict):
    """A TIPSv2 state dict under transformers' module names: the released checkpoints' names renamed and their
    packed projections split (`_TIPSV2_RENAMES`, `_TIPSV2_SPLITS`); a dict already so named is returned as is."""
    if not any(key.startswith(("vision_encoder.", "text_encoder.")) for key in state_dict):
        return state_dict
    out = {}
    for key, value in state_dict.items():
        for pattern, replacement in _TIPSV2_RENAMES:
            key = re.sub(pattern, replacement, key)
        for pattern, parts in _TIPSV2_SPLITS:
            match = re.search(pattern, key)
            if match:
                stem = key[:match.start()]
                for part, array in zip(parts, np.split(np.asarray(value), len(parts), axis=0)):
                    out[stem + part.format(match.group(1))] = array
                break
        else:
            out[key] = value
    return out


def _tipsv2_vision_rules(v, num_layers, swiglu):
    rules = [
        C.transpose(f"{v}.embeddings.patch_embeddings.projection.weight", "vision/patch_embedding/conv/kernel",
                    (2, 3, 1, 0)),
        C.copy(f"{v}.embeddings.patch_embeddings.projection.bias", "vision/patch_embedding/conv/bias"),
    ]
    for i in range(num_layers):
        s, d = f"{v}.encoder.layer.{i}", f"vision/block_{i}"
        rules += C.torch_layer_norm(f"{s}.norm1", f"{d}/ln_1")
        for hf, ours in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value"), ("o_proj", "output")):
            rules += C.torch_linear(f"{s}.attention.{hf}", f"{d}/attention/{ours}")
        rules.append(C.copy(f"{s}.layer_scale1.lambda1", f"{d}/ls_1"))
        rules += C.torch_layer_norm(f"{s}.norm2", f"{d}/ln_2")
        if swiglu:
            rules += C.concatenated_linear([f"{s}.mlp.gate_proj", f"{s}.mlp.up_proj"], f"{d}/mlp/fc1")
            rules += C.torch_linear(f"{s}.mlp.down_proj", f"{d}/mlp/fc2")
        else:
            rules += C.torch_linear(f"{s}.mlp.fc1", f"{d}/mlp/fc1")
            rules += C.torch_linear(f"{s}.mlp.fc2", f"{d}/mlp/fc2")
        rules.append(C.copy(f"{s}.layer_scale2.lambda1", f"{d}/ls_2"))
    return rules + C.torch_layer_norm(f"{v}.layernorm", "vision/post_norm")


def _tipsv2_spec(config, state_dict):
    """TIPSv2's spec, from the released checkpoints' names or transformers' (`_tipsv2_transformers_names`; the
    spec's `state_dict` is the renamed one). The released checkpoints hold no `temperature` (transformers takes
    its config's `temperature_init_value`): that value stands in for a missing one, and
    `logit_scale = -ln(temperature)`."""
    vcfg = _sub_config(config, "vision_config", _TIPSV2_VISION)
    tcfg = _sub_config(config, "text_config", _TIPSV2_TEXT)
    state_dict = dict(_tipsv2_transformers_names(state_dict))
    if not vcfg["qkv_bias"]:
        raise NotImplementedError("transformers TIPSv2 vision_config: `qkv_bias=False` is not supported.")
    if int(vcfg["num_register_tokens"]) < 1:
        raise NotImplementedError("transformers TIPSv2 vision_config: a tower without register tokens is not "
                                  "supported (the register token embeds the image for synthetic captions).")
    swiglu = bool(vcfg["use_swiglu_ffn"])
    v, t = "vision_model", "text_model"
    first_mlp = f"{v}.encoder.layer.0.mlp.{'gate_proj' if swiglu else 'fc1'}.weight"
    if first_mlp not in state_dict:
        raise KeyError(f"transformers TIPSv2: the checkpoint has no {first_mlp!r} (use_swiglu_ffn={swiglu}).")
    geometry = _geometry({**vcfg, "intermediate_size": int(np.shape(state_dict[first_mlp])[0])},
                         "TIPSv2 vision_config")
    if swiglu:
        geometry["activation"] = "swiglu"
    width = geometry["hidden_dim"]
    registers = int(vcfg["num_register_tokens"])
    vision = dict(
        **_vision_image(vcfg, "TIPSv2 vision_config"), **geometry, output_dim=None, num_prefix_tokens=1,
        num_register_tokens=registers, pooling="cls", use_pre_norm=False, patch_bias=True, projection_bias=False,
        layer_scale=float(vcfg["layerscale_value"]),
    )
    text = dict(
        vocabulary_size=int(tcfg["vocab_size"]), sequence_length=int(tcfg["max_position_embeddings"]),
        **_geometry(tcfg, "TIPSv2 text_config"), output_dim=None, causal=False, pooling="mean",
        use_padding_mask=True, projection_bias=False, positions="sinusoidal",
        scale_embeddings=bool(tcfg["scale_sqrt_depth"]),
    )
    temperature = float(config.get("temperature_init_value") or 0.005065968260169029)
    state_dict.setdefault("temperature", np.float32(temperature))
    grid = (vision["image_size"] // vision["patch_size"]) ** 2
    rules = [
        C.reshape(f"{v}.embeddings.cls_token", "vision/prefix_tokens", (1, width), (1, 1, width)),
        C.reshape(f"{v}.embeddings.register_tokens", "vision/register_tokens", (registers, width),
                  (1, registers, width)),
        C.reshape(f"{v}.embeddings.position_embeddings", "vision/position_embedding/embeddings",
                  (1 + grid, width), (1, 1 + grid, width)),
        *_tipsv2_vision_rules(v, vision["num_layers"], swiglu),
        C.copy(f"{t}.embeddings.token_embedding.weight", "text/token_embedding/embeddings"),
        *_encoder_rules(f"{t}.encoder", "text", text["num_layers"]),
        *C.torch_layer_norm(f"{t}.final_layer_norm", "text/post_norm"),
        C.Rule(["temperature"], ["logit_scale"],
               lambda a: [np.reshape(-np.log(np.asarray(a[0], np.float64)), ()).astype("float32")],
               lambda a: [np.exp(-np.asarray(a[0], np.float64)).astype("float32")]),
    ]
    return dict(family="tipsv2", vision=vision, text=text, rules=rules,
                logit_scale=-np.log(float(np.reshape(state_dict["temperature"], -1)[0])), logit_bias=None,
                ignore=(f"{v}.embeddings.mask_token",), state_dict=state_dict)


register_model_type("clip", _clip_spec, ("CLIPModel",), repository_tokenizers.clip_bpe_tokenizer)
register_model_type("metaclip_2", functools.partial(_clip_spec, pool_at_eos=True), ("MetaClip2Model",),
                    repository_tokenizers.metaclip2_tokenizer)
register_model_type("siglip", _siglip_spec, ("SiglipModel",), repository_tokenizers.siglip_tokenizer)
register_model_type("siglip2", functools.partial(_siglip_spec, naflex=True), ("Siglip2Model",),
                    repository_tokenizers.gemma_tokenizer)
register_model_type("tipsv2", _tipsv2_spec, ("Tipsv2Model",), repository_tokenizers.tipsv2_tokenizer)
