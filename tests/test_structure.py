"""The package's shape, read from the source (no import, no backend): no import cycle, layers
that import only downwards, no import hidden in a function but the CLI's, Keras internals
behind one module, backend switches in one package, no module over 800 lines."""

import ast
import functools
import pathlib
import subprocess
import sys

import pytest
from backend_utils import run_once

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Reads the source and starts processes with no backend: the same on every pass, so it runs in one.
pytestmark = run_once

PACKAGE = ROOT / "vlzoo"
MAX_LINES = 800

# Lower layers must not import higher ones (prefix match on module names).
_PRESETS_ABOVE_FILES = ("vlzoo.presets.local", "vlzoo.presets.remote", "vlzoo.presets.loading", "vlzoo.presets.upload",
                        "vlzoo.presets.huggingface", "vlzoo.presets.kaggle")  # what builds, fetches or sends models
FORBIDDEN = {
    "vlzoo.models": ("vlzoo.distribution", "vlzoo.convert", "vlzoo.evaluation", "vlzoo.cli", "vlzoo.training",
                     "vlzoo.transfer", *_PRESETS_ABOVE_FILES),
    "vlzoo.families": ("vlzoo.models", "vlzoo.presets.saving", "vlzoo.convert", "vlzoo.transfer",
                       *_PRESETS_ABOVE_FILES),
    "vlzoo.presets.files": ("vlzoo.presets.", "vlzoo.models"),
    "vlzoo.presets.catalogue": ("vlzoo.presets.saving", "vlzoo.models", *_PRESETS_ABOVE_FILES),
    "vlzoo.presets.saving": ("vlzoo.models", "vlzoo.presets.catalogue", *_PRESETS_ABOVE_FILES),
    "vlzoo.presets.local": ("vlzoo.models", "vlzoo.convert", *_PRESETS_ABOVE_FILES),
    "vlzoo.presets.huggingface": ("vlzoo.models", "vlzoo.convert", "vlzoo.presets.catalogue", *_PRESETS_ABOVE_FILES),
    "vlzoo.presets.kaggle": ("vlzoo.models", "vlzoo.convert", "vlzoo.presets.catalogue", *_PRESETS_ABOVE_FILES),
    "vlzoo.presets.remote": ("vlzoo.models", "vlzoo.presets.loading", "vlzoo.presets.upload"),
    "vlzoo.tokenizers": ("vlzoo.models", "vlzoo.presets"),
    "vlzoo.preprocessing": ("vlzoo.models", "vlzoo.presets"),
    "vlzoo.layers": ("vlzoo.models",),
    "vlzoo.losses": ("vlzoo.models", "vlzoo.layers"),
    "vlzoo.data": ("vlzoo.models", "vlzoo.evaluation", "vlzoo.cli"),
    "vlzoo.compiled": ("vlzoo.models", "vlzoo.layers", "vlzoo.presets", "vlzoo.training", "vlzoo.cli"),
    "vlzoo.parallel": ("vlzoo.models", "vlzoo.presets", "vlzoo.data", "vlzoo.training", "vlzoo.cli"),
    "vlzoo.optimizers": ("vlzoo.models", "vlzoo.layers", "vlzoo.presets", "vlzoo.training", "vlzoo.cli"),
    "vlzoo.kernels": ("vlzoo.models", "vlzoo.layers", "vlzoo.presets", "vlzoo.training", "vlzoo.cli"),
    # The fenced package of what differs per backend and of the workarounds of Keras' gaps is the floor: it
    # imports only itself and the leaf helpers; the rooms above it, the public facades over it among them, import it.
    "vlzoo._backends": ("vlzoo.models", "vlzoo.layers", "vlzoo.losses", "vlzoo.data", "vlzoo.presets", "vlzoo.training",
                        "vlzoo.cli", "vlzoo.evaluation", "vlzoo.convert", "vlzoo.tokenizers", "vlzoo.preprocessing",
                        "vlzoo.families", "vlzoo.transfer", "vlzoo.distribution", "vlzoo.serving", "vlzoo.compiled",
                        "vlzoo.parallel", "vlzoo.optimizers", "vlzoo.kernels"),
}
# Modules that must import without Keras (what listing and checking names reads).
KERAS_FREE = ("vlzoo", "vlzoo.version", "vlzoo.presets", "vlzoo.presets.catalogue", "vlzoo.presets.files",
              "vlzoo.families", "vlzoo.formats", "vlzoo.plugins", "vlzoo._lazy", "vlzoo._paths", "vlzoo._arrays")


