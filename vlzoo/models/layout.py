"""Sharding rules of the models' weights, and the `keras.distribution.LayoutMap` they give on a mesh.

- `TOWER_RULES`: `(path pattern, axes)` of the towers' Megatron-style splits, matched with
  `re.fullmatch` on `variable.path`; `MODEL_AXIS` ("model") marks the dimension split over the
  mesh's model axis. A family adds its own `extra_layout_rules`.
- `layout_map(weights, rules, mesh, model_axis)`: what `ContrastiveModel.get_layout_map` returns.
- `axes_for(rules, path, shape, model_axis, size)`: one weight's axes under the rules.
"""

import re

import keras

from vlzoo._backends import workarounds

MODEL_AXIS = "model"
_M = MODEL_AXIS  # the placeholder in the rules, replaced by the mesh's model axis

# (path pattern, axes) shared by every family's towers; `re.fullmatch` on `variable.path`.
TOWER_RULES = (
    (r".*/attention/(query|key|value)/kernel", (None, _M)),
    (r".*/attention/(query|key|value)/bias", (_M,)),
    (r".*/attention/output/kernel", (_M, None)),
    (r".*/mlp/fc1/kernel", (None, _M)),
    (r".*/mlp/fc1/bias", (_M,)),
    (r".*/mlp/fc2/kernel", (_M, None)),
    (r".*/(token|position)_embedding/embeddings", (None, _M)),
    (r".*/patch_embedding/conv/kernel", (None, None, None, _M)),
    (r"(.*/)?\w*projection/kernel", (_M, None)),
)


def axes_for(rules, path, shape, model_axis, size):
    """The axes of the weight at `path` of `shape` under the first rule that matches it, None if none does.

    A dimension the rule splits (`MODEL_AXIS`) is named `model_axis` when `size` (the mesh's model axis
    length) divides it, and replicated (None) otherwise.

    Raises:
        ValueError: if the matching rule has another number of axes than `shape`.

    Example:
    >>> axes_for((("a/kernel", (None, "model")),), "a/kernel", (8, 10), "model", 4)
    (None, None)
    """
    for pattern, axes in rules:
        if re.fullmatch(pattern, path):
            if len(axes) != len(shape):
                raise ValueError(f"Layout rule {pattern!r} gives {len(axes)} axes to {path} of shape {shape}.")
            return tuple(model_axis if axis == _M and dim % size == 0 else None
                         for axis, dim in zip(axes, shape))
    return None


def layout_map(weights, rules, mesh, model_axis=MODEL_AXIS):
    """The `keras.distribution.LayoutMap` of `weights` under `rules` on `mesh`: one entry (the weight's
    exact path) per weight split over `model_axis`; the others are replicated.

    Raises:
        NotImplementedError: on a backend other than JAX.
        TypeError: if `mesh` is not a `keras.distribution.DeviceMesh`.
        ValueError: if `mesh` has no axis `model_axis`.
    """
    workarounds.check_distribution_backend("A keras.distribution.LayoutMap")
    if not isinstance(mesh, keras.distribution.DeviceMesh):
        raise TypeError(f"`mesh` must be a keras.distribution.DeviceMesh; received {type(mesh).__name__}.")
    if model_axis not in mesh.axis_names:
        raise ValueError(f"`mesh` has axes {tuple(mesh.axis_names)}; `model_axis` {model_axis!r} is not one of them.")
    size = mesh.shape[list(mesh.axis_names).index(model_axis)]
    layouts = keras.distribution.LayoutMap(mesh)
    for variable in weights:
        axes = axes_for(rules, variable.path, tuple(variable.shape), model_axis, size)
        if axes is not None and model_axis in axes:
            layouts[variable.path] = axes
    return layouts
