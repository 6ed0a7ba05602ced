"""keras-hub `CLIPBackbone` / `SigLIPBackbone` -> vlzoo.

Reads the backbone's layers and variables (duck-typed; keras-hub is not
imported). Load a keras-hub preset you have locally with
`keras_hub.models.Backbone.from_preset("/path/to/preset")` and pass the
backbone.

Known difference: keras-hub's CLIP text encoder normalises its output with
LayerNorm epsilon 1e-6 while its blocks use 1e-5; vlzoo's text tower has one
epsilon for all its LayerNorms (1e-5 here). The effect on normalised text
embeddings is below float32 noise (the tests bound it).

keras-hub's CLIP image encoder looks its position table up through a
`position_ids` weight (zeros in a freshly built encoder, `arange` in presets);
the converter gathers the table through it, so either state converts exactly.
"""

import functools
import warnings

import numpy as np

from vlzoo.convert import _common as C
from vlzoo.convert.converters import architecture
from vlzoo.convert.converters import architectures
from vlzoo.convert.converters import register_architecture


def register_backbone(class_name, spec):
    """Registers the conversion of the keras-hub backbone class `class_name` (a subclass converts as it).

    `spec(backbone)` -> `{"family", "vision", "text", "logit_scale", "logit_bias", "rules", "sources"}`:
    as a transformers spec (`vlzoo.convert.transformers.TransformersModelType`), with `sources` the
    backbone's variables by the names the rules read; every backbone variable must be among them.
    """
    register_architecture("keras_hub", class_name, spec)


def from_keras_hub(backbone, *, dtype=None, tokenizer=None, preprocessor=None, progress=None):
    """Converts a keras-hub backbone of a registered class (`CLIPBackbone`, `SigLIPBackbone`) to a vlzoo model.

    Args:
        backbone: the keras-hub backbone.
        dtype: dtype policy of the vlzoo model (default float32).
        tokenizer: tokenizer to attach (default: vlzoo's CLIP BPE for CLIP
            with CLIP's vocabulary; none for SigLIP).
        preprocessor: image preprocessor to attach (default: the family's
            standard one at the backbone's resolution).
        progress: optional `progress(done, total)` callback while assigning.

    Returns:
        `vlzoo.CLIP` or `vlzoo.SigLIP`.

    Raises:
        KeyError: a backbone variable has no vlzoo counterpart (named).
        NotImplementedError: an unsupported backbone or feature.

    Example:
    >>> backbone = keras_hub.models.CLIPBackbone.from_preset("dir")  # doctest: +SKIP
    >>> model = vlzoo.convert.from_keras_hub(backbone)  # doctest: +SKIP
    """
    name = type(backbone).__name__
    registered = architectures("keras_hub")
    key = next((cls.__name__ for cls in type(backbone).__mro__ if cls.__name__ in registered), None)
    if key is None:
        raise NotImplementedError(
            f"from_keras_hub: {name} is not supported; pass a keras-hub {' or '.join(registered)}."
        )
    spec = architecture("keras_hub", key)(backbone)
    sources = spec["sources"]
    mapped = {id(v) for v in sources.values()}
    for variable in backbone.weights:
        if id(variable) not in mapped:
            raise KeyError(
                f"keras-hub variable {variable.path!r} {tuple(variable.shape)} has no vlzoo counterpart "
                f"(in {name})."
            )
    C.warn_logit_scale(spec["logit_scale"], f"keras-hub {name}")
    model = C.build_model(
        spec["family"], spec["vision"], spec["text"], spec["logit_scale"], spec["logit_bias"], dtype=dtype,
    )
    C.load_rules(spec["rules"], sources, model, progress=progress)
    return C.attach_processing(
        model, spec["family"], spec["vision"]["image_size"], tokenizer=tokenizer, preprocessor=preprocessor,
    )


# ----------------------------------------------------------------------------- walking keras-hub layers


class _Sources(dict):
    """`{name: keras variable}` filled while walking the backbone."""

    def dense(self, name, layer):
        self[f"{name}.kernel"] = layer.kernel
        if layer.bias is not None:
            self[f"{name}.bias"] = layer.bias

    def norm(self, name, layer):
        self[f"{name}.gamma"] = layer.gamma
        self[f"{name}.beta"] = layer.beta

    def mha(self, name, layer):
        for part in ("_query_dense", "_key_dense", "_value_dense", "_output_dense"):
            self.dense(f"{name}.{part}", getattr(layer, part))


