"""Checkpoint files on disk -> vlzoo preset directories (`vlzoo convert`, `tools/convert.py`).

- `open_clip_model_config(name)`: open_clip's `model_configs/<name>.json`, found
  without importing open_clip.
- `transformers_files(checkpoint, config)`: state dict + `config.json` of a
  transformers directory or weights file.
- `open_clip_peer` / `transformers_peer`: the peer model rebuilt from the same
  weights, for the parity check.
- `convert_checkpoint(source, checkpoint, out, ...)`: read, convert, save with
  `save_to_preset`, reload and (optionally) compare against the peer
  (open_clip, transformers, keras-hub; the Llip and SPARO authors' checkpoints
  with the vlzoo `preset` of their architecture).

Nothing is downloaded.
"""

import difflib
import importlib.util
import json
import pathlib
import sys

import numpy as np

from vlzoo import formats
from vlzoo import plugins
from vlzoo.convert import _common as C
from vlzoo.convert.converters import converter
from vlzoo.convert.keras_hub import from_keras_hub
from vlzoo.convert.open_clip import from_open_clip_state_dict
from vlzoo.convert.state_dict import load_state_dict
from vlzoo.convert.state_dict import strip_prefix
from vlzoo.convert.transformers import from_transformers_state_dict
from vlzoo.presets.files import read_json
from vlzoo.presets.local import load_local_preset

TOLERANCES = {"image": 1e-4, "text": 1e-4, "logits": 1e-3}

__all__ = [
    "TOLERANCES", "convert_checkpoint", "open_clip_model_config", "open_clip_peer", "transformers_files",
    "transformers_peer",
]

# ----------------------------------------------------------------------------- reading files


def open_clip_model_config(name):
    """open_clip's model config dict for `name`, read from its installed JSON files (open_clip not imported).

    FileNotFoundError when open_clip is not installed; ValueError for an unknown `name` (with close
    matches)."""
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "open_clip is not installed, so its model configs cannot be found; pass `--config model.json`."
        )
    directory = pathlib.Path(list(spec.submodule_search_locations)[0]) / "model_configs"
    path = directory / f"{name}.json"
    if not path.is_file():
        names = sorted(p.stem for p in directory.glob("*.json"))
        close = difflib.get_close_matches(name, names, n=5)
        raise ValueError(
            f"Unknown open_clip model {name!r}." + (f" Did you mean: {', '.join(close)}?" if close else "")
        )
    return json.loads(path.read_text())


def transformers_files(checkpoint, config, log=print):
    """(state dict, config dict) of a transformers directory or weights file (+ `--config`);
    FileNotFoundError without a config or weights file."""
    checkpoint = pathlib.Path(checkpoint)
    if checkpoint.is_dir():
        config = config or checkpoint / "config.json"
        for name in ("model.safetensors", "pytorch_model.bin"):
            if (checkpoint / name).is_file():
                weights = checkpoint / name
                break
        else:
            raise FileNotFoundError(
                f"{checkpoint} holds neither model.safetensors nor pytorch_model.bin (sharded checkpoints: "
                "pass the single merged file)."
            )
    else:
        weights = checkpoint
        config = config or checkpoint.parent / "config.json"
    config = pathlib.Path(config)
    if not config.is_file():
        raise FileNotFoundError(f"transformers config not found: {config}; pass `--config config.json`.")
    return load_state_dict(weights, log), read_json(config, "transformers config")


# ----------------------------------------------------------------------------- peers


