"""Presets: what exists, the directory format, loading, and the hubs by host.

One module per job:

    catalogue     the registered and pretrained presets, names, directories, descriptions (no Keras)
    files         the preset directory format: its files, read and written (no Keras)
    saving        a model written as a preset directory (`save_to_preset`)
    local         a preset on this machine built into a model; `preset_info`
    remote        hub handles, pretrained presets and URLs fetched (and converted once) into the cache
    loading       `from_preset`: any preset as a model
    huggingface   the Hugging Face Hub, download and upload
    kaggle        Kaggle Models, download and upload
    upload        `upload_preset`: a preset checked, described by a model card, sent to its host

Names are imported on first use (PEP 562), so `vlzoo.presets.catalogue` loads no backend.

Example:
>>> from vlzoo import presets
>>> presets.list_presets(family="clip")[:2]  # doctest: +SKIP
['clip_shapes', 'clip_tiny']
>>> model = presets.from_preset("clip_tiny")  # doctest: +SKIP
"""

from vlzoo._lazy import lazy_names as _lazy_names

_NAMES = {
    **{name: "vlzoo.presets.catalogue" for name in ("describe", "list_presets", "model_config")},
    **{name: "vlzoo.presets.files" for name in (
        "CONFIG_FILE", "METADATA_FILE", "PREPROCESSOR_FILE", "TOKENIZER_ASSETS", "TOKENIZER_FILE", "WEIGHTS_FILE",
        "read_json", "read_metadata")},
    **{name: "vlzoo.presets.local" for name in (
        "count_parameters_abstractly", "import_defining_module", "merge_config", "preset_info", "resolve_preset")},
    **{name: "vlzoo.presets.saving" for name in (
        "save_model_weights", "save_to_preset", "write_preset", "write_registered_preset")},
    "from_preset": "vlzoo.presets.loading",
    "presets_root": "vlzoo._paths",
    "upload_preset": "vlzoo.presets.upload",
}
_SUBMODULES = ("catalogue", "files", "huggingface", "kaggle", "loading", "local", "remote", "saving", "upload")
__getattr__, __dir__, __all__ = _lazy_names(__name__, globals(), _NAMES, _SUBMODULES)
