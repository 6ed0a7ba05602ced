"""Golden Llip fixtures from the authors' code (facebookresearch/Llip), for `tests/test_convert_llip.py`.

Builds the authors' `CMP` model (their `llip/open_clip/model.py`) on a small
random configuration of the released checkpoints' layout, runs it on fixed
random inputs and saves, per variant, under `tests/fixtures/llip/<variant>/`:

- `state_dict.npz`: `CMP.state_dict()` as float32 arrays, the authors' key names;
- `inputs.npz`: `images_nchw (N_I, 3, H, W)` (already normalised, the authors'
  channel order) and `token_ids (N_T, T)` int32;
- `outputs.npz`: what the authors' code returns for them (see
  `tests/fixtures/llip/README.md`);
- `config.json`: the `CMP` constructor arguments and the fixture's settings.

Usage (the authors' code is imported from a checkout, nothing is downloaded):

    git -C <Llip mirror> archive d5649c3 | tar -x -C /tmp/llip_src
    python tools/make_llip_fixture.py --repo /tmp/llip_src

Their package `llip.open_clip` is not imported through its `__init__` (which
pulls in torchvision transforms and the tokenizer): `llip` and
`llip.open_clip` are registered as bare packages pointing at the checkout, and
only `model` and `loss` are imported. `model` imports `.utils`, which imports
`torchvision.ops.misc.FrozenBatchNorm2d` (used only to freeze ResNet batch
norms); when torchvision cannot be imported, a stand-in module providing that
name is registered (the ViT model never calls it).
"""

import argparse
import importlib
import json
import pathlib
import sys
import types

import numpy as np

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "llip"
COMMIT = "d5649c3"
SEED = 0
TEMPERATURE = 5.0  # the authors' `weight_scale` (tau) of every B and G/14 run config
VOCABULARY = 512  # not hard-coded by `CMP`; the real 49408 rows would not fit a small fixture
START, END = VOCABULARY - 2, VOCABULARY - 1  # CLIP's SOT / EOT are the two largest ids (EOT pools: argmax)
NUM_IMAGES, NUM_TEXTS = 3, 5

# The authors' model config layout (their model_configs/ViT-*-quickgelu-siglip-ncls:*.json), scaled down.
CONFIG = dict(
    embed_dim=32,
    num_heads=8,
    init_logit_bias=-10,
    quick_gelu=True,
    vision_cfg=dict(image_size=32, layers=2, width=32, head_width=16, mlp_ratio=4.0, patch_size=8, ncls=4),
    text_cfg=dict(context_length=16, vocab_size=VOCABULARY, width=32, heads=2, layers=2),
)
VARIANTS = {"qkv_norm_off": dict(use_norm=False), "qkv_norm_on": dict(use_norm=True)}


def import_authors(repo):
    """The authors' `model` and `loss` modules from the checkout `repo` (see the module docstring)."""
    root = pathlib.Path(repo).resolve()
    package = root / "llip" / "open_clip"
    if not (package / "model.py").is_file():
        raise FileNotFoundError(f"`--repo` {root} is not a Llip checkout: {package / 'model.py'} is missing.")
    for name, path in (("llip", root / "llip"), ("llip.open_clip", package)):
        module = types.ModuleType(name)
        module.__path__ = [str(path)]
        sys.modules[name] = module
    try:
        import torchvision.ops.misc  # noqa: F401
    except Exception:  # absent, or a build whose compiled ops do not load next to this torch
        import torch

        misc = types.ModuleType("torchvision.ops.misc")
        misc.FrozenBatchNorm2d = type("FrozenBatchNorm2d", (torch.nn.Module,), {})
        for name in ("torchvision", "torchvision.ops"):
            sys.modules[name] = types.ModuleType(name)
        sys.modules["torchvision.ops.misc"] = misc
    return importlib.import_module("llip.open_clip.model"), importlib.import_module("llip.open_clip.loss")


