"""Shared machinery of the converters: numpy conversion, mapping rules and a strict assigner.

A converter describes a checkpoint as a list of `Rule`s. Each rule reads one or
more checkpoint keys, transforms the arrays (transpose, split a fused q/k/v
projection, reshape) and yields one array per vlzoo variable. `load_rules`
checks everything before it assigns anything: every rule's keys exist, every
transformed array has the shape of its vlzoo variable, every checkpoint key is
consumed and every vlzoo variable receives exactly one array. Otherwise it
raises `KeyError`/`ValueError` naming the key, so a checkpoint is never loaded
partially. The same rules run backwards (`export_rules`) for the reverse
direction (vlzoo -> checkpoint); every transform is a pure data move, so a
round trip is exact.
"""

import inspect
import math
import re
import warnings

import numpy as np

from vlzoo._arrays import to_numpy
from vlzoo._backends.keras_internals import without_weights
from vlzoo import families
from vlzoo.models.base import LOGIT_SCALE_MAX
from vlzoo.preprocessing import CLIP_MEAN, CLIP_STD, SIGLIP_MEAN, SIGLIP_STD, ImagePreprocessor
from vlzoo.tokenizers import UnavailableTokenizer


# ----------------------------------------------------------------------------- rules


class Rule:
    """Maps checkpoint keys `sources` to vlzoo variables `targets`.

    `forward(arrays) -> arrays` turns the source arrays (in `sources` order)
    into the target arrays (in `targets` order); `backward` does the reverse.
    """

    __slots__ = ("sources", "targets", "forward", "backward")

    def __init__(self, sources, targets, forward, backward):
        self.sources = tuple(sources)
        self.targets = tuple(targets)
        self.forward = forward
        self.backward = backward

    def __repr__(self):
        return f"Rule({list(self.sources)} -> {list(self.targets)})"


def copy(src, dst):
    """Same layout on both sides."""
    return Rule([src], [dst], lambda a: [a[0]], lambda a: [a[0]])


def reshape(src, dst, dst_shape, src_shape):
    """Same values, another shape (e.g. a `(D,)` class token -> `(1, D)` prefix tokens)."""
    dst_shape, src_shape = tuple(dst_shape), tuple(src_shape)
    return Rule(
        [src], [dst],
        lambda a: [_reshape(a[0], dst_shape, src)],
        lambda a: [np.reshape(a[0], src_shape)],
    )


def _reshape(array, shape, key):
    if int(np.prod(array.shape)) != int(np.prod(shape)):
        raise ValueError(
            f"Checkpoint key {key!r} has shape {tuple(array.shape)}; expected {int(np.prod(shape))} "
            f"values to fill shape {tuple(shape)}."
        )
    return np.reshape(array, shape)


def transpose(src, dst, axes):
    """`dst = src.transpose(axes)` (e.g. a torch conv `(D, C, p, p)` -> Keras `(p, p, C, D)`)."""
    axes = tuple(axes)
    inverse = tuple(np.argsort(axes))

    def forward(a):
        if a[0].ndim != len(axes):
            raise ValueError(
                f"Checkpoint key {src!r} has shape {tuple(a[0].shape)}; expected a rank-{len(axes)} tensor."
            )
        return [np.transpose(a[0], axes)]

    return Rule([src], [dst], forward, lambda a: [np.transpose(a[0], inverse)])


def torch_linear(src_prefix, dst_prefix, bias=True):
    """torch `Linear` `weight (out, in)` (+ `bias`) -> Keras `Dense` `kernel (in, out)` (+ `bias`)."""
    rules = [transpose(f"{src_prefix}.weight", f"{dst_prefix}/kernel", (1, 0))]
    if bias:
        rules.append(copy(f"{src_prefix}.bias", f"{dst_prefix}/bias"))
    return rules


def torch_layer_norm(src_prefix, dst_prefix):
    """torch `LayerNorm` `weight`, `bias` -> Keras `gamma`, `beta`."""
    return [copy(f"{src_prefix}.weight", f"{dst_prefix}/gamma"), copy(f"{src_prefix}.bias", f"{dst_prefix}/beta")]