def _module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _resolve(module, node, path):
    """The vlzoo modules an import statement names (a package's submodule when it is one)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = module if path.name == "__init__.py" else module.rpartition(".")[0]
        if node.level:
            base = ".".join(base.split(".")[: len(base.split(".")) - node.level + 1])
            base = ".".join(filter(None, [base, node.module]))
        else:
            base = node.module
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    found = []
    for name in names:
        while name not in MODULES and "." in name:
            name = name.rpartition(".")[0]
        if name in MODULES and name != module:
            found.append(name)
    return found


@functools.cache
def _imports():
    """`(module, imported module, line, inside a function)` for every vlzoo import in the package (read when a test
    asks: the file is collected on every pass, and runs on one)."""
    rows = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        nested = {id(inner) for outer in ast.walk(tree) if isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef))
                  for inner in ast.walk(outer) if isinstance(inner, (ast.Import, ast.ImportFrom))}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                rows += [(module, target, node.lineno, id(node) in nested) for target in _resolve(module, node, path)]
    return rows



def _cycles(edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return components


def test_the_analysis_sees_the_package():
    # Guards the guard: the parser finds the modules and the edges it must.
    assert {"vlzoo.models.base", "vlzoo.presets", "vlzoo.presets.catalogue", "vlzoo.cli", "vlzoo.tokenizers"} <= set(
        MODULES)
    edges = {(a, b) for a, b, _, _ in _imports()}
    assert ("vlzoo.models.base", "vlzoo.presets.saving") in edges
    assert ("vlzoo.distribution", "vlzoo.presets.catalogue") in edges
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]


def test_no_import_cycle():
    """Counting imports inside functions too: a cycle held by a late import is still a cycle."""
    edges = {}
    for module, target, _, _ in _imports():
        edges.setdefault(module, set()).add(target)
    assert _cycles(edges) == []


@pytest.mark.parametrize("lower", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_higher_ones(lower):
    wrong = [f"{m} -> {t} (line {line})" for m, t, line, _ in _imports()
             if (m == lower or m.startswith(lower + ".")) and t.startswith(FORBIDDEN[lower])]
    assert wrong == []


def test_imports_inside_functions_only_in_the_cli():
    """The CLI imports a command's backend-heavy modules when the command runs (so `--help` stays
    light); nowhere else does an import of vlzoo hide inside a function."""
    hidden = [f"{m} -> {t} (line {line})" for m, t, line, nested in _imports()
              if nested and not (m == "vlzoo.cli" or m.startswith("vlzoo.cli."))]
    assert hidden == []


def test_keras_free_modules_do_not_import_keras():
    for module in KERAS_FREE:
        tree = ast.parse(MODULES[module].read_text())
        names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        assert not any(name.split(".")[0] in ("keras", "jax", "tensorflow", "torch") for name in names), module
        assert not [t for m, t, _, _ in _imports() if m == module and t not in KERAS_FREE], module


# Outside the fenced package, the places that read the backend's name without choosing a code path by it: the
# name reported (the command line's messages and records, the serving manifest) or passed to serving's public
# table of what Keras' exporters support, and the losses' caches of rematerialised functions keyed by it.
_BACKEND_NAME_READERS = {"vlzoo/cli/convert.py": 1, "vlzoo/cli/demo.py": 1, "vlzoo/cli/export.py": 1,
                         "vlzoo/cli/retrieve.py": 1, "vlzoo/cli/train.py": 1, "vlzoo/cli/zeroshot.py": 1,
                         "vlzoo/serving.py": 2, "vlzoo/losses/_chunking.py": 1, "vlzoo/losses/stair.py": 1}


def test_backend_switches_only_in_the_fenced_package():
    """What differs per backend is chosen in `vlzoo._backends` (its running modules and named switches);
    elsewhere the backend's name is only read where `_BACKEND_NAME_READERS` says."""
    readers = {str(path.relative_to(ROOT)): n for path in PACKAGE.rglob("*.py")
               if not path.is_relative_to(PACKAGE / "_backends")
               and (n := path.read_text().count("keras.backend.backend()"))}
    assert readers == _BACKEND_NAME_READERS


def test_keras_internals_only_behind_one_helper():
    users = sorted(str(path.relative_to(ROOT)) for folder in ("vlzoo", "tools", "tests")
                   for path in (ROOT / folder).rglob("*.py")
                   if path != pathlib.Path(__file__) and "keras.src" in path.read_text())
    assert users == ["vlzoo/_backends/keras_internals.py"]


def test_no_module_over_800_lines():
    long = {str(path.relative_to(ROOT)): n for folder in ("vlzoo", "tools", "tests")
            for path in (ROOT / folder).rglob("*.py")
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


_CATALOGUE_COMMANDS = """
import contextlib, io, sys
from vlzoo.cli import main
for argv in (["list"], ["list", "--pretrained"], ["list", "--family", "sparc"], ["info", "clip_tiny"],
             ["info", "clip_vit_b16_openai"], ["--help"], ["train", "--help"]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            status = main(argv)
        except SystemExit as exit:  # --help
            status = exit.code
    assert status == 0 and out.getvalue().strip(), (argv, status)
print(sorted(name for name in ("keras", "jax", "tensorflow", "torch", "h5py") if name in sys.modules))
"""


def test_listing_describing_and_help_import_no_backend():
    """`vlzoo list`, `info` of a registered or pretrained preset and `--help` read the catalogue only:
    no Keras, no framework (they answer in well under a second instead of a framework's import)."""
    result = subprocess.run([sys.executable, "-c", _CATALOGUE_COMMANDS], capture_output=True, text=True,
                            cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
