"""Registry, from_preset / save_to_preset, parameter counts, and clear preset errors."""

import json
import os
import random
import resource
import shutil
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest
from backend_utils import run_once
from conftest import shipped_presets, tiny_batch, to_numpy

import vlzoo
from vlzoo import presets
from vlzoo.tokenizers import CLIPTokenizer, bundled_assets_dir

# open_clip's counts for the same geometries (sum of p.numel() over create_model(name)).
OPEN_CLIP_COUNTS = {
    "clip_vit_b32": 151_277_313,
    "clip_vit_b16": 149_620_737,
    "clip_vit_l14": 427_616_513,
    "siglip_vit_b16": 203_155_970,  # open_clip "ViT-B-16-SigLIP"
}

# transformers' counts for the SigLIP 2 checkpoints of the same geometries (`SiglipModel` of each hub
# config, position-id buffers not counted; the same totals the hub repositories' model cards record).
SIGLIP2_COUNTS = {
    "siglip2_vit_b16": 375_187_970, "siglip2_vit_b16_256": 375_234_050, "siglip2_vit_b16_384": 375_479_810,
    "siglip2_vit_b16_512": 375_823_874, "siglip2_vit_b32_256": 376_856_066, "siglip2_vit_l16_256": 881_526_786,
    "siglip2_vit_l16_384": 881_854_466, "siglip2_vit_l16_512": 882_313_218, "siglip2_so400m14_224": 1_135_463_602,
    "siglip2_so400m14_384": 1_136_008_498, "siglip2_so400m16_256": 1_135_670_962,
    "siglip2_so400m16_384": 1_136_039_602, "siglip2_so400m16_512": 1_136_555_698,
    "siglip2_vit_g16_256": 1_871_393_906, "siglip2_vit_g16_384": 1_871_885_426,
}


def test_list_presets():
    names = vlzoo.list_presets()
    assert set(OPEN_CLIP_COUNTS) | {"clip_tiny", "siglip_tiny"} <= set(names)
    assert vlzoo.list_presets(family="siglip") == sorted([*SIGLIP2_COUNTS, "siglip_shapes", "siglip_tiny",
                                                           "siglip_vit_b16"])
    with pytest.raises(ValueError, match="family"):
        vlzoo.list_presets(family="blip")


def test_preset_info_counts_big_presets_without_allocating():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for name, count in OPEN_CLIP_COUNTS.items():
        info = vlzoo.preset_info(name)
        assert info["params"] == count, name
        assert info["family"] == name.split("_")[0]
        assert info["weights_available"] is False
        assert info["paper"] and info["description"]
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    # Allocating ViT-L/14 alone would take 1.7 GB.
    assert grown_mb < 800, f"preset_info allocated about {grown_mb:.0f} MB"


def test_siglip2_presets_have_the_checkpoints_geometry_activation_and_preprocessing():
    # Every SigLIP 2 geometry (B/16 at four sizes, B/32, L/16, So400m/14 and /16, the giant-opt g/16 whose
    # text tower is So400m's projected to 1536): exact parameter counts, tanh-approximate GELU (the
    # checkpoints' `gelu_pytorch_tanh`, big_vision's default) and a bilinear resize to the square without
    # crop (their image processor's).
    for name, count in SIGLIP2_COUNTS.items():
        assert vlzoo.preset_info(name)["params"] == count, name
        config = json.loads((presets.resolve_preset(name) / "config.json").read_text())["config"]
        assert config["vision"]["activation"] == config["text"]["activation"] == "gelu_tanh", name
        assert config["vision"]["image_size"] % config["vision"]["patch_size"] == 0, name
        processing = json.loads((presets.resolve_preset(name) / "preprocessor.json").read_text())["config"]
        assert (processing["interpolation"], processing["crop"]) == ("bilinear", "none"), name
        assert processing["image_size"] == config["vision"]["image_size"], name
    giant = json.loads((presets.resolve_preset("siglip2_vit_g16_256") / "config.json").read_text())["config"]
    assert (giant["vision"]["hidden_dim"], giant["text"]["hidden_dim"], giant["embed_dim"]) == (1536, 1152, 1536)