def fused_qkv(src_weight, src_bias, dst_prefix, num_parts=3, names=("query", "key", "value")):
    """A fused torch projection `(num_parts * D, D)` (+ bias) -> separate Dense kernels `(D, D)`.

    `nn.MultiheadAttention.in_proj_weight` and timm's `qkv` stack q, k, v
    along the output axis; timm's MAP head stacks k, v (`num_parts=2`).
    """
    names = names[-num_parts:] if num_parts < len(names) else names

    def split(array, key):
        if array.shape[0] % num_parts:
            raise ValueError(
                f"Checkpoint key {key!r} has shape {tuple(array.shape)}; its first axis must stack "
                f"{num_parts} equal projections."
            )
        return np.split(array, num_parts, axis=0)

    rules = [
        Rule(
            [src_weight], [f"{dst_prefix}/{n}/kernel" for n in names],
            lambda a: [w.T for w in split(a[0], src_weight)],
            lambda a: [np.concatenate([w.T for w in a], axis=0)],
        )
    ]
    if src_bias is not None:
        rules.append(
            Rule(
                [src_bias], [f"{dst_prefix}/{n}/bias" for n in names],
                lambda a: list(split(a[0], src_bias)),
                lambda a: [np.concatenate(a, axis=0)],
            )
        )
    return rules


def concatenated_linear(sources, dst_prefix):
    """torch `Linear`s side by side (`sources` prefixes) -> one Keras `Dense` with their outputs in order
    (SwiGLU's gate and up projections -> `fc1`); the reverse of `fused_qkv`'s split."""

    def rule(suffix, forward, split):
        keys = [f"{source}.{suffix}" for source in sources]
        return Rule(keys, [f"{dst_prefix}/{'kernel' if suffix == 'weight' else 'bias'}"],
                    lambda a: [forward(a)], lambda a: split(a[0]))

    halves = len(sources)
    return [
        rule("weight", lambda a: np.concatenate([w.T for w in a], axis=1),
             lambda k: [w.T for w in np.split(k, halves, axis=1)]),
        rule("bias", lambda a: np.concatenate(a, axis=0), lambda b: np.split(b, halves, axis=0)),
    ]


def scalar(src, dst, src_shape=()):
    """A scalar stored as `()` or `(1,)` -> vlzoo's `()` variable."""
    src_shape = tuple(src_shape)

    def forward(a):
        if a[0].size != 1:
            raise ValueError(f"Checkpoint key {src!r} has shape {tuple(a[0].shape)}; expected a scalar.")
        return [np.reshape(a[0], ())]

    return Rule([src], [dst], forward, lambda a: [np.reshape(a[0], src_shape)])


def key_shape(state_dict, key):
    """The shape of `state_dict[key]` as a tuple of ints, None when the key is absent."""
    return tuple(int(d) for d in np.shape(state_dict[key])) if key in state_dict else None


def key_dim(state_dict, key, axis):
    """Axis `axis` of `state_dict[key]`'s shape, None when the key is absent."""
    shape = key_shape(state_dict, key)
    return shape[axis] if shape else None


def check_geometry(checks, state_dict, preset):
    """Raises ValueError naming every `(what, key, found, expected)` where the checkpoint (`found`, None: not
    shown) and the preset differ, all at once, with the key and its shape as evidence."""
    problems = []
    for what, key, found, expected in checks:
        if found is not None and found != expected:
            if isinstance(found, bool):
                evidence = f"{key!r} {'present' if found else 'absent'}"
            else:
                shape = key_shape(state_dict, key)
                evidence = f"{key!r} {shape}" if shape is not None else key
            problems.append(f"{what}: checkpoint {found} ({evidence}), preset {expected}")
    if problems:
        raise ValueError(
            f"The checkpoint does not match preset {preset!r}: " + "; ".join(problems)
            + ". Pick the preset of the checkpoint's architecture, or override the preset's config."
        )


def _layers(state_dict, prefix):
    pattern = re.compile(re.escape(prefix) + r"transformer\.resblocks\.(\d+)\.")
    indices = {int(m.group(1)) for key in state_dict for m in [pattern.match(key)] if m}
    return max(indices) + 1 if indices else None


