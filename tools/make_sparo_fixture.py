"""Golden SPARO fixtures from the authors' code (ankitkv/sparo-clip), for `tests/test_convert_sparo.py`.

Builds the authors' `CLIP` with `use_sparo=True` (their fork of open_clip
v2.20, `src/open_clip/model.py` and `transformer.py`) on a small random
configuration of the layout of their `ViT-B-*-SPARO.json`, runs it on fixed
random inputs and saves under `tests/fixtures/sparo/`:

- `state_dict.npz`: `CLIP.state_dict()` as float32 arrays, the authors' key
  names (with the tied `visual.sparo.v.*` / `text_sparo.v.*` aliases of
  `k.*`);
- `inputs.npz`: `images_nchw (N_I, 3, H, W)` (already normalised, the
  authors' channel order) and `token_ids (N_T, T)` int32;
- `outputs.npz`: what the authors' code returns for them (see
  `tests/fixtures/sparo/README.md`);
- `config.json`: the `CLIP` constructor arguments and the fixture's settings.

Usage (the authors' code is imported from a checkout, nothing is downloaded):

    mkdir -p /tmp/sparo_src
    git -C <sparo-clip mirror> archive 6621a31 src | tar -x -C /tmp/sparo_src
    python tools/make_sparo_fixture.py --repo /tmp/sparo_src

`<repo>/src` goes first on `sys.path`, so their `open_clip` package is
imported, not an installed open_clip (checked). Their package imports
torchvision; where its compiled ops do not load next to this torch, vlzoo's
`import_torchvision` defines the two missing op schemas first (the SPARO model
never calls those ops).
"""

import argparse
import json
import os
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "sparo"
REPOSITORY = "https://github.com/ankitkv/sparo-clip"
COMMIT = "6621a31"  # README-only commits after f013384, the code the spec was checked against
SEED = 0
VOCABULARY = 512  # the text tower takes any `vocab_size`; the real 49408 rows would not fit a small fixture
START, END = VOCABULARY - 2, VOCABULARY - 1  # CLIP's SOT / EOT are the two largest ids (SPARO's text mask: argmax)
NUM_IMAGES = 3
WORDS = (5, 9, 14, 0, 2)  # words per caption; 14 fills the context: EOT at the last position (truncation)
NUM_PAIRS = 3  # the loss takes images[i] with texts[i], i < NUM_PAIRS

# Their ViT-B-*-SPARO.json with smaller sizes: D = width / heads = 8 in both towers (`sparo_attn_dim=None`).
CONFIG = dict(
    embed_dim=4096,  # sizes only the projections that SPARO deletes, as in the released configs
    use_sparo=True,
    sparo_attn_dim=None,
    sparo_value_dim=None,
    sparo_heads=None,
    L=8,
    V=4,
    reduce_depth=1,
    share_kv=True,
    share_queries=False,
    sparo_type="cont:const",
    vision_cfg=dict(image_size=32, layers=3, width=32, head_width=8, patch_size=8),
    text_cfg=dict(context_length=16, vocab_size=VOCABULARY, width=32, heads=4, layers=3),
)


def import_authors(repo):
    """The authors' `open_clip` package from the checkout `repo` (see the module docstring)."""
    src = pathlib.Path(repo).resolve() / "src"
    if not (src / "open_clip" / "transformer.py").is_file():
        raise FileNotFoundError(f"`--repo` {repo} is not a sparo-clip checkout: {src / 'open_clip'} is missing.")
    if "open_clip" in sys.modules:
        raise RuntimeError("An open_clip package is already imported; run this tool in a fresh process.")
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("KERAS_BACKEND", "torch")  # importing vlzoo imports Keras: keep it to torch
    from vlzoo.convert.checkpoints import import_torchvision

    import_torchvision()
    sys.path.insert(0, str(src))
    import open_clip

    if pathlib.Path(open_clip.__file__).resolve().parent != src / "open_clip":
        raise RuntimeError(f"Imported {open_clip.__file__}, not the checkout's open_clip under {src}.")
    return open_clip


