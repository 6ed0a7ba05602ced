"""Peer implementations used as references in tests (imported lazily, optional).

open_clip and transformers import torchvision, whose CUDA-only PyPI wheel cannot load its compiled
ops next to the CPU torch wheel; `vlzoo.convert.checkpoints` imports them past that (see
the shared ENV.md next to the checkout, "The torchvision trap").
"""

from vlzoo.convert.checkpoints import import_open_clip, import_torchvision  # noqa: F401 (re-exported)


def open_clip_or_skip():
    """`import_open_clip()`, or skip the calling test when it is not importable."""
    import pytest

    try:
        return import_open_clip()
    except ImportError as e:
        pytest.skip(str(e))


# ----------------------------------------------------------------------------- converter tests

# The pass that checks parity at every public geometry of a family. A geometry differs from another only in its
# sizes (widths, heads, depth, patch, image size) and in the tower switches it sets (activation, class token,
# pooling head); the conversion maps the peer's arrays in numpy, the same on every backend, and the conformance
# test (tests/test_conformance.py) holds the three backends to one another, within 1e-5, on every family's
# tiny model. The other passes therefore check the cheapest geometry of each family and each geometry that sets
# a switch no tiny preset sets, what the conformance test does not reach on their backend, on images of
# `REDUCED_GRID` x `REDUCED_GRID` patches (`parity_image_size`): the image size sets only the sequence's length.
PARITY_BACKEND = "torch"
REDUCED_GRID = 8


def parity_image_size(image_size, patch_size):
    """The image size a parity test feeds at a geometry of `image_size`: that one in `PARITY_BACKEND`'s pass,
    `REDUCED_GRID` patches a side in the others."""
    import keras

    return image_size if keras.backend.backend() == PARITY_BACKEND else REDUCED_GRID * patch_size


def geometries(cases, elsewhere):
    """`cases` (a parity test's parameters) for `pytest.mark.parametrize`: all of them in `PARITY_BACKEND`'s
    pass; in the others only those of `elsewhere`, each of which the caller gives a reason for."""
    import keras
    import pytest

    unknown = set(elsewhere) - set(cases)
    assert not unknown, unknown
    skip = pytest.mark.skipif(keras.backend.backend() != PARITY_BACKEND,
                              reason=f"a geometry of sizes only: every geometry is checked in the {PARITY_BACKEND} "
                                     "pass, the backends are held together by the conformance test")
    return [case if case in elsewhere else pytest.param(*(case if isinstance(case, tuple) else (case,)), marks=skip)
            for case in cases]


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


# Relative error bound of the normalised embeddings (per vector, `relative_error`) and of the logits (of the
# logit scale, the largest a logit can be: random towers' cosines are near 0, so a row of logits has no scale of
# its own): 1e-5. Two float32 computations of the same two-block towers with other kernels differ by a few units
# of float32 rounding (2**-24 = 6e-8) per operation, accumulated over some hundred operations on each path.
RELATIVE = 1e-5


def relative_error(got, want):
    """Largest `|got - want| / |want|` over the rows (vectors, or rows of the logits)."""
    import keras
    import numpy as np

    got, want = (np.asarray(keras.ops.convert_to_numpy(x), np.float64) for x in (got, want))
    return float(np.max(np.linalg.norm(got - want, axis=-1) / np.linalg.norm(want, axis=-1)))


def model_outputs(model, images, texts):
    """`(image, text, logits)`: `encode_image(images)`, `encode_text(texts)` and their scores (`similarity`'s),
    each tower run once (a parity test of a large geometry spends its time compiling and running the towers).
    `model.normalize_embeds(image)` gives `encode_image(images, normalize=True)`'s values."""
    image, text = model.encode_image(images), model.encode_text(texts)
    return image, text, model.score(image, text)


def assert_relative_parity(model, images, texts, peer_image, peer_text, peer_logits, label):
    """Asserts a vlzoo model's normalised embeddings and logits are within `RELATIVE` of a peer's (the logits'
    difference taken of the model's logit scale); returns the errors and the model's image and text embeddings
    (`model_outputs`, before normalisation). The peer's embeddings are normalised here."""
    import keras
    import numpy as np

    to_numpy = keras.ops.convert_to_numpy
    scale = float(to_numpy(model.logit_scale_value()))
    image, text, logits = model_outputs(model, images, texts)
    errors = {
        "image": relative_error(model.normalize_embeds(image)["embeds"], _unit(peer_image)),
        "text": relative_error(model.normalize_embeds(text)["embeds"], _unit(peer_text)),
        "logits": float(np.max(np.abs(to_numpy(logits) - to_numpy(peer_logits)))) / scale,
    }
    print(f"[{keras.backend.backend()}] {label}: relative errors "
          + ", ".join(f"{key} {value:.1e}" for key, value in errors.items()))
    assert max(errors.values()) < RELATIVE, errors
    return errors, image, text


def assert_towers_match_preset(model, preset, differ=("num_layers", "vocabulary_size")):
    """The converted `model`'s towers are configured as the architecture `preset`'s (its `config.json`), but
    for the settings in `differ` (the parity peers' fewer blocks and smaller vocabulary)."""
    import json

    import vlzoo

    config = json.loads((vlzoo.presets.resolve_preset(preset) / "config.json").read_text())["config"]
    for side, tower in (("vision", model.vision), ("text", model.text)):
        want = {key: value for key, value in config[side].items() if key not in differ}
        got = tower.get_config()
        assert {key: got.get(key) for key in want} == want, (preset, side, {
            key: (got.get(key), value) for key, value in want.items() if got.get(key) != value})


def assert_parity(model, images, texts, peer_image, peer_text, peer_logits, label):
    """Asserts a vlzoo model matches a peer's outputs on `images`/`texts`; returns the max abs diffs.

    vlzoo's embeddings are taken as `encode_*(normalize=True)` gives them (`model_outputs`, not
    renormalised here); the peer's embeddings are L2-normalised here, so unnormalised ones may be passed.
    Prints `[backend] label: max abs diff {...}`.
    """
    import keras
    import numpy as np

    to_numpy = keras.ops.convert_to_numpy
    image, text, logits = model_outputs(model, images, texts)
    image, text = (to_numpy(model.normalize_embeds(x)["embeds"]) for x in (image, text))
    logits = to_numpy(logits)
    diffs = {
        "image": float(np.abs(image - _unit(peer_image)).max()),
        "text": float(np.abs(text - _unit(peer_text)).max()),
        "logits": float(np.abs(logits - to_numpy(peer_logits)).max()),
    }
    print(f"[{keras.backend.backend()}] {label}: max abs diff {diffs}")
    assert diffs["image"] < EMBED_TOL and diffs["text"] < EMBED_TOL, diffs
    assert diffs["logits"] < LOGIT_TOL, diffs
    return diffs


# ----------------------------------------------------------------------------- clip_benchmark's metric code


def clip_benchmark_embedding_model(texts):
    """A PyTorch module for clip_benchmark's `image_caption_selection.evaluate` that scores given
    embeddings: its "images" are the image embeddings themselves (flattened) and caption id `k` is row
    `k` of `texts` reshaped to `(-1, D)`; so clip_benchmark's metrics run on scores computed here."""
    import torch

    class Embeddings(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.texts = torch.tensor(texts.reshape(-1, texts.shape[-1]))

        def encode_image(self, x):
            return x.flatten(1)

        def encode_text(self, ids):
            return self.texts[ids]

    return Embeddings()