def tower_geometry_checks(state_dict, model):
    """`(what, key, found, expected)` for the towers of an open_clip-layout checkpoint (`visual.*` and the
    top-level text keys, as the Llip and FLAIR authors' code keeps them) against a vlzoo model, for
    `check_geometry`: widths, patch, positions, layer counts, MLP widths, vocabulary and context length."""
    vision, text = model.vision, model.text
    grid = (vision.image_size // vision.patch_size) ** 2

    def dim(key, axis):
        return key_dim(state_dict, key, axis)

    return [
        ("vision width", "visual.class_embedding", dim("visual.class_embedding", -1), vision.hidden_dim),
        ("patch size", "visual.conv1.weight", dim("visual.conv1.weight", -1), vision.patch_size),
        ("image positions", "visual.positional_embedding", dim("visual.positional_embedding", 0),
         vision.num_prefix_tokens + grid),
        ("vision layers", "visual.transformer.resblocks.*", _layers(state_dict, "visual."), vision.num_layers),
        ("vision MLP width", "visual.transformer.resblocks.0.mlp.c_fc.weight",
         dim("visual.transformer.resblocks.0.mlp.c_fc.weight", 0), vision.intermediate_dim),
        ("vocabulary", "token_embedding.weight", dim("token_embedding.weight", 0), text.vocabulary_size),
        ("text width", "token_embedding.weight", dim("token_embedding.weight", -1), text.hidden_dim),
        ("context length", "positional_embedding", dim("positional_embedding", 0), text.sequence_length),
        ("text layers", "transformer.resblocks.*", _layers(state_dict, ""), text.num_layers),
        ("text MLP width", "transformer.resblocks.0.mlp.c_fc.weight",
         dim("transformer.resblocks.0.mlp.c_fc.weight", 0), text.intermediate_dim),
    ]


# ----------------------------------------------------------------------------- vlzoo side


def _dense(out, name, layer):
    out[f"{name}/kernel"] = layer.kernel
    if layer.use_bias:
        out[f"{name}/bias"] = layer.bias


def _norm(out, name, layer):
    if layer.scale:
        out[f"{name}/gamma"] = layer.gamma
    if layer.center:
        out[f"{name}/beta"] = layer.beta


def _attention(out, name, layer):
    for part, dense in (("query", layer.query), ("key", layer.key), ("value", layer.value), ("output", layer.output_dense)):
        _dense(out, f"{name}/{part}", dense)


def _mlp(out, name, layer):
    _dense(out, f"{name}/fc1", layer.fc1)
    _dense(out, f"{name}/fc2", layer.fc2)


def _blocks(out, prefix, blocks):
    for i, block in enumerate(blocks):
        name = f"{prefix}/block_{i}"
        _norm(out, f"{name}/ln_1", block.ln_1)
        _attention(out, f"{name}/attention", block.attention)
        _norm(out, f"{name}/ln_2", block.ln_2)
        _mlp(out, f"{name}/mlp", block.mlp)
        if block.layer_scale is not None:
            out[f"{name}/ls_1"], out[f"{name}/ls_2"] = block.ls_1, block.ls_2


def _family_heads(out, model):
    """The heads some families add after the towers (Llip's cross-attention, FLAIR's pooling, SPARO's read-outs)."""
    head = getattr(model, "cross_attention", None)  # Llip
    if head is not None:
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out[f"cross_attention/{name}"] = getattr(head, name)
        for name in ("q_norm", "k_norm", "v_norm"):
            if getattr(head, name) is not None:
                _norm(out, f"cross_attention/{name}", getattr(head, name))
        _dense(out, "text_projection", model.text_projection)
    pooling = getattr(model, "text_pooling", None)  # FLAIR
    if pooling is not None:
        for name in ("q_norm", "k_norm", "v_norm"):
            _norm(out, f"text_pooling/{name}", getattr(pooling, name))
        for name in ("query", "key", "value", "output_dense"):
            _dense(out, f"text_pooling/{name}", getattr(pooling, name))
        _dense(out, "image_projection", model.image_projection)
        _dense(out, "text_projection", model.text_projection)
    for name in ("vision_readout", "text_readout"):  # SPARO
        readout = getattr(model, name, None)
        if readout is not None:
            out[f"{name}/queries"] = readout.queries
            _dense(out, f"{name}/key", readout.key)
            if readout.value is not None:
                _dense(out, f"{name}/value", readout.value)
            _dense(out, f"{name}/output", readout.output_dense)


def vlzoo_variables(model):
    """`{name: variable}` for every weight of a vlzoo contrastive model, under stable names.

    Names follow the layers (`vision/block_0/attention/query/kernel`,
    `text/token_embedding/embeddings`, `cross_attention/k_proj`,
    `vision_readout/queries`, `logit_scale`, ...) and do not depend
    on Keras' name scopes. Raises `NotImplementedError` if the model holds a
    variable this walk does not know (a converter would otherwise miss it).
    """
    out = {}
    vision, text = model.vision, model.text
    conv = vision.patch_embedding.conv
    out["vision/patch_embedding/conv/kernel"] = conv.kernel
    if conv.use_bias:
        out["vision/patch_embedding/conv/bias"] = conv.bias
    if vision.num_prefix_tokens:
        out["vision/prefix_tokens"] = vision.prefix_tokens
    if vision.num_register_tokens:
        out["vision/register_tokens"] = vision.register_tokens
    out["vision/position_embedding/embeddings"] = vision.position_embedding.embeddings
    if vision.pre_norm is not None:
        _norm(out, "vision/pre_norm", vision.pre_norm)
    _blocks(out, "vision", vision.blocks)
    _norm(out, "vision/post_norm", vision.post_norm)
    if vision.map_head is not None:
        head = vision.map_head
        out["vision/map_head/latent"] = head.latent
        _attention(out, "vision/map_head/attention", head.attention)
        _norm(out, "vision/map_head/norm", head.norm)
        _mlp(out, "vision/map_head/mlp", head.mlp)
    if vision.projection is not None:
        _dense(out, "vision/projection", vision.projection)

    out["text/token_embedding/embeddings"] = text.token_embedding.embeddings
    if text.position_embedding is not None:
        out["text/position_embedding/embeddings"] = text.position_embedding.embeddings
    _blocks(out, "text", text.blocks)
    _norm(out, "text/post_norm", text.post_norm)
    if text.projection is not None:
        _dense(out, "text/projection", text.projection)

    _family_heads(out, model)
    out["logit_scale"] = model.logit_scale
    if getattr(model, "logit_bias", None) is not None:
        out["logit_bias"] = model.logit_bias

    known = {id(v) for v in out.values()}
    for variable in model.weights:
        if id(variable) not in known:
            raise NotImplementedError(
                f"vlzoo variable {variable.path!r} {tuple(variable.shape)} is not handled by the converters "
                f"(model class {type(model).__name__})."
            )
    return out


# ----------------------------------------------------------------------------- load / export


def _describe(keys):
    keys = sorted(keys)
    shown = ", ".join(repr(k) for k in keys[:20])
    return shown + (f", ... ({len(keys)} in all)" if len(keys) > 20 else "")


def plan_rules(rules, state_dict, model, ignore=()):
    """Checks and runs the rules without assigning: returns `[(variable, array, source_keys, name)]`.

    Raises:
        KeyError: a rule's checkpoint key is missing (named), checkpoint keys
            are left over (named), a rule names an unknown vlzoo variable, or a
            vlzoo variable receives nothing (named) or twice.
        ValueError: a converted array's shape differs from its vlzoo
            variable's (names the checkpoint key, the vlzoo variable, the
            expected and the received shape).
    """
    targets = vlzoo_variables(model)
    consumed, assigned, plan = set(), {}, []
    for rule in rules:
        missing = [k for k in rule.sources if k not in state_dict]
        if missing:
            raise KeyError(
                f"Checkpoint key {missing[0]!r} is missing (needed for vlzoo variable(s) "
                f"{', '.join(rule.targets)})."
            )
        arrays = [to_numpy(state_dict[k]) for k in rule.sources]
        consumed.update(rule.sources)
        outputs = rule.forward(arrays)
        for name, array in zip(rule.targets, outputs):
            if name not in targets:
                raise KeyError(
                    f"Checkpoint key(s) {', '.join(map(repr, rule.sources))} map to vlzoo variable {name!r}, "
                    "which this model does not have (its configuration differs from the checkpoint's)."
                )
            if name in assigned:
                raise KeyError(
                    f"vlzoo variable {name!r} receives two checkpoint keys: {assigned[name]} and {rule.sources}."
                )
            variable = targets[name]
            expected = tuple(int(d) for d in variable.shape)
            if tuple(array.shape) != expected:
                sources = ", ".join(f"{k!r} {tuple(np.shape(to_numpy(state_dict[k])))}" for k in rule.sources)
                raise ValueError(
                    f"Shape mismatch for checkpoint key {sources} -> vlzoo variable {name!r}: "
                    f"expected {expected}, received {tuple(array.shape)}."
                )
            assigned[name] = rule.sources
            plan.append((variable, array, rule.sources, name))
    ignore = set(ignore)
    leftover = [k for k in state_dict if k not in consumed and k not in ignore]
    if leftover:
        raise KeyError(f"Unexpected checkpoint key(s) with no vlzoo counterpart: {_describe(leftover)}.")
    unfilled = [name for name in targets if name not in assigned]
    if unfilled:
        raise KeyError(f"vlzoo variable(s) received no checkpoint key: {_describe(unfilled)}.")
    return plan


def load_rules(rules, state_dict, model, ignore=(), progress=None):
    """Assigns a checkpoint to `model` through `rules`, all or nothing (see `plan_rules`).

    Args:
        rules: list of `Rule`.
        state_dict: `{key: tensor or array}`.
        model: a vlzoo model whose configuration matches the checkpoint.
        ignore: checkpoint keys that carry no weights (buffers, metadata).
        progress: optional callable `progress(done, total)` after each variable.

    Returns:
        `model`.
    """
    plan = plan_rules(rules, state_dict, model, ignore=ignore)
    total = len(plan)
    for i, (variable, array, _, _) in enumerate(plan):
        _set_value(variable, _contiguous(array, variable.dtype))
        if progress is not None:
            progress(i + 1, total)
    return model


def _contiguous(array, dtype=None):
    """C-contiguous copy when needed, keeping 0-d arrays 0-d (`np.ascontiguousarray` makes them 1-d)."""
    return np.require(np.asarray(array, dtype=dtype), requirements="C")


def _set_value(variable, value):
    """Assigns `value`; a variable left uninitialised by `build_model` is initialised with it directly."""
    if getattr(variable, "_value", 0) is None and getattr(variable, "_initializer", None) is not None:
        variable._initializer = lambda shape, dtype=None: value
        variable._deferred_initialize()
    else:
        variable.assign(value)


def export_rules(rules, model):
    """Runs `rules` backwards: `{checkpoint key: numpy array}` from the model's variables."""
    targets = vlzoo_variables(model)
    out, used = {}, set()
    for rule in rules:
        missing = [t for t in rule.targets if t not in targets]
        if missing:
            raise KeyError(f"vlzoo variable {missing[0]!r} is missing from this model.")
        arrays = [to_numpy(targets[t]) for t in rule.targets]
        used.update(rule.targets)
        for key, array in zip(rule.sources, rule.backward(arrays)):
            out[key] = _contiguous(array)
    unused = [t for t in targets if t not in used]
    if unused:
        raise NotImplementedError(f"vlzoo variable(s) with no checkpoint counterpart: {_describe(unused)}.")
    return out


# ----------------------------------------------------------------------------- activations


def torch_activation_name(module, where):
    """vlzoo activation name of a torch activation module (QuickGELU, GELU, GELUTanh)."""
    name = type(module).__name__
    if name == "QuickGELU":
        return "quick_gelu"
    if name in ("GELUTanh", "GELUTanhApprox", "PytorchGELUTanh", "NewGELUActivation"):
        return "gelu_tanh"
    if name in ("GELU", "GELUActivation"):
        return "gelu_tanh" if getattr(module, "approximate", "none") == "tanh" else "gelu"
    raise NotImplementedError(
        f"{where}: activation {name} is not supported by vlzoo (supported: QuickGELU, GELU, GELU tanh)."
    )


def hf_activation_name(name, where):
    """vlzoo activation name of a transformers `hidden_act` string."""
    table = {
        "quick_gelu": "quick_gelu",
        "gelu": "gelu",
        "gelu_pytorch_tanh": "gelu_tanh",
        "gelu_new": "gelu_tanh",
        "gelu_fast": "gelu_tanh",
        "relu": "relu",
    }
    if name not in table:
        raise NotImplementedError(
            f"{where}: `hidden_act={name!r}` is not supported by vlzoo (supported: {sorted(table)})."
        )
    return table[name]


def keras_activation_name(activation, where):
    """vlzoo activation name of a keras-hub `intermediate_activation` (string or function)."""
    name = activation if isinstance(activation, str) else getattr(activation, "__name__", repr(activation))
    table = {"quick_gelu": "quick_gelu", "gelu": "gelu", "gelu_approximate": "gelu_tanh"}
    if name not in table:
        raise NotImplementedError(
            f"{where}: activation {name!r} is not supported by vlzoo (supported: {sorted(table)})."
        )
    return table[name]


# ----------------------------------------------------------------------------- model building


def warn_logit_scale(log_scale, source, family=None):
    """Warns when a checkpoint's log-scale exceeds the training bound `ln 100` of its family's models
    (`family`, when given, a registered family whose class may set no bound: TIPSv2's).

    Scores are exact (the forward pass never clamps), but the first
    fine-tuning step would pull the scale down to the bound.
    """
    if family is not None:
        parameter = inspect.signature(families.get_family(family).model_class).parameters.get("logit_scale_max")
        if parameter is not None and parameter.default is None:
            return
    if float(log_scale) > LOGIT_SCALE_MAX + 1e-6:
        warnings.warn(
            f"{source}: logit_scale is {float(log_scale):.4f} (multiplier {math.exp(float(log_scale)):.2f}), "
            f"above the training bound ln(100) = {LOGIT_SCALE_MAX:.4f}. Scores match the source; "
            "fine-tuning clamps the scale after its first step unless the model is built with "
            "`logit_scale_max=None`.",
            stacklevel=3,
        )


def build_model(family, vision, text, logit_scale, logit_bias=None, dtype=None, name=None, initialize=False):
    """Builds the model of the registered `family` (`vlzoo.families`) from complete tower argument dicts.

    `logit_bias`, when given, is the model's `init_logit_bias` (SigLIP's). With `initialize=False` the
    variables stay uninitialised until `load_rules` fills them; such a model must not be used before that.

    Raises:
        KeyError: `family` is not registered.
        ValueError: a `logit_bias` for a family whose model has none.
    """
    model_class = families.get_family(family).model_class
    kwargs = dict(
        vision=dict(vision), text=dict(text),
        embed_dim=int(text["output_dim"] if text.get("output_dim") is not None else text["hidden_dim"]),
        init_logit_scale=float(logit_scale), dtype=dtype,
    )
    if name is not None:
        kwargs["name"] = name
    if logit_bias is not None:
        if "init_logit_bias" not in inspect.signature(model_class).parameters:
            raise ValueError(f"A {model_class.__name__} model has no `logit_bias`; received {logit_bias}.")
        kwargs["init_logit_bias"] = float(logit_bias)
    if initialize:
        return model_class(**kwargs)
    with without_weights():
        return model_class(**kwargs)


def attach_processing(model, family, image_size, preprocess=None, tokenizer=None, preprocessor=None):
    """Attaches an image preprocessor (and a tokenizer when one applies) to a converted model.

    CLIP-family models with CLIP's 49,408-token vocabulary keep their bundled
    BPE tokenizer (the family default); other vocabularies get an
    `UnavailableTokenizer` unless `tokenizer` is given.
    """
    if preprocessor is None:
        if family == "siglip":
            cfg = dict(mean=SIGLIP_MEAN, std=SIGLIP_STD, interpolation="bicubic", crop="none")
        elif family == "tipsv2":  # transformers' Tipsv2ImageProcessor: [0, 1] pixels, resized, not normalised
            cfg = dict(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), interpolation="bilinear", crop="none")
        else:
            cfg = dict(mean=CLIP_MEAN, std=CLIP_STD, interpolation="bicubic", crop="center")
        cfg.update({k: v for k, v in (preprocess or {}).items() if v is not None})
        preprocessor = ImagePreprocessor(image_size=image_size, **cfg)
    model.preprocessor = preprocessor
    if tokenizer is not None:
        model.tokenizer = tokenizer
    elif family == "clip" and model.text.vocabulary_size == 49408:
        pass  # the family default: vlzoo's bundled CLIP BPE at the tower's context length
    else:
        what = (
            "SigLIP's SentencePiece model is not bundled" if family == "siglip"
            else f"the vocabulary ({model.text.vocabulary_size} tokens) is not CLIP's BPE"
        )
        model.tokenizer = UnavailableTokenizer(
            f"this converted model has none ({what}); set `model.tokenizer = ...` "
            "(e.g. `vlzoo.tokenizers.SentencePieceTokenizer`) or pass `tokenizer=` to the converter."
        )
    return model