@pytest.mark.slow
def test_clip_vit_b16_builds_with_exact_parameter_count():
    model = vlzoo.from_preset("clip_vit_b16", load_weights=False)
    assert model.count_params() == 149_620_737
    assert model.vision.activation == model.text.activation == "quick_gelu"
    assert model.vision.layer_norm_epsilon == model.text.layer_norm_epsilon == 1e-5


def test_unknown_name_suggests_close_names():
    with pytest.raises(ValueError, match="clip_vit_b16") as error:
        vlzoo.from_preset("clip_vit_b61")
    assert "Did you mean" in str(error.value)
    with pytest.raises(ValueError, match="siglip_vit_b16"):
        vlzoo.preset_info("siglip_b16")


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        vlzoo.from_preset(str(tmp_path / "nowhere"))


def test_random_init_is_announced_once():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        presets.local._warned_random.clear()
        vlzoo.from_preset("clip_tiny")
        vlzoo.from_preset("clip_tiny")
        vlzoo.from_preset("clip_tiny", load_weights=False)
    messages = [str(w.message) for w in caught if "randomly initialised" in str(w.message)]
    assert len(messages) == 1 and "clip_tiny" in messages[0]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    keras.utils.set_random_seed(7)
    model = vlzoo.from_preset("clip_tiny")
    model.compile(optimizer="adamw")
    model.fit(tiny_batch(batch_size=4, vocabulary_size=49408, sequence_length=16), epochs=1, verbose=0)
    directory = tmp_path_factory.mktemp("preset") / "clip_tiny_finetuned"
    model.save_to_preset(directory)
    return model, directory


def test_save_load_round_trip_is_bit_exact(saved):
    model, directory = saved
    for file in ("config.json", "metadata.json", "tokenizer.json", "preprocessor.json", "model.weights.h5"):
        assert (directory / file).is_file(), file
    assert (directory / "assets" / "tokenizer" / "vocabulary.json").is_file()
    loaded = vlzoo.from_preset(str(directory))
    assert type(loaded) is type(model)
    for a, b in zip(model.weights, loaded.weights):
        assert a.path == b.path
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b), err_msg=a.path)
    texts = ["a red circle", "a blue square"]
    images = np.random.default_rng(0).normal(size=(2, 32, 32, 3)).astype("float32")
    np.testing.assert_array_equal(to_numpy(loaded.similarity(images, texts)), to_numpy(model.similarity(images, texts)))
    np.testing.assert_array_equal(loaded.tokenizer(texts)["token_ids"], model.tokenizer(texts)["token_ids"])
    assert loaded.preprocessor.get_config() == model.preprocessor.get_config()
    metadata = json.loads((directory / "metadata.json").read_text())
    assert metadata["family"] == "clip" and metadata["parameter_count"] == model.count_params()


def test_a_preset_with_weights_draws_no_initial_values(saved):
    # The weights overwrite whatever the build draws, so the build draws nothing: a seeded program's random
    # streams are where they were (Keras seeds each unseeded initializer from Python's `random`).
    _, directory = saved
    random.seed(11)
    keras.utils.set_random_seed(11)
    state, keras_draw = random.getstate(), to_numpy(keras.random.normal((3,)))
    random.seed(11)
    keras.utils.set_random_seed(11)
    vlzoo.from_preset(str(directory))
    assert random.getstate() == state
    np.testing.assert_array_equal(to_numpy(keras.random.normal((3,))), keras_draw)
    # Without weights the build draws its initial values as before: the seeded stream moves on.
    random.seed(11)
    vlzoo.from_preset("clip_tiny")
    assert random.getstate() != state


