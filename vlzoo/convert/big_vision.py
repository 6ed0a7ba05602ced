"""big_vision's SigLIP and SigLIP 2 checkpoints (`.npz`) -> `vlzoo.SigLIP`.

big_vision (google-research/big_vision) releases its two-tower models as `.npz`
files of the flattened flax parameter tree, `/`-separated, under `params/`:

    img/embedding/kernel (p, p, 3, W)    NaFlex: (p * p * 3, W), patches flattened (row, column, channel)
    img/pos_embedding (1, N, W)          NaFlex: (g, g, W), the learned grid it resizes per image
    img/Transformer/encoderblock/...     the blocks, stacked on a leading layer axis (`scan=True`);
                                         unscanned checkpoints: `encoderblock_{i}/...`
        LayerNorm_0, LayerNorm_1         {scale, bias}
        MultiHeadDotProductAttention_0   {query, key, value}/kernel (W, H, d), bias (H, d);
                                         out/kernel (H, d, W), bias (W,)
        MlpBlock_0/Dense_0, Dense_1      {kernel (in, out), bias}
    img/Transformer/encoder_norm
    img/MAPHead_0/{probe (1, 1, W), MultiHeadDotProductAttention_0, LayerNorm_0, MlpBlock_0}
    txt/Embed_0/embedding (V, W), txt/pos_embedding (1, L, W)
    txt/Encoder_0/encoderblock/..., txt/Encoder_0/encoder_norm
    txt/head/{kernel (W, D), bias (D,)}
    t (1,)   the log of the logit scale, as vlzoo's `logit_scale`
    b (1,)   the logit bias

Every kernel is already in Keras' `x @ W` layout: the attention projections only
merge or split their head axes. The checkpoints hold no architecture; the vlzoo
preset of their geometry supplies it (`siglip2_vit_b16` for `siglip2_b16_224.npz`,
`siglip2_vit_b16_256` for `siglip2_b16_naflex.npz`, whose 16 x 16 position grid is
the 256-pixel model's).
"""

import os
import re

import numpy as np

from vlzoo._backends.keras_internals import without_weights
from vlzoo.convert import _common as C
from vlzoo.convert.converters import register_converter
from vlzoo.presets.local import load_local_preset

_STACKED = re.compile(r"^(.*/encoderblock)/(.*)$")


