"""`hf://` handles in `from_preset`, against a loopback server that answers like the Hub.

Nothing reaches the internet: `tests/hub_server.py` serves, on 127.0.0.1, a preset that
`save_to_preset` wrote, and `tests/hub_worker.py` loads it in a fresh process with
`HF_ENDPOINT` and `HF_HUB_CACHE` pointing there, as a user would set them.
"""

import importlib
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
from hub_server import FileServer, HubServer, KaggleServer

try:
    import peers
except ImportError:  # tests/ imported as a package
    from tests import peers

import vlzoo
from vlzoo.presets import huggingface, remote
from vlzoo.convert.checkpoints import import_transformers

REPO = "vlzoo-tests/clip-tiny"
TEXTS = ["a photo of a cat", "Two  DOGS playing, in the snow!", "x" * 40]
# keras-hub's SigLIP cleaning deletes `_` and lowercases ASCII letters only (tf.strings.lower).
KERAS_HUB_TEXTS = [*TEXTS, "Une ÉCOLE_du soir"]
WORKER = pathlib.Path(__file__).parent / "hub_worker.py"


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """`(files, text embeddings)` of a clip_tiny preset with seeded random weights."""
    keras.utils.set_random_seed(5)
    model = vlzoo.from_preset("clip_tiny", load_weights=False)
    directory = tmp_path_factory.mktemp("published") / "clip-tiny"
    model.save_to_preset(str(directory))
    files = {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}
    return files, to_numpy(model.encode_text(model.tokenizer(TEXTS), normalize=True)["embeds"])


@pytest.fixture
def server(published):
    with HubServer({REPO: published[0]}) as running:
        yield running


def load_in_fresh_process(tmp_path, endpoint, *handles, offline=False, texts=TEXTS, inputs=None, kaggle=None):
    """What `hub_worker.py` recorded for each handle, loaded in order by one new process.

    The hub caches (`HF_HUB_CACHE`, `KAGGLEHUB_CACHE`) and vlzoo's converted cache
    (`VLZOO_CACHE`) live in `tmp_path`, shared by the calls of one test. `kaggle`: the
    address of a `KaggleServer`, which kagglehub reaches as the proxy of `http://localhost`
    (`KAGGLE_API_ENVIRONMENT=LOCALHOST`), without credentials.
    """
    request, out = tmp_path / "request.json", tmp_path / "out.json"
    request.write_text(json.dumps({"handles": handles, "texts": texts, "inputs": inputs and str(inputs)}))
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("KAGGLE") and key.lower() not in ("no_proxy", "http_proxy")}
    env.update({"HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(tmp_path / "hub"),
                "VLZOO_CACHE": str(tmp_path / "vlzoo"), "HF_HUB_OFFLINE": "1" if offline else "0",
                "HF_HUB_DISABLE_PROGRESS_BARS": "1", "KAGGLEHUB_CACHE": str(tmp_path / "kagglehub"),
                "KAGGLE_CONFIG_DIR": str(tmp_path / "kaggle-config"), "KAGGLE_API_ENVIRONMENT": "LOCALHOST"})
    if kaggle is not None:
        env.update(HTTP_PROXY=kaggle, http_proxy=kaggle)
    subprocess.run([sys.executable, str(WORKER), str(request), str(out)], env=env, check=True,
                   timeout=600, cwd=WORKER.parent.parent)
    return json.loads(out.read_text())


def assert_loaded(result, want, label):
    assert "texts" in result, f"{label}: {result}"
    np.testing.assert_array_equal(np.asarray(result["texts"], np.float32), want, err_msg=label)


@pytest.mark.parametrize("handle, want", [
    ("hf://org/name", ("org/name", None)),
    ("hf://google/siglip-base-patch16-224@main", ("google/siglip-base-patch16-224", "main")),
    ("hf://a/b.c-d_e@0123456789abcdef0123456789abcdef01234567", ("a/b.c-d_e", "0123456789abcdef0123456789abcdef01234567")),
])
def test_parse_hf_handle(handle, want):
    assert huggingface.is_handle(handle)
    assert huggingface.parse_hf_handle(handle) == want


@pytest.mark.parametrize("handle", ["hf://", "hf://name", "hf://org/name@", "hf://org/na me", "hf:///name"])
def test_malformed_handles_are_refused_by_name(handle):
    with pytest.raises(ValueError, match="not a valid hub handle"):
        vlzoo.from_preset(handle)


