"""`vlzoo.upload_preset` and `vlzoo upload`, against loopback servers that speak the
Hub's and Kaggle's upload protocols (tests/hub_server.py): what was uploaded loads back, in a fresh
process, with bit-identical weights; an incomplete preset is refused before any request; a failed
commit leaves the repository as it was.

`huggingface_hub` uploads large files through Xet storage when `hf_xet` is installed; the loopback
Hub speaks the LFS protocol, which the client uses with `HF_HUB_DISABLE_XET` set. The client reads
that variable when it is imported, so the tests set the constant it fills
(`huggingface_hub.constants.HF_HUB_DISABLE_XET`), as the variable would have.
"""

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import warnings

import huggingface_hub
import kagglehub.clients
import keras
import numpy as np
import pytest
from backend_utils import run_once
from hub_server import HubServer, KaggleServer
from test_hub import load_in_fresh_process

import vlzoo
from vlzoo.presets import upload
from vlzoo.cli import main

REPO = "me/clip-tiny-tuned"
EVAL_RECORDS = [
    {"dataset": "winoground", "model": "clip", "pretrained": "x", "task": "compositionality",
     "metrics": {"text_score": 0.25, "image_score": 0.125}, "language": "en"},
    {"dataset": "cifar10", "model": "clip", "pretrained": "x", "task": "zeroshot_classification",
     "metrics": {"acc1": 0.5}, "language": "en"},
]


def weights_digest(model):
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight)).tobytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """`(directory, weights digest)` of clip_tiny with seeded random weights, saved with what a training run
    records, and a `vlzoo eval --json` file beside it."""
    keras.utils.set_random_seed(7)
    with warnings.catch_warnings():  # clip_tiny has no weights: warned once per process (test_presets checks it)
        warnings.simplefilter("ignore", UserWarning)
        model = vlzoo.from_preset("clip_tiny")  # records clip_tiny as where the weights started
    directory = tmp_path_factory.mktemp("saved") / "clip-tiny-tuned"
    model.save_to_preset(str(directory), metadata={"training": {"data": "shapes.csv", "steps": 120}})
    (directory / "eval.json").write_text(json.dumps(EVAL_RECORDS))
    return directory, weights_digest(model)


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    """A loopback Hub that `huggingface_hub` uploads to (`HF_ENDPOINT`, a token, no Xet, no proxy)."""
    with HubServer({}) as server:
        for key in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(key, raising=False)
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setenv("HF_TOKEN", "hf_loopback_test_token")
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_PROGRESS_BARS", True)
        yield server


@pytest.fixture
def kaggle_env(monkeypatch, tmp_path):
    """A loopback Kaggle that kagglehub reaches as the proxy of `http://localhost` (`KAGGLE_API_ENVIRONMENT`)."""
    with KaggleServer({}) as server:
        for key in list(os.environ):
            if key.startswith("KAGGLE") or key.lower() in ("no_proxy", "http_proxy", "https_proxy", "all_proxy"):
                monkeypatch.delenv(key)
        monkeypatch.setenv("KAGGLE_API_ENVIRONMENT", "LOCALHOST")
        monkeypatch.setenv("HTTP_PROXY", server.endpoint)
        monkeypatch.setenv("KAGGLE_USERNAME", "me")
        monkeypatch.setenv("KAGGLE_KEY", "loopback-test-key")
        monkeypatch.setenv("KAGGLE_CONFIG_DIR", str(tmp_path / "kaggle-config"))
        # kagglehub names the library that calls it in its User-Agent by reading the whole call stack
        # (`inspect.stack()`: each frame's module, found among every loaded one, and source) for each client it
        # builds, 14 per upload: seconds per upload in a test process (pytest's deep stack, thousands of modules).
        # The loopback server reads no User-Agent; the protocol's requests are unchanged.
        monkeypatch.setattr(kagglehub.clients, "get_user_agent", lambda: f"kagglehub/{kagglehub.__version__}")
        yield server


def test_the_model_card_holds_what_is_recorded(saved):
    directory, _ = saved
    card = upload.model_card(directory, "hf://me/clip-tiny-tuned")
    front, body = card.split("---\n")[1], card.split("---\n", 2)[2]
    assert front.splitlines() == ["license: apache-2.0", "library_name: keras", "tags: [vlzoo, clip]"]
    for expected in ("# clip-tiny-tuned", "| family | clip |", "Radford et al. 2021", "| parameters | 1,624,193 |",
                     "| started from | `clip_tiny` |", "| licence of the starting weights | Apache-2.0",
                     "| training data | shapes.csv |", "| training steps | 120 |",
                     "| dataset | text_score | image_score | acc1 |", "| winoground | 0.2500 | 0.1250 |  |",
                     "| cifar10 |  |  | 0.5000 |", 'vlzoo.from_preset("hf://me/clip-tiny-tuned")'):
        assert expected in body, (expected, card)
    assert upload.evaluation_records(directory) == EVAL_RECORDS