def open_clip_preprocess(cfg):
    """vlzoo `ImagePreprocessor` arguments from open_clip's `preprocess_cfg` dict (or None)."""
    if not cfg:
        return None
    out = {}
    if cfg.get("mean") is not None:
        out["mean"] = tuple(float(m) for m in cfg["mean"])
    if cfg.get("std") is not None:
        out["std"] = tuple(float(s) for s in cfg["std"])
    if cfg.get("interpolation") in ("bicubic", "bilinear"):
        out["interpolation"] = cfg["interpolation"]
    mode = cfg.get("resize_mode")
    if mode == "squash":
        out["crop"] = "none"
    elif mode == "shortest":
        out["crop"] = "center"
    return out


# ----------------------------------------------------------------------------- parity


def random_inputs(model, batch_size=3, seed=0):
    """Random images and token ids for a vlzoo model: each text ends with the largest id (CLIP's end token)."""
    rng = np.random.default_rng(seed)
    size, vocab, length = model.vision.image_size, model.text.vocabulary_size, model.text.sequence_length
    images = rng.normal(size=(batch_size, size, size, 3)).astype("float32")
    ids = np.zeros((batch_size, length), "int64")
    mask = np.zeros((batch_size, length), bool)
    for i in range(batch_size):
        n = int(rng.integers(2, length + 1))
        ids[i, :n] = rng.integers(1, vocab - 1, size=n)
        ids[i, n - 1] = vocab - 1
        mask[i, :n] = True
    return images, ids, mask