@run_once
def test_unknown_names_and_damaged_downloads_are_refused_by_name_then_recover(published, server, tmp_path):
    """Unknown repositories, revisions and formats; a corrupted file (right size, other bytes) and a truncated
    one (the connection dies halfway and every resume fails) are refused naming the file, then load."""
    server.repos["openai/clip-like"] = {"config.json": b'{"architectures": ["CLIPModel"]}'}
    server.commits["openai/clip-like"] = "f" * 40
    server.repos["vlzoo-tests/clip-tiny-2"] = server.repos[REPO]
    server.commits["vlzoo-tests/clip-tiny-2"] = server.commits[REPO]
    faults = {REPO: "corrupt", "vlzoo-tests/clip-tiny-2": "truncate"}
    for repo, fault in faults.items():
        server.faults[(repo, "model.weights.h5")] = fault  # every response for that file, retries included
    damaged = [f"hf://{repo}" for repo in faults]
    unknown = ["hf://vlzoo-tests/nothing-here", f"hf://{REPO}@no-such-branch", "hf://openai/clip-like"]
    results = load_in_fresh_process(tmp_path, server.endpoint, *unknown, *damaged)
    assert results[0]["error"] == "FileNotFoundError" and "vlzoo-tests/nothing-here" in results[0]["message"]
    assert results[1]["error"] == "FileNotFoundError" and "no-such-branch" in results[1]["message"], results[1]
    assert results[2]["error"] == "ValueError" and "holds no model vlzoo can load" in results[2]["message"]
    assert "found: config.json." in results[2]["message"], results[2]
    for handle, result in zip(damaged, results[3:]):
        assert result["error"] == "ValueError" and "'model.weights.h5'" in result["message"], (handle, result)
    server.faults.clear()
    for handle, result in zip(damaged, load_in_fresh_process(tmp_path, server.endpoint, *damaged)):
        assert_loaded(result, published[1], f"{handle} after a damaged download")


# ----------------------------------------------------------------------------- models written by the peers

BPE = pathlib.Path(__file__).parent.parent / "presets" / "_assets" / "clip_bpe"
CLIP_VOCAB = 49408
SMALL, LENGTH = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4), 16


def _directory_files(directory):
    directory = pathlib.Path(directory)
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _unit(x):
    x = np.asarray(x, np.float64)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _peer_inputs(vocabulary_size, seed=0):
    """Preprocessed images (NHWC) and full-length token ids ending with the largest id."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, vocabulary_size - 1, size=(3, 12)).astype("int32")
    ids[:, -1] = vocabulary_size - 1
    return {"images": rng.normal(size=(3, 32, 32, 3)).astype("float32"), "token_ids": ids,
            "padding_mask": np.ones(ids.shape, bool)}


def _transformers_clip(hf, torch, directory):
    """CLIPModel + CLIPTokenizer + CLIPImageProcessor, `save_pretrained` (safetensors); its peer outputs."""
    torch.manual_seed(0)
    text = dict(SMALL, vocab_size=CLIP_VOCAB, max_position_embeddings=LENGTH, eos_token_id=CLIP_VOCAB - 1,
                bos_token_id=CLIP_VOCAB - 2, pad_token_id=CLIP_VOCAB - 1)
    model = hf.CLIPModel(hf.CLIPConfig(text_config=text, vision_config=dict(SMALL, image_size=32, patch_size=8),
                                       projection_dim=16)).eval()
    tokenizer = hf.CLIPTokenizer(str(BPE / "vocabulary.json"), str(BPE / "merges.txt"))
    processor = hf.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    for item in (model, tokenizer, processor):
        item.save_pretrained(directory)
    tokens = tokenizer(TEXTS, padding="max_length", max_length=LENGTH, truncation=True, return_tensors="pt")
    with torch.no_grad():
        texts = model.get_text_features(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"])
    return {"ids": tokens["input_ids"].numpy(), "texts": getattr(texts, "pooler_output", texts).numpy(),
            "preprocessor": dict(image_size=32, mean=list(processor.image_mean), std=list(processor.image_std),
                                 interpolation="bicubic", crop="center")}


def _sentencepiece_model(root):
    """A 64-piece SentencePiece model (`</s>` 1, `<pad>` 0, `<unk>` 2) trained here on a small corpus."""
    sentencepiece = pytest.importorskip("sentencepiece")
    corpus = root / "siglip-corpus.txt"
    corpus.write_text("\n".join(f"a photo of a {c} {s} playing in the snow with two dogs and a cat"
                                for c in ("red", "blue", "green") for s in ("circle", "square", "cat", "dog")) * 20)
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(root / "spiece"), vocab_size=64, eos_id=1, pad_id=0,
        unk_id=2, bos_id=-1, hard_vocab_limit=False, minloglevel=2)
    return root / "spiece.model"


def _tiny_siglip(hf, torch, seed):
    """A tiny transformers SiglipModel (64-piece vocabulary, 12 text positions, 32 px images), seeded."""
    torch.manual_seed(seed)
    return hf.SiglipModel(hf.SiglipConfig(
        text_config=dict(SMALL, vocab_size=64, max_position_embeddings=12, layer_norm_eps=1e-6, projection_size=32),
        vision_config=dict(SMALL, image_size=32, patch_size=8, layer_norm_eps=1e-6),
    )).eval()


def _siglip_outputs(torch, model, inputs, ids):
    """A SiglipModel's embeddings of `inputs` and of its tokenizer's `ids`: the peer outputs a load must match."""
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(inputs["token_ids"]).long(),
                    pixel_values=torch.from_numpy(inputs["images"].transpose(0, 3, 1, 2).copy()))
        texts = model.get_text_features(input_ids=ids)
    return {"images": out.image_embeds.numpy(), "token_ids": out.text_embeds.numpy(), "ids": ids.numpy(),
            "texts": getattr(texts, "pooler_output", texts).numpy()}


def _transformers_siglip(hf, torch, directory, inputs):
    """SiglipModel + SiglipTokenizer (a SentencePiece model trained here), `save_pretrained` with pickled
    `pytorch_model.bin`; its peer outputs on `inputs` and on its tokenizer's ids."""
    model = _tiny_siglip(hf, torch, seed=1)
    model.save_pretrained(directory, safe_serialization=False)
    tokenizer = hf.SiglipTokenizer(vocab_file=str(_sentencepiece_model(directory.parent)))
    tokenizer.save_pretrained(directory)
    ids = tokenizer(TEXTS, padding="max_length", max_length=12, truncation=True, return_tensors="pt")["input_ids"]
    return _siglip_outputs(torch, model, inputs, ids)


