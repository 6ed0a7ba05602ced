"""`from_preset`: any preset as a model, the library's one way to load one.

A registered name or a preset directory is built by `vlzoo.presets.local`; a hub handle, a
pretrained preset or a catalogue URL is first fetched (and converted, once) into a local preset
directory by `vlzoo.presets.remote`; `family=` then starts another family from the CLIP model
(`vlzoo.transfer`).

Example:
>>> model = from_preset("clip_tiny")
>>> model.family
'clip'
"""

from vlzoo import transfer
from vlzoo.presets import catalogue
from vlzoo.presets.files import read_metadata
from vlzoo.presets.local import load_local_preset
from vlzoo.presets.local import resolve_preset
from vlzoo.presets.remote import is_remote
from vlzoo.presets.remote import local_directory


def from_preset(preset, load_weights=True, dtype=None, family=None, **config_overrides):
    """Builds a model from a preset name, a preset directory, a hub handle or a catalogue URL.

    Args:
        preset: a name from `list_presets()`, a pretrained preset from
            `list_presets(pretrained=True)` (downloaded and converted on first
            use), a directory written by `save_to_preset`, a Hugging Face
            Hub repository `"hf://org/name"` or `"hf://org/name@revision"`
            holding a vlzoo preset, a keras-hub CLIP/SigLIP preset, a
            transformers `CLIPModel`/`SiglipModel` or an open_clip model, a
            Kaggle Models version `"kaggle://owner/model/framework/variation
            [/version]"` holding a keras-hub preset (both converted once and
            cached; see `vlzoo.presets.remote`), or the URL of a single-file
            checkpoint the pretrained catalogue names (checked by its sha256).
        load_weights: load the weights when the preset has them. A preset
            without weights loads randomly initialised and says so once.
        dtype: dtype policy (`"float32"`, `"bfloat16"`, `"mixed_bfloat16"`).
        family: build this family instead, on the towers and weights of the
            preset's CLIP model: `"filip"`, `"sparc"`, `"sparo"`, `"llip"`,
            `"stair"`, `"flair"` or another registered family with a `CLIPTransfer`, an
            installed plugin's among them (see `vlzoo.transfer`: what transfers, what is new).
            None (default) or the preset's own family: the preset as it is.
        **config_overrides: replace entries of the preset's model config
            (with `family`: of the new family's config).

    Returns:
        The model, with its tokenizer and image preprocessor attached.

    Example:
    >>> model = vlzoo.from_preset("clip_tiny")
    >>> model = vlzoo.from_preset("clip_vit_b32_openai")  # doctest: +SKIP
    >>> model = vlzoo.from_preset("hf://openai/clip-vit-base-patch32")  # doctest: +SKIP
    >>> model = vlzoo.from_preset("kaggle://keras/siglip/keras/siglip2_base_patch16_224/1")  # doctest: +SKIP
    >>> sparc = vlzoo.from_preset("clip_vit_b16_openai", family="sparc")  # doctest: +SKIP
    """
    name = preset
    if is_remote(preset) or catalogue.is_pretrained(preset):
        preset = local_directory(preset)
    transferred = family is not None and family != read_metadata(resolve_preset(preset)).get("family")
    model = load_local_preset(preset, load_weights=load_weights, dtype=dtype,
                              **({} if transferred else config_overrides))
    if load_weights:
        model.preset_origin = preset_origin(name, preset)
    if transferred:  # `from_clip` records the transfer in the new model's `preset_origin`
        model = transfer.from_clip(model, family, **config_overrides)[0]
    return model


def preset_origin(name, preset):
    """What `save_to_preset` records as the `base_preset` of a model `from_preset(name)` loaded from the local
    `preset`: its name (or handle, or directory) and the licence of its weights (the pretrained catalogue's, or
    what its `metadata.json` records, carried over from its own `base_preset`).

    Example:
    >>> preset_origin("clip_vit_b16_openai", local_directory("clip_vit_b16_openai"))  # doctest: +SKIP
    {'preset': 'clip_vit_b16_openai', 'licence': 'none stated ...'}
    """
    metadata = read_metadata(resolve_preset(preset))
    earlier = metadata.get("base_preset") or {}
    entry = catalogue.pretrained_presets().get(name) if catalogue.is_pretrained(name) else None
    origin = {"preset": str(name), "licence": (entry or {}).get("licence") or earlier.get("licence")
              or metadata.get("licence")}
    return {key: value for key, value in origin.items() if value is not None}