# torchvision's PyPI wheel is a CUDA build whose compiled ops do not load next to the CPU torch wheel
# (`RuntimeError: operator torchvision::nms does not exist`); open_clip and transformers import it. Defining
# the op schemas its Python side registers kernels for lets everything but those compiled ops import and run.
_TORCHVISION_SCHEMAS = (
    ("torchvision::nms", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"),
    ("torchvision::qnms", "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"),
)


def _purge(prefix):
    for name in [m for m in sys.modules if m == prefix or m.startswith(prefix + ".")]:
        del sys.modules[name]


def import_torchvision():
    """`import torchvision`, defining its missing op schemas if its ops library does not load (see above)."""
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


def _import_peer(name):
    """`import name` after torchvision (when installed); ImportError, not a half-imported module, on failure."""
    if name in sys.modules:
        return sys.modules[name]
    try:
        if importlib.util.find_spec("torchvision") is not None:
            import_torchvision()
        module = importlib.import_module(name)
    except (ImportError, RuntimeError) as error:
        _purge(name)
        raise ImportError(f"{name} is not importable here: {error}") from error
    return module


def import_open_clip():
    """`import open_clip` (torchvision made importable first); ImportError if it cannot be imported here."""
    return _import_peer("open_clip")


def import_transformers():
    """`import transformers` (torchvision made importable first); ImportError if it cannot be imported here."""
    return _import_peer("transformers")


def open_clip_peer(config, state_dict, open_clip=None):
    """The open_clip model built from `config` with the given weights (`open_clip`: the module, else imported)."""
    import torch

    open_clip = open_clip or import_open_clip()
    kwargs = {k: config[k] for k in ("embed_dim", "vision_cfg", "text_cfg", "quick_gelu", "init_logit_bias",
                                     "init_logit_scale", "nonscalar_logit_scale") if k in config}
    custom = config.get("custom_text", False) or "text.token_embedding.weight" in state_dict
    peer = (open_clip.CustomTextCLIP if custom else open_clip.CLIP)(**kwargs)
    weights = {k: torch.as_tensor(v).float() for k, v in state_dict.items()
               if k not in ("input_resolution", "context_length", "vocab_size")}
    if custom:
        weights = open_clip.model.convert_to_custom_text_state_dict(weights)
    peer.load_state_dict(weights, strict=True)
    return peer.eval()


def transformers_peer(config, state_dict, transformers=None):
    """The transformers `CLIPModel` / `SiglipModel` built from `config` with the given weights; KeyError
    naming missing or unexpected keys."""
    import torch

    transformers = transformers or import_transformers()
    classes = {"clip": (transformers.CLIPConfig, transformers.CLIPModel),
               "siglip": (transformers.SiglipConfig, transformers.SiglipModel)}
    config_cls, model_cls = classes[config["model_type"]]
    peer = model_cls(config_cls.from_dict(config))
    weights = {k: torch.as_tensor(v).float() for k, v in state_dict.items()}
    missing, unexpected = peer.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not k.endswith("position_ids")]
    unexpected = [k for k in unexpected if not k.endswith("position_ids")]
    if missing or unexpected:
        raise KeyError(f"transformers peer: missing {missing}, unexpected {unexpected}.")
    return peer.eval()


# ----------------------------------------------------------------------------- conversion


def progress_bar():
    """A `progress(done, total)` callback drawing a `keras.utils.Progbar`."""
    import keras

    state = {}

    def update(done, total):
        if "bar" not in state:
            state["bar"] = keras.utils.Progbar(total, unit_name="variable")
        state["bar"].update(done)

    return update