def _transformers_siglip2(hf, torch, directory, inputs):
    """A SigLIP 2 repository as the Hub holds them: SiglipModel `save_pretrained`, Gemma's `tokenizer.model`
    (a SentencePiece BPE model with Gemma's pieces, trained here by sentencepiece: no dummy prefix, identity
    normalisation) and transformers' GemmaTokenizer of it, no start piece and `<eos>` last, as SigLIP 2's
    repositories configure it, `save_pretrained`; its peer outputs on `inputs` and on that tokenizer's ids."""
    sentencepiece = pytest.importorskip("sentencepiece")
    model = _tiny_siglip(hf, torch, seed=5)
    model.save_pretrained(directory)
    corpus = directory.parent / "gemma-corpus.txt"
    corpus.write_text("\n".join(f"a photo of a {c} {s} and two dogs in the snow" for c in ("red", "blue", "green")
                                for s in ("circle", "square", "cat", "dog")) * 20)
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(directory / "tokenizer"), model_type="bpe", vocab_size=64,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
        unk_piece="<unk>", add_dummy_prefix=False, normalization_rule_name="identity",
        remove_extra_whitespaces=False, hard_vocab_limit=False, minloglevel=2)
    (directory / "tokenizer.vocab").unlink()
    tokenizer = hf.GemmaTokenizer.from_pretrained(directory, add_bos_token=False, add_eos_token=True,
                                                  padding_side="right")
    tokenizer.save_pretrained(directory)
    ids = tokenizer(TEXTS, padding="max_length", max_length=12, truncation=True, return_tensors="pt")["input_ids"]
    return _siglip_outputs(torch, model, inputs, ids)


def _transformers_metaclip2(hf, torch, directory, inputs):
    """A MetaCLIP 2 repository as transformers 5 writes it: MetaClip2Model, transformers' XLMRobertaTokenizer of
    an XLM-V layout SentencePiece model trained here (saved as `tokenizer.json` alone) and CLIPImageProcessor,
    `save_pretrained`; its peer outputs on `inputs`' images and on that tokenizer's ids (pooled at `</s>` = 2)."""
    sentencepiece = pytest.importorskip("sentencepiece")
    source = directory.parent / "xlm-v-source"
    source.mkdir()
    corpus = source / "corpus.txt"
    corpus.write_text("\n".join(f"a photo of a {c} {s} playing in the snow with two dogs" for c in ("red", "blue")
                                for s in ("circle", "cat", "Кошка", "猫")) * 20, encoding="utf-8")
    sentencepiece.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(source / "sentencepiece.bpe"),
                                             vocab_size=64, hard_vocab_limit=False, minloglevel=2)
    tokenizer = hf.XLMRobertaTokenizer.from_pretrained(str(source))
    torch.manual_seed(6)
    # 64 rows, as the shared inputs' ids need (the tokenizer's pieces are fewer).
    text = dict(SMALL, vocab_size=max(64, len(tokenizer)), max_position_embeddings=LENGTH, bos_token_id=0,
                pad_token_id=1, eos_token_id=2, hidden_act="gelu")
    model = hf.MetaClip2Model(hf.MetaClip2Config(
        text_config=text, vision_config=dict(SMALL, image_size=32, patch_size=8, hidden_act="gelu"),
        projection_dim=16)).eval()
    processor = hf.CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    for item in (model, tokenizer, processor):
        item.save_pretrained(directory)
    assert not (directory / "sentencepiece.bpe.model").exists()
    tokens = tokenizer(TEXTS, padding="max_length", max_length=LENGTH, truncation=True, return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"],
                    pixel_values=torch.from_numpy(inputs["images"].transpose(0, 3, 1, 2).copy()))
    return {"ids": tokens["input_ids"].numpy(), "texts": out.text_embeds.numpy(), "images": out.image_embeds.numpy(),
            "preprocessor": dict(image_size=32, mean=list(processor.image_mean), std=list(processor.image_std),
                                 interpolation="bicubic", crop="center")}


