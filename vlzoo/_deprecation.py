"""Names kept for a while with a `DeprecationWarning`: constants that became functions
(`deprecated_constants`), modules that moved (`moved_module`), functions folded into another one's
argument (`warn_renamed`), arguments replaced by another (`warn_argument`).

The first two are module `__getattr__` hooks (PEP 562): the warning names the replacement, and the
old name keeps working.
"""

import importlib
import warnings


_MISSING = object()


def _warn(name, replacement, verb, stacklevel=3):
    """The warning, attributed `stacklevel` frames up (3: the code that read a module's old name)."""
    warnings.warn(f"`{name}` is deprecated; {verb} `{replacement}`.", DeprecationWarning, stacklevel=stacklevel)


def deprecated_constants(module_name, constants):
    """A module `__getattr__` serving former constants.

    Args:
        module_name: the module's `__name__` (for the AttributeError of any other name).
        constants: `{name: (replacement, function)}`: reading `name` warns that it is deprecated,
            naming `replacement`, and returns `function()`.

    Example, in a module:
    >>> __getattr__ = deprecated_constants(__name__, {"FORMATS": ("formats()", formats)})  # doctest: +SKIP
    """
    def __getattr__(name):
        if name not in constants:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        replacement, function = constants[name]
        _warn(name, replacement, "call")
        return function()

    return __getattr__


def moved_module(module_name, targets, renamed=None):
    """`(__getattr__, __dir__)` for a module whose names moved to `targets`.

    Reading a name of the old module imports the first of `targets` that defines it (so the old
    module imports nothing until a name is read), warns that the old name is deprecated, naming
    the new one, and returns the new module's value.

    Args:
        module_name: the old module's `__name__`, e.g. `"vlzoo.hub"`.
        targets: the new modules' names, searched in order.
        renamed: `{old name: "new.module.new_name"}` for names that changed on the way.

    Raises:
        AttributeError: (from `__getattr__`) a name no target defines.

    Example, the whole of a moved module:
    >>> __getattr__, __dir__ = moved_module(__name__, ["vlzoo.presets.huggingface"])  # doctest: +SKIP
    """
    renamed = dict(renamed or {})

    def __getattr__(name):
        if name.startswith("__"):  # the module protocol (`__path__`, `__file__`, ...), not a moved name
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        places = [renamed[name].rpartition(".")[::2]] if name in renamed else [(module, name) for module in targets]
        for module, new_name in places:
            value = getattr(importlib.import_module(module), new_name, _MISSING)
            if value is not _MISSING:
                _warn(f"{module_name}.{name}", f"{module}.{new_name}", "use")
                return value
        raise AttributeError(f"module {module_name!r} has no attribute {name!r} (it moved to {', '.join(targets)})")

    def __dir__():
        return sorted({*renamed, *(name for module in targets for name in dir(importlib.import_module(module))
                                   if not name.startswith("__"))})

    return __getattr__, __dir__


def warn_renamed(old, new):
    """Warns, at the caller of the deprecated function that calls this, that `old` is deprecated for `new`.

    Example, in a deprecated function:
    >>> def clip_loss_rows(i, t, s, start, count):  # doctest: +SKIP
    ...     warn_renamed("clip_loss_rows(..., start, count)", "clip_loss(..., rows=(start, count))")
    ...     return clip_loss(i, t, s, rows=(start, count))
    """
    _warn(old, new, "call", stacklevel=4)


def warn_argument(old, new, depth=0):
    """Warns, at the caller of the function that calls this, that its argument `old` is deprecated for `new`.

    `depth` counts the helpers between that function and this call (1 for a helper it calls, which calls this).

    Example, in a function whose `chunk_size` became `num_chunks`:
    >>> if chunk_size is not None:  # doctest: +SKIP
    ...     warn_argument("chunk_size", "num_chunks")
    """
    _warn(old, new, "use", stacklevel=4 + depth)