def random_inputs(rng):
    """`(images_nchw, token_ids)`: normalised pixels and CLIP-style rows `[SOT, words, EOT, 0...]`."""
    vision, text = CONFIG["vision_cfg"], CONFIG["text_cfg"]
    size, length = vision["image_size"], text["context_length"]
    images = rng.standard_normal((NUM_IMAGES, 3, size, size)).astype(np.float32)
    token_ids = np.zeros((NUM_TEXTS, length), np.int32)
    for row, words in enumerate((3, 14, 1, 7, 9)[:NUM_TEXTS]):  # one caption fills the context
        token_ids[row, : words + 2] = [START, *rng.integers(1, START, words), END]
    return images, token_ids


def perturb(model, torch, generator):
    """Moves every LayerNorm and bias off its constant initialisation (ones / zeros).

    A converter that dropped, swapped or transposed one of them would then
    change the outputs.
    """
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim == 1:
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))


def run_authors(model_module, loss_module, use_norm, images, token_ids, torch):
    """(state dict, outputs) of a seeded `CMP` on the inputs."""
    torch.manual_seed(SEED)
    model = model_module.CMP(use_norm=use_norm, **CONFIG).eval()
    perturb(model, torch, torch.Generator().manual_seed(SEED + 1))
    images, texts = torch.from_numpy(images), torch.from_numpy(token_ids.astype(np.int64))
    square = min(NUM_IMAGES, NUM_TEXTS)

    with torch.no_grad():
        tokens = model.visual(images)  # (N_I, K, W_v): the K mixture tokens after ln_post
        keys, values = model.encode_image(images)  # (N_I, M, K, d_h) each
        queries, text_embeds = model.encode_text(texts)  # (N_T, M, d_h), (N_T, D)
        contextualized = model.pred(keys, queries, values, TEMPERATURE)  # (N_I, N_T, D)
        logit_scale = model.logit_scale.exp()
        logits = loss_module.CMPLoss().get_logits(
            keys, queries, values, torch.nn.functional.normalize(text_embeds, dim=-1), model.pred,
            TEMPERATURE, logit_scale, model.logit_bias,
        )
    # The loss as their training step computes it (train_one_epoch_ex): forward, normalised zt, CMPLoss.
    (k, v), (q, zt), pred, scale, bias = model(images[:square], texts[:square])
    loss = loss_module.CMPLoss()(k, q, v, torch.nn.functional.normalize(zt, dim=-1), pred, TEMPERATURE, scale, bias)

    state_dict = {key: value.detach().numpy().astype(np.float32) for key, value in model.state_dict().items()}
    outputs = dict(
        image_tokens=tokens, image_keys=keys, image_values=values, text_queries=queries,
        text_embeds=text_embeds, contextualized=contextualized, logits=logits, loss=loss,
    )
    return state_dict, {key: value.detach().numpy().astype(np.float32) for key, value in outputs.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help="checkout of facebookresearch/Llip at commit " + COMMIT)
    parser.add_argument("--out", default=str(FIXTURES), help="fixture directory (default: %(default)s)")
    args = parser.parse_args(argv)

    import torch

    torch.use_deterministic_algorithms(True)
    model_module, loss_module = import_authors(args.repo)
    images, token_ids = random_inputs(np.random.default_rng(SEED))
    for variant, options in VARIANTS.items():
        state_dict, outputs = run_authors(model_module, loss_module, options["use_norm"], images, token_ids, torch)
        directory = pathlib.Path(args.out) / variant
        directory.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(directory / "state_dict.npz", **state_dict)
        np.savez_compressed(directory / "inputs.npz", images_nchw=images, token_ids=token_ids)
        np.savez_compressed(directory / "outputs.npz", **outputs)
        config = dict(
            repository="https://github.com/facebookresearch/Llip", commit=COMMIT, model_class="CMP",
            cmp_arguments=dict(CONFIG, **options), temperature=TEMPERATURE, seed=SEED,
            perturbation="N(0, 0.1^2) added to every 1-D parameter after initialisation",
            tokens=dict(start=START, end=END, padding=0),
        )
        (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        print(f"{directory}: {len(state_dict)} keys, outputs {sorted(outputs)}")


if __name__ == "__main__":
    main()