def _transformers_tipsv2(hf, torch, directory, inputs):
    """A TIPSv2 repository: Tipsv2Model, transformers' Tipsv2Tokenizer of a SentencePiece BPE model in TIPSv2's
    layout trained here (`<pad>` 0, `<unk>` 1, byte fallback; its `tokenizer.model` beside the `tokenizer.json`
    transformers 5 writes) and Tipsv2ImageProcessor, `save_pretrained`; its peer outputs."""
    sentencepiece = pytest.importorskip("sentencepiece")
    directory.mkdir()
    corpus = directory.parent / "tipsv2-corpus.txt"
    corpus.write_text("\n".join(f"a photo of a {c} {s} playing in the snow" for c in ("red", "blue")
                                for s in ("circle", "cat", "dog")) * 20)
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(directory / "tokenizer"), model_type="bpe", vocab_size=300, pad_id=0,
        unk_id=1, bos_id=-1, eos_id=-1, byte_fallback=True, hard_vocab_limit=False, minloglevel=2)
    (directory / "tokenizer.vocab").unlink()
    tokenizer = hf.Tipsv2Tokenizer.from_pretrained(str(directory))
    torch.manual_seed(7)
    model = hf.Tipsv2Model(hf.Tipsv2Config(
        vision_config=dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2, image_size=32,
                           patch_size=8),
        text_config=dict(SMALL, vocab_size=len(tokenizer), max_position_embeddings=LENGTH))).eval()
    processor = hf.Tipsv2ImageProcessor(size={"height": 32, "width": 32})
    for item in (model, tokenizer, processor):
        item.save_pretrained(directory)
    tokens = tokenizer(TEXTS, padding="max_length", max_length=LENGTH, truncation=True, return_tensors="pt")
    with torch.no_grad():
        out = model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"],
                    pixel_values=torch.from_numpy(inputs["images"].transpose(0, 3, 1, 2).copy()))
    return {"ids": tokens["input_ids"].numpy(), "texts": out.text_embeds.numpy(), "images": out.image_embeds.numpy(),
            "preprocessor": dict(image_size=32, mean=[0.0] * 3, std=[1.0] * 3, interpolation="bilinear", crop="none")}


def _open_clip(open_clip, torch, hf, directory, inputs):
    """An open_clip CLIP written by open_clip's `save_for_hf` (hub layout); its peer outputs."""
    torch.manual_seed(2)
    config = dict(embed_dim=16, quick_gelu=True, vision_cfg=dict(image_size=32, patch_size=8, width=32, layers=2,
                                                                 head_width=8),
                  text_cfg=dict(context_length=12, vocab_size=64, width=32, heads=4, layers=2))
    model = open_clip.CLIP(**config).eval()
    model.visual.image_mean, model.visual.image_std = (0.5, 0.25, 0.125), (0.2, 0.3, 0.4)  # create_model sets these
    model.visual.preprocess_cfg = {"interpolation": "bilinear", "resize_mode": "squash"}
    tokenizer = hf.CLIPTokenizer(str(BPE / "vocabulary.json"), str(BPE / "merges.txt"))
    importlib.import_module("open_clip.push_to_hf_hub").save_for_hf(model, tokenizer, config, directory, safe_serialization=True)
    with torch.no_grad():
        images = model.encode_image(torch.from_numpy(inputs["images"].transpose(0, 3, 1, 2).copy()))
        texts = model.encode_text(torch.from_numpy(inputs["token_ids"]).long())
    return {"images": images.numpy(), "token_ids": texts.numpy(), "preprocessor": dict(
        image_size=32, mean=[0.5, 0.25, 0.125], std=[0.2, 0.3, 0.4], interpolation="bilinear", crop="none")}


def _keras_hub_clip(directory, inputs):
    """A keras-hub CLIPBackbone, `save_to_preset`; its outputs on this backend."""
    import keras_hub

    keras.utils.set_random_seed(3)
    tower = dict(hidden_dim=32, num_layers=2, num_heads=4, intermediate_dim=64, intermediate_activation="quick_gelu")
    vision = keras_hub.models.CLIPVisionEncoder(patch_size=8, image_shape=(32, 32, 3), **tower)
    text = keras_hub.models.CLIPTextEncoder(vocabulary_size=64, embedding_dim=32, max_sequence_length=12, **tower)
    ids = vision.embedding.position_ids  # as in keras-hub's presets; a fresh encoder holds zeros
    ids.assign(np.arange(ids.shape[1])[None].astype(keras.backend.standardize_dtype(ids.dtype)))
    backbone = keras_hub.models.CLIPBackbone(vision, text, projection_dim=16)
    backbone.save_to_preset(str(directory))
    return {"images": to_numpy(backbone.get_vision_embeddings(inputs["images"])),
            "token_ids": to_numpy(backbone.get_text_embeddings(inputs["token_ids"]))}


