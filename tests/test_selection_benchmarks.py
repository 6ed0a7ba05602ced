"""SugarCrepe, Winoground and MMVP-VLM read from tiny fixtures in their published layouts, scored by
test models whose answers are known (an oracle: 1.0; a constant: chance exactly) and by real models
against a per-item computation."""

import csv
import functools
import json
import os
import pickle
import re

import keras
import numpy as np
import pytest
from backend_utils import run_once
from margins import DECISION_MARGIN, ranking_gap
from peers import clip_benchmark_embedding_model
from PIL import Image

import vlzoo
from vlzoo.evaluation import benchmarks
from vlzoo.evaluation.selection import selection_metrics
from vlzoo.evaluation.zeroshot import EmbeddingMean, classification_metrics
from vlzoo.preprocessing import ImagePreprocessor

LEVELS = 12  # image k is a solid grey of value 20 k + 10; its captions name "thing k"


def _solid(path, k):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(np.full((24, 32, 3), 20 * k + 10, np.uint8)).save(path)


class Oracle:
    """A stand-in model that sees the answer: one-hot embeddings of the image's grey level and of the
    `thing k` its caption names; `constant=True` scores everything alike."""

    symmetric_score = True
    prompt_ensembling = EmbeddingMean()

    def __init__(self, constant=False):
        self.constant = constant
        self.preprocessor = ImagePreprocessor(image_size=8)
        self._levels = np.array([self.preprocessor(np.full((1, 24, 32, 3), 20 * k + 10, np.uint8)).mean()
                                 for k in range(LEVELS)])

    def tokenizer(self, texts):
        ids = np.array([[int(re.search(r"thing (\d+)", t).group(1))] for t in texts])
        return {"token_ids": ids, "padding_mask": np.ones_like(ids, bool)}

    def encode_image(self, images):
        means = np.asarray(images).reshape(len(images), -1).mean(axis=1)
        return {"embeds": np.eye(LEVELS)[np.abs(means[:, None] - self._levels).argmin(axis=1)]}

    def encode_text(self, texts, normalize=False):
        ids = texts if isinstance(texts, dict) else self.tokenizer(texts)
        return {"embeds": np.eye(LEVELS)[keras.ops.convert_to_numpy(ids["token_ids"])[:, 0]]}

    def normalize_embeds(self, embeds):
        return embeds  # one-hot rows, and means of equal ones

    def score(self, image_embeds, text_embeds):
        scores = keras.ops.matmul(image_embeds["embeds"], keras.ops.transpose(text_embeds["embeds"]))
        return keras.ops.zeros_like(scores) if self.constant else scores


# ------------------------------------------------------------------ fixtures in each layout


def _sugarcrepe(root):
    data, images = root / "sugar-crepe" / "data", root / "coco" / "val2017"
    os.makedirs(data)
    for f, stem in enumerate(benchmarks.SUGARCREPE_FILES):
        entries = {}
        for i, key in enumerate(["0", "1", "3"]):  # keys need not be contiguous (swap_obj.json lacks "108")
            k = (f + i) % LEVELS
            filename = f"{100 * f + i:012d}.jpg"
            _solid(str(images / filename), k)
            entries[key] = {"filename": filename, "caption": f"a photo of thing {k}",
                            "negative_caption": f"a photo of thing {(k + 1) % LEVELS}"}
        (data / f"{stem}.json").write_text(json.dumps(entries))
    return data, images


def _winoground(root):
    data = root / "winoground" / "data"
    os.makedirs(data / "images")
    lines = []
    for i in range(3):
        for j in range(2):
            _solid(str(data / "images" / f"ex_{i}_img_{j}.png"), 2 * i + j)
        lines.append(json.dumps({"id": i, "image_0": f"ex_{i}_img_0", "image_1": f"ex_{i}_img_1",
                                 "caption_0": f"thing {2 * i} left of thing", "caption_1": f"thing {2 * i + 1} there",
                                 "tag": "Noun", "secondary_tag": "", "num_main_preds": 1,
                                 "collapsed_tag": ["Object", "Relation", "Both"][i]}))
    (data / "examples.jsonl").write_text("\n".join(lines) + "\n")
    return data


