"""docs/api.md, the public API's page: its `vlzoo` section is exactly `vlzoo.__all__`, every name it lists
exists where it says, with the arguments and defaults it shows, and its command table is the command line's.

Reads names and signatures, the same on every backend: one pass."""

import argparse
import ast
import importlib
import inspect
import pathlib
import re

import pytest
from backend_utils import run_once

import vlzoo
from vlzoo import models
from vlzoo.cli import build_parser

pytestmark = run_once

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "api.md"
# A table row's first cell: one code span, a name with an optional argument list.
ROW = re.compile(r"^\| `(?P<name>[\w.]+(?: [\w-]+)?)(?:\((?P<arguments>.*)\))?` \|")
HEADING = re.compile(r"^#+ (?:`(?P<module>vlzoo[\w.]*)`)?")


def _entries():
    """`[(section module or None, name, argument text or None)]` of the page's tables, in order."""
    module, entries = None, []
    for line in PAGE.read_text().splitlines():
        heading = HEADING.match(line)
        if heading:
            module = heading["module"]
            continue
        row = ROW.match(line)
        if row:
            entries.append((module, row["name"], row["arguments"]))
    return entries


def _resolve(module, name):
    """The object `name` names: absolute (`vlzoo.x.y`), a model's (`model.m`, `FILIP.m`) or in `module`."""
    owner, _, attribute = name.partition(".")
    if owner == "model":
        return getattr(models.ContrastiveModel, attribute)
    if owner in dir(models) and attribute:
        return getattr(getattr(models, owner), attribute)
    if owner != "vlzoo":
        assert module is not None, f"{name!r} sits under no module heading"
        name = f"{module}.{name}"
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            value = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for part in parts[split:]:
            value = getattr(value, part)
        return value
    raise AssertionError(f"{name!r} names no module")


def _check_arguments(function, arguments, name):
    """Each argument shown is a parameter of `function`, of that kind, with the default shown."""
    shown = ast.parse(f"def f({arguments}): pass").body[0].args
    parameters = inspect.signature(function).parameters
    positional = shown.posonlyargs + shown.args
    defaults = dict(zip([a.arg for a in positional][len(positional) - len(shown.defaults):], shown.defaults))
    defaults.update({a.arg: d for a, d in zip(shown.kwonlyargs, shown.kw_defaults) if d is not None})
    kinds = {inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD}
    for argument in positional + shown.kwonlyargs:
        assert argument.arg in parameters, f"{name}: no argument {argument.arg!r}"
        parameter = parameters[argument.arg]
        keyword_only = parameter.kind is inspect.Parameter.KEYWORD_ONLY
        assert keyword_only == (argument in shown.kwonlyargs) and (keyword_only or parameter.kind in kinds), (
            f"{name}: {argument.arg} is {parameter.kind.description}")
        if argument.arg in defaults:
            assert parameter.default == ast.literal_eval(defaults[argument.arg]), f"{name}: {argument.arg}'s default"
        else:
            assert parameter.default is inspect.Parameter.empty, f"{name}: {argument.arg} has a default"
    for variadic, kind in ((shown.vararg, inspect.Parameter.VAR_POSITIONAL),
                           (shown.kwarg, inspect.Parameter.VAR_KEYWORD)):
        if variadic is not None:
            assert parameters.get(variadic.arg) and parameters[variadic.arg].kind == kind, f"{name}: {variadic.arg}"


def test_the_vlzoo_section_is_vlzoo_all():
    listed = [name for module, name, _ in _entries() if module == "vlzoo"]
    assert sorted(listed) == sorted(vlzoo.__all__)


def test_every_name_exists_with_the_arguments_shown():
    entries = [entry for entry in _entries() if not entry[1].startswith("vlzoo ")]
    assert len(entries) > 100
    for module, name, arguments in entries:
        value = _resolve(module, name)
        if arguments is not None:
            _check_arguments(value, arguments, name)


def test_the_command_table_is_the_command_line():
    listed = {name.split()[1] for _, name, _ in _entries() if name.startswith("vlzoo ")}
    subparsers = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    assert listed == set(subparsers.choices)


def test_a_wrong_argument_is_caught():
    for arguments, error in (("preset", "no argument 'preset'"), ('family="clip"', "family's default"),
                             ("family", "family has a default"), ("*, name", "name is positional or keyword")):
        with pytest.raises(AssertionError, match=re.escape(error)):
            _check_arguments(vlzoo.list_presets if "family" in arguments else vlzoo.preset_info, arguments, "f")