def _keras_hub_siglip(directory, inputs):
    """A keras-hub SigLIPBackbone and SigLIPPreprocessor (SentencePiece trained here), `save_to_preset`;
    the backbone's outputs on `inputs`, and the preprocessor's ids of KERAS_HUB_TEXTS and their embeddings."""
    import keras_hub

    keras.utils.set_random_seed(4)
    tower = dict(hidden_dim=32, num_layers=2, num_heads=4, intermediate_dim=64)
    vision = keras_hub.models.SigLIPVisionEncoder(patch_size=8, image_shape=(32, 32, 3), **tower)
    text = keras_hub.models.SigLIPTextEncoder(vocabulary_size=64, embedding_dim=32, max_sequence_length=12, **tower)
    backbone = keras_hub.models.SigLIPBackbone(vision, text)
    directory.mkdir(parents=True)
    tokenizer = keras_hub.models.SigLIPTokenizer(proto=str(_sentencepiece_model(directory.parent)))
    converter = keras_hub.layers.SigLIPImageConverter(image_size=(32, 32), scale=1 / 127.5, offset=-1.0)
    preprocessor = keras_hub.models.SigLIPPreprocessor(tokenizer, image_converter=converter, sequence_length=12)
    backbone.save_to_preset(str(directory))
    preprocessor.save_to_preset(str(directory))
    images = np.zeros((len(KERAS_HUB_TEXTS), 32, 32, 3), "float32")
    ids = to_numpy(preprocessor({"prompts": KERAS_HUB_TEXTS, "images": images})["token_ids"])
    return {"images": to_numpy(backbone.get_vision_embeddings(inputs["images"])),
            "token_ids": to_numpy(backbone.get_text_embeddings(inputs["token_ids"])),
            "ids": ids, "texts": to_numpy(backbone.get_text_embeddings(ids)),
            "preprocessor": dict(image_size=32, mean=[0.5] * 3, std=[0.5] * 3, interpolation="bilinear",
                                 crop="center")}


@pytest.fixture(scope="module")
def peer_repos(tmp_path_factory):
    """`{repo_id: (files, format, peer outputs)}` of tiny models written by transformers, open_clip, keras-hub."""
    transformers, open_clip = import_transformers(), peers.open_clip_or_skip()
    transformers.logging.set_verbosity_error()
    import torch

    root = tmp_path_factory.mktemp("peer-repos")
    inputs = _peer_inputs(64)
    np.savez(root / "inputs.npz", **inputs)
    written = {
        "openai/clip-tiny": ("transformers", _transformers_clip(transformers, torch, root / "clip")),
        "google/siglip-tiny": ("transformers", _transformers_siglip(transformers, torch, root / "siglip", inputs)),
        "google/siglip2-tiny": ("transformers", _transformers_siglip2(transformers, torch, root / "siglip2", inputs)),
        "facebook/metaclip-2-tiny": ("transformers", _transformers_metaclip2(transformers, torch, root / "metaclip2",
                                                                             inputs)),
        "google/tipsv2-tiny": ("transformers", _transformers_tipsv2(transformers, torch, root / "tipsv2", inputs)),
        "laion/open-clip-tiny": ("open_clip", _open_clip(open_clip, torch, transformers, root / "open-clip", inputs)),
        "keras/clip-tiny": ("keras_hub", _keras_hub_clip(root / "keras-hub", inputs)),
    }
    names = dict(zip(written, ("clip", "siglip", "siglip2", "metaclip2", "tipsv2", "open-clip", "keras-hub")))
    repos = {repo: (_directory_files(root / names[repo]), fmt, want) for repo, (fmt, want) in written.items()}
    return repos, root / "inputs.npz"


def _resolves(requests):
    return [path.split("/", 5)[-1] for method, path in requests if method == "GET" and "/resolve/" in path]