def _mmvp(root):
    data = root / "MMVP_VLM"
    rows = []
    for pair, kind in enumerate(["Orientation", "Camera Perspective"]):
        for j in range(2):
            qid = 2 * pair + j + 1
            _solid(str(data / benchmarks.MMVP_IMAGES / kind / f"{qid}.jpg"), qid)
            rows.append({"Question ID": qid, "Type": kind, "Statement": f"thing {qid} facing left"})
    with open(data / "Questions.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(benchmarks.MMVP_COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
    return data


def _karpathy(root, coco=True):
    images = root / ("coco" if coco else "flickr30k-images")
    entries = []
    for i in range(5):
        filename = f"COCO_val2014_{i:012d}.jpg" if coco else f"{1000 + i}.jpg"
        _solid(str(images / ("val2014" if coco else "") / filename), i)
        entry = {"filename": filename, "imgid": i, "split": "test" if i < 4 else "train",
                 "sentences": [{"raw": f"A photo of thing {i}. ", "imgid": i, "sentid": 2 * i + j} for j in range(2)]}
        entries.append({**entry, "filepath": "val2014", "cocoid": i} if coco else entry)
    path = root / ("dataset_coco.json" if coco else "dataset_flickr30k.json")
    path.write_text(json.dumps({"images": entries, "dataset": "coco" if coco else "flickr30k"}))
    return path, images


@pytest.fixture
def layouts(tmp_path):
    return {"sugarcrepe": benchmarks.sugarcrepe(*_sugarcrepe(tmp_path)),
            "winoground": [benchmarks.winoground(_winoground(tmp_path))], "mmvp": [benchmarks.mmvp(_mmvp(tmp_path))]}


# ------------------------------------------------------------------ known answers

CHANCE = {"caption": {"acc": 0.5}, "winoground": {"text": 0.25, "image": 0.25, "group": 1 / 6}, "mmvp": {"pair": 0.25}}


def test_the_readers_find_every_item(layouts):
    assert [b.name for b in layouts["sugarcrepe"]] == [f"sugar_crepe/{s}" for s in benchmarks.SUGARCREPE_FILES]
    assert [len(b.items) for b in layouts["sugarcrepe"]] == [3] * 7 and layouts["sugarcrepe"][0].items[2].key == "3"
    wino, = layouts["winoground"]
    assert len(wino.items) == 3 and wino.items[1].captions == ("thing 2 left of thing", "thing 3 there")
    pairs, = layouts["mmvp"]
    assert [item.key for item in pairs.items] == ["1-2", "3-4"]
    assert pairs.items[1].captions == ("a photo of thing 3 facing left", "a photo of thing 4 facing left")
    assert pairs.items[1].images[0].endswith(os.path.join("MLLM_VLM Images", "Camera Perspective", "3.jpg"))


def test_a_model_that_sees_the_answer_scores_one(layouts):
    for benchmark in sum(layouts.values(), []):
        result = benchmarks.evaluate_selection(Oracle(), benchmark, batch_size=2)
        assert set(result["metrics"].values()) == {1.0}, benchmark.name
        assert all(set(group.values()) == {1.0} for group in result["groups"].values())


@pytest.mark.parametrize("ties", ["expected", "pessimistic", "optimistic"])
def test_a_constant_model_scores_chance_exactly_or_the_tie_rule(layouts, ties):
    for benchmark in sum(layouts.values(), []):
        metrics = benchmarks.evaluate_selection(Oracle(constant=True), benchmark, ties=ties)["metrics"]
        want = {name: {"expected": chance, "pessimistic": 0.0, "optimistic": 1.0}[ties]
                for name, chance in CHANCE[benchmark.kind].items()}
        assert metrics == want, benchmark.name


def test_ties_break_at_random_within_equal_scores_only():
    # Caption 0 beats caption 2 outright and ties caption 1: passes in half of the orderings.
    i2t = np.array([[[0.5, 0.5, 0.1]]])
    assert selection_metrics("caption", i2t, i2t)["acc"] == 0.5
    assert selection_metrics("caption", i2t, i2t, ties="pessimistic")["acc"] == 0.0


# ------------------------------------------------------------------ malformed files


def test_a_missing_key_names_the_file_and_the_entry(tmp_path):
    data, images = _sugarcrepe(tmp_path)
    records = json.loads((data / "swap_obj.json").read_text())
    del records["1"]["negative_caption"]
    (data / "swap_obj.json").write_text(json.dumps(records))
    with pytest.raises(ValueError, match=r"swap_obj\.json, entry 1: missing key\(s\) \['negative_caption'\]"):
        benchmarks.sugarcrepe(data, images)


def test_a_missing_image_names_the_file_the_entry_and_the_path(tmp_path):
    data = _winoground(tmp_path)
    os.remove(data / "images" / "ex_2_img_1.png")
    with pytest.raises(FileNotFoundError, match=r"examples\.jsonl, entry 2: image not found: .*ex_2_img_1\.png"):
        benchmarks.winoground(data)


def test_an_unpaired_statement_is_refused(tmp_path):
    data = _mmvp(tmp_path)
    lines = (data / "Questions.csv").read_text().splitlines()
    (data / "Questions.csv").write_text("\n".join(lines[:-1]) + "\n")
    with pytest.raises(ValueError, match=r"Questions\.csv: statements come in pairs; received 3 rows"):
        benchmarks.mmvp(data)


# ------------------------------------------------------------------ real families


@functools.lru_cache(maxsize=None)
def _preset(name):
    return vlzoo.from_preset(name)


SHAPES_PRESETS = ["clip_shapes", "siglip_shapes", "filip_shapes", "sparc_shapes", "sparo_shapes", "llip_shapes",
                  "stair_shapes"]


# What this checks is `evaluate_selection`'s batching (numpy) around the families' encoders and `score`, whose
# values on each backend the conformance and family tests check: one pass.
@run_once
@pytest.mark.parametrize("preset", SHAPES_PRESETS)
def test_batched_scores_equal_the_items_scored_one_by_one(layouts, preset):
    # Every family through its own `score`: FILIP ranks captions with S_I and images with S_T; Llip scores
    # each pair with its own embedding; SPARO compares its slots; STAIR its sparse vocabulary vectors.
    model = _preset(preset)
    wino, = layouts["winoground"]
    result = benchmarks.evaluate_selection(model, wino, batch_size=2)
    i2t, t2i = [], []
    for item in wino.items:
        image = model.encode_image(model.preprocessor([np.asarray(Image.open(p).convert("RGB")) for p in item.images]))
        text = model.encode_text(list(item.captions))
        directions = [{}] if model.symmetric_score else [{"direction": "i2t"}, {"direction": "t2i"}]
        scores = [keras.ops.convert_to_numpy(model.score(image, text, **d)) for d in directions]
        i2t.append(scores[0])
        t2i.append(scores[-1])
    # Every two-way choice of an item (its captions for an image, its images for a caption) is decided by a
    # margin, so that batches of 2 and single items decide it alike on any CPU.
    for scores, axis in ((np.array(i2t), 2), (np.array(t2i), 1)):
        assert ranking_gap(scores, axis=axis) >= DECISION_MARGIN * np.abs(scores).max()
    want = selection_metrics("winoground", np.array(i2t), np.array(t2i), symmetric=model.symmetric_score)
    assert result["metrics"] == want


def test_vlzoo_eval_prints_a_table_and_writes_clip_benchmark_records(tmp_path, capsys):
    from vlzoo.cli import main

    data = _winoground(tmp_path)
    out = tmp_path / "wino.json"
    assert main(["eval", "--preset", "clip_shapes", "--benchmark", "winoground", "--data", str(data),
                 "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| dataset | model | text | image | group |" in printed and "| winoground | clip_shapes |" in printed
    record, = json.loads(out.read_text())
    assert {k: record[k] for k in ("dataset", "model", "pretrained", "task", "language")} == {
        "dataset": "winoground", "model": "clip_shapes", "pretrained": None, "task": "image_caption_selection",
        "language": "en"}
    want = benchmarks.evaluate_selection(_preset("clip_shapes"), benchmarks.winoground(data))
    assert record["metrics"] == want["metrics"] and record["groups"] == want["groups"]


def test_vlzoo_eval_in_bfloat16(tmp_path, capsys):
    # The towers run in bfloat16 (recorded as the dtype), and the metrics are those of the API on the
    # bfloat16 model: the scores of the same weights rounded to bfloat16, not the float32 ones.
    from vlzoo.cli import main

    data = _winoground(tmp_path)
    out = tmp_path / "wino_bf16.json"
    assert main(["eval", "--preset", "sparc_shapes", "--benchmark", "winoground", "--data", str(data),
                 "--dtype", "bfloat16", "--json", str(out)]) == 0
    record, = json.loads(out.read_text())
    assert record["dtype"] == "bfloat16"
    model = vlzoo.from_preset("sparc_shapes", dtype="bfloat16")
    wino = benchmarks.winoground(data)
    # The six captions `evaluate_selection` encodes below as its one text batch: the dtype is read from the
    # program the evaluation runs, not from one compiled for another batch size.
    captions = [caption for item in wino.items for caption in item.captions]
    assert keras.backend.standardize_dtype(model.encode_text(captions)["embeds"].dtype) == "bfloat16"
    want = benchmarks.evaluate_selection(model, wino)
    assert record["metrics"] == want["metrics"] and record["groups"] == want["groups"]
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--preset", "sparc_shapes", "--benchmark", "winoground", "--data", str(data),
              "--dtype", "float16"])
    assert exit_info.value.code == 2 and "--dtype" in capsys.readouterr().err


@pytest.mark.parametrize("option", [["--templates", "simple"], ["--background", "prompts"], ["--candidates", "present"],
                                    ["--seed", "3"]])
def test_vlzoo_eval_refuses_an_option_the_benchmark_does_not_use(tmp_path, capsys, option):
    from vlzoo.cli import main

    data = _winoground(tmp_path)
    assert main(["eval", "--preset", "clip_shapes", "--benchmark", "winoground", "--data", str(data), *option]) == 2
    assert f"argument {option[0]}: winoground does not use it" in capsys.readouterr().err


def test_vlzoo_eval_names_a_malformed_file(tmp_path, capsys):
    from vlzoo.cli import main

    data = _mmvp(tmp_path)
    (data / "Questions.csv").write_text("Question ID,Type,Statement\n1,Color,red\n")
    assert main(["eval", "--preset", "clip_shapes", "--benchmark", "mmvp", "--data", str(data)]) == 2
    assert "Questions.csv: statements come in pairs; received 1 rows" in capsys.readouterr().err


@run_once  # clip_benchmark's metric code runs in PyTorch, whatever Keras' backend
def test_metrics_agree_with_clip_benchmark_on_the_same_scores():
    # clip_benchmark's image_caption_selection.evaluate, fed the same embeddings through a PyTorch
    # module whose "images" are the embeddings themselves; random scores never tie, where the
    # two tie rules would differ (argmax's first index against the benchmarks' strict >).
    import torch
    from clip_benchmark.metrics import image_caption_selection

    rng = np.random.default_rng(0)
    for kind, n_images in (("caption", 1), ("winoground", 2), ("mmvp", 2)):
        images, texts = rng.normal(size=(300, n_images, 16)), rng.normal(size=(300, 2, 16))
        loader = [(torch.tensor(images[s:s + 64, :, :, None, None]),
                   [[str(2 * i + c) for c in range(2)] for i in range(s, min(s + 64, 300))])
                  for s in range(0, 300, 64)]
        tokenizer = lambda ids: torch.tensor([int(i) for i in ids])  # noqa: E731
        model = clip_benchmark_embedding_model(texts)
        theirs = image_caption_selection.evaluate(model, loader, tokenizer, "cpu", amp=False)
        unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
        scores = np.einsum("nad,ncd->nac", unit(images), unit(texts))
        ours = selection_metrics(kind, scores, scores)
        pairs = {"caption": {"acc": "text_acc"}, "mmvp": {"pair": "image_acc"},
                 "winoground": {"text": "text_acc", "image": "image_acc", "group": "acc"}}[kind]
        for mine, name in pairs.items():
            assert abs(ours[mine] - theirs[name]) <= 1e-6, (kind, mine, ours[mine], theirs[name])
        assert 0.0 < min(ours.values()) and max(ours.values()) < 1.0  # neither trivial


@pytest.mark.parametrize("coco", [True, False])
def test_karpathy_split_reads_the_test_images_and_every_caption(tmp_path, coco):
    path, images = _karpathy(tmp_path, coco)
    benchmark = benchmarks.karpathy(path, images)
    assert benchmark.name == ("coco" if coco else "flickr30k") and len(benchmark.images) == 4
    assert benchmark.captions[:3] == ("A photo of thing 0.", "A photo of thing 0.", "A photo of thing 1.")
    assert benchmark.image_ids == (0, 0, 1, 1, 2, 2, 3, 3)
    result = benchmarks.evaluate_retrieval(Oracle(), benchmark, ks=(1, 5))
    assert result["task"] == "zeroshot_retrieval" and set(result["metrics"].values()) == {1.0}
    assert sorted(result["metrics"]) == ["image_retrieval_recall@1", "image_retrieval_recall@5",
                                         "text_retrieval_recall@1", "text_retrieval_recall@5"]


def test_a_constant_model_retrieves_at_chance_or_by_the_tie_rule_exactly(tmp_path):
    # 4 test images, 2 captions each. Ranking images for a caption: 3 negatives; ranking captions for an
    # image: 6 negatives (its own second caption never counts). With every score tied, "expected" gives
    # chance: K / 4 for a caption's image, 1 - C(6, K) / C(8, K) for one of an image's 2 captions among
    # K of 8; "pessimistic" puts all negatives ahead (a hit only when they number under K), "optimistic"
    # none.
    benchmark = benchmarks.karpathy(*_karpathy(tmp_path))
    constant = Oracle(constant=True)
    chance = benchmarks.evaluate_retrieval(constant, benchmark, ks=(1, 5, 10))["metrics"]
    assert chance == pytest.approx({"image_retrieval_recall@1": 0.25, "image_retrieval_recall@5": 1.0,
                                    "image_retrieval_recall@10": 1.0, "text_retrieval_recall@1": 0.25,
                                    "text_retrieval_recall@5": 1 - 6 / 56, "text_retrieval_recall@10": 1.0},
                                   abs=1e-12)
    pessimistic = benchmarks.evaluate_retrieval(constant, benchmark, ks=(1, 5, 10), ties="pessimistic")["metrics"]
    assert pessimistic == {"text_retrieval_recall@1": 0.0, "text_retrieval_recall@5": 0.0,
                           "text_retrieval_recall@10": 1.0, "image_retrieval_recall@1": 0.0,
                           "image_retrieval_recall@5": 1.0, "image_retrieval_recall@10": 1.0}
    optimistic = benchmarks.evaluate_retrieval(constant, benchmark, ks=(1, 5, 10), ties="optimistic")["metrics"]
    assert set(optimistic.values()) == {1.0}


def test_karpathy_split_names_a_missing_key(tmp_path):
    path, images = _karpathy(tmp_path)
    document = json.loads(path.read_text())
    del document["images"][1]["sentences"]
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=r"dataset_coco\.json, entry 1: missing key\(s\) \['sentences'\]"):
        benchmarks.karpathy(path, images)


