"""`hf://` handles in `from_preset`, against a loopback server that answers like the Hub.

Nothing reaches the internet: `tests/hub_server.py` serves, on 127.0.0.1, a preset that
`save_to_preset` wrote, and `tests/hub_worker.py` loads it in a fresh process with
`HF_ENDPOINT` and `HF_HUB_CACHE` pointing there, as a user would set them.
"""

import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
from backend_utils import run_once
from conftest import to_numpy
from hub_server import HubServer

import vlzoo
from vlzoo import hub

REPO = "vlzoo-tests/clip-tiny"
TEXTS = ["a red circle", "two blue squares"]
WORKER = pathlib.Path(__file__).parent / "hub_worker.py"


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """`(files, text embeddings)` of a clip_tiny preset with seeded random weights."""
    keras.utils.set_random_seed(5)
    model = vlzoo.from_preset("clip_tiny", load_weights=False)
    directory = tmp_path_factory.mktemp("published") / "clip-tiny"
    model.save_to_preset(str(directory))
    files = {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
    return files, to_numpy(model.encode_text(model.tokenizer(TEXTS)))


@pytest.fixture
def server(published):
    with HubServer({REPO: published[0]}) as running:
        yield running


def load_in_fresh_process(tmp_path, endpoint, *handles, offline=False):
    """What `hub_worker.py` recorded for each handle, loaded in order by one new process."""
    texts, out = tmp_path / "texts.json", tmp_path / "out.json"
    texts.write_text(json.dumps(TEXTS))
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_HUB_OFFLINE": "1" if offline else "0", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    subprocess.run([sys.executable, str(WORKER), str(out), str(texts), *handles], env=env, check=True,
                   timeout=600, cwd=WORKER.parent.parent)
    return json.loads(out.read_text())


def assert_loaded(result, want, label):
    assert "embeddings" in result, f"{label}: {result}"
    np.testing.assert_array_equal(np.asarray(result["embeddings"], np.float32), want, err_msg=label)


@pytest.mark.parametrize("handle, want", [
    ("hf://org/name", ("org/name", None)),
    ("hf://google/siglip-base-patch16-224@main", ("google/siglip-base-patch16-224", "main")),
    ("hf://a/b.c-d_e@0123456789abcdef0123456789abcdef01234567", ("a/b.c-d_e", "0123456789abcdef0123456789abcdef01234567")),
])
def test_parse_hf_handle(handle, want):
    assert hub.is_handle(handle)
    assert hub.parse_hf_handle(handle) == want


@pytest.mark.parametrize("handle", ["hf://", "hf://name", "hf://org/name@", "hf://org/na me", "hf:///name"])
def test_malformed_handles_are_refused_by_name(handle):
    with pytest.raises(ValueError, match="not a valid hub handle"):
        vlzoo.from_preset(handle)


def test_hf_handle_loads_the_published_preset_then_offline(published, server, tmp_path):
    files, want = published
    handles = [f"hf://{REPO}", f"hf://{REPO}@main", f"hf://{REPO}@{server.commits[REPO]}"]
    for handle, result in zip(handles, load_in_fresh_process(tmp_path, server.endpoint, *handles)):
        assert_loaded(result, want, handle)
    downloads = [path.split("/", 5)[-1] for method, path in server.requests if method == "GET" and "/resolve/" in path]
    assert sorted(downloads) == sorted(files)  # each file once, for three handles
    # A new process, HF_HUB_OFFLINE=1 and nothing listening: the cache alone.
    requests = len(server.requests)
    (offline,) = load_in_fresh_process(tmp_path, "http://127.0.0.1:9", f"hf://{REPO}", offline=True)
    assert_loaded(offline, want, "offline")
    assert len(server.requests) == requests


@run_once
def test_unknown_repositories_revisions_and_formats_are_named(server, tmp_path):
    server.repos["openai/clip-like"] = {"config.json": b'{"architectures": ["CLIPModel"]}'}
    server.commits["openai/clip-like"] = "f" * 40
    handles = ["hf://vlzoo-tests/nothing-here", f"hf://{REPO}@no-such-branch", "hf://openai/clip-like"]
    results = load_in_fresh_process(tmp_path, server.endpoint, *handles)
    assert results[0]["error"] == "FileNotFoundError" and "vlzoo-tests/nothing-here" in results[0]["message"]
    assert results[1]["error"] == "FileNotFoundError" and "no-such-branch" in results[1]["message"], results[1]
    assert results[2]["error"] == "ValueError" and "holds no model vlzoo can load" in results[2]["message"]
    assert "found: config.json." in results[2]["message"], results[2]
    (offline,) = load_in_fresh_process(tmp_path, "http://127.0.0.1:9", f"hf://{REPO}", offline=True)
    assert offline["error"] == "FileNotFoundError" and f"hf://{REPO}: not in the cache" in offline["message"]


@run_once
@pytest.mark.parametrize("fault", ["corrupt", "truncate"])
def test_a_damaged_download_is_refused_then_recovers(published, server, tmp_path, fault):
    server.faults[(REPO, "model.weights.h5")] = fault  # every response for that file, retries included
    (first,) = load_in_fresh_process(tmp_path, server.endpoint, f"hf://{REPO}")
    assert first["error"] == "ValueError" and "'model.weights.h5'" in first["message"], first
    server.faults.clear()
    (second,) = load_in_fresh_process(tmp_path, server.endpoint, f"hf://{REPO}")
    assert_loaded(second, published[1], f"after a {fault} download")
