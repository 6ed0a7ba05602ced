"""The checkpoint formats vlzoo reads, by name: one table for `vlzoo convert --from`, the catalogue of
pretrained presets (`format`) and the hub repositories `from_preset` converts on download.

Keras-free, so that the command line and `vlzoo list` read it without importing a backend. A format
declares here what it is; the function that converts it is registered by its converter module
(`vlzoo.convert.register_converter`). vlzoo's own formats are declared below; another package
declares its own with `register_format` when it is imported.

Example:
>>> from vlzoo import formats
>>> formats.get_format("llip").architecture
'llip_vit_b16'
>>> formats.converted_formats()[:3]
('open_clip', 'transformers', 'keras_hub')
"""

import dataclasses

__all__ = [
    "CheckpointFormat", "architecture_formats", "catalogue_formats", "converted_formats", "get_format",
    "register_format", "repository_formats", "url_formats",
]


@dataclasses.dataclass(frozen=True)
class CheckpointFormat:
    """A checkpoint format.

    Args:
        name: its name: `vlzoo convert --from NAME`, a catalogue entry's `format`.
        summary: what its files are, in a few words (the command line's help).
        architecture: for a checkpoint that does not describe its own architecture (an authors'
            training checkpoint): an example of the vlzoo preset that gives it (`--preset`); None
            when the checkpoint carries its configuration.
        repository: a hub repository holding this layout loads by handle (`from_preset("hf://...")`).
        url: a catalogue entry may give this format's weights as one file at a URL (with its
            `architecture` preset).
        converted: `vlzoo convert` reads it (False for vlzoo's own presets, which need no conversion).
    """

    name: str
    summary: str
    architecture: str | None = None
    repository: bool = False
    url: bool = False
    converted: bool = True


_FORMATS = {}


def register_format(fmt):
    """Adds `fmt` (a `CheckpointFormat`) to the table; registering the same format again is a no-op.

    Raises:
        TypeError: `fmt` is not a `CheckpointFormat`.
        ValueError: another format of the same name is registered.
    """
    if not isinstance(fmt, CheckpointFormat):
        raise TypeError(f"`fmt` must be a vlzoo.formats.CheckpointFormat; received {type(fmt).__name__}.")
    if _FORMATS.get(fmt.name, fmt) != fmt:
        raise ValueError(f"A checkpoint format named {fmt.name!r} is registered already: {_FORMATS[fmt.name]}.")
    _FORMATS[fmt.name] = fmt
    return fmt


def get_format(name):
    """The registered `CheckpointFormat` called `name`.

    Raises:
        ValueError: naming the registered formats when none is called `name`.
    """
    if name not in _FORMATS:
        raise ValueError(f"Unknown checkpoint format {name!r}; expected one of {', '.join(_FORMATS)}.")
    return _FORMATS[name]


def _names(keep):
    return tuple(name for name, fmt in _FORMATS.items() if keep(fmt))


def converted_formats():
    """The formats `vlzoo convert` reads, in registration order."""
    return _names(lambda fmt: fmt.converted)


def architecture_formats():
    """`{name: example preset}` of the formats whose checkpoints need a vlzoo preset for their architecture."""
    return {name: _FORMATS[name].architecture for name in _names(lambda fmt: fmt.architecture is not None)}


def repository_formats():
    """The layouts of hub repositories that load by handle."""
    return _names(lambda fmt: fmt.repository)


def url_formats():
    """The formats a catalogue entry may give as one file at a URL."""
    return _names(lambda fmt: fmt.url)


def catalogue_formats():
    """The `format`s a catalogue entry may have: a repository layout or a file at a URL."""
    return _names(lambda fmt: fmt.repository or fmt.url)


for _fmt in (
    CheckpointFormat("vlzoo", "a vlzoo preset", repository=True, converted=False),
    CheckpointFormat("open_clip", "an open_clip state dict with its model config", repository=True),
    CheckpointFormat("transformers", "a transformers CLIPModel / SiglipModel", repository=True),
    CheckpointFormat("keras_hub", "a keras-hub CLIPBackbone / SigLIPBackbone preset", repository=True),
    CheckpointFormat("llip", "a checkpoint of the Llip authors' code", architecture="llip_vit_b16", url=True),
    CheckpointFormat("sparo", "a checkpoint of the SPARO authors' open_clip fork", architecture="sparo_clip_vit_b16"),
    CheckpointFormat("flair", "a checkpoint of the FLAIR authors' code", architecture="flair_vit_b16", url=True),
    CheckpointFormat("big_vision", "a big_vision SigLIP / SigLIP 2 .npz", architecture="siglip2_vit_b16"),
):
    register_format(_fmt)
del _fmt
