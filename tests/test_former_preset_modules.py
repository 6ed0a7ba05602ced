"""The preset modules that moved into `vlzoo.presets` still serve their public names, each read warning where
the name lives now; `vlzoo.presets` (a module before, the package now) serves its names without a warning."""

import importlib
import pathlib
import re
import subprocess
import sys
import warnings

import pytest
from backend_utils import run_once

import vlzoo

# Reads names and imports modules, the same on every backend: one pass.
pytestmark = run_once

# The public names each former module offered (module objects and incidental imports of other packages aside).
FORMER_NAMES = {
    "vlzoo.registry": ("DATA_ROOT", "REGISTRY_FILE", "REQUIRED", "definitions", "register", "defined_in_code",
                       "definition", "families", "names"),
    "vlzoo.pretrained": ("DATA_ROOT", "CATALOGUE_FILE", "REQUIRED", "catalogue", "is_pretrained"),
    "vlzoo.catalogue": ("presets_root", "pretrained_catalogue", "CONFIG_FILE", "METADATA_FILE", "TOKENIZER_FILE",
                        "PREPROCESSOR_FILE", "WEIGHTS_FILE", "TOKENIZER_ASSETS", "list_presets", "read_metadata",
                        "read_json", "resolve_preset", "model_config", "describe"),
    "vlzoo.preset_files": ("CONFIG_FILE", "METADATA_FILE", "PREPROCESSOR_FILE", "TOKENIZER_ASSETS", "TOKENIZER_FILE",
                           "WEIGHTS_FILE", "VOCABULARY_LICENCES", "write_preset", "save_to_preset",
                           "save_model_weights", "write_registered_preset"),
    "vlzoo.loading": ("files_digest", "is_handle", "is_remote", "local_preset", "pretrained_preset",
                      "local_directory", "from_preset", "preset_origin"),
    "vlzoo.hub": ("HF_SCHEME", "RemoteFile", "Snapshot", "is_handle", "cache_dir", "offline", "parse_hf_handle",
                  "remote_snapshot", "file_hash", "WEIGHT_SUFFIXES", "download", "cached_snapshot", "cached_blob_ids",
                  "fetch_url"),
    "vlzoo.kaggle": ("KAGGLE_SCHEME", "is_kaggle_handle", "parse_kaggle_handle", "download", "file_digests"),
    "vlzoo.upload": ("CONFIG_FILE", "METADATA_FILE", "WEIGHTS_FILE", "read_json", "CARD_FILE", "REQUIRED_FILES",
                     "validate_preset", "evaluation_records", "model_card", "preset_files", "upload_preset"),
}
# The names the former module `vlzoo.presets` offered, now the package's.
PRESETS_NAMES = ("presets_root", "CONFIG_FILE", "METADATA_FILE", "PREPROCESSOR_FILE", "TOKENIZER_ASSETS",
                 "TOKENIZER_FILE", "WEIGHTS_FILE", "describe", "list_presets", "model_config", "read_json",
                 "read_metadata", "save_model_weights", "save_to_preset", "write_preset", "write_registered_preset",
                 "resolve_preset", "preset_info", "merge_config", "import_defining_module",
                 "count_parameters_abstractly", "from_preset")


@pytest.mark.parametrize("former", sorted(FORMER_NAMES))
def test_a_former_module_serves_each_name_and_warns_where_it_lives(former):
    module = importlib.import_module(former)
    for name in FORMER_NAMES[former]:
        with pytest.warns(DeprecationWarning, match=rf"`{re.escape(former)}\.{name}` is deprecated; use `") as caught:
            value = getattr(module, name)
        message = next(str(w.message) for w in caught if str(w.message).startswith(f"`{former}.{name}`"))
        new = re.search(r"use `(vlzoo\.presets\.\w+)\.(\w+)`", message)
        assert new, message
        assert getattr(importlib.import_module(new[1]), new[2]) is value, (former, name)
    with pytest.warns(DeprecationWarning, match="is deprecated; use `vlzoo.presets."):
        exec(f"from {former} import {FORMER_NAMES[former][-1]}", {})  # noqa: S102  (the form users write)
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        module.no_such_name  # noqa: B018


def test_the_renamed_names_say_their_new_names():
    renamed = {("vlzoo.catalogue", "resolve_preset"): "vlzoo.presets.catalogue.preset_directory",
               ("vlzoo.pretrained", "catalogue"): "vlzoo.presets.catalogue.pretrained_presets",
               ("vlzoo.registry", "REQUIRED"): "vlzoo.presets.catalogue.REGISTRY_REQUIRED",
               ("vlzoo.hub", "fetch_url"): "vlzoo.presets.remote.fetch_url"}
    for (former, name), new in renamed.items():
        with pytest.warns(DeprecationWarning, match=re.escape(f"use `{new}`")):
            getattr(importlib.import_module(former), name)


def test_the_presets_package_serves_the_former_module_names_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        values = {name: getattr(vlzoo.presets, name) for name in PRESETS_NAMES}
    assert values["from_preset"] is vlzoo.from_preset  # one from_preset
    assert set(PRESETS_NAMES) <= set(dir(vlzoo.presets))


def test_a_former_module_imports_in_a_fresh_process_and_warns():
    code = ("import warnings; warnings.simplefilter('always')\n"
            "from vlzoo.registry import names\n"
            "import vlzoo.pretrained, sys\n"
            "assert names(family='clip') and vlzoo.pretrained.is_pretrained('clip_vit_b16_openai')\n"
            "print(sorted(m for m in ('keras', 'jax', 'tensorflow', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=120,
                          cwd=pathlib.Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"  # the aliases of the Keras-free catalogue import no backend either
    assert "`vlzoo.registry.names` is deprecated; use `vlzoo.presets.catalogue.names`" in done.stderr