def test_karpathy_split_names_a_missing_image(tmp_path):
    path, images = _karpathy(tmp_path)
    os.remove(images / "val2014" / "COCO_val2014_000000000002.jpg")
    with pytest.raises(FileNotFoundError, match=r"dataset_coco\.json, entry 2: image not found"):
        benchmarks.karpathy(path, images)


@run_once  # clip_benchmark's metric code runs in PyTorch
def test_recall_agrees_with_clip_benchmark_on_the_same_scores():
    import torch
    from clip_benchmark.metrics import zeroshot_retrieval

    from vlzoo.evaluation import recall_at_k

    rng = np.random.default_rng(0)
    image_ids = np.repeat(np.arange(37), 3)[:110]  # three captions per image, the last image with two
    scores = rng.normal(size=(37, 110))  # (images, captions); never ties
    ours = recall_at_k(scores, image_ids=image_ids, ks=(1, 5, 10))
    positive = torch.tensor(image_ids[:, None] == np.arange(37)[None])  # (captions, images)
    t2i = torch.tensor(scores.T)
    for k in (1, 5, 10):
        image_retrieval = (zeroshot_retrieval.recall_at_k(t2i, positive, k) > 0).float().mean().item()
        text_retrieval = (zeroshot_retrieval.recall_at_k(t2i.T, positive.T, k) > 0).float().mean().item()
        assert abs(ours[f"t2i_r@{k}"] - image_retrieval) <= 1e-6 and abs(ours[f"i2t_r@{k}"] - text_retrieval) <= 1e-6
        assert 0.0 < ours[f"t2i_r@{k}"] < 1.0


