"""Convert a local checkpoint (open_clip, Hugging Face transformers, keras-hub) into a vlzoo preset directory.

    python tools/convert.py --source open_clip --checkpoint ViT-B-32.pt --model ViT-B-32 --out presets/my_b32
    python tools/convert.py --source open_clip --checkpoint ckpt.safetensors --config my_model.json --out DIR
    python tools/convert.py --source transformers --checkpoint ./clip-vit-base-patch32 --out DIR
    python tools/convert.py --source transformers --checkpoint model.safetensors --config config.json --out DIR
    python tools/convert.py --source keras_hub --checkpoint ./keras_hub_preset_dir --out DIR

Nothing is downloaded. `--checkpoint` is a `.pt`/`.pth`/`.bin` file (read with
`torch.load(map_location="cpu", weights_only=True)`; OpenAI's TorchScript
archives are read with `torch.jit.load`), a `.safetensors` file, or a
directory (transformers: `config.json` + `model.safetensors` /
`pytorch_model.bin`; keras-hub: a preset directory). For open_clip the
architecture comes from `--model` (open_clip's `model_configs/<name>.json`,
found without importing open_clip) or `--config` (that JSON).

The weights are assigned with a progress bar and saved with
`model.save_to_preset(--out)`. Unless `--no-check`, the preset is reloaded
and, when the peer package is importable, the peer is built from the same
weights and both run on random inputs: the max abs differences of the
normalised image and text embeddings and of the logits are printed (exit
status 1 if they exceed 1e-4 / 1e-4 / 1e-3). The Keras backend is
`KERAS_BACKEND`'s.
"""

import argparse
import importlib.util
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
TOLERANCES = {"image": 1e-4, "text": 1e-4, "logits": 1e-3}


# ----------------------------------------------------------------------------- reading files


def load_state_dict(path):
    """`{key: tensor}` from a .pt/.pth/.bin/.safetensors file (a training checkpoint's `state_dict` is unwrapped)."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Checkpoint file not found: {path}.")
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError:
            from safetensors.numpy import load_file
        return dict(load_file(str(path)))
    import torch

    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as error:  # OpenAI's original checkpoints are TorchScript archives
        try:
            obj = torch.jit.load(str(path), map_location="cpu").state_dict()
        except Exception:
            raise ValueError(f"Could not read {path} as a torch state dict: {error}") from error
        print(f"{path.name}: TorchScript archive, read its state dict with torch.jit.load.")
    if isinstance(obj, dict) and "state_dict" in obj and isinstance(obj["state_dict"], dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict):
        raise ValueError(f"{path} does not hold a state dict (found {type(obj).__name__}).")
    return obj


def open_clip_model_config(name):
    """open_clip's model config dict for `name`, read from its installed JSON files (open_clip not imported)."""
    spec = importlib.util.find_spec("open_clip")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "open_clip is not installed, so its model configs cannot be found; pass `--config model.json`."
        )
    directory = pathlib.Path(list(spec.submodule_search_locations)[0]) / "model_configs"
    path = directory / f"{name}.json"
    if not path.is_file():
        names = sorted(p.stem for p in directory.glob("*.json"))
        import difflib

        close = difflib.get_close_matches(name, names, n=5)
        raise ValueError(
            f"Unknown open_clip model {name!r}." + (f" Did you mean: {', '.join(close)}?" if close else "")
        )
    return json.loads(path.read_text())


def transformers_files(checkpoint, config):
    """(state dict, config dict) of a transformers directory or weights file (+ `--config`)."""
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
    return load_state_dict(weights), json.loads(config.read_text())


# ----------------------------------------------------------------------------- peers


def _peers():
    """The repository's `tests/peers.py` (imports open_clip/torchvision on CPU-only torch)."""
    spec = importlib.util.spec_from_file_location("_vlzoo_test_peers", ROOT / "tests" / "peers.py")
    if spec is None:
        raise ImportError("tests/peers.py not found next to tools/")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def open_clip_peer(config, state_dict, name=None):
    """The open_clip model built from `config` (or `name`) with the given weights."""
    import torch

    open_clip = _peers().import_open_clip()
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


def transformers_peer(config, state_dict):
    import torch

    _peers().import_torchvision()
    import transformers

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


# ----------------------------------------------------------------------------- main