def test_a_family_transfer_is_named_as_the_start(tmp_path):
    model = vlzoo.from_preset("clip_tiny", family="sparc", load_weights=True)
    assert model.preset_origin["family"] == "sparc" and model.preset_origin["preset"] == "clip_tiny"
    model.save_to_preset(str(tmp_path / "sparc"))
    card = upload.model_card(tmp_path / "sparc")
    assert "tags: [vlzoo, sparc]" in card and "transferred with `family='sparc'`" in card, card


@run_once
def test_an_upload_loads_back_bit_identical_in_a_fresh_process(saved, hub_env, tmp_path, capsys):
    """One commit creates the repository with the preset, its eval file and a model card; `from_preset` of the
    handle, in a new process, gives the same weights, bit for bit. The command line uploads as well."""
    directory, digest = saved
    commit = vlzoo.upload_preset(f"hf://{REPO}", directory)
    files = hub_env.repos[REPO]
    assert commit == hub_env.commits[REPO]
    assert [method for method, path in hub_env.requests if path.endswith("/commit/main")] == ["POST"]
    local = {p.relative_to(directory).as_posix(): p.read_bytes() for p in directory.rglob("*") if p.is_file()}
    assert {name: files[name] for name in local} == local
    assert set(files) == set(local) | {"README.md"}
    assert files["README.md"].decode() == upload.model_card(directory, f"hf://{REPO}")

    assert main(["upload", "hf://me/by-the-cli", str(directory), "--message", "from the CLI"]) == 0
    assert hub_env.commits["me/by-the-cli"] in capsys.readouterr().out

    loaded = load_in_fresh_process(tmp_path, hub_env.endpoint, f"hf://{REPO}", f"hf://me/by-the-cli@{commit}",
                                   "hf://me/by-the-cli")
    assert loaded[0].get("weights") == digest, loaded[0]
    assert loaded[1]["error"] == "FileNotFoundError"  # another repository's commit
    assert loaded[2].get("weights") == digest, loaded[2]