def test_overrides_and_dtype(saved):
    _, directory = saved
    model = vlzoo.from_preset(str(directory), load_weights=False, dtype="bfloat16", vision={"image_size": 48})
    assert model.vision.image_size == 48 and model.vision.num_layers == 2
    assert keras.backend.standardize_dtype(model.vision.compute_dtype) == "bfloat16"
    with pytest.raises(ValueError, match="model.weights.h5"):
        vlzoo.from_preset(str(directory), vision={"hidden_dim": 48})


def test_missing_config_is_named(saved, tmp_path):
    _, directory = saved
    broken = tmp_path / "broken"
    shutil.copytree(directory, broken)
    (broken / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        vlzoo.from_preset(str(broken))


def test_corrupt_files_are_named(saved, tmp_path):
    _, directory = saved
    broken = tmp_path / "broken"
    shutil.copytree(directory, broken)
    (broken / "metadata.json").write_text("{not json")
    with pytest.raises(ValueError, match="metadata.json"):
        vlzoo.from_preset(str(broken))
    shutil.copy(directory / "metadata.json", broken / "metadata.json")
    data = (broken / "model.weights.h5").read_bytes()
    (broken / "model.weights.h5").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="model.weights.h5"):
        vlzoo.from_preset(str(broken))


def _copy(directory, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(directory, broken)
    return broken


def _edit_json(path, **changes):
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_weights_truncated_inside_an_array_are_named(saved, tmp_path):
    # Cut in the middle of the data: the HDF5 index is intact, an array's bytes are not.
    broken = _copy(saved[1], tmp_path)
    data = (broken / "model.weights.h5").read_bytes()
    (broken / "model.weights.h5").write_bytes(data[: len(data) - 4096])
    with pytest.raises(ValueError, match=r"weights file .*broken/model.weights.h5"):
        vlzoo.from_preset(str(broken))


@pytest.mark.parametrize("override", [{"vision": {"num_layers": 1}}, {"vision": {"num_layers": 3}},
                                      {"text": {"hidden_dim": 48}}, {"text": {"output_dim": 8}}])
def test_config_that_does_not_match_the_weights_is_refused(saved, override):
    # Fewer layers than the file holds used to load silently, ignoring the rest of the file.
    with pytest.raises(ValueError, match=r"(?s)model.weights.h5.*(match|config.json)"):
        vlzoo.from_preset(str(saved[1]), **override)


def test_weights_file_with_an_array_missing_is_refused(saved, tmp_path):
    h5py = pytest.importorskip("h5py")
    broken = _copy(saved[1], tmp_path)
    with h5py.File(broken / "model.weights.h5", "a") as file:
        del file["layers/text_transformer/post_norm/vars/1"]
    with pytest.raises(ValueError, match=r"model.weights.h5.*post_norm"):
        vlzoo.from_preset(str(broken))


def test_unknown_family_is_named(saved, tmp_path):
    broken = _copy(saved[1], tmp_path)
    _edit_json(broken / "metadata.json", family="clap")
    with pytest.raises(ValueError, match=r"metadata.json says family 'clap'.*CLIP, a 'clip' model"):
        vlzoo.from_preset(str(broken))
    _edit_json(broken / "metadata.json", family="clap")
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "class_name": "CLAP", "registered_name": "vlzoo>CLAP"}))
    with pytest.raises(ValueError, match=r"config.json describes a model of class 'CLAP'.*neither a vlzoo family"):
        vlzoo.from_preset(str(broken))


@pytest.mark.parametrize("version, problem", [("9.0.0", "newer than the installed"), ("0.1.1.dev1", "newer"),
                                              ("latest", "not a version number")])
def test_preset_from_a_newer_vlzoo_is_refused(saved, tmp_path, version, problem):
    broken = _copy(saved[1], tmp_path)
    _edit_json(broken / "metadata.json", vlzoo_version=version)
    with pytest.raises(ValueError, match=rf"metadata.json.*{problem}"):
        vlzoo.from_preset(str(broken))


def test_older_or_equal_versions_load(saved, tmp_path):
    copy = _copy(saved[1], tmp_path)
    for version in ("0.0.9", vlzoo.__version__):
        _edit_json(copy / "metadata.json", vlzoo_version=version)
        vlzoo.from_preset(str(copy))


