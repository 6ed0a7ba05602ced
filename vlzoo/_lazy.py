"""Package names imported on first use (PEP 562), so that importing a package loads no backend."""

import importlib


def lazy_names(package, namespace, names, submodules=()):
    """`(__getattr__, __dir__, __all__)` for a package whose names are imported when first read.

    Args:
        package: the package's `__name__`, e.g. `"vlzoo"`.
        namespace: the package's `globals()`, where each name is kept once imported.
        names: `{name: module}`: reading `name` imports `module` and returns its `name`.
        submodules: submodule names, imported when read as attributes.

    Example, in a package's `__init__.py`:
    >>> names = {"from_preset": "vlzoo.presets.loading"}
    >>> __getattr__, __dir__, __all__ = lazy_names(__name__, globals(), names)  # doctest: +SKIP
    """
    def __getattr__(name):
        if name in names:
            value = getattr(importlib.import_module(names[name]), name)
        elif name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    public = sorted(names) + list(submodules)

    def __dir__():
        return sorted(set(namespace) | set(public))

    return __getattr__, __dir__, public
