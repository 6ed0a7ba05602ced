"""Peer implementations used as references in tests (imported lazily, optional).

open_clip needs torchvision, whose CUDA-only PyPI wheel cannot load its compiled ops
next to the CPU torch wheel (`RuntimeError: operator torchvision::nms does not
exist`). Defining the two op schemas that torchvision's Python side registers fake
kernels for lets torchvision (minus its compiled ops such as nms) and open_clip import
and run. See /work/shared/ENV.md ("The torchvision trap").
"""

import sys

_TORCHVISION_SCHEMAS = (
    ("torchvision::nms", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"),
    ("torchvision::qnms", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"),
)


def _purge(prefix):
    for name in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        del sys.modules[name]


def import_torchvision():
    """Import torchvision, defining its missing op schemas if its ops library fails."""
    if "torchvision" in sys.modules and hasattr(sys.modules["torchvision"], "transforms"):
        return sys.modules["torchvision"]
    import torch

    try:
        import torchvision  # works where torchvision matches torch

        return torchvision
    except RuntimeError:
        _purge("torchvision")
    for name, schema in _TORCHVISION_SCHEMAS:
        try:
            torch.library.define(name, schema)
        except RuntimeError:  # already defined
            pass
    import torchvision

    return torchvision


def import_open_clip():
    """Returns the `open_clip` module (torchvision made importable first); raises ImportError if it
    cannot be imported."""
    from vlzoo.convert.checkpoints import import_open_clip as import_module

    if "open_clip" not in sys.modules:
        try:
            import_torchvision()
        except (ImportError, RuntimeError) as e:
            raise ImportError(f"open_clip is not importable here: {e}") from e
    return import_module()


def open_clip_or_skip():
    """`import_open_clip()`, or skip the calling test when it is not importable."""
    import pytest

    try:
        return import_open_clip()
    except ImportError as e:
        pytest.skip(str(e))


# ----------------------------------------------------------------------------- converter tests

EMBED_TOL, LOGIT_TOL = 1e-4, 1e-3  # normalised embeddings, image-text logits (max abs diff)


def load_convert_tool():
    """`tools/convert.py` as a module (tools/ is not a package)."""
    import importlib.util
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("vlzoo_tools_convert", os.path.join(root, "tools", "convert.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parity_inputs(model, batch_size=3, seed=0):
    """`(images, texts)` for `model` from `vlzoo.convert.random_inputs`, with int32 token ids.

    Every text ends with the largest id (CLIP's end token; transformers' `eos_token_id` in
    these tests), every other id lies in [1, vocabulary_size - 1).
    """
    from vlzoo.convert import random_inputs

    images, ids, mask = random_inputs(model, batch_size, seed)
    return images, {"token_ids": ids.astype("int32"), "padding_mask": mask}


def _unit(x):
    import keras
    import numpy as np

    x = np.asarray(keras.ops.convert_to_numpy(x), np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def assert_parity(model, images, texts, peer_image, peer_text, peer_logits, label):
    """Asserts a vlzoo model matches a peer's outputs on `images`/`texts`; returns the max abs diffs.

    vlzoo's embeddings are taken as `encode_*(normalize=True)` returns them (not renormalised
    here); the peer's embeddings are L2-normalised here, so unnormalised ones may be passed.
    Prints `[backend] label: max abs diff {...}`.
    """
    import keras
    import numpy as np

    to_numpy = keras.ops.convert_to_numpy
    image = to_numpy(model.encode_image(images, normalize=True))
    text = to_numpy(model.encode_text(texts, normalize=True))
    logits = to_numpy(model.similarity(images, texts))
    diffs = {
        "image": float(np.abs(image - _unit(peer_image)).max()),
        "text": float(np.abs(text - _unit(peer_text)).max()),
        "logits": float(np.abs(logits - to_numpy(peer_logits)).max()),
    }
    print(f"[{keras.backend.backend()}] {label}: max abs diff {diffs}")
    assert diffs["image"] < EMBED_TOL and diffs["text"] < EMBED_TOL, diffs
    assert diffs["logits"] < LOGIT_TOL, diffs
    return diffs
