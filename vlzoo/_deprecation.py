"""Former names kept for a while with a `DeprecationWarning`: module constants that became functions
(`deprecated_constants`) and functions folded into another one's argument (`warn_renamed`)."""

import warnings


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
        warnings.warn(f"`{name}` is deprecated; call `{replacement}`.", DeprecationWarning, stacklevel=2)
        return function()

    return __getattr__


def warn_renamed(old, new):
    """Warns, at the caller of the deprecated function that calls this, that `old` is deprecated for `new`.

    Example, in a deprecated function:
    >>> def clip_loss_rows(i, t, s, start, count):  # doctest: +SKIP
    ...     warn_renamed("clip_loss_rows(..., start, count)", "clip_loss(..., rows=(start, count))")
    ...     return clip_loss(i, t, s, rows=(start, count))
    """
    warnings.warn(f"`{old}` is deprecated; call `{new}`.", DeprecationWarning, stacklevel=3)