def test_missing_tokenizer_asset_is_named(saved, tmp_path):
    _, directory = saved
    broken = tmp_path / "broken"
    shutil.copytree(directory, broken)
    (broken / "assets" / "tokenizer" / "merges.txt").unlink()
    with pytest.raises(FileNotFoundError, match="merges.txt"):
        vlzoo.from_preset(str(broken))


def test_siglip_b16_tokenizer_explains_why_it_is_missing():
    directory = presets.resolve_preset("siglip_vit_b16")
    config = json.loads((directory / "config.json").read_text())
    assert config["config"]["vision"]["pooling"] == "map"
    assert config["config"]["text"]["layer_norm_epsilon"] == 1e-6
    tokenizer = vlzoo.from_preset("siglip_tiny", load_weights=False).tokenizer
    assert tokenizer(["a cat"])["token_ids"].shape == (1, 16)


@pytest.mark.skipif(keras.backend.backend() != "jax", reason="backend-independent files (parameter counts "
                    "included); checked once, in the jax pass")
def test_registered_directories_match_the_registry(repo_root):
    result = subprocess.run(
        [sys.executable, "tools/build_presets.py", "--check"], cwd=repo_root, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_unbundled_tokenizer_survives_save_and_loads_once_supplied(tmp_path):
    spm = pytest.importorskip("sentencepiece")
    source = vlzoo.from_preset("siglip_tiny", load_weights=False)
    source.save_to_preset(tmp_path / "a")
    # Turn it into a preset whose SentencePiece model is not bundled (as siglip_vit_b16).
    shutil.rmtree(tmp_path / "a" / "assets")
    spec = {"class_name": "SentencePieceTokenizer", "config": {"sequence_length": 16, "proto_file": "spiece.model"},
            "module": "vlzoo.tokenizers", "registered_name": "vlzoo>SentencePieceTokenizer"}
    (tmp_path / "a" / "tokenizer.json").write_text(json.dumps(spec))
    metadata = json.loads((tmp_path / "a" / "metadata.json").read_text())
    metadata.update(tokenizer_bundled=False, tokenizer_note="bring spiece.model")
    (tmp_path / "a" / "metadata.json").write_text(json.dumps(metadata))

    model = vlzoo.from_preset(str(tmp_path / "a"))
    with pytest.raises(FileNotFoundError, match="spiece.model"):
        model.tokenizer(["a cat"])
    model.save_to_preset(tmp_path / "b")
    assert json.loads((tmp_path / "b" / "tokenizer.json").read_text())["class_name"] == "SentencePieceTokenizer"
    assert json.loads((tmp_path / "b" / "metadata.json").read_text())["tokenizer_bundled"] is False

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(f"a {c} {s} next to a {s2}" for c in ("red", "blue", "green")
                                for s in ("circle", "square") for s2 in ("cat", "dog")) * 20)
    (tmp_path / "b" / "assets" / "tokenizer").mkdir(parents=True)
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(tmp_path / "b" / "assets" / "tokenizer" / "spiece"),
        vocab_size=20, eos_id=1, pad_id=0, unk_id=2, bos_id=-1,
    )
    reloaded = vlzoo.from_preset(str(tmp_path / "b"))
    out = reloaded.tokenizer(["a red circle"])
    assert out["token_ids"].shape == (1, 16) and out["padding_mask"][0, 0]


def test_presets_doc_table_lists_every_preset_with_its_count(repo_root):
    rows = {}
    with open(f"{repo_root}/docs/presets.md") as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 3 and cells[0].startswith("`") and cells[2].replace(",", "").isdigit():
                rows[cells[0].strip("`")] = (cells[1], int(cells[2].replace(",", "")))
    for name in shipped_presets():
        with open(f"{repo_root}/presets/{name}/metadata.json") as f:
            metadata = json.load(f)
        assert name in rows, f"docs/presets.md's preset table lacks {name}"
        assert rows[name][1] == metadata["parameter_count"], name


