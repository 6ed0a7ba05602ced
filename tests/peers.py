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
    """Returns the `open_clip` module; raises ImportError if it cannot be imported."""
    if "open_clip" in sys.modules:
        return sys.modules["open_clip"]
    try:
        import_torchvision()
        import open_clip
    except (ImportError, RuntimeError) as e:
        _purge("open_clip")
        raise ImportError(f"open_clip is not importable here: {e}") from e
    return open_clip


def open_clip_or_skip():
    """`import_open_clip()`, or skip the calling test when it is not importable."""
    import pytest

    try:
        return import_open_clip()
    except ImportError as e:
        pytest.skip(str(e))
