"""Multi-device training with keras.distribution: 8 simulated CPU devices (JAX), and clear errors elsewhere.

The 8-device part runs `tests/distribution_worker.py` in a subprocess (the device count
is fixed when JAX starts) in the jax pass; see the worker for what it computes.
"""

import os
import sys

import keras
import pytest
from backend_utils import shared_subprocess

import vlzoo
from vlzoo import distribution

from margins import DECISION_MARGIN

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAMILIES = ("clip", "siglip", "filip", "sparc", "sparo", "llip", "stair", "flair")
JAX_ONLY = pytest.mark.skipif(keras.backend.backend() != "jax",
                              reason="keras.distribution runs on JAX only (Keras 3.15)")


def start_background_subprocesses(tmp_path_factory):
    """Starts the 8-device worker (a few minutes) once per run; returns the function that waits for its JSON.

    `conftest` calls this at the start of a JAX run that selected these tests, so that the worker
    runs while the xdist workers go on with other tests."""
    if keras.backend.backend() != "jax":
        return None
    env = dict(os.environ, KERAS_BACKEND="jax", XLA_FLAGS="--xla_force_host_platform_device_count=8",
               TF_CPP_MIN_LOG_LEVEL="2")
    argv = [sys.executable, os.path.join(ROOT, "tests", "distribution_worker.py")]
    return shared_subprocess(tmp_path_factory, "distribution_worker", argv, env, timeout=1200)


@pytest.fixture(scope="session")
def worker(tmp_path_factory):
    return start_background_subprocesses(tmp_path_factory)()


@JAX_ONLY
@pytest.mark.parametrize("family", FAMILIES)
def test_data_parallel_equals_one_device_on_the_global_batch(worker, family):
    assert worker["num_devices"] == 8
    result = next(r for r in worker["data_parallel"] if r["family"] == family)
    assert result["devices_per_weight"] == 8  # replicated on every device
    # FILIP's, SPARC's and STAIR's maxima and thresholds are decided alike by both steps on any CPU.
    assert all(margin >= DECISION_MARGIN for margin in result["margins"].values()), result["margins"]
    # Same loss and same update (so the same gradients) as one device holding the 16 pairs.
    assert abs(result["loss_data_parallel"] - result["loss_single"]) <= 1e-5 * max(1.0, result["loss_single"])
    assert result["weights_after_step_max_diff"] <= 1e-5
    assert result["step_changed_weights"] > 1e-2  # the step did move the weights
    # The negatives span the global batch: a loss over each device's 2 pairs alone differs (the
    # single-device step's loss is the global batch's at the same weights, before the update).
    assert abs(result["loss_device_local_negatives"] - result["loss_single"]) > 1e-3


@JAX_ONLY
def test_model_parallel_llip_g14_layout_shards_and_trains(worker):
    result = worker["model_parallel"]
    assert result["num_prefix_tokens"] == 64  # G/14's K = 64 mixture tokens kept
    sharded = result["sharded"]
    assert sharded == {path: list(axes) for path, axes in sharded.items()}
    assert sorted(sharded) == result["layout_entries"]  # every entry of the map took effect
    expected = {
        "vision/block_0/attention/query/kernel": [None, "model"],
        "vision/block_1/attention/output/kernel": ["model", None],
        "vision/block_0/mlp/fc1/kernel": [None, "model"],
        "text/block_1/mlp/fc2/kernel": ["model", None],
        "text/token_embedding/embeddings": [None, "model"],
        "cross_attention/k_proj": [None, None, "model"],
        "cross_attention/out_proj": ["model", None],
    }
    for path, axes in expected.items():
        assert sharded.get(path) == axes, path
    assert len(sharded) >= 40 and result["still_sharded_after_step"]
    assert abs(result["loss_model_parallel"] - result["loss_single"]) <= 1e-5 * result["loss_single"]
    assert result["weights_after_step_max_diff"] <= 1e-5


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
    assert distribution._axes_for(rules, "a/kernel", (8, 12), "model", 4) == (None, "model")
    assert distribution._axes_for(rules, "a/kernel", (8, 10), "model", 4) == (None, None)
    assert distribution._axes_for(rules, "b/kernel", (8, 12), "model", 4) is None


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