_LOAD_KERAS_FILE = """
import sys
import keras
import numpy as np
import vlzoo
try:
    keras.saving.load_model(sys.argv[1])
except TypeError as error:  # lazy `import vlzoo`: no class registered yet
    print("unregistered:", "vlzoo>CLIP" in str(error))
import vlzoo.models
model = keras.saving.load_model(sys.argv[1])
print(np.asarray(keras.ops.convert_to_numpy(model.encode_image(np.load(sys.argv[2]))["embeds"])).tolist())
"""


@pytest.mark.slow
def test_a_keras_file_loads_once_vlzoo_models_is_imported(tmp_path):
    # As the README says: `import vlzoo` registers nothing; `import vlzoo.models` registers the classes.
    model = vlzoo.from_preset("clip_shapes")
    model.save(tmp_path / "model.keras")
    images = np.random.default_rng(0).random((2, model.vision.image_size, model.vision.image_size, 3), "float32")
    np.save(tmp_path / "images.npy", images)
    result = subprocess.run([sys.executable, "-c", _LOAD_KERAS_FILE, str(tmp_path / "model.keras"),
                             str(tmp_path / "images.npy")], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "unregistered: True"
    np.testing.assert_allclose(np.array(json.loads(lines[-1])), to_numpy(model.encode_image(images)["embeds"]),
                               atol=1e-6)


# Each public function that reads a preset, as the first vlzoo call of a new process: nothing imported
# before registers the model classes with Keras, so each must find them itself (before the fix, the
# three library calls raised "neither a vlzoo family model ... nor a registered Keras class" or
# "Could not locate class 'CLIP'", and `vlzoo info DIR` a traceback).
FIRST_CALLS = {
    "vlzoo.presets.from_preset": ["-c", "import sys, vlzoo.presets; print(vlzoo.presets.from_preset(sys.argv[1])"
                                        ".count_params())"],
    "vlzoo.preset_info": ["-c", "import sys, vlzoo; print(vlzoo.preset_info(sys.argv[1])['params'])"],
    "vlzoo.presets.upload.validate_preset": [
        "-c", "import sys, vlzoo.presets.upload; print(vlzoo.presets.upload.validate_preset(sys.argv[1]).count_params())"],
    "vlzoo info DIR": ["-m", "vlzoo.cli", "info"],
}


@run_once  # starts its own processes, on torch (the backend of the pass)
@pytest.mark.parametrize("call", sorted(FIRST_CALLS))
def test_a_preset_reads_as_the_first_call_of_a_fresh_process(saved, call):
    model, directory = saved
    done = subprocess.run([sys.executable, *FIRST_CALLS[call], str(directory)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "KERAS_BACKEND": "torch"}, cwd=directory.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    count = json.loads(done.stdout)["params"] if call.startswith("vlzoo info") else int(done.stdout.split()[-1])
    assert count == model.count_params()


def test_a_registered_preset_reads_the_vocabulary_vlzoo_ships(tmp_path):
    """A registered preset's directory holds no copy of its vocabulary: metadata.json names the one vlzoo
    ships, wherever the directory is copied. A name that is not a shipped vocabulary is refused."""
    copy = tmp_path / "clip_tiny"
    shutil.copytree(presets.resolve_preset("clip_tiny"), copy)
    assert not (copy / "assets").exists() and presets.read_metadata(copy)["tokenizer_assets"] == "clip_bpe"
    model = vlzoo.from_preset(str(copy), load_weights=False)
    texts = ["a red circle above a blue square", "dog"]
    want = CLIPTokenizer.from_assets(str(bundled_assets_dir("clip_bpe")), sequence_length=16)(texts)
    np.testing.assert_array_equal(to_numpy(model.tokenizer(texts)["token_ids"]), to_numpy(want["token_ids"]))
    _edit_json(copy / "metadata.json", tokenizer_assets="../../etc")
    with pytest.raises(ValueError, match="tokenizer_assets"):
        vlzoo.from_preset(str(copy), load_weights=False)