def test_vlzoo_eval_runs_karpathy_retrieval(tmp_path, capsys):
    from vlzoo.cli import main

    path, images = _karpathy(tmp_path, coco=False)
    out = tmp_path / "flickr.json"
    assert main(["eval", "--preset", "sparc_shapes", "--benchmark", "flickr30k", "--data", str(path),
                 "--images", str(images), "--json", str(out)]) == 0
    assert "flickr30k: 4 images, 8 captions" in capsys.readouterr().out
    record, = json.loads(out.read_text())
    want = benchmarks.evaluate_retrieval(_preset("sparc_shapes"), benchmarks.karpathy(path, images, name="flickr30k"))
    assert record["task"] == "zeroshot_retrieval" and record["metrics"] == want["metrics"]
    assert main(["eval", "--preset", "sparc_shapes", "--benchmark", "coco", "--data", str(path)]) == 2
    assert "--images" in capsys.readouterr().err


def _cifar(root, hundred):
    directory = root / ("cifar-100-python" if hundred else "cifar-10-batches-py")
    os.makedirs(directory)
    names = [f"thing_{k}".encode() for k in range(LEVELS if hundred else 10)]
    labels = [k % len(names) for k in range(14)]
    data = np.stack([np.full((3, 32, 32), 20 * k + 10, np.uint8).reshape(-1) for k in labels])
    batch = {b"data": data, (b"fine_labels" if hundred else b"labels"): labels,
             b"filenames": [f"{i}.png".encode() for i in range(len(labels))], b"batch_label": b"testing batch 1 of 1"}
    meta = {b"fine_label_names" if hundred else b"label_names": names}
    files = {"test" if hundred else "test_batch": batch, "meta" if hundred else "batches.meta": meta}
    for name, content in files.items():
        with open(directory / name, "wb") as f:
            pickle.dump(content, f)
    return directory