def _mha_rules(src, dst, hidden_dim, num_heads, bias=True):
    head_dim = hidden_dim // num_heads
    rules = []
    for part, ours in (("_query_dense", "query"), ("_key_dense", "key"), ("_value_dense", "value")):
        rules.append(C.reshape(f"{src}.{part}.kernel", f"{dst}/{ours}/kernel", (hidden_dim, hidden_dim),
                               (hidden_dim, num_heads, head_dim)))
        if bias:
            rules.append(C.reshape(f"{src}.{part}.bias", f"{dst}/{ours}/bias", (hidden_dim,), (num_heads, head_dim)))
    rules.append(C.reshape(f"{src}._output_dense.kernel", f"{dst}/output/kernel", (hidden_dim, hidden_dim),
                           (num_heads, head_dim, hidden_dim)))
    if bias:
        rules.append(C.copy(f"{src}._output_dense.bias", f"{dst}/output/bias"))
    return rules


def _gather_positions(ids_key, table_key, dst):
    """keras-hub looks its position table up through a `position_ids` weight (zeros in a freshly built
    CLIPVisionEncoder, `arange` once a preset is loaded): vlzoo's table is `table[position_ids]`."""

    def forward(a):
        ids, table = np.reshape(a[0], -1).astype("int64"), a[1]
        if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
            raise ValueError(f"keras-hub weight {ids_key!r} holds positions outside [0, {table.shape[0]}).")
        return [table[ids]]

    return C.Rule(
        [ids_key, table_key], [dst], forward,
        lambda a: [np.arange(a[0].shape[0])[None], a[0]],
    )


def _norm_rules(src, dst):
    return [C.copy(f"{src}.gamma", f"{dst}/gamma"), C.copy(f"{src}.beta", f"{dst}/beta")]


def _dense_rules(src, dst, bias=True):
    rules = [C.copy(f"{src}.kernel", f"{dst}/kernel")]
    if bias:
        rules.append(C.copy(f"{src}.bias", f"{dst}/bias"))
    return rules


def _check_mha(layer, where):
    if not getattr(layer, "_use_bias", True):
        raise NotImplementedError(f"{where}: attention without biases is not supported by vlzoo.")
    return int(layer._num_heads)


def _image_size(encoder, where):
    shape = tuple(encoder.image_shape)
    fmt = getattr(encoder.embedding, "data_format", "channels_last")
    height, width, channels = (shape[0], shape[1], shape[2]) if fmt == "channels_last" else (shape[1], shape[2], shape[0])
    if height != width or channels != 3:
        raise NotImplementedError(f"{where}: image shape {shape} is not supported (square RGB only).")
    # The patch convolution never reads the pixels past the last whole patch (SigLIP 2 So400m/14 at 384 px:
    # 27 patches of 14, 378 px), so the tower is built at that size, as the transformers converter does.
    return int(height) - int(height) % int(encoder.patch_size)


def _scalar(variable):
    return float(np.reshape(C.to_numpy(variable), -1)[0])


# ----------------------------------------------------------------------------- CLIP


# keras-hub's attribute names, per block role, in its CLIP and SigLIP encoders.
_CLIP_BLOCK = dict(ln_1="layer_norm_1", attention="attention", ln_2="layer_norm_2", fc1="dense_1", fc2="dense_2")
_SIGLIP_BLOCK = dict(ln_1="layer_norm1", attention="self_attn", ln_2="layer_norm2", fc1="mlp.fc1", fc2="mlp.fc2")