@run_once
def test_models_written_by_vlzoo_and_the_peers_load_by_handle_and_match_them(published, peer_repos, tmp_path):
    """Every format by `hf://` (and a pretrained name) in a fresh process, again from the cache, then offline.

    Once: the download, the cache and the tokenizers do not depend on the backend, and each converter's
    numerics are checked against its peer on every backend by test_convert_*."""
    repos, inputs = peer_repos
    served = {repo: files for repo, (files, _, _) in repos.items()}
    # The catalogue's OpenAI B/32 name resolves to this repository id: the tiny CLIP stands in for it, with
    # copies of its weights in formats vlzoo does not read, which must not be downloaded.
    served["openai/clip-vit-base-patch32"] = {**served["openai/clip-tiny"], "tf_model.h5": b"\0" * 4096,
                                              "flax_model.msgpack": b"\0" * 4096}
    # So does the tiny MetaCLIP 2 for the catalogue's MetaCLIP 2 S/16.
    served["facebook/metaclip-2-worldwide-s16"] = served["facebook/metaclip-2-tiny"]
    by_name = {"clip_vit_b32_openai": "openai/clip-tiny", "metaclip2_vit_s16_worldwide": "facebook/metaclip-2-tiny"}
    served[REPO] = published[0]
    with HubServer(served) as running:
        vlzoo_handles = [f"hf://{REPO}", f"hf://{REPO}@main", f"hf://{REPO}@{running.commits[REPO]}"]
        handles = [*vlzoo_handles, *(f"hf://{repo}" for repo in repos), *by_name]
        # Each handle twice: the second load finds the conversion in the cache and downloads nothing.
        online = load_in_fresh_process(tmp_path, running.endpoint, *handles, *handles, inputs=inputs)
        downloads = _resolves(running.requests)
    # A new process, HF_HUB_OFFLINE=1 and nothing listening: the caches alone.
    offline = load_in_fresh_process(tmp_path, "http://127.0.0.1:9", *handles, "hf://vlzoo-tests/never-fetched",
                                    inputs=inputs, offline=True)
    never = offline.pop()
    assert never["error"] == "FileNotFoundError" and "never-fetched: not in the cache" in never["message"], never
    runs = [online[: len(handles)], online[len(handles):], offline]
    unread = ("tf_model.h5", "flax_model.msgpack")
    assert sorted(downloads) == sorted(n for files in served.values() for n in files if n not in unread)
    for handle, *loaded in zip(handles, *runs):
        assert all("error" not in result for result in loaded), f"{handle}: {loaded}"
        if handle in vlzoo_handles:  # vlzoo's own preset: bit for bit
            for result in loaded:
                assert_loaded(result, published[1], handle)
            continue
        repo = handle[len("hf://"):] if handle.startswith("hf://") else by_name[handle]
        _, fmt, want = repos[repo]
        label = f"{handle} ({fmt})"
        for key, peer in want.items():
            if key == "ids":  # the repository's own tokenizer gives transformers' ids
                np.testing.assert_array_equal(np.asarray(loaded[0]["ids"]), peer, err_msg=label)
            elif key == "preprocessor":  # read from the repository's preprocessing files
                assert loaded[0]["preprocessor"] == peer, label
            else:
                got = np.asarray(loaded[0][key])
                np.testing.assert_allclose(got, _unit(peer), atol=1e-4, rtol=0, err_msg=f"{label} {key}")
            for other in loaded[1:]:  # from the converted cache, online and offline
                assert other.get(key) == loaded[0].get(key), f"{label} {key}: differs when cached"


# ----------------------------------------------------------------------------- kaggle:// (keras-hub's presets)


@run_once
def test_keras_hub_presets_load_by_kaggle_handle_and_match_keras_hub(tmp_path):
    """keras-hub presets served as Kaggle model versions load by `kaggle://`, with and without a version,
    match keras-hub's embeddings and its SigLIPPreprocessor's ids, and a versioned handle loads again
    from the converted cache with no call at all, also in a new process with nothing listening.

    Once: the download, the cache and the tokenizer do not depend on the backend, and the keras-hub
    converter's numerics are checked on every backend by test_convert_keras_hub and the hf:// test."""
    inputs = _peer_inputs(64)
    np.savez(tmp_path / "inputs.npz", **inputs)
    siglip, clip = tmp_path / "peers" / "siglip", tmp_path / "peers" / "clip"
    want = {"siglip": _keras_hub_siglip(siglip, inputs), "clip": _keras_hub_clip(clip, inputs)}
    models = {"keras/siglip-tiny/keras/tiny": {2: _directory_files(siglip)},
              "keras/clip-tiny/keras/tiny": {1: _directory_files(clip)}}
    handles = ["kaggle://keras/siglip-tiny/keras/tiny/2", "kaggle://keras/siglip-tiny/keras/tiny",
               "kaggle://keras/clip-tiny/keras/tiny/1"]
    missing = ["kaggle://keras/siglip-tiny/keras/tiny/3", "kaggle://keras/nothing/keras/tiny/1", "kaggle://keras/a"]
    with KaggleServer(models) as running:
        online = load_in_fresh_process(tmp_path, "http://127.0.0.1:9", *handles, *handles, *missing,
                                       texts=KERAS_HUB_TEXTS, inputs=tmp_path / "inputs.npz",
                                       kaggle=running.endpoint)
        calls = list(running.requests)
    offline = load_in_fresh_process(tmp_path, "http://127.0.0.1:9", handles[0], handles[2], texts=KERAS_HUB_TEXTS,
                                    inputs=tmp_path / "inputs.npz", kaggle="http://127.0.0.1:9")
    *online, later_version, no_model, malformed = online
    assert later_version["error"] == no_model["error"] == "FileNotFoundError", (later_version, no_model)
    assert "kaggle://keras/nothing/keras/tiny/1: Kaggle has no such model version" in no_model["message"]
    assert malformed["error"] == "ValueError" and "kaggle://owner/model/framework/variation" in malformed["message"]
    # Every file downloaded once; only the handle without a version asks for the latest one (at each load).
    downloads = sorted(path for method, path in calls if method == "DownloadModelInstanceVersion")
    assert downloads == sorted([*models["keras/siglip-tiny/keras/tiny"][2], *models["keras/clip-tiny/keras/tiny"][1]])
    assert [method for method, _ in calls].count("GetModelInstance") == 2, calls
    runs = {handles[0]: [online[0], online[3], offline[0]], handles[1]: [online[1], online[4]],
            handles[2]: [online[2], online[5], offline[1]]}
    for handle, loaded in runs.items():
        assert all("error" not in result for result in loaded), f"{handle}: {loaded}"
        peer = want["siglip" if "siglip" in handle else "clip"]
        for key, value in peer.items():
            if key == "ids":
                np.testing.assert_array_equal(np.asarray(loaded[0]["ids"]), value, err_msg=handle)
            elif key == "preprocessor":
                assert loaded[0]["preprocessor"] == value, handle
            else:
                np.testing.assert_allclose(np.asarray(loaded[0][key]), _unit(value), atol=1e-4, rtol=0,
                                           err_msg=f"{handle} {key}")
            for other in loaded[1:]:  # from the converted cache, online and offline
                assert other.get(key) == loaded[0].get(key), f"{handle} {key}: differs when cached"