def random_inputs(rng):
    """`(images_nchw, token_ids)`: normalised pixels and open_clip-style rows `[SOT, words, EOT, 0...]`."""
    size, length = CONFIG["vision_cfg"]["image_size"], CONFIG["text_cfg"]["context_length"]
    images = rng.standard_normal((NUM_IMAGES, 3, size, size)).astype(np.float32)
    token_ids = np.zeros((len(WORDS), length), np.int32)
    for row, words in enumerate(WORDS):
        token_ids[row, : words + 2] = [START, *rng.integers(1, START, words), END]
    return images, token_ids


def perturb(model, torch, generator):
    """Moves every bias, LayerNorm, class embedding and the logit scale off its initialisation.

    SPARO's `k` and `proj` biases start at zero, LayerNorms at ones / zeros and
    the logit scale at vlzoo's own default, ln(1 / 0.07); a converter that
    dropped, swapped or transposed one of them would then change the outputs.
    """
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim <= 1:
                parameter.add_(0.1 * torch.randn(parameter.shape, generator=generator))


def run_authors(open_clip, images, token_ids, torch):
    """(state dict, outputs) of the seeded SPARO `CLIP` on the inputs."""
    torch.manual_seed(SEED)
    model = open_clip.model.CLIP(**CONFIG).eval()
    perturb(model, torch, torch.Generator().manual_seed(SEED + 1))
    images, texts = torch.from_numpy(images), torch.from_numpy(token_ids.astype(np.int64))

    raw = {}  # the SPARO modules' raw slots (B, L, V), before the per-slot normalisation
    hooks = [
        module.register_forward_hook(lambda _, __, output, key=key: raw.__setitem__(key, output[0]))
        for key, module in (("image_slots", model.visual.sparo), ("text_slots", model.text_sparo))
    ]
    with torch.no_grad():
        image_embeds = model.encode_image(images, normalize=True)  # (N_I, L V)
        text_embeds = model.encode_text(texts, normalize=True)  # (N_T, L V)
        for hook in hooks:
            hook.remove()
        _, image_attention = model.encode_image(images, normalize=True, return_sparo=True, return_attn=True)
        _, text_attention = model.encode_text(texts, normalize=True, return_sparo=True, return_attn=True)
        logit_scale = model.logit_scale.exp()
        logits_per_image, _ = open_clip.ClipLoss().get_logits(image_embeds, text_embeds, logit_scale)
        # The loss as their training step computes it: forward on paired inputs, then ClipLoss.
        loss = open_clip.ClipLoss()(*model(images[:NUM_PAIRS], texts[:NUM_PAIRS]))

    state_dict = {key: value.detach().numpy().astype(np.float32) for key, value in model.state_dict().items()}
    outputs = dict(
        image_slots=raw["image_slots"], text_slots=raw["text_slots"],
        image_embeds=image_embeds, text_embeds=text_embeds,
        image_attention=image_attention, text_attention=text_attention,
        logit_scale=logit_scale, logits_per_image=logits_per_image, loss=loss,
    )
    return state_dict, {key: value.detach().numpy().astype(np.float32) for key, value in outputs.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help=f"checkout of {REPOSITORY} at commit {COMMIT}")
    parser.add_argument("--out", default=str(FIXTURES), help="fixture directory (default: %(default)s)")
    args = parser.parse_args(argv)

    open_clip = import_authors(args.repo)
    import torch

    torch.use_deterministic_algorithms(True)
    images, token_ids = random_inputs(np.random.default_rng(SEED))
    state_dict, outputs = run_authors(open_clip, images, token_ids, torch)
    directory = pathlib.Path(args.out)
    directory.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(directory / "state_dict.npz", **state_dict)
    np.savez_compressed(directory / "inputs.npz", images_nchw=images, token_ids=token_ids)
    np.savez_compressed(directory / "outputs.npz", **outputs)
    config = dict(
        repository=REPOSITORY, commit=COMMIT, model_class="open_clip.model.CLIP", clip_arguments=CONFIG,
        seed=SEED, perturbation="N(0, 0.1^2) added to every parameter with at most one axis after initialisation",
        tokens=dict(start=START, end=END, padding=0), loss_pairs=NUM_PAIRS,
    )
    (directory / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"{directory}: {len(state_dict)} keys, outputs {sorted(outputs)}")


if __name__ == "__main__":
    main()
