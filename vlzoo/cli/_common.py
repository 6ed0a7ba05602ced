"""Helpers shared by the `vlzoo` commands: usage errors, preset loading, reports, argparse types and options.

Imports no backend at module level (`vlzoo --help` stays fast): the vlzoo modules are imported
inside the functions that need them.
"""

import argparse
import contextlib
import json
import math
import os
import warnings


class UsageError(Exception):
    """A user mistake in the value of `argument`; printed as one line, exit status 2."""

    def __init__(self, argument, message):
        super().__init__(f"argument {argument}: {message}" if argument else message)


@contextlib.contextmanager
def _naming(argument):
    """Re-raises the `ValueError` / `FileNotFoundError` of a reader as a `UsageError` naming `argument`."""
    try:
        yield
    except (ValueError, FileNotFoundError) as error:
        raise UsageError(argument, str(error)) from None


def _check_file(path, argument, what="file"):
    if not os.path.exists(path):
        raise UsageError(argument, f"{what} not found: {path}")
    return path


def _format_metrics(metrics):
    return "  ".join(f"{k}={v:.3f}" for k, v in metrics.items())


def _format_params(n):
    if n >= 1e9:
        return f"{n / 1e9:.2f}B"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    if n >= 1e3:
        return f"{n / 1e3:.1f}K"
    return str(n)


def _write_json(path, payload, out):
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2)
        f.write("\n")
    print(f"wrote {path}", file=out)


# ----------------------------------------------------------------------------- presets


def _load(preset, out, family=None, dtype=None):
    """`vlzoo.from_preset(preset, family=family, dtype=dtype)`, printing its warnings as plain notes."""
    # heavy: imports a backend
    import vlzoo

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = vlzoo.from_preset(preset, family=family, dtype=dtype)
    for warning in caught:
        print(f"note: {warning.message}", file=out)
    return model


def _load_preset(preset, out, family=None, dtype=None, argument="--preset"):
    """`_load`, with a bad preset reported as a usage error naming `argument` (from_preset's suggestions kept)."""
    with _naming(argument):
        return _load(preset, out, family=family, dtype=dtype)


def _check_preset(preset, argument="--preset"):
    """Fails fast (before reading any data) on a preset (`argument`) that is neither registered nor a directory.

    Handles and pretrained names pass: they are fetched, and a malformed handle refused, when loaded."""
    # heavy: imports a backend
    from vlzoo.presets import catalogue
    from vlzoo.presets.local import resolve_preset
    from vlzoo.presets.remote import is_remote

    if is_remote(preset) or catalogue.is_pretrained(preset):
        return
    with _naming(argument):
        resolve_preset(preset)


# ----------------------------------------------------------------------------- argparse


def _number(kind, allow_zero):
    """An argparse `type`: `kind` (int or float) that is > 0, or >= 0 with `allow_zero`, and finite."""
    expected = f"{'an integer' if kind is int else 'a number'} >= 0" if allow_zero else (
        f"a positive {'integer' if kind is int else 'number'}")

    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}") from None
        if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}")
        return value

    return parse


def _probability(closed):
    """An argparse `type`: a number in [0, 1] (`closed`) or in (0, 1)."""
    expected = "a number in [0, 1]" if closed else "a number in (0, 1)"

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}") from None
        if not (0 <= value <= 1 if closed else 0 < value < 1):
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}")
        return value

    return parse


_positive_int = _number(int, allow_zero=False)
_non_negative_int = _number(int, allow_zero=True)
_positive_float = _number(float, allow_zero=False)
_non_negative_float = _number(float, allow_zero=True)


def _add_command(sub, name, help, description, examples):
    return sub.add_parser(
        name, help=help, description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n" + "\n".join(f"  {line}" for line in examples),
    )


def _add_report_options(p, json_help):
    p.add_argument("--json", default=None, metavar="OUT", help=json_help)
    p.add_argument("--verbose", action="store_true", help="show progress bars while encoding")


def _add_ties(p, applies_to=""):
    """`--ties`: one default for every command that ranks (`vlzoo retrieve`, `vlzoo eval`)."""
    p.add_argument("--ties", default="expected", choices=("expected", "pessimistic", "optimistic"),
                   help=f"{applies_to}tied scores count their expected value under a random order (default; "
                   "chance for a constant model, and repeated captions of different images share their hits), "
                   "as failed (the benchmarks' own scripts; retrieval_recall's default) or as passed")


def _add_preset(p, required=True):
    p.add_argument("--preset", required=required, metavar="NAME_OR_DIR",
                   help="a registered or pretrained preset name (see `vlzoo list [--pretrained]`), a "
                   "preset directory written by save_to_preset / `vlzoo train` / `vlzoo convert`, or "
                   "a hub handle hf://org/name[@revision] or kaggle://owner/model/framework/variation[/version]")


def _add_image_key(p):
    p.add_argument("--image-key", default=None, metavar="KEY",
                   help="caption files: column/key of the image path (default: the first present of image, "
                   "file_name, filename, filepath, image_path, path)")


def _add_caption_keys(p, caption_help):
    _add_image_key(p)
    p.add_argument("--caption-key", default=None, metavar="KEY", help=caption_help)
    p.add_argument("--on-error", default="raise", choices=("raise", "skip"),
                   help="bad records (missing or undecodable image, empty caption, malformed row): raise an "
                   "error naming the file and line, or skip and count them (default: %(default)s)")