def read_big_vision_params(path_or_arrays):
    """`{key: numpy array}` of a big_vision checkpoint: `params/` removed, stacked blocks split.

    Args:
        path_or_arrays: an `.npz` path or a mapping of its arrays.

    Returns:
        Flat `/`-separated keys; the blocks of a `scan=True` checkpoint
        (`.../encoderblock/<leaf>` with a leading layer axis) become
        `.../encoderblock_{i}/<leaf>`, as an unscanned checkpoint stores them.

    Raises:
        TypeError: neither a path nor a mapping.

    Example:
    >>> params = read_big_vision_params("siglip2_b16_224.npz")  # doctest: +SKIP
    """
    if isinstance(path_or_arrays, (str, os.PathLike)):
        with np.load(os.fspath(path_or_arrays), allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    elif hasattr(path_or_arrays, "items"):
        arrays = {key: np.asarray(value) for key, value in path_or_arrays.items()}
    else:
        raise TypeError("`path_or_arrays` must be an .npz path or a mapping of its arrays; received "
                        f"{type(path_or_arrays).__name__}.")
    params = {}
    for key, value in arrays.items():
        key = key[len("params/"):] if key.startswith("params/") else key
        stacked = _STACKED.match(key)
        if stacked:
            for i, layer in enumerate(value):
                params[f"{stacked.group(1)}_{i}/{stacked.group(2)}"] = layer
        else:
            params[key] = value
    return params


def from_big_vision_checkpoint(path_or_arrays, preset, *, dtype=None, progress=None, **config_overrides):
    """Builds the vlzoo SigLIP preset `preset` holding the weights of a big_vision checkpoint.

    Args:
        path_or_arrays: the `.npz` file (e.g. `siglip2_b16_224.npz`) or its
            arrays; scanned and unscanned block layouts are both read.
        preset: the vlzoo preset of its geometry, a name or a directory:
            `siglip2_vit_b16` (B/16 at 224 px), `siglip2_so400m14_384`, ...;
            for a NaFlex checkpoint the fixed-resolution preset whose position
            grid it stores (`siglip2_vit_b16_256` for the 16 x 16 grid).
        dtype: dtype policy of the model (default: the preset's, float32).
        progress: optional `progress(done, total)` callback while assigning.
        **config_overrides: constructor arguments replacing the preset's.

    Returns:
        A `vlzoo.SigLIP` giving big_vision's embeddings and logits
        (`exp(t) * cos + b`) for images `(B, H, W, 3)` in [-1, 1].

    Raises:
        ValueError: the checkpoint's geometry differs from the preset's (every
            number named with its key), or a shape does not match.
        KeyError: a key is missing or has no vlzoo counterpart (named).

    Example:
    >>> model = vlzoo.convert.from_big_vision_checkpoint("siglip2_b16_224.npz", "siglip2_vit_b16")  # doctest: +SKIP
    """
    params = read_big_vision_params(path_or_arrays)
    with without_weights():
        model = load_local_preset(preset, load_weights=False, dtype=dtype, **config_overrides)
    if getattr(model, "family", None) != "siglip":
        raise ValueError(f"`preset` {preset!r} is a {type(model).__name__} preset; expected a SigLIP preset.")
    naflex = len(C.key_shape(params, "img/embedding/kernel") or ()) == 2  # a Dense over flattened patches
    _check_geometry(params, model, preset, naflex)
    C.load_rules(_rules(model, naflex), params, model, progress=progress)
    C.warn_logit_scale(C.to_numpy(model.logit_scale), "big_vision checkpoint")
    return model


# =============================================================================== rules


def _attention(src, dst, width, heads):
    d = width // heads
    rules = []
    for part in ("query", "key", "value"):
        rules += [C.reshape(f"{src}/{part}/kernel", f"{dst}/{part}/kernel", (width, width), (width, heads, d)),
                  C.reshape(f"{src}/{part}/bias", f"{dst}/{part}/bias", (width,), (heads, d))]
    return rules + [C.reshape(f"{src}/out/kernel", f"{dst}/output/kernel", (width, width), (heads, d, width)),
                    C.copy(f"{src}/out/bias", f"{dst}/output/bias")]


def _norm(src, dst):
    return [C.copy(f"{src}/scale", f"{dst}/gamma"), C.copy(f"{src}/bias", f"{dst}/beta")]


def _mlp(src, dst):
    return [C.copy(f"{src}/Dense_{i}/{leaf}", f"{dst}/fc{i + 1}/{leaf}") for i in (0, 1) for leaf in ("kernel", "bias")]


def _blocks(src, dst, tower):
    rules = []
    for i in range(tower.num_layers):
        s, d = f"{src}/encoderblock_{i}", f"{dst}/block_{i}"
        rules += _norm(f"{s}/LayerNorm_0", f"{d}/ln_1")
        rules += _attention(f"{s}/MultiHeadDotProductAttention_0", f"{d}/attention", tower.hidden_dim, tower.num_heads)
        rules += _norm(f"{s}/LayerNorm_1", f"{d}/ln_2")
        rules += _mlp(f"{s}/MlpBlock_0", f"{d}/mlp")
    return rules


def _rules(model, naflex):
    """big_vision's keys -> the `vlzoo_variables` names of the vlzoo SigLIP `model`."""
    vision, text = model.vision, model.text
    w, p = vision.hidden_dim, vision.patch_size
    positions = (vision.image_size // p) ** 2
    grid = int(round(positions**0.5))
    rules = [
        C.reshape("img/embedding/kernel", "vision/patch_embedding/conv/kernel", (p, p, 3, w),
                  (p * p * 3, w) if naflex else (p, p, 3, w)),
        C.copy("img/embedding/bias", "vision/patch_embedding/conv/bias"),
        C.reshape("img/pos_embedding", "vision/position_embedding/embeddings", (positions, w),
                  (grid, grid, w) if naflex else (1, positions, w)),
        *_blocks("img/Transformer", "vision", vision),
        *_norm("img/Transformer/encoder_norm", "vision/post_norm"),
        C.copy("img/MAPHead_0/probe", "vision/map_head/latent"),
        *_attention("img/MAPHead_0/MultiHeadDotProductAttention_0", "vision/map_head/attention", w, vision.num_heads),
        *_norm("img/MAPHead_0/LayerNorm_0", "vision/map_head/norm"),
        *_mlp("img/MAPHead_0/MlpBlock_0", "vision/map_head/mlp"),
        C.copy("txt/Embed_0/embedding", "text/token_embedding/embeddings"),
        C.reshape("txt/pos_embedding", "text/position_embedding/embeddings", (text.sequence_length, text.hidden_dim),
                  (1, text.sequence_length, text.hidden_dim)),
        *_blocks("txt/Encoder_0", "text", text),
        *_norm("txt/Encoder_0/encoder_norm", "text/post_norm"),
        C.copy("txt/head/kernel", "text/projection/kernel"),
        C.copy("txt/head/bias", "text/projection/bias"),
        C.scalar("t", "logit_scale", (1,)),
        C.scalar("b", "logit_bias", (1,)),
    ]
    return rules


# =============================================================================== geometry


def _layers(params, prefix):
    pattern = re.compile(re.escape(prefix) + r"/encoderblock_(\d+)/")
    indices = {int(m.group(1)) for key in params for m in [pattern.match(key)] if m}
    return max(indices) + 1 if indices else None


def _check_geometry(params, model, preset, naflex):
    vision, text = model.vision, model.text
    positions = C.key_shape(params, "img/pos_embedding")
    positions = None if positions is None else int(np.prod(positions[:-1]))
    kernel = C.key_shape(params, "img/embedding/kernel")
    patch = None if kernel is None else (int(round((kernel[0] / 3) ** 0.5)) if naflex else kernel[0])
    checks = [
        ("vision width", "img/embedding/kernel", C.key_dim(params, "img/embedding/kernel", -1), vision.hidden_dim),
        ("patch size", "img/embedding/kernel", patch, vision.patch_size),
        ("image positions", "img/pos_embedding", positions, (vision.image_size // vision.patch_size) ** 2),
        ("vision layers", "img/Transformer/encoderblock*", _layers(params, "img/Transformer"), vision.num_layers),
        ("vision MLP width", "img/Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel",
         C.key_dim(params, "img/Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel", -1), vision.intermediate_dim),
        ("vision heads", "img/Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel",
         C.key_dim(params, "img/Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel", 1),
         vision.num_heads),
        ("vocabulary", "txt/Embed_0/embedding", C.key_dim(params, "txt/Embed_0/embedding", 0), text.vocabulary_size),
        ("text width", "txt/Embed_0/embedding", C.key_dim(params, "txt/Embed_0/embedding", -1), text.hidden_dim),
        ("context length", "txt/pos_embedding", C.key_dim(params, "txt/pos_embedding", 1), text.sequence_length),
        ("text layers", "txt/Encoder_0/encoderblock*", _layers(params, "txt/Encoder_0"), text.num_layers),
        ("embed dim", "txt/head/kernel", C.key_dim(params, "txt/head/kernel", -1), model.embed_dim),
    ]
    C.check_geometry(checks, params, preset)


register_converter("big_vision", from_big_vision_checkpoint, read=read_big_vision_params)