@run_once  # starts its own process (on torch, the backend of the pass)
def test_the_command_uploads_in_a_fresh_process_and_sends_nothing_for_a_truncated_preset(saved, hub_env, tmp_path,
                                                                                        capsys):
    """`vlzoo upload` as a user runs it, a new process whose first vlzoo call it is: the preset is checked
    (its model class found without anything imported before) and committed. A preset whose weights file
    was cut short is refused by the command naming that file, before any request reaches the Hub: `main`,
    what that process runs, called here (the first call's model class lookup is the new process's to check)."""
    directory, _ = saved
    truncated = tmp_path / "truncated"
    shutil.copytree(directory, truncated)
    weights = (truncated / "model.weights.h5").read_bytes()
    (truncated / "model.weights.h5").write_bytes(weights[: len(weights) // 2])
    assert main(["upload", "hf://me/fresh", str(truncated)]) == 2
    err = capsys.readouterr().err
    assert "model.weights.h5" in err and "Nothing was uploaded" in err and "Traceback" not in err, err
    assert hub_env.requests == []
    env = {key: value for key, value in os.environ.items() if key.lower() not in (
        "http_proxy", "https_proxy", "all_proxy", "hf_hub_offline")}
    env.update(HF_ENDPOINT=hub_env.endpoint, HF_TOKEN="hf_loopback_test_token", HF_HUB_DISABLE_XET="1",
               HF_HUB_DISABLE_PROGRESS_BARS="1", HF_HOME=str(tmp_path / "hf-home"), KERAS_BACKEND="torch")
    done = subprocess.run([sys.executable, "-m", "vlzoo.cli", "upload", "hf://me/fresh", str(directory)],
                          env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert hub_env.commits["me/fresh"] in done.stdout
    assert hub_env.repos["me/fresh"]["model.weights.h5"] == weights


@pytest.mark.parametrize("damage, named", [
    ("model.weights.h5", "model.weights.h5"),
    ("config.json", "config.json"),
    ("metadata.json", "metadata.json"),
    ("assets/tokenizer/vocabulary.json", "vocabulary.json"),
    ("fewer layers", "holds"),
])
def test_an_incomplete_preset_is_refused_before_any_request(saved, hub_env, kaggle_env, tmp_path, damage, named):
    directory = tmp_path / "damaged"
    shutil.copytree(saved[0], directory)
    if damage == "fewer layers":  # the weights of a 2-layer text tower under a config that has 1
        config = json.loads((directory / "config.json").read_text())
        config["config"]["text"]["num_layers"] = 1
        (directory / "config.json").write_text(json.dumps(config))
    else:
        (directory / damage).unlink()
    for handle in (f"hf://{REPO}", "kaggle://me/clip-tiny/keras/tuned"):
        with pytest.raises((FileNotFoundError, ValueError), match=named) as error:
            vlzoo.upload_preset(handle, directory)
        assert "Nothing was uploaded" in str(error.value)
    assert hub_env.requests == [] and kaggle_env.requests == []


@pytest.mark.parametrize("handle", ["hf://me", "hf://me/name@", "kaggle://me/model/keras/variant/3",
                                    "kaggle://me/model", "s3://me/model", "me/model"])
def test_a_malformed_handle_is_refused_by_name(saved, hub_env, handle):
    with pytest.raises(ValueError, match="handle"):
        vlzoo.upload_preset(handle, saved[0])
    assert hub_env.requests == []


def test_a_missing_directory_is_refused_by_name(tmp_path):
    with pytest.raises(NotADirectoryError, match="`preset_dir`"):
        vlzoo.upload_preset(f"hf://{REPO}", tmp_path / "nothing")


def test_a_failed_commit_leaves_the_repository_as_it_was(saved, hub_env):
    """The files reach the server (LFS), the commit fails: the repository keeps its files and commit. Once
    the server recovers, the same call commits; the repository's own README.md is kept, not replaced."""
    hub_env.repos[REPO] = {"README.md": b"# Our own card\n", "notes.txt": b"kept"}
    hub_env.commits[REPO] = before_commit = "a" * 40
    before = dict(hub_env.repos[REPO])
    hub_env.faults[(REPO, "commit")] = "fail"
    with pytest.raises(RuntimeError, match=f"hf://{REPO}.*as it was"):
        vlzoo.upload_preset(f"hf://{REPO}", saved[0])
    assert hub_env.repos[REPO] == before and hub_env.commits[REPO] == before_commit
    assert hub_env.lfs  # the weights were sent, yet nothing names them
    hub_env.faults.clear()
    commit = vlzoo.upload_preset(f"hf://{REPO}", saved[0])
    assert commit == hub_env.commits[REPO] != before_commit
    assert hub_env.repos[REPO]["README.md"] == before["README.md"]
    assert hub_env.repos[REPO]["notes.txt"] == b"kept"
    assert hub_env.repos[REPO]["model.weights.h5"] == (saved[0] / "model.weights.h5").read_bytes()


def test_a_commit_against_a_moved_branch_is_refused(saved, hub_env, monkeypatch):
    """The commit names the revision read before it (`parentCommit`): a push in between is not overwritten."""
    original = hub_env._preupload

    def someone_else_commits_first(repo, body):
        hub_env.repos[repo], hub_env.commits[repo] = {"theirs.txt": b"x"}, "b" * 40
        return original(repo, body)

    monkeypatch.setattr(hub_env, "_preupload", someone_else_commits_first)  # the server's state, not vlzoo's
    with pytest.raises(RuntimeError, match="as it was"):
        vlzoo.upload_preset(f"hf://{REPO}", saved[0])
    assert hub_env.repos[REPO] == {"theirs.txt": b"x"}


def test_a_model_uploads_through_a_temporary_preset(hub_env):
    keras.utils.set_random_seed(3)
    model = vlzoo.from_preset("clip_tiny", load_weights=False)
    commit = vlzoo.upload_preset("hf://me/from-the-model", model)
    files = hub_env.repos["me/from-the-model"]
    assert commit == hub_env.commits["me/from-the-model"]
    assert {"config.json", "metadata.json", "model.weights.h5", "tokenizer.json", "README.md"} <= set(files)
    assert "# from-the-model" in files["README.md"].decode()


@run_once
def test_a_kaggle_upload_makes_versions_that_load_back_bit_identical(saved, kaggle_env, tmp_path):
    directory, digest = saved
    handle = "kaggle://me/clip-tiny/keras/tuned"
    assert vlzoo.upload_preset(handle, directory) == 1
    assert vlzoo.upload_preset(handle, directory, message="again") == 2
    assert kaggle_env.licences == {"me/clip-tiny/keras/tuned": "Apache 2.0"}  # clip_tiny's, carried over
    methods = [method for method, _ in kaggle_env.requests]
    assert methods.count("CreateModel") == 1 and methods.count("CreateModelInstanceVersion") == 1
    files = kaggle_env.models["me/clip-tiny/keras/tuned"][2]
    assert files["model.weights.h5"] == (directory / "model.weights.h5").read_bytes()
    assert files["README.md"].decode() == upload.model_card(directory, handle)
    loaded = load_in_fresh_process(tmp_path, "http://127.0.0.1:9", f"{handle}/2", f"{handle}/1",
                                   kaggle=kaggle_env.endpoint)
    assert [result.get("weights") for result in loaded] == [digest, digest], loaded


def test_the_preset_files_follow_links_and_skip_hidden_files(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "vocab.txt").write_text("a")
    (tmp_path / "preset" / "assets").mkdir(parents=True)
    (tmp_path / "preset" / "assets" / "tokenizer").symlink_to(tmp_path / "real", target_is_directory=True)
    (tmp_path / "preset" / ".cache").mkdir()
    (tmp_path / "preset" / ".cache" / "x").write_text("x")
    (tmp_path / "preset" / "config.json").write_text("{}")
    assert sorted(upload.preset_files(tmp_path / "preset")) == ["assets/tokenizer/vocab.txt", "config.json"]
    assert upload.preset_files(tmp_path / "preset")["assets/tokenizer/vocab.txt"] == pathlib.Path(
        tmp_path / "preset" / "assets" / "tokenizer" / "vocab.txt")
