"""`vlzoo.distribution`: layout maps of the presets built abstractly, and clear errors off JAX.

Training under DataParallel and ModelParallel (the Llip G/14 layout) runs over 2 JAX processes x 4 CPU
devices in `test_parallel.py`, every family against one device.
"""

import keras
import pytest

import vlzoo
from vlzoo import distribution
from vlzoo.models import layout

JAX_ONLY = pytest.mark.skipif(keras.backend.backend() != "jax",
                              reason="keras.distribution runs on JAX only (Keras 3.15)")


@JAX_ONLY
def test_layout_map_of_the_big_presets_is_built_abstractly():
    mesh = keras.distribution.DeviceMesh((1, 1), ("batch", "model"), keras.distribution.list_devices()[:1])
    for name in ("clip_vit_b16", "siglip_vit_b16", "sparc_vit_l14", "sparo_clip_vit_b16", "llip_vit_g14",
                 "stair_vit_b16", "filip_vit_l14"):
        layouts = distribution.layout_map(name, mesh)
        assert layouts["vision/block_0/mlp/fc1/kernel"].axes == (None, "model"), name
        assert layouts["text/block_0/attention/output/kernel"].axes == ("model", None), name
    with pytest.raises(ValueError, match="`model_axis` 'tensor'"):
        distribution.layout_map("clip_tiny", mesh, model_axis="tensor")
    with pytest.raises(TypeError, match="`mesh` must be a keras.distribution.DeviceMesh"):
        distribution.layout_map("clip_tiny", (2, 4))


def test_dimension_the_model_axis_does_not_divide_is_replicated():
    rules = (("a/kernel", (None, "model")),)
    assert layout.axes_for(rules, "a/kernel", (8, 12), "model", 4) == (None, "model")
    assert layout.axes_for(rules, "a/kernel", (8, 10), "model", 4) == (None, None)
    assert layout.axes_for(rules, "b/kernel", (8, 12), "model", 4) is None


@pytest.mark.skipif(keras.backend.backend() == "jax", reason="the other backends' error")
def test_other_backends_refuse_with_a_clear_error():
    with pytest.raises(NotImplementedError, match="needs the JAX backend"):
        distribution.layout_map("clip_tiny", None)
    with pytest.raises(NotImplementedError, match="needs the JAX backend"):
        distribution.check_backend()
    if keras.backend.backend() == "tensorflow":  # Keras builds a mesh there; building a model under it fails
        mesh = keras.distribution.DeviceMesh((1,), ("batch",), keras.distribution.list_devices()[:1])
        with keras.distribution.DataParallel(device_mesh=mesh).scope():
            with pytest.raises(NotImplementedError, match="Building CLIP under a keras.distribution"):
                vlzoo.from_preset("clip_tiny")


@JAX_ONLY
def test_a_model_gives_its_own_layout_map():
    mesh = keras.distribution.DeviceMesh((1, 1), ("batch", "model"), keras.distribution.list_devices()[:1])
    model = vlzoo.from_preset("sparc_tiny")
    layouts = model.get_layout_map(mesh)
    assert isinstance(layouts, keras.distribution.LayoutMap)
    assert sorted(layouts) == sorted(distribution.layout_map("sparc_tiny", mesh))
    assert layouts["vision/block_0/attention/query/kernel"].axes == (None, "model")
    assert layouts["vision_head/kernel"].axes == (None, "model")  # SPARC's extra_layout_rules
    with pytest.raises(ValueError, match="`model_axis` 'tensor'"):
        model.get_layout_map(mesh, model_axis="tensor")