@pytest.mark.parametrize("hundred", [False, True])
def test_cifar_pickles_scored_by_an_oracle_and_a_constant_model(tmp_path, hundred):
    benchmark = benchmarks.cifar(_cifar(tmp_path, hundred))
    classes = LEVELS if hundred else 10
    assert benchmark.name == ("cifar100" if hundred else "cifar10") and benchmark.images.shape == (14, 32, 32, 3)
    assert benchmark.class_names[3] == "thing 3" and benchmark.labels.tolist()[:3] == [0, 1, 2]
    templates = ("a photo of a {}.", "art of the {}.")
    result = benchmarks.evaluate_classification(Oracle(), benchmark, templates, batch_size=4)
    assert result["task"] == "zeroshot_classification" and set(result["metrics"].values()) == {1.0}
    chance = benchmarks.evaluate_classification(Oracle(constant=True), benchmark, templates)["metrics"]
    assert chance == pytest.approx({"acc1": 1 / classes, "acc5": 5 / classes, "mean_per_class_recall": 1 / classes},
                                   abs=1e-12)


def test_a_cifar_batch_with_a_missing_key_is_named(tmp_path):
    directory = _cifar(tmp_path, hundred=False)
    with open(directory / "test_batch", "wb") as f:
        pickle.dump({b"data": np.zeros((2, 3072), np.uint8)}, f)
    with pytest.raises(ValueError, match=r"test_batch: missing key 'labels'"):
        benchmarks.cifar(directory)


