"""Module constants that became functions, kept for a while with a `DeprecationWarning`."""

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
