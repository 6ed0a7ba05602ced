"""The converter of each checkpoint format that needs a vlzoo preset for its architecture (the authors'
training checkpoints of `vlzoo.formats`), registered by its converter module.

`vlzoo convert --from NAME --preset P`, `convert_checkpoint` and the catalogue's URL entries find
the function here; the library formats (open_clip, transformers, keras-hub), which carry their
configuration, have readers of their own in `vlzoo.convert.checkpoints`.

Example, for a format `mine` declared with `vlzoo.formats.register_format`:
>>> register_converter("mine", from_mine_checkpoint)  # doctest: +SKIP
"""

import functools

from vlzoo import formats
from vlzoo.convert.state_dict import load_state_dict

__all__ = ["converter", "read_weights_only", "register_converter"]

read_weights_only = functools.partial(load_state_dict, torchscript=False)
"""`read_weights_only(path)`: a `.pt`/`.pth`/`.bin`/`.safetensors` state dict read with torch's
weights-only unpickler (an authors' checkpoint is a plain state dict; nothing in a file runs code)."""

_CONVERTERS = {}


def register_converter(name, convert, read=read_weights_only):
    """Registers the converter of the checkpoint format `name`.

    Args:
        name: a format of `vlzoo.formats` with an `architecture`.
        convert: `convert(weights, preset, *, dtype=None, progress=None)` -> the vlzoo model of the
            preset `preset` (a name or directory) holding `weights`.
        read: `read(path)` -> the `weights` `convert` takes (default: a state dict file).

    Raises:
        ValueError: `name` is not a registered format, or its checkpoints carry their configuration.
    """
    if formats.get_format(name).architecture is None:
        raise ValueError(f"The {name} format carries its configuration; register_converter is for the formats "
                         f"whose checkpoints take a vlzoo preset ({', '.join(formats.architecture_formats())}).")
    _CONVERTERS[name] = (read, convert)


def converter(name):
    """`(read, convert)` registered for the format `name`.

    Raises:
        ValueError: naming the formats with a converter when `name` has none.
    """
    if name not in _CONVERTERS:
        raise ValueError(f"No converter is registered for the checkpoint format {name!r}; registered: "
                         f"{', '.join(_CONVERTERS)}.")
    return _CONVERTERS[name]
