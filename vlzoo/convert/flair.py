"""The FLAIR authors' checkpoints (ExplainableML/flair) -> `vlzoo.FLAIR`.

The authors' `FLAIR` module keeps open_clip's key names for the towers, without
their projections, and adds the projections and the pooling:

    visual.class_embedding (W_v,), visual.positional_embedding (1 + P, W_v), visual.conv1.weight,
    visual.ln_pre.*, visual.transformer.resblocks.{i}.*, visual.ln_post.*
    token_embedding.weight, positional_embedding, transformer.resblocks.{i}.*, ln_final.*
    image_post.proj (W_v, D)     applied as x @ proj to the CLS and the patch outputs
    text_post.proj  (W_t, D)
    visual_proj.ln_q.*, ln_k.*, ln_v.*                       (D,) each
    visual_proj.attn.in_proj_weight (3D, D), in_proj_bias (3D,)   q, k, v stacked (torch layout)
    visual_proj.attn.out_proj.weight (D, D), out_proj.bias (D,)
    logit_scale ()  the log of the multiplier, as vlzoo's
    logit_bias ()

The released files (`flair-cc3m-recap.pt`, ...) are training checkpoints
`{"epoch", "name", "state_dict", ...}` whose keys may carry DDP's `module.`.
The pooling's head count and the activation are not in the checkpoint; the
preset supplies them.
"""

from vlzoo._keras import without_weights
from vlzoo.convert import _common as C
from vlzoo.convert.converters import register_converter
from vlzoo.convert.open_clip import text_tower_rules, vit_tower_rules
from vlzoo.convert.state_dict import read_state_dict
from vlzoo.presets.local import load_local_preset


def from_flair_checkpoint(path_or_state_dict, preset="flair_vit_b16", *, dtype=None, progress=None,
                          **config_overrides):
    """Builds the vlzoo FLAIR preset `preset` holding the weights of an authors' checkpoint.

    Args:
        path_or_state_dict: a `.pt` / `.pth` / `.bin` / `.safetensors` file,
            or its contents: a training checkpoint `{"epoch", "state_dict", ...}`
            or a bare state dict `{key: torch tensor or numpy array}`;
            `module.` and `_orig_mod.` key prefixes are accepted.
        preset: the vlzoo preset of the checkpoint's architecture, a name or
            a directory; `"flair_vit_b16"` for every released model.
        dtype: dtype policy of the model (default: the preset's, float32).
        progress: optional `progress(done, total)` callback while assigning.
        **config_overrides: constructor arguments replacing the preset's, as
            in `vlzoo.from_preset` (e.g. `chunk_size=256`).

    Returns:
        A `vlzoo.FLAIR` whose `similarity(images, texts)` gives the authors'
        `get_logits` (`logit_scale.exp() * cos(z_ij, t_j) + logit_bias`) for
        images `(B, H, W, 3)` (channels last; the authors' are `(B, 3, H, W)`).

    Raises:
        ValueError: the checkpoint's geometry (widths, patch, layer counts,
            vocabulary, context length, D) differs from the preset's (every
            mismatch named with its key and shape), or a tensor's shape
            differs from its vlzoo variable's.
        KeyError: a key is missing or has no vlzoo counterpart (named).
        Nothing is assigned unless every key and variable matched.

    Example:
    >>> model = vlzoo.convert.from_flair_checkpoint("flair-merged30m.pt")
    >>> model.similarity(images, ["a dog on a sofa", "a red door"]).shape  # images: (B, 224, 224, 3)
    (B, 2)
    """
    state_dict = read_state_dict(path_or_state_dict)
    with without_weights():
        model = load_local_preset(preset, load_weights=False, dtype=dtype, **config_overrides)
    if getattr(model, "family", None) != "flair":
        raise ValueError(f"`preset` {preset!r} is a {type(model).__name__} preset; expected a FLAIR preset.")
    checks = C.tower_geometry_checks(state_dict, model) + [
        ("embed dim D", "image_post.proj", C.key_dim(state_dict, "image_post.proj", -1), model.embed_dim),
    ]
    C.check_geometry(checks, state_dict, preset)
    C.load_rules(_rules(model), state_dict, model, progress=progress)
    C.warn_logit_scale(C.to_numpy(model.logit_scale), "FLAIR checkpoint")
    return model


def _rules(model):
    """The authors' keys -> the `vlzoo_variables` names of the vlzoo FLAIR `model`."""
    rules = vit_tower_rules(model.vision.get_config()) + text_tower_rules(model.text.get_config())
    rules += [
        C.copy("image_post.proj", "image_projection/kernel"),
        C.copy("text_post.proj", "text_projection/kernel"),
        *C.fused_qkv("visual_proj.attn.in_proj_weight", "visual_proj.attn.in_proj_bias", "text_pooling"),
        *C.torch_linear("visual_proj.attn.out_proj", "text_pooling/output_dense"),
    ]
    for name in ("q", "k", "v"):
        rules += C.torch_layer_norm(f"visual_proj.ln_{name}", f"text_pooling/{name}_norm")
    return rules + [C.scalar("logit_scale", "logit_scale"), C.scalar("logit_bias", "logit_bias")]


register_converter("flair", from_flair_checkpoint)