def test_classification_metrics_agree_with_scikit_learn_on_the_same_scores():
    # clip_benchmark computes mean_per_class_recall with scikit-learn's balanced_accuracy_score; its
    # own top-k `accuracy` cannot run with NumPy 2.4 (it calls float() on a one-element array), so
    # top-k is checked against scikit-learn's top_k_accuracy_score, the same definition.
    from sklearn.metrics import balanced_accuracy_score, top_k_accuracy_score

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 20, 500)
    scores = rng.normal(size=(500, 20))
    scores[np.arange(500), labels] += 1.5  # better than chance, far from perfect
    ours = classification_metrics(scores, labels, ks=(1, 5))
    for k in (1, 5):
        assert abs(ours[f"acc{k}"] - top_k_accuracy_score(labels, scores, k=k, labels=np.arange(20))) <= 1e-6
    assert abs(ours["mean_per_class_recall"] - balanced_accuracy_score(labels, scores.argmax(axis=1))) <= 1e-6
    assert 0.05 < ours["acc1"] < 0.95


def test_vlzoo_eval_runs_cifar(tmp_path, capsys):
    from vlzoo.cli import main

    directory = _cifar(tmp_path, hundred=False)
    out = tmp_path / "cifar.json"
    assert main(["eval", "--preset", "clip_shapes", "--benchmark", "cifar10", "--data", str(directory),
                 "--templates", "simple", "--json", str(out)]) == 0
    assert "cifar10: 14 images of 10 of 10 classes, 7 template(s)" in capsys.readouterr().out
    record, = json.loads(out.read_text())
    want = benchmarks.evaluate_classification(_preset("clip_shapes"), benchmarks.cifar(directory),
                                              vlzoo.evaluation.SIMPLE_TEMPLATES)
    assert record["task"] == "zeroshot_classification" and record["metrics"] == want["metrics"]
    assert main(["eval", "--preset", "clip_shapes", "--benchmark", "cifar100", "--data", str(directory)]) == 2
    assert "holds cifar10, not cifar100" in capsys.readouterr().err


