"""Publishing presets: `upload_preset(handle, preset_dir)` to the Hugging Face Hub or Kaggle Models.

The reverse of `from_preset`'s handles, as keras-hub's `upload_preset`:

    hf://user/name                      a Hub model repository, created when absent, one commit
    hf://user/name@branch               ... committed to that (existing) branch
    kaggle://user/model/keras/variant   a new version of a Kaggle Models variation (created when absent)

Nothing leaves the machine before the preset directory is checked (`validate_preset`): it
must hold `config.json`, `metadata.json` and `model.weights.h5`, and load as a vlzoo preset:
the weights file's arrays are the ones the config's model has, the tokenizer's assets are
there. A file that is missing or does not fit is named in the error.

When neither the preset directory nor the remote repository has a `README.md`, a model card
is written for the upload (`model_card`): the family and its paper, the parameter count,
the preset it started from and the licence of those weights, training data and steps when
`metadata.json` records them, and the results of `vlzoo eval --json` files found beside it.

The transfers are the hosts' modules': `vlzoo.presets.huggingface` (all files in one commit) and
`vlzoo.presets.kaggle` (a new version), each with its client's credentials.

Example:
>>> model = vlzoo.from_preset("clip_vit_b16_openai")  # doctest: +SKIP
>>> model.fit(...)  # doctest: +SKIP
>>> vlzoo.upload_preset("hf://me/clip-b16-finetuned", model)  # doctest: +SKIP
'3f9a...'  # the commit
"""

import json
import os
import pathlib
import re
import tempfile

from vlzoo.presets import catalogue
from vlzoo.presets import huggingface
from vlzoo.presets import kaggle
from vlzoo.presets.files import CARD_FILE  # noqa: F401  (public: the model card's file name)
from vlzoo.presets.files import CONFIG_FILE
from vlzoo.presets.files import METADATA_FILE
from vlzoo.presets.files import WEIGHTS_FILE
from vlzoo.presets.files import read_json
from vlzoo.presets.local import load_local_preset

REQUIRED_FILES = (CONFIG_FILE, METADATA_FILE, WEIGHTS_FILE)
_COMMIT_MESSAGE = "Upload vlzoo preset"


def _directory(preset_dir):
    directory = pathlib.Path(preset_dir).expanduser()
    if not directory.is_dir():
        raise NotADirectoryError(f"`preset_dir` {str(preset_dir)!r} is not a directory (write one with "
                                 "`model.save_to_preset(path)`).")
    return directory


def validate_preset(preset_dir):
    """Checks that `preset_dir` is a complete vlzoo preset; returns the model it loads as.

    The required files are there (`config.json`, `metadata.json`, `model.weights.h5`), and the
    preset loads (`vlzoo.presets.local.load_local_preset`): every array of the weights file fills a
    variable of the model `config.json` describes (no more, no fewer), and the tokenizer
    `tokenizer.json` names finds its assets.

    Raises:
        NotADirectoryError: `preset_dir` is not a directory.
        FileNotFoundError: naming a required file or tokenizer asset that is missing.
        ValueError: naming the file that does not load or does not fit the config.

    Example:
    >>> validate_preset("runs/clip_tiny_finetuned")  # doctest: +SKIP
    <CLIP name=clip, built=True>
    """
    directory = _directory(preset_dir)
    for name in REQUIRED_FILES:
        if not (directory / name).is_file():
            raise FileNotFoundError(
                f"`preset_dir` {directory} is not a complete preset: {name} is missing (a preset written by "
                f"`save_to_preset` holds {', '.join(REQUIRED_FILES)}). Nothing was uploaded."
            )
    try:
        return load_local_preset(str(directory))
    except (ValueError, FileNotFoundError, KeyError, TypeError) as error:
        kind = FileNotFoundError if isinstance(error, FileNotFoundError) else ValueError
        raise kind(f"`preset_dir` {directory} does not load as a vlzoo preset: {error} Nothing was uploaded.") \
            from error


# ----------------------------------------------------------------------------- the model card