# ----------------------------------------------------------------------------- single files at a URL


@run_once
def test_a_url_checkpoint_is_pinned_by_sha256_converted_once_and_cached(tmp_path, monkeypatch):
    """The Llip authors' checkpoint layout (`torch.save` of a training checkpoint) served over loopback HTTP."""
    import hashlib

    import test_convert_llip as llip_fixture
    import torch

    config, state_dict, inputs, outputs = llip_fixture.load("qkv_norm_on")
    served = tmp_path / "served"
    served.mkdir()
    torch.save({"epoch": 1, "state_dict": {f"module.{k}": torch.from_numpy(v) for k, v in state_dict.items()}},
               served / "llip_tiny.pt")
    digest = hashlib.sha256((served / "llip_tiny.pt").read_bytes()).hexdigest()
    architecture = tmp_path / "architecture"
    vlzoo.from_preset("llip_tiny", load_weights=False, **llip_fixture.overrides(config)).save_to_preset(str(architecture))
    monkeypatch.setenv("VLZOO_CACHE", str(tmp_path / "cache"))
    with FileServer(served) as server:
        entry = {"handle": server.url("llip_tiny.pt"), "sha256": "0" * 64, "format": "llip",
                 "architecture": str(architecture)}
        with pytest.raises(ValueError, match=r"'llip_tiny.pt' has sha256 .*not the pinned 0000"):
            remote._url_preset(entry)
        assert not any(p.is_file() for p in (tmp_path / "cache").rglob("*")), "a refused file stayed in the cache"
        entry["sha256"] = digest
        first = remote._url_preset(entry)
        requests = len(server.requests)
        assert remote._url_preset(entry) == first and len(server.requests) == requests
        # A URL the catalogue does not name: nothing says which model its weights fit, nor their sha256.
        with pytest.raises(ValueError, match=r"llip_tiny.pt'.*catalogue names.*https://dl.fbaipublicfiles.com/llip/"):
            vlzoo.from_preset(server.url("llip_tiny.pt"))
        assert len(server.requests) == requests
    llip_fixture.assert_logits_match(vlzoo.from_preset(str(first)), inputs, outputs)


@run_once
def test_a_flair_checkpoint_at_a_url_converts_to_the_authors_outputs(tmp_path, monkeypatch):
    """The FLAIR authors' release layout (`torch.save` of `{"epoch", "state_dict"}` with DDP's `module.`), its
    golden fixture's weights, served over loopback HTTP and read through the catalogue's `flair` format."""
    import hashlib

    import test_flair
    import torch

    config, state_dict, inputs, outputs = test_flair.load()
    served = tmp_path / "served"
    served.mkdir()
    torch.save({"epoch": 32, "name": "flair", "state_dict": {f"module.{k}": torch.from_numpy(v)
                                                            for k, v in state_dict.items()}},
               served / "flair-tiny.pt")
    architecture = tmp_path / "architecture"
    vlzoo.from_preset("flair_tiny", load_weights=False, **test_flair.overrides(config)).save_to_preset(str(architecture))
    monkeypatch.setenv("VLZOO_CACHE", str(tmp_path / "cache"))
    with FileServer(served) as server:
        entry = {"handle": server.url("flair-tiny.pt"), "format": "flair", "architecture": str(architecture),
                 "sha256": hashlib.sha256((served / "flair-tiny.pt").read_bytes()).hexdigest()}
        model = vlzoo.from_preset(str(remote._url_preset(entry)))
    images, texts = test_flair.vlzoo_inputs(inputs)
    np.testing.assert_allclose(to_numpy(model.similarity(images, texts)), outputs["conditioned_logits"],
                               atol=test_flair.ATOL, rtol=0)


# ----------------------------------------------------------------------------- the pretrained catalogue