def convert_checkpoint(source, checkpoint, out, *, model_name=None, config=None, preset=None, dtype=None,
                       check=True, peer_check=True, batch_size=2, log=print, progress=True):
    """Converts a local checkpoint to a vlzoo preset directory; returns the exit status (0 OK, 1 mismatch).

    Args:
        source: `"open_clip"`, `"transformers"`, `"keras_hub"`, or the
            authors' code of a family: `"llip"` (facebookresearch/Llip),
            `"sparo"` (ankitkv/sparo-clip), `"flair"` (ExplainableML/flair),
            `"big_vision"` (SigLIP and SigLIP 2 `.npz` files), or a format an
            installed plugin registers (`vlzoo.plugins`; imported when `source`
            is none of the registered formats).
        checkpoint: open_clip, llip, sparo, flair: a `.pt`/`.pth`/`.bin`/`.safetensors`
            state dict or training checkpoint; transformers: a directory
            (`config.json` + `model.safetensors` or `pytorch_model.bin`) or a
            weights file; keras_hub: a preset directory.
        out: the preset directory to write.
        model_name: open_clip model name whose `model_configs/<name>.json` describes
            the architecture (open_clip must be installed, not imported).
        config: open_clip model config JSON path (instead of `model_name`), or the
            transformers `config.json` path (default: next to the weights).
        preset: llip, sparo, flair and big_vision: the vlzoo preset of the checkpoint's
            architecture (e.g. `"llip_vit_b16"`, `"llip_vit_g14"`,
            `"sparo_clip_vit_b32"`); it gives what the weights do not show
            (head counts, Llip's tau) and the tokenizer and preprocessor.
        dtype: dtype policy of the vlzoo model (default float32).
        check: reload the preset and check the embeddings are identical.
        peer_check: also rebuild the peer from the same weights (when importable)
            and compare embeddings and logits on random inputs.
        batch_size: random inputs of the checks.
        log: `log(str)` for the messages.
        progress: show a progress bar while assigning.

    Raises:
        FileNotFoundError, ValueError, KeyError, NotImplementedError: bad inputs, named.

    Example:
    >>> convert_checkpoint("open_clip", "open_clip_model.safetensors", "my_clip",
    ...                    model_name="ViT-B-32")  # doctest: +SKIP
    """
    if source not in formats.converted_formats():  # an installed plugin's format registers when it is imported
        plugins.load_families()
    sources, architectures = formats.converted_formats(), formats.architecture_formats()
    if source not in sources:
        raise ValueError(f"Unknown source {source!r}; expected one of {', '.join(sources)}.")
    if (source in architectures) != (preset is not None):
        raise ValueError(
            f"{source} checkpoints need `preset`, the vlzoo preset of their architecture (e.g. "
            f"{architectures[source]!r})." if source in architectures
            else f"`preset` applies to the authors' checkpoints ({', '.join(architectures)}), not to {source}."
        )
    bar = progress_bar() if progress else None
    log(f"Reading {checkpoint} ...")
    if source == "open_clip":
        if not (model_name or config):
            raise ValueError("open_clip checkpoints need --model NAME or --config model.json.")
        config_dict = read_json(config, "open_clip model config") if config else open_clip_model_config(model_name)
        state_dict = load_state_dict(checkpoint, log)
        log(f"Assigning {len(state_dict)} tensors:")
        model = from_open_clip_state_dict(state_dict, config_dict, dtype=dtype, progress=bar)

        def peer_factory():
            return open_clip_peer(config_dict, strip_prefix(dict(state_dict)))

        peer_name = "open_clip"
    elif source == "transformers":
        state_dict, config_dict = transformers_files(checkpoint, config, log)
        log(f"Assigning {len(state_dict)} tensors:")
        model = from_transformers_state_dict(state_dict, config_dict, dtype=dtype, progress=bar)

        def peer_factory():
            return transformers_peer(config_dict, state_dict)

        peer_name = "transformers"
    elif source in architectures:
        read, convert = converter(source)
        state_dict = read(checkpoint)
        log(f"Assigning {len(state_dict)} tensors to {preset}:")
        model = convert(state_dict, preset, dtype=dtype, progress=bar)
        peer_factory = peer_name = None
    else:
        if not pathlib.Path(checkpoint).is_dir():
            raise FileNotFoundError(f"keras-hub preset directory not found: {checkpoint}.")
        import keras_hub

        backbone = keras_hub.models.Backbone.from_preset(str(checkpoint))
        log(f"Assigning {len(backbone.weights)} variables:")
        model = from_keras_hub(backbone, dtype=dtype, progress=bar)

        def peer_factory():
            return backbone

        peer_name = "keras-hub"

    model.save_to_preset(str(out))
    log(f"Saved {type(model).__name__} ({model.count_params():,} parameters) to {out}")
    if not check:
        return 0

    reloaded = load_local_preset(str(out))
    images, ids, mask = C.random_inputs(model, batch_size, seed=0)
    texts = {"token_ids": ids.astype("int32"), "padding_mask": mask}
    a, b = (C.to_numpy(m.similarity(images, texts)) for m in (model, reloaded))
    if not np.array_equal(a, b):
        log(f"preset reload: the similarities differ (max {np.max(np.abs(a - b)):.3g})")
        return 1
    log("preset reload: identical similarities")
    if not peer_check:
        return 0
    if peer_factory is None:
        log(f"parity check: none here (the {source} authors' code is not an installable package; the "
            "converter's tests compare it with outputs of their code)")
        return 0
    try:
        peer = peer_factory()
    except ImportError as error:
        log(f"parity check skipped: the peer is not importable here ({error})")
        return 0
    diffs = C.parity(model, peer, batch_size=batch_size, seed=0)
    ok = all(diffs[k] < TOLERANCES[k] for k in diffs)
    log(
        f"parity vs {peer_name} (batch {batch_size}, max abs diff): "
        f"image embeddings {diffs['image']:.3g}, text embeddings {diffs['text']:.3g}, logits {diffs['logits']:.3g} "
        f"-> {'OK' if ok else 'MISMATCH'}"
    )
    return 0 if ok else 1
