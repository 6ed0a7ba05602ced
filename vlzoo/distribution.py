"""Training on several devices with Keras' own `keras.distribution` (JAX backend).

Data parallelism needs nothing from vlzoo: set `keras.distribution.DataParallel()`
before building the model and `fit` as usual. Each batch is split over the devices
while the train step stays one program over the global batch, so the contrastive
losses see every pair of the global batch: the negatives of each image are all the
captions of all the devices, as the papers train, and the loss and gradients are
those of one device holding the whole batch (tested for every family on 8 simulated
CPU devices).

Model parallelism shards the big presets' weights: a model's `get_layout_map(mesh)`
gives its `keras.distribution.LayoutMap`, and `layout_map(preset, mesh)` the same
for a preset name or directory, built without allocating its weights: the Megatron split of
every transformer block (query, key, value and first MLP matrices by output
column, the attention output and second MLP matrices by input row), token and
position tables by width, projections by input row, and each family's own large
matrices (Llip's cross-attention, SPARC's patch head, STAIR's vocabulary-head
transform). A dimension that the mesh's model axis does not divide is replicated
instead; everything else (norms, biases of row-split matrices, scales) is
replicated.

```python
import keras, vlzoo

devices = keras.distribution.list_devices()                       # e.g. 8
mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), devices)
layouts = vlzoo.distribution.layout_map("llip_vit_g14", mesh)
keras.distribution.set_distribution(
    keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name="batch"))
model = vlzoo.from_preset("llip_vit_g14")                           # weights created sharded
```

Backends: in Keras 3.15 `keras.distribution` runs on JAX only (its TensorFlow
part is an unfinished prototype; PyTorch has none). On TensorFlow and PyTorch
vlzoo trains on several devices with their own engines (`tf.distribute`,
`torch.distributed`: `vlzoo.parallel`, docs/distributed.md), and building or
compiling a vlzoo model while a `keras.distribution` is set raises an error that
says so (`check_backend`).
"""

import keras

from vlzoo.presets import catalogue
from vlzoo._backends.keras_internals import without_weights
from vlzoo._backends.workarounds import check_distribution_backend as check_backend
from vlzoo.models.layout import MODEL_AXIS

__all__ = ["MODEL_AXIS", "check_backend", "layout_map", "sharded_dimensions"]


def _model_for(model):
    """`model` itself, or the preset it names built without allocating weights."""
    if isinstance(model, keras.Model):
        return model
    if not isinstance(model, str):
        raise TypeError(f"`model` must be a vlzoo model, a preset name or a preset directory; "
                        f"received {type(model).__name__}.")
    config = catalogue.model_config(model)
    with without_weights():
        return keras.saving.deserialize_keras_object(config)


def layout_map(model, mesh, model_axis=MODEL_AXIS):
    """The `keras.distribution.LayoutMap` that shards `model`'s weights over `mesh`: `model.get_layout_map(mesh)`,
    also for a preset that is not built.

    Args:
        model: a vlzoo model, or a preset name or directory (built abstractly:
            its weights are never allocated, so any preset works).
        mesh: a `keras.distribution.DeviceMesh` with an axis named `model_axis`
            (e.g. shape `(2, 4)`, axes `("batch", "model")`).
        model_axis: the mesh axis that splits the weights.

    Returns:
        A `LayoutMap` with one entry per sharded weight (its exact path);
        weights without an entry are replicated. Pass it to
        `keras.distribution.ModelParallel(layout_map=..., batch_dim_name=...)`
        and build the model under that distribution.

    Raises:
        NotImplementedError: on a backend other than JAX.
        TypeError: if `mesh` is not a `keras.distribution.DeviceMesh`.
        ValueError: if `mesh` has no axis `model_axis`.

    Example:
    >>> mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), keras.distribution.list_devices())
    >>> layouts = vlzoo.distribution.layout_map("clip_vit_b16", mesh)
    >>> layouts["vision/block_0/mlp/fc1/kernel"].axes
    (None, 'model')
    """
    check_backend("vlzoo.distribution.layout_map")
    return _model_for(model).get_layout_map(mesh, model_axis)


def sharded_dimensions(model):
    """`{path: axes}` of the weights of a built `model` that are split over devices (JAX).

    Reads each weight's actual sharding, e.g. to check that a `ModelParallel`
    build took the layouts. Replicated weights are left out.
    """
    check_backend("vlzoo.distribution.sharded_dimensions")
    result = {}
    for variable in model.weights:
        spec = getattr(getattr(variable.value, "sharding", None), "spec", None)
        if spec is not None and any(axis is not None for axis in spec):
            result[variable.path] = tuple(spec) + (None,) * (len(variable.shape) - len(spec))
    return result