def _progress_bar():
    import keras

    state = {}

    def update(done, total):
        if "bar" not in state:
            state["bar"] = keras.utils.Progbar(total, unit_name="variable")
        state["bar"].update(done)

    return update


def convert(args):
    import vlzoo
    import vlzoo.convert as vc

    source, peer_factory = args.source, None
    print(f"Reading {args.checkpoint} ...")
    if source == "open_clip":
        if not (args.model or args.config):
            raise SystemExit("--source open_clip needs --model NAME or --config model.json.")
        config = json.loads(pathlib.Path(args.config).read_text()) if args.config else open_clip_model_config(args.model)
        state_dict = load_state_dict(args.checkpoint)
        print(f"Assigning {len(state_dict)} tensors:")
        model = vc.from_open_clip_state_dict(state_dict, config, dtype=args.dtype, progress=_progress_bar())
        peer_factory = lambda: open_clip_peer(config, vc._common.strip_prefix(dict(state_dict)))  # noqa: E731
        peer_name = "open_clip"
    elif source == "transformers":
        state_dict, config = transformers_files(args.checkpoint, args.config)
        print(f"Assigning {len(state_dict)} tensors:")
        model = vc.from_transformers_state_dict(state_dict, config, dtype=args.dtype, progress=_progress_bar())
        peer_factory = lambda: transformers_peer(config, state_dict)  # noqa: E731
        peer_name = "transformers"
    elif source == "keras_hub":
        import keras_hub

        backbone = keras_hub.models.Backbone.from_preset(str(args.checkpoint))
        print(f"Assigning {len(backbone.weights)} variables:")
        model = vc.from_keras_hub(backbone, dtype=args.dtype, progress=_progress_bar())
        peer_factory = lambda: backbone  # noqa: E731
        peer_name = "keras-hub"
    else:
        raise SystemExit(f"Unknown --source {source!r}.")

    model.save_to_preset(args.out)
    print(f"Saved {type(model).__name__} ({model.count_params():,} parameters) to {args.out}")
    if args.no_check:
        return 0

    import numpy as np

    reloaded = vlzoo.from_preset(args.out)
    images, ids, mask = vc.random_inputs(model, args.batch_size, seed=0)
    texts = {"token_ids": ids.astype("int32"), "padding_mask": mask}
    for what, fn in (("image", lambda m: m.encode_image(images)), ("text", lambda m: m.encode_text(texts))):
        a, b = vc._common.to_numpy(fn(model)), vc._common.to_numpy(fn(reloaded))
        if not np.array_equal(a, b):
            print(f"preset reload: {what} embeddings differ (max {np.max(np.abs(a - b)):.3g})")
            return 1
    print("preset reload: identical embeddings")
    try:
        peer = peer_factory()
    except ImportError as error:
        print(f"parity check skipped: the peer is not importable here ({error})")
        return 0
    diffs = vc.parity(model, peer, batch_size=args.batch_size, seed=0)
    ok = all(diffs[k] < TOLERANCES[k] for k in diffs)
    print(
        f"parity vs {peer_name} (batch {args.batch_size}, max abs diff): "
        f"image embeddings {diffs['image']:.3g}, text embeddings {diffs['text']:.3g}, logits {diffs['logits']:.3g} "
        f"-> {'OK' if ok else 'MISMATCH'}"
    )
    return 0 if ok else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", required=True, choices=("open_clip", "transformers", "keras_hub"))
    parser.add_argument("--checkpoint", required=True, help="weights file or directory")
    parser.add_argument("--model", help="open_clip model name (e.g. ViT-B-32, ViT-B-16-SigLIP)")
    parser.add_argument("--config", help="open_clip model config JSON, or transformers config.json")
    parser.add_argument("--out", required=True, help="preset directory to write")
    parser.add_argument("--dtype", default=None, help="dtype policy of the vlzoo model (default float32)")
    parser.add_argument("--batch-size", type=int, default=2, help="random inputs for the parity check")
    parser.add_argument("--no-check", action="store_true", help="skip the reload and parity checks")
    args = parser.parse_args(argv)
    start = time.time()
    status = convert(args)
    print(f"done in {time.time() - start:.1f} s (Keras backend: {os.environ.get('KERAS_BACKEND', 'default')})")
    return status


if __name__ == "__main__":
    sys.exit(main())