@run_once  # the command's wiring on each benchmark; the scores themselves are checked above
@pytest.mark.parametrize("benchmark", ["sugarcrepe", "mmvp", "coco"])
def test_vlzoo_eval_runs_each_benchmark_by_its_name(tmp_path, capsys, benchmark):
    from vlzoo.cli import main

    if benchmark == "sugarcrepe":
        data, images = _sugarcrepe(tmp_path)
        options, want = ["--images", str(images)], benchmarks.sugarcrepe(data, images)
    elif benchmark == "mmvp":
        data = _mmvp(tmp_path)
        options, want = [], [benchmarks.mmvp(data)]
    else:
        data, images = _karpathy(tmp_path)
        options, want = ["--images", str(images)], [benchmarks.karpathy(data, images)]
    out = tmp_path / "records.json"
    assert main(["eval", "--preset", "stair_shapes", "--benchmark", benchmark, "--data", str(data), *options,
                 "--batch-size", "2", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    records = json.loads(out.read_text())
    model = _preset("stair_shapes")
    evaluate = benchmarks.evaluate_retrieval if benchmark == "coco" else benchmarks.evaluate_selection
    assert [r["dataset"] for r in records] == [b.name for b in want]
    for record, chosen in zip(records, want):
        # The API in the command's batches: the same scores, bit for bit.
        assert record["metrics"] == evaluate(model, chosen, batch_size=2)["metrics"]
        assert f"| {chosen.name} | stair_shapes |" in printed


@run_once  # the command's wiring; SPARO's slot selection itself is checked in test_sparo
def test_vlzoo_eval_scores_sparo_on_chosen_slots(tmp_path, capsys):
    from vlzoo.cli import main

    data = _winoground(tmp_path)
    out = tmp_path / "wino.json"
    assert main(["eval", "--preset", "sparo_shapes", "--benchmark", "winoground", "--data", str(data),
                 "--slots", "0,2", "--json", str(out)]) == 0
    record, = json.loads(out.read_text())
    want = benchmarks.evaluate_selection(_preset("sparo_shapes"), benchmarks.winoground(data), slots=[0, 2])
    assert record["metrics"] == want["metrics"] and record["groups"] == want["groups"]
    capsys.readouterr()
    assert main(["eval", "--preset", "clip_shapes", "--benchmark", "winoground", "--data", str(data),
                 "--slots", "0"]) == 2
    assert "clip_shapes has no slots to choose" in capsys.readouterr().err
    num_slots = _preset("sparo_shapes").num_slots
    assert main(["eval", "--preset", "sparo_shapes", "--benchmark", "winoground", "--data", str(data),
                 "--slots", f"0,{num_slots}"]) == 2
    assert f"sparo_shapes has {num_slots} slots" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--preset", "sparo_shapes", "--benchmark", "winoground", "--data", str(data), "--slots", "1,1"])
    assert "expected distinct slot indices" in capsys.readouterr().err