OPEN_CLIP_TAGS = {  # catalogue name -> (open_clip model, pretrained tag) whose `hf_hub` it must name
    "clip_vit_b32_laion2b": ("ViT-B-32", "laion2b_s34b_b79k"),
    "clip_vit_b16_laion2b": ("ViT-B-16", "laion2b_s34b_b88k"),
    "clip_vit_l14_laion2b": ("ViT-L-14", "laion2b_s32b_b82k"),
    "clip_vit_b32_datacomp": ("ViT-B-32", "datacomp_xl_s13b_b90k"),
    "clip_vit_b16_datacomp": ("ViT-B-16", "datacomp_xl_s13b_b90k"),
    "clip_vit_l14_datacomp": ("ViT-L-14", "datacomp_xl_s13b_b90k"),
}
REQUIRED = {*OPEN_CLIP_TAGS, "clip_vit_b32_openai", "clip_vit_b16_openai", "clip_vit_l14_openai",
            "siglip_vit_b16_webli", "siglip2_vit_b16_webli", "llip_vit_b16_k32", "llip_vit_g14_k64"}
# The FLAIR authors' four released files (their README's table, repository xiaorui638/flair on the Hub).
FLAIR_FILES = {"flair_vit_b16_cc3m_recap": "flair-cc3m-recap.pt", "flair_vit_b16_cc12m_recap": "flair-cc12m-recap.pt",
               "flair_vit_b16_yfcc15m_recap": "flair-yfcc15m-recap.pt", "flair_vit_b16_merged30m": "flair-merged30m.pt"}


@run_once
def test_the_pretrained_catalogue_names_real_weights_with_their_facts(capsys):
    names = vlzoo.list_presets(pretrained=True)
    assert REQUIRED <= set(names)
    assert vlzoo.list_presets(family="llip", pretrained=True) == ["llip_vit_b16_k32", "llip_vit_g14_k64"]
    assert vlzoo.list_presets(family="flair", pretrained=True) == sorted(FLAIR_FILES)
    for name, file in FLAIR_FILES.items():
        assert vlzoo.preset_info(name)["handle"] == f"https://huggingface.co/xiaorui638/flair/resolve/main/{file}"
    for name in names:
        info = vlzoo.preset_info(name)
        assert info["architecture"] in vlzoo.list_presets(family=info["family"]), name
        assert info["params"] == vlzoo.preset_info(info["architecture"])["params"], name
        assert info["licence"] and info["reference"] and info["source"], name
    open_clip = peers.open_clip_or_skip()
    for name, (model, tag) in OPEN_CLIP_TAGS.items():
        assert vlzoo.preset_info(name)["handle"] == "hf://" + open_clip.get_pretrained_cfg(model, tag)["hf_hub"].rstrip("/")
    import keras_hub

    siglip2, facts = vlzoo.preset_info("siglip2_vit_b16_webli"), keras_hub.models.SigLIPBackbone.presets[
        "siglip2_base_patch16_224"]
    assert siglip2["handle"] == facts["kaggle_handle"]
    # keras-hub counts its position-id buffers (196 patches + 64 text positions) among the parameters.
    assert siglip2["params"] + 196 + 64 == facts["metadata"]["params"] == 375_188_230
    # Every keras-hub SigLIP 2 preset is in the catalogue under its geometry: the same handle, and keras-hub's
    # count is ours plus its buffers, except two entries of keras-hub's list whose counts are copied from a
    # neighbour (base_patch16_384 repeats base_patch32_256's; so400m_patch16_512 leaves its buffers out).
    copied = {"siglip2_base_patch16_384", "siglip2_so400m_patch16_512"}
    hub_siglip2 = {key: value for key, value in keras_hub.models.SigLIPBackbone.presets.items()
                   if key.startswith("siglip2_")}
    by_handle = {vlzoo.preset_info(name)["handle"]: name for name in names}
    assert len(hub_siglip2) == 14
    for key, value in hub_siglip2.items():
        info = vlzoo.preset_info(by_handle[value["kaggle_handle"]])
        vision = json.loads((vlzoo.presets.resolve_preset(info["architecture"]) / "config.json").read_text())["config"]["vision"]
        buffers = (vision["image_size"] // vision["patch_size"]) ** 2 + 64
        if key not in copied:
            assert info["params"] + buffers == value["metadata"]["params"], key
    # MetaCLIP 2's twelve released checkpoints; keras-hub carries four of them, with the same parameter counts.
    metaclip2 = [name for name in names if name.startswith("metaclip2_")]
    assert len(metaclip2) == 12 and {vlzoo.preset_info(name)["licence"] for name in metaclip2} == {"CC-BY-NC-4.0"}
    for key, name in {"metaclip_2_vit_huge_patch14_224": "metaclip2_vit_h14_quickgelu_worldwide",
                      "metaclip_2_vit_huge_patch14_378": "metaclip2_vit_h14_378_worldwide",
                      "metaclip_2_vit_giant_patch14_224": "metaclip2_vit_g14_worldwide",
                      "metaclip_2_vit_giant_patch14_378": "metaclip2_vit_g14_378_worldwide"}.items():
        assert vlzoo.preset_info(name)["params"] == keras_hub.models.MetaCLIP2Backbone.presets[key]["metadata"][
            "params"], name
    from vlzoo import cli

    assert cli.main(["list", "--pretrained"]) == 0
    table = capsys.readouterr().out
    for name in names:
        assert name in table and vlzoo.preset_info(name)["handle"] in table
