"""Converters by checkpoint format, registered by the modules that define them.

- `register_converter(name, convert)`: the converter of a format whose checkpoints need a vlzoo
  preset for their architecture (the authors' training checkpoints of `vlzoo.formats`);
  `vlzoo convert --from NAME --preset P`, `convert_checkpoint` and the catalogue's URL entries
  find it with `converter(name)`.
- `register_architecture(fmt, key, reader)`: how a library format, whose checkpoints name their
  architecture, converts one of them: transformers by `model_type`, keras-hub by backbone class
  (`vlzoo.convert.transformers.register_model_type` and `vlzoo.convert.keras_hub.register_backbone`
  say what their `reader` is). A family whose weights come in such a format registers its
  architecture there, beside its model; `architecture(fmt, key)` and `architectures(fmt)` read them.

Example, for a format `mine` declared with `vlzoo.formats.register_format`:
>>> register_converter("mine", from_mine_checkpoint)  # doctest: +SKIP
"""

import functools

from vlzoo import formats
from vlzoo.convert.state_dict import load_state_dict

__all__ = ["architecture", "architectures", "converter", "read_weights_only", "register_architecture",
           "register_converter"]

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


_ARCHITECTURES = {}


def register_architecture(fmt, key, reader):
    """Registers `reader`, the conversion of the architecture `key` of the library format `fmt`.

    Args:
        fmt: a format of `vlzoo.formats` whose checkpoints carry their configuration.
        key: how a checkpoint of `fmt` names its architecture (a transformers `model_type`, a keras-hub
            backbone class name).
        reader: what the format's converter calls for it (each format documents its own).

    Raises:
        ValueError: `fmt` is not a registered format, or its checkpoints need a vlzoo preset.
    """
    if formats.get_format(fmt).architecture is not None:
        raise ValueError(f"The {fmt} format's checkpoints take a vlzoo preset; register_architecture is for the "
                         "formats whose checkpoints carry their configuration.")
    _ARCHITECTURES.setdefault(fmt, {})[key] = reader


def architectures(fmt):
    """The architecture keys registered for the library format `fmt`, in registration order."""
    return tuple(_ARCHITECTURES.get(fmt, ()))


def architecture(fmt, key):
    """The reader registered for the architecture `key` of `fmt`.

    Raises:
        NotImplementedError: naming the registered keys when `key` has none.
    """
    readers = _ARCHITECTURES.get(fmt, {})
    if key not in readers:
        raise NotImplementedError(f"vlzoo converts no {fmt} architecture {key!r}; registered: "
                                  f"{', '.join(repr(k) for k in readers) or 'none'}.")
    return readers[key]