def evaluation_records(preset_dir):
    """`vlzoo eval --json` records found in `preset_dir`: every `*.json` file holding a list of records with
    `"dataset"` and `"metrics"` keys, in file-name order.

    Example:
    >>> evaluation_records("runs/clip_tiny_finetuned")  # doctest: +SKIP
    [{'dataset': 'winoground', 'metrics': {'text_score': 0.26, ...}, ...}]
    """
    records = []
    for path in sorted(_directory(preset_dir).glob("*.json")):
        try:
            found = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(found, list) and found and all(
                isinstance(r, dict) and "dataset" in r and isinstance(r.get("metrics"), dict) for r in found):
            records.extend(found)
    return records


def _family_paper(family):
    for name in catalogue.names(family) if family in catalogue.families() else ():
        paper = catalogue.definition(name).get("paper")
        if paper:
            return paper
    return None


def _spdx(licence):
    """The Hub's `license:` identifier for a recorded licence: its first word when it reads like one, else other."""
    word = str(licence or "").split(" ")[0].strip(";,.()").lower()
    known = {"mit", "apache-2.0", "bsd-3-clause", "bsd-2-clause", "cc-by-4.0", "cc-by-nc-4.0", "cc-by-sa-4.0",
             "gpl-3.0", "openrail", "llama2", "gemma"}
    return word if word in known else "other"


