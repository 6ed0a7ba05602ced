"""The FLAIR authors' checkpoints (ExplainableML/flair) -> `vlzoo.FLAIR`.

`from_flair_checkpoint` reads the authors' training checkpoints (`flair-cc3m-recap.pt`, ...:
`{"epoch", "name", "state_dict", ...}`, keys possibly prefixed by DDP's `module.`): open_clip's
tower keys without their projections, plus the projections (`image_post.proj`,
`text_post.proj`), the text-conditioned pooling (`visual_proj.*`), `logit_scale` and
`logit_bias`. The pooling's head count and the activation are not in the checkpoint; the preset
supplies them. The key layout: docs/converting.md, *The authors' checkpoint layouts*.
"""

from vlzoo._backends.keras_internals import without_weights
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
            in `vlzoo.from_preset` (e.g. `num_chunks=8`).

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
    >>> model = vlzoo.convert.from_flair_checkpoint("flair-merged30m.pt")  # doctest: +SKIP
    >>> import numpy as np
    >>> images = np.zeros((4, 224, 224, 3), "float32")  # preprocessed pixels
    >>> tuple(model.similarity(images, ["a dog on a sofa", "a red door"]).shape)  # doctest: +SKIP
    (4, 2)
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
