"""LoRA adapters on the towers' dense projections, through Keras' own `Dense.enable_lora`.

LoRA (Hu et al., ICLR 2022) trains a low-rank update `W + (alpha / r) A B` of chosen
weight matrices and freezes the rest. `enable_lora(model, rank=8)` enables it on the
query and value projections of every transformer block of both towers (the paper's
choice; `targets` names others: `key`, `output` of the attention, `fc1`, `fc2` of
the MLP) and makes every other variable non-trainable. At rank 8 on query and
value that is 0.3% of a ViT-B/16 CLIP's parameters.

Keras writes a LoRA layer's kernel merged (`W + (alpha / r) A B`) when it saves
weights, so `model.save_to_preset(dir)` of an adapted model is the merged model,
loadable as a plain preset. `merge_lora(model)` gives that model in memory, and
`save_lora_weights` / `load_lora_weights` keep the adapters alone (a few MB) to
apply to the base preset again.

Example:
>>> model = vlzoo.from_preset("clip_vit_b16_openai")  # doctest: +SKIP
>>> enable_lora(model, rank=8)  # doctest: +SKIP
>>> model.compile(optimizer="adamw"); model.fit(dataset)  # doctest: +SKIP
>>> save_lora_weights(model, "adapters.npz")            # the adapters alone  # doctest: +SKIP
>>> model.save_to_preset("clip_b16_lora_merged")        # or merged into a preset  # doctest: +SKIP
"""

import json
import numbers
import os

import keras
import numpy as np

from vlzoo.training._models import TOWERS, blank_copy, check_model

__all__ = ["LORA_TARGETS", "enable_lora", "load_lora_weights", "lora_layers", "merge_lora", "save_lora_weights"]

# Target name -> where the Dense layer sits in a `TransformerBlock`.
LORA_TARGETS = {"query": ("attention", "query"), "key": ("attention", "key"), "value": ("attention", "value"),
                "output": ("attention", "output_dense"), "fc1": ("mlp", "fc1"), "fc2": ("mlp", "fc2")}
_CONFIG_KEY = "__lora_config__"


def _check_names(values, allowed, name):
    values = (values,) if isinstance(values, str) else tuple(values)
    unknown = [v for v in values if v not in allowed]
    if not values or unknown:
        raise ValueError(f"`{name}` must name some of {list(allowed)}; received {list(values)}.")
    return values


def _targets(model, targets, towers):
    """The Dense layers `targets` names in every block of `towers`, in order."""
    layers = []
    for tower in towers:
        for block in getattr(model, TOWERS[tower]).blocks:
            for target in targets:
                part, name = LORA_TARGETS[target]
                layers.append(getattr(getattr(block, part), name))
    return layers


def lora_layers(model):
    """The Dense layers of `model`'s towers that have LoRA enabled."""
    return [layer for layer in _targets(model, tuple(LORA_TARGETS), tuple(TOWERS)) if layer.lora_enabled]


def _lora_variables(model):
    return [v for layer in lora_layers(model) for v in (layer.lora_kernel_a, layer.lora_kernel_b)]


def enable_lora(model, rank=8, targets=("query", "value"), towers=("image", "text"), alpha=None):
    """Enables LoRA of `rank` on the `targets` of every block of `towers`; freezes every other variable.

    Args:
        model: a vlzoo model, not yet adapted.
        rank: the rank `r` of the update `A B` (`A` `(d_in, r)` He-uniform, `B` `(r, d_out)` zeros,
            Keras' initialisers, so training starts from the model as it is).
        targets: the block projections to adapt, among `LORA_TARGETS`.
        towers: `"image"`, `"text"` or both.
        alpha: the update's scale numerator (`alpha / rank`); None: `rank` (scale 1).

    Returns:
        The number of trainable parameters (the adapters'), for the record.

    Raises:
        TypeError: `model` is not a vlzoo model.
        ValueError: `rank` not a positive int, unknown `targets` or `towers`, or LoRA already
            enabled.

    Example:
    >>> enable_lora(model, rank=8)  # doctest: +SKIP
    """
    check_model(model)
    if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or rank < 1:
        raise ValueError(f"`rank` must be a positive int; received {rank!r}.")
    targets = _check_names(targets, LORA_TARGETS, "targets")
    towers = _check_names(towers, TOWERS, "towers")
    if lora_layers(model):
        raise ValueError("LoRA is already enabled on this model; enable it once (merge_lora gives a plain model).")
    for layer in _targets(model, targets, towers):
        layer.enable_lora(int(rank), lora_alpha=alpha)
    _freeze_all_but_adapters(model)
    return sum(int(np.prod(v.shape)) for v in model.trainable_weights)