def model_card(preset_dir, handle=None, metadata=None):
    """The README.md (YAML front matter the Hub reads, then Markdown) describing the preset in `preset_dir`.

    It holds what is recorded: the family and its paper (`metadata.json`, else the registry's
    presets of the family), the parameter count, the preset the weights started from
    (`base_preset`: a registered or pretrained name, a hub handle or a directory, with a
    `family=` transfer), the licence of those weights (the pretrained catalogue's), the
    training data and steps (`training`), and the `vlzoo eval --json` records found beside.

    Example:
    >>> print(model_card("runs/clip_tiny_finetuned"))  # doctest: +SKIP
    ---
    license: other
    library_name: keras
    tags: [vlzoo, clip]
    ...
    """
    directory = _directory(preset_dir)
    metadata = read_json(directory / METADATA_FILE) if metadata is None else metadata
    family = metadata.get("family") or "unknown"
    base = metadata.get("base_preset") or {}
    licence = base.get("licence") or metadata.get("licence")
    paper = metadata.get("paper") or _family_paper(family)
    lines = ["---", f"license: {_spdx(licence)}"]
    if licence and _spdx(licence) == "other":
        lines.append(f"license_name: {re.sub('[^a-z0-9]+', '-', licence.lower())[:40].strip('-') or 'other'}")
    lines += ["library_name: keras", f"tags: [vlzoo, {family}]", "---", ""]
    title = handle.rstrip("/").split("@")[0].rpartition("/")[2] if handle else directory.name
    lines += [f"# {title}", "", f"A vlzoo preset of the **{family}** family"
              + (f": {metadata['description']}" if metadata.get("description") else ".")]
    lines += ["", "| | |", "|---|---|", f"| family | {family} |"]
    if paper:
        lines.append(f"| paper | {paper} |")
    if metadata.get("parameter_count") is not None:
        lines.append(f"| parameters | {int(metadata['parameter_count']):,} |")
    if base.get("preset"):
        started = f"`{base['preset']}`"
        if base.get("family_transfer"):
            started += f" (a {base.get('from_family', 'clip')} model, transferred with `family={base['family']!r}`)"
        lines.append(f"| started from | {started} |")
    lines.append(f"| licence of the starting weights | {licence or 'not recorded'} |")
    if metadata.get("quantization"):
        lines.append(f"| weights | {metadata['quantization']} quantized |")
    training = metadata.get("training") or {}
    for key, label in (("data", "training data"), ("steps", "training steps"), ("epochs", "epochs"),
                       ("batch_size", "batch size"), ("learning_rate", "learning rate")):
        if training.get(key) is not None:
            lines.append(f"| {label} | {training[key]} |")
    for key in ("vlzoo_version", "keras_version"):
        if metadata.get(key):
            lines.append(f"| {key.replace('_', ' ')} | {metadata[key]} |")
    records = evaluation_records(directory)
    if records:
        metrics = list(dict.fromkeys(name for record in records for name in record["metrics"]))
        lines += ["", "## Evaluation", "", "Recorded by `vlzoo eval --json`:", "",
                  "| dataset | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
        for record in records:
            values = [record["metrics"].get(name) for name in metrics]
            cells = ["" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v) for v in values]
            lines.append(f"| {record['dataset']} | " + " | ".join(cells) + " |")
    source = json.dumps(handle or str(directory))
    lines += ["", "## Use", "", "```python", "import vlzoo", "", f"model = vlzoo.from_preset({source})",
              "scores = model.similarity(images, model.tokenizer([\"a photo of a cat\"]))", "```", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- files

def preset_files(preset_dir):
    """`{path in the repository: local path}` of what an upload sends: every file of `preset_dir`, symbolic
    links followed, hidden files and folders left out.

    Example:
    >>> sorted(preset_files("runs/clip_tiny_finetuned"))  # doctest: +SKIP
    ['assets/tokenizer/merges.txt', 'assets/tokenizer/vocabulary.json', 'config.json', ...]
    """
    directory = _directory(preset_dir)
    found = {}
    for root, folders, files in os.walk(directory, followlinks=True):
        folders[:] = sorted(f for f in folders if not f.startswith("."))
        for name in sorted(files):
            if not name.startswith("."):
                path = pathlib.Path(root) / name
                found[path.relative_to(directory).as_posix()] = path
    return found


def upload_preset(handle, preset_dir, message=None):
    """Publishes the preset directory `preset_dir` at `handle`, after checking that it loads.

    Args:
        handle: `"hf://user/name"` (or `"hf://user/name@branch"`): a Hugging Face Hub model
            repository, created when absent; or `"kaggle://user/model/keras/variant"`: a new
            version of a Kaggle Models variation (the model and variation created when absent).
        preset_dir: a directory written by `save_to_preset` (`model.save_to_preset`,
            `vlzoo train --out`, `vlzoo convert --out`), or a vlzoo model, saved to a temporary
            directory first.
        message: the commit message (Hub) or version notes (Kaggle); default "Upload vlzoo preset".

    Returns:
        The Hub's commit sha; Kaggle's new version number, or None when Kaggle does not list it yet
        (a new version is processed before it is listed).

    Raises:
        ValueError: a malformed `handle` (the expected forms are named), or a preset that does not load
            (the file is named); FileNotFoundError: a required file is missing (it is named). Nothing has
            been sent then.
        PermissionError: the hub refused the credentials. RuntimeError: the transfer failed; the Hub
            repository is as it was.

    Example:
    >>> vlzoo.upload_preset("hf://me/clip-tiny-shapes", "runs/clip_tiny")  # doctest: +SKIP
    'c0ffee...'
    >>> vlzoo.upload_preset("kaggle://me/clip-tiny/keras/shapes", "runs/clip_tiny")  # doctest: +SKIP
    1
    >>> vlzoo.upload_preset("hf://me/clip-tiny", model)  # doctest: +SKIP
    'c0ffee...'
    """
    if not isinstance(handle, str) or not (huggingface.is_handle(handle) or kaggle.is_kaggle_handle(handle)):
        raise ValueError(f"`handle` {handle!r} is not an upload handle: expected 'hf://user/name[@branch]' or "
                         "'kaggle://user/model/framework/variation'.")
    if huggingface.is_handle(handle):
        huggingface.parse_hf_handle(handle)
    else:
        kaggle.parse_kaggle_handle(handle)
    if hasattr(preset_dir, "save_to_preset"):  # a model
        with tempfile.TemporaryDirectory(prefix="vlzoo-upload-") as directory:
            preset_dir.save_to_preset(directory)
            return upload_preset(handle, directory, message=message)
    directory = _directory(preset_dir)
    validate_preset(directory)  # before any request
    files, card, message = preset_files(directory), model_card(directory, handle), message or _COMMIT_MESSAGE
    if huggingface.is_handle(handle):
        return huggingface.upload(handle, files, card, message)
    metadata = read_json(directory / METADATA_FILE)
    licence = (metadata.get("base_preset") or {}).get("licence") or metadata.get("licence")
    return kaggle.upload(handle, files, card, _spdx(licence), message)