def _l2(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def peer_outputs(peer, images, token_ids):
    """Normalised image/text embeddings and image-text logits of a peer model, as numpy.

    `peer` is an open_clip model, a transformers `CLIPModel`/`SiglipModel` or a
    keras-hub `CLIPBackbone`/`SigLIPBackbone` (detected by duck typing).
    `images` are channels-last `(B, H, W, 3)`.
    """
    if hasattr(peer, "get_vision_embeddings"):  # keras-hub
        image = to_numpy(peer.get_vision_embeddings(images))
        text = to_numpy(peer.get_text_embeddings(token_ids.astype("int32")))
        logits = to_numpy(peer({"images": images, "token_ids": token_ids.astype("int32")})["vision_logits"])
        return _l2(image), _l2(text), logits
    import torch

    pixels = torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2)))
    ids = torch.from_numpy(token_ids.astype("int64"))
    peer.eval()
    with torch.no_grad():
        if hasattr(peer, "get_image_features"):  # transformers
            out = peer(input_ids=ids, pixel_values=pixels)
            return to_numpy(out.image_embeds), to_numpy(out.text_embeds), to_numpy(out.logits_per_image)
        image = peer.encode_image(pixels, normalize=True)
        text = peer.encode_text(ids, normalize=True)
        logits = peer.logit_scale.exp() * image @ text.T
        if getattr(peer, "logit_bias", None) is not None:
            logits = logits + peer.logit_bias
        return to_numpy(image), to_numpy(text), to_numpy(logits)


def parity(model, peer, batch_size=3, seed=0):
    """Max abs differences between a converted vlzoo model and its peer on random inputs.

    Returns:
        dict with `"image"` and `"text"` (normalised embeddings) and
        `"logits"` (image-text scores) max abs differences.
    """
    images, ids, mask = random_inputs(model, batch_size, seed)
    texts = {"token_ids": ids.astype("int32"), "padding_mask": mask}
    image_embeds = model.encode_image(images, normalize=True)
    text_embeds = model.encode_text(texts, normalize=True)
    logits = to_numpy(model.score(image_embeds, text_embeds))
    image, text = to_numpy(image_embeds["embeds"]), to_numpy(text_embeds["embeds"])
    p_image, p_text, p_logits = peer_outputs(peer, images, ids)
    return {
        "image": float(np.max(np.abs(image - p_image))),
        "text": float(np.max(np.abs(text - p_text))),
        "logits": float(np.max(np.abs(logits - p_logits))),
    }