def _blocks(sources, rules, encoder, src, dst, hidden_dim, num_heads, names, reject_causal=False):
    """Maps every transformer block of a keras-hub encoder onto vlzoo's `block_{i}`."""
    for i, block in enumerate(encoder.encoder_layers):
        s, d = f"{src}.encoder_layers.{i}", f"{dst}/block_{i}"
        if reject_causal and block.use_causal_mask:
            raise NotImplementedError(f"keras-hub {src} block {i}: causal SigLIP blocks are not supported.")
        layer = {role: functools.reduce(getattr, path.split("."), block) for role, path in names.items()}
        _check_mha(layer["attention"], f"keras-hub {src} block {i}")
        sources.norm(f"{s}.{names['ln_1']}", layer["ln_1"])
        sources.mha(f"{s}.{names['attention']}", layer["attention"])
        sources.norm(f"{s}.{names['ln_2']}", layer["ln_2"])
        sources.dense(f"{s}.{names['fc1']}", layer["fc1"])
        sources.dense(f"{s}.{names['fc2']}", layer["fc2"])
        rules += _norm_rules(f"{s}.{names['ln_1']}", f"{d}/ln_1")
        rules += _mha_rules(f"{s}.{names['attention']}", f"{d}/attention", hidden_dim, num_heads)
        rules += _norm_rules(f"{s}.{names['ln_2']}", f"{d}/ln_2")
        rules += _dense_rules(f"{s}.{names['fc1']}", f"{d}/mlp/fc1")
        rules += _dense_rules(f"{s}.{names['fc2']}", f"{d}/mlp/fc2")


def _clip(backbone):
    ve, te = backbone.vision_encoder, backbone.text_encoder
    sources, rules = _Sources(), []
    where = "keras-hub CLIPVisionEncoder"
    block = ve.encoder_layers[0]
    eps = float(block.layer_norm_1.epsilon)
    projection_dim = int(backbone.projection_dim)
    vision = dict(
        image_size=_image_size(ve, where), patch_size=int(ve.patch_size), hidden_dim=int(ve.hidden_dim),
        num_layers=int(ve.num_layers), num_heads=int(ve.num_heads), intermediate_dim=int(ve.intermediate_dim),
        output_dim=projection_dim, num_prefix_tokens=1, pooling="cls",
        activation=C.keras_activation_name(ve.intermediate_activation, where), layer_norm_epsilon=eps,
        use_pre_norm=True, patch_bias=False, projection_bias=False,
    )
    width = vision["hidden_dim"]
    emb = ve.embedding
    sources["vision_encoder.embedding.patch_embedding.kernel"] = emb.patch_embedding.kernel
    if emb.patch_embedding.use_bias:
        raise NotImplementedError(f"{where}: a patch embedding with bias is not a CLIP layout.")
    sources["vision_encoder.embedding.class_embedding"] = emb.class_embedding
    sources["vision_encoder.embedding.position_embedding.embeddings"] = emb.position_embedding.embeddings
    sources["vision_encoder.embedding.position_ids"] = emb.position_ids
    sources.norm("vision_encoder.pre_layer_norm", ve.pre_layer_norm)
    sources.norm("vision_encoder.layer_norm", ve.layer_norm)
    rules += [
        C.copy("vision_encoder.embedding.patch_embedding.kernel", "vision/patch_embedding/conv/kernel"),
        C.reshape("vision_encoder.embedding.class_embedding", "vision/prefix_tokens", (1, width), (width,)),
        _gather_positions(
            "vision_encoder.embedding.position_ids", "vision_encoder.embedding.position_embedding.embeddings",
            "vision/position_embedding/embeddings",
        ),
        *_norm_rules("vision_encoder.pre_layer_norm", "vision/pre_norm"),
    ]
    _blocks(sources, rules, ve, "vision_encoder", "vision", width, vision["num_heads"], _CLIP_BLOCK)
    rules += _norm_rules("vision_encoder.layer_norm", "vision/post_norm")
    sources.dense("vision_projection", backbone.vision_projection)
    rules += _dense_rules("vision_projection", "vision/projection", bias=False)

    where = "keras-hub CLIPTextEncoder"
    if int(te.embedding_dim) != int(te.hidden_dim):
        raise NotImplementedError(f"{where}: `embedding_dim` != `hidden_dim` is not supported by vlzoo.")
    text_eps = float(te.encoder_layers[0].layer_norm_1.epsilon)
    if not all(getattr(b, "use_causal_mask", True) for b in te.encoder_layers):
        raise NotImplementedError(f"{where}: a bidirectional CLIP text encoder is not supported by this converter.")
    text = dict(
        vocabulary_size=int(te.vocabulary_size), sequence_length=int(te.max_sequence_length),
        hidden_dim=int(te.hidden_dim), num_layers=int(te.num_layers), num_heads=int(te.num_heads),
        intermediate_dim=int(te.intermediate_dim), output_dim=projection_dim, causal=True, pooling="eot",
        use_padding_mask=False, activation=C.keras_activation_name(te.intermediate_activation, where),
        layer_norm_epsilon=text_eps, projection_bias=False,
    )
    sources["text_encoder.embedding.token_embedding.embeddings"] = te.embedding.token_embedding.embeddings
    sources["text_encoder.embedding.position_embedding.position_embeddings"] = (
        te.embedding.position_embedding.position_embeddings
    )
    if getattr(te.embedding.token_embedding, "reverse_embeddings", None) is not None:
        raise NotImplementedError(f"{where}: untied reverse token embeddings are not supported by vlzoo.")
    rules += [
        C.copy("text_encoder.embedding.token_embedding.embeddings", "text/token_embedding/embeddings"),
        C.copy("text_encoder.embedding.position_embedding.position_embeddings", "text/position_embedding/embeddings"),
    ]
    _blocks(sources, rules, te, "text_encoder", "text", text["hidden_dim"], text["num_heads"], _CLIP_BLOCK)
    sources.norm("text_encoder.layer_norm", te.layer_norm)
    rules += _norm_rules("text_encoder.layer_norm", "text/post_norm")
    sources.dense("text_projection", backbone.text_projection)
    rules += _dense_rules("text_projection", "text/projection", bias=False)
    sources["clip_head.logit_scale"] = backbone.clip_head.logit_scale
    rules.append(C.scalar("clip_head.logit_scale", "logit_scale"))
    return dict(
        family="clip", vision=vision, text=text, sources=sources, rules=rules,
        logit_scale=_scalar(backbone.clip_head.logit_scale), logit_bias=None,
    )