def _freeze_all_but_adapters(model):
    adapters = {id(v) for v in _lora_variables(model)}
    for variable in model.weights:
        if id(variable) not in adapters:
            variable.trainable = False


def _config(model):
    layers = lora_layers(model)
    return {"rank": layers[0].lora_rank, "alpha": layers[0].lora_alpha,
            "layers": [layer.path for layer in layers]}


def save_lora_weights(model, path):
    """Writes `model`'s LoRA adapters alone to `path` (`.npz`: each `A` and `B` by variable path,
    and the rank, alpha and adapted layers); ValueError when `model` has no adapters.

    >>> save_lora_weights(model, "adapters.npz")  # doctest: +SKIP
    """
    check_model(model)
    if not lora_layers(model):
        raise ValueError("`model` has no LoRA adapters to save (see enable_lora).")
    arrays = {v.path: keras.ops.convert_to_numpy(v.value) for v in _lora_variables(model)}
    arrays[_CONFIG_KEY] = np.array(json.dumps(_config(model)))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "wb") as f:
        np.savez(f, **arrays)


def load_lora_weights(model, path):
    """Applies the adapters `save_lora_weights` wrote to `model` (the base model they were trained on,
    or one with LoRA already enabled alike): enables LoRA as saved, then assigns `A` and `B`.

    Raises:
        FileNotFoundError: `path` is missing.
        ValueError: not a file `save_lora_weights` wrote, adapters of another rank or layer set than
            `model`'s, layers `model` lacks, or an array of the wrong shape.

    >>> load_lora_weights(vlzoo.from_preset("clip_vit_b16_openai"), "adapters.npz")  # doctest: +SKIP
    """
    check_model(model)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"LoRA weights file not found: {path}.")
    with np.load(path) as file:
        arrays = {name: file[name] for name in file.files}
    if _CONFIG_KEY not in arrays:
        raise ValueError(f"{path} is not a LoRA weights file written by save_lora_weights (no {_CONFIG_KEY}).")
    config = json.loads(str(arrays.pop(_CONFIG_KEY)))
    if not lora_layers(model):
        by_path = {layer.path: layer for layer in _targets(model, tuple(LORA_TARGETS), tuple(TOWERS))}
        unknown = [p for p in config["layers"] if p not in by_path]
        if unknown:
            raise ValueError(f"{path} adapts layers this model lacks: {unknown[:3]}.")
        for layer_path in config["layers"]:
            by_path[layer_path].enable_lora(config["rank"], lora_alpha=config["alpha"])
        _freeze_all_but_adapters(model)
    if _config(model) != config:
        raise ValueError(f"{path} holds adapters of rank {config['rank']} on {len(config['layers'])} layers; the "
                         f"model's are of rank {_config(model)['rank']} on {len(lora_layers(model))}.")
    for variable in _lora_variables(model):
        value = arrays.get(variable.path)
        if value is None or value.shape != tuple(variable.shape):
            raise ValueError(f"{path}: no array of shape {tuple(variable.shape)} for {variable.path}.")
        variable.assign(value)


def merge_lora(model):
    """A new model of `model`'s config without adapters, each adapted kernel replaced by
    `W + (alpha / r) A B` (computed in float32, stored in the kernel's dtype); the tokenizer and
    preprocessor are `model`'s. Its outputs equal the adapted model's.

    >>> plain = merge_lora(model)  # doctest: +SKIP
    >>> lora_layers(plain)  # doctest: +SKIP
    []
    """
    check_model(model)
    merged_kernels = {}
    for layer in lora_layers(model):
        kernel, = [v for v in layer.weights if v.path == f"{layer.path}/kernel"]
        update = np.matmul(keras.ops.convert_to_numpy(layer.lora_kernel_a.value),
                           keras.ops.convert_to_numpy(layer.lora_kernel_b.value))
        value = keras.ops.convert_to_numpy(kernel.value).astype(np.float32)
        merged_kernels[kernel.path] = value + (layer.lora_alpha / layer.lora_rank) * update  # cast by assign
    adapters = {id(v) for v in _lora_variables(model)}
    sources = [v for v in model.weights if id(v) not in adapters]
    merged = blank_copy(model)
    for target, source in zip(merged.weights, sources, strict=True):
        target.assign(merged_kernels.get(source.path, keras.ops.convert_to_numpy(source.value)))
    return merged