# ----------------------------------------------------------------------------- SigLIP


def _siglip(backbone):
    ve, te = backbone.vision_encoder, backbone.text_encoder
    sources, rules = _Sources(), []
    where = "keras-hub SigLIPVisionEncoder"
    eps = float(ve.encoder_layers[0].layer_norm1.epsilon)
    post_eps = float(ve.post_layer_norm.epsilon)
    if post_eps != eps:
        warnings.warn(
            f"{where}: its final LayerNorm epsilon ({post_eps:g}) differs from its blocks' ({eps:g}); vlzoo's "
            f"image tower uses {eps:g} for all of them.",
            stacklevel=3,
        )
    vision = dict(
        image_size=_image_size(ve, where), patch_size=int(ve.patch_size), hidden_dim=int(ve.hidden_dim),
        num_layers=int(ve.num_layers), num_heads=int(ve.num_heads), intermediate_dim=int(ve.intermediate_dim),
        output_dim=None, num_prefix_tokens=0, pooling="map",
        activation=C.keras_activation_name(ve.intermediate_activation, where), layer_norm_epsilon=eps,
        use_pre_norm=False, patch_bias=True, projection_bias=False,
    )
    width, heads = vision["hidden_dim"], vision["num_heads"]
    emb = ve.embedding
    if not emb.patch_embedding.use_bias:
        raise NotImplementedError(f"{where}: a patch embedding without bias is not a SigLIP layout.")
    sources.dense("vision_encoder.embedding.patch_embedding", emb.patch_embedding)
    sources["vision_encoder.embedding.position_embedding.embeddings"] = emb.position_embedding.embeddings
    sources["vision_encoder.embedding.position_ids"] = emb.position_ids
    rules += [
        *_dense_rules("vision_encoder.embedding.patch_embedding", "vision/patch_embedding/conv"),
        _gather_positions(
            "vision_encoder.embedding.position_ids", "vision_encoder.embedding.position_embedding.embeddings",
            "vision/position_embedding/embeddings",
        ),
    ]
    _blocks(sources, rules, ve, "vision_encoder", "vision", width, heads, _SIGLIP_BLOCK, reject_causal=True)
    sources.norm("vision_encoder.post_layer_norm", ve.post_layer_norm)
    rules += _norm_rules("vision_encoder.post_layer_norm", "vision/post_norm")
    head = ve.head
    if int(head.num_heads) != heads or int(head.intermediate_dim) != vision["intermediate_dim"]:
        raise NotImplementedError(f"{where}: a MAP head with its own geometry is not supported by vlzoo.")
    if float(head.layer_norm_epsilon) != eps:
        raise NotImplementedError(f"{where}: a MAP head LayerNorm epsilon unlike the blocks' is not supported.")
    _check_mha(head.attention, f"{where} head")
    sources["vision_encoder.head.probe"] = head.probe
    sources.mha("vision_encoder.head.attention", head.attention)
    sources.norm("vision_encoder.head.layer_norm", head.layer_norm)
    sources.dense("vision_encoder.head.mlp.fc1", head.mlp.fc1)
    sources.dense("vision_encoder.head.mlp.fc2", head.mlp.fc2)
    rules += [
        C.copy("vision_encoder.head.probe", "vision/map_head/latent"),
        *_mha_rules("vision_encoder.head.attention", "vision/map_head/attention", width, heads),
        *_norm_rules("vision_encoder.head.layer_norm", "vision/map_head/norm"),
        *_dense_rules("vision_encoder.head.mlp.fc1", "vision/map_head/mlp/fc1"),
        *_dense_rules("vision_encoder.head.mlp.fc2", "vision/map_head/mlp/fc2"),
    ]

    where = "keras-hub SigLIPTextEncoder"
    if int(te.embedding_dim) != int(te.hidden_dim):
        raise NotImplementedError(f"{where}: `embedding_dim` != `hidden_dim` is not supported by vlzoo.")
    text_eps = float(te.layer_norm_epsilon)
    text = dict(
        vocabulary_size=int(te.vocabulary_size), sequence_length=int(te.max_sequence_length),
        hidden_dim=int(te.hidden_dim), num_layers=int(te.num_layers), num_heads=int(te.num_heads),
        intermediate_dim=int(te.intermediate_dim), output_dim=int(te.projection_dim), causal=False,
        pooling="last", use_padding_mask=False,
        activation=C.keras_activation_name(te.intermediate_activation, where), layer_norm_epsilon=text_eps,
        projection_bias=True,
    )
    temb = te.embedding
    for part in ("token_embedding", "position_embedding"):
        layer = getattr(temb, part)
        if getattr(layer, "reverse_embeddings", None) is not None:
            raise NotImplementedError(f"{where}: untied reverse embeddings are not supported by vlzoo.")
        sources[f"text_encoder.embedding.{part}.embeddings"] = layer.embeddings
    sources["text_encoder.embedding.position_ids"] = temb.position_ids
    rules += [
        C.copy("text_encoder.embedding.token_embedding.embeddings", "text/token_embedding/embeddings"),
        _gather_positions(
            "text_encoder.embedding.position_ids", "text_encoder.embedding.position_embedding.embeddings",
            "text/position_embedding/embeddings",
        ),
    ]
    _blocks(
        sources, rules, te, "text_encoder", "text", text["hidden_dim"], text["num_heads"], _SIGLIP_BLOCK,
        reject_causal=True,
    )
    sources.norm("text_encoder.post_layer_norm", te.post_layer_norm)
    rules += _norm_rules("text_encoder.post_layer_norm", "text/post_norm")
    sources.dense("text_encoder.head", te.head)
    rules += _dense_rules("text_encoder.head", "text/projection")
    head = backbone.siglip_head
    sources["siglip_head.logit_scale"] = head.logit_scale
    sources["siglip_head.logit_bias"] = head.logit_bias
    rules += [C.scalar("siglip_head.logit_scale", "logit_scale"), C.scalar("siglip_head.logit_bias", "logit_bias")]
    return dict(
        family="siglip", vision=vision, text=text, sources=sources, rules=rules,
        logit_scale=_scalar(head.logit_scale), logit_bias=_scalar(head.logit_bias),
    )


register_backbone("CLIPBackbone", _clip)
register_backbone("SigLIPBackbone", _siglip)
