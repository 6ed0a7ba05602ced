"""ARO (VG-Relation, VG-Attribution, COCO-Order, Flickr30k-Order) read from tiny fixtures in the
authors' layouts, scored by test models whose answers are known and by a real model against a
per-item computation; the perturbations checked against their definition and the authors' seeding."""

import itertools
import json
import os
import random
import re

import keras
import numpy as np
import pytest
from backend_utils import run_once
from peers import clip_benchmark_embedding_model
from PIL import Image
from test_selection_benchmarks import LEVELS, Oracle, _preset, _solid

from vlzoo.evaluation import aro
from vlzoo.evaluation.selection import selection_metrics

# ------------------------------------------------------------------ Visual Genome fixtures

# Image i (`images/<2316000 + i>.jpg`) is grey level 2i on its left half and 2i + 1 on its right
# half; an item's box is one half, so a model that sees the level of the uncropped image errs.
HALF = {"left": (0, 0, 16, 24), "right": (16, 0, 16, 24)}


def _halves(path, left, right):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pixels = np.empty((24, 32, 3), np.uint8)
    pixels[:, :16], pixels[:, 16:] = 20 * left + 10, 20 * right + 10
    Image.fromarray(pixels).save(path)


def _vg_record(image, side, right_answer):
    """A record whose true caption names the level of its crop (the other half's when not `right_answer`)."""
    seen = 2 * image + (side == "right")
    other = 2 * image + (side == "left")
    named, swapped = (seen, other) if right_answer else (other, seen)
    x, y, w, h = HALF[side]
    return {"image_id": 2316000 + image, "image_path": f"{2316000 + image}.jpg", "bbox_x": x, "bbox_y": y,
            "bbox_w": w, "bbox_h": h, "true_caption": f"the thing {named} is near the thing {swapped}",
            "false_caption": f"the thing {swapped} is near the thing {named}"}


# VG-Relation: "on" 2/2 right, "holding" 1/2, "next to" (a symmetric relation) 0/2: micro 3/6,
# macro without the symmetric relation (1 + 0.5) / 2 = 0.75 (0.5 with it).
RELATIONS = [("on", 0, "left", True), ("on", 1, "right", True), ("holding", 2, "left", True),
             ("holding", 3, "right", False), ("next to", 4, "left", False), ("next to", 0, "right", False)]


def _vg(root, relation=True):
    directory = root / "prerelease_bow"
    for i in range(5):
        _halves(str(directory / "images" / f"{2316000 + i}.jpg"), 2 * i, 2 * i + 1)
    if relation:
        records = [{**_vg_record(image, side, right), "relation_name": name}
                   for name, image, side, right in RELATIONS]
        path = directory / "visual_genome_relation.json"
    else:
        # "red_blue" 25 items, all right; "big_small" 2 items, both wrong (under 25: not in the macro).
        records = [{**_vg_record(i % 5, ("left", "right")[i % 2], True), "attributes": ["red", "blue"]}
                   for i in range(25)]
        records += [{**_vg_record(i, "left", False), "attributes": ["big", "small"]} for i in range(2)]
        path = directory / "visual_genome_attribution.json"
    path.write_text(json.dumps(records))
    return directory, path


def test_vg_readers_keep_paths_boxes_and_groups(tmp_path):
    directory, _ = _vg(tmp_path)
    benchmark = aro.vg_relation(directory)
    assert benchmark.name == "vg_relation" and len(benchmark.items) == 6
    item = benchmark.items[3]
    assert item.captions == ("the thing 6 is near the thing 7", "the thing 7 is near the thing 6")
    assert item.group == "holding" and item.key == "3" and item.images[0].endswith("2316003.jpg")
    assert benchmark.boxes[3] == (16, 0, 16, 24) and "next to" in benchmark.excluded
    attribution = aro.vg_attribution(_vg(tmp_path / "a", relation=False)[0])
    assert attribution.min_count == 25 and {i.group for i in attribution.items} == {"red_blue", "big_small"}


def test_the_symmetric_relations_are_the_notebooks_157():
    assert len(aro.SYMMETRIC_RELATIONS) == len(set(aro.SYMMETRIC_RELATIONS)) == 157
    assert aro.SYMMETRIC_RELATIONS[:3] == ("adjusting", "attached to", "between")
    assert aro.SYMMETRIC_RELATIONS[-8:] == ("by", "of", "near", "next to", "with", "beside", "on the side of",
                                            "around")
    assert "on" not in aro.SYMMETRIC_RELATIONS and "holding" not in aro.SYMMETRIC_RELATIONS


def test_vg_relation_macro_leaves_out_the_symmetric_relations(tmp_path):
    result = aro.evaluate_aro(Oracle(), aro.vg_relation(_vg(tmp_path)[0]), batch_size=4)
    assert result["metrics"] == {"acc": 0.5, "macro_acc": 0.75}
    assert result["groups"] == {"holding": {"acc": 0.5, "count": 2, "in_macro": True},
                                "next to": {"acc": 0.0, "count": 2, "in_macro": False},
                                "on": {"acc": 1.0, "count": 2, "in_macro": True}}


def test_vg_attribution_macro_skips_groups_under_25_items(tmp_path):
    result = aro.evaluate_aro(Oracle(), aro.vg_attribution(_vg(tmp_path, relation=False)[0]), batch_size=9)
    assert result["metrics"] == {"acc": 25 / 27, "macro_acc": 1.0}
    assert result["groups"]["big_small"] == {"acc": 0.0, "count": 2, "in_macro": False}
    assert result["groups"]["red_blue"] == {"acc": 1.0, "count": 25, "in_macro": True}


@pytest.mark.parametrize("ties, want", [("expected", 0.5), ("pessimistic", 0.0), ("optimistic", 1.0)])
def test_a_constant_model_scores_chance_or_the_tie_rule_on_vg(tmp_path, ties, want):
    result = aro.evaluate_aro(Oracle(constant=True), aro.vg_relation(_vg(tmp_path)[0]), ties=ties)
    assert result["metrics"] == {"acc": want, "macro_acc": want}
    attribution = aro.vg_attribution(_vg(tmp_path / "attribution", relation=False)[0])
    result = aro.evaluate_aro(Oracle(constant=True), attribution, ties=ties)
    assert result["metrics"] == {"acc": want, "macro_acc": want}


class _Uint8:
    """A preprocessor that keeps the uint8 pixels of `(24, 16)` crops."""

    image_size = (24, 16)

    def __call__(self, images):
        return np.stack([np.asarray(image) for image in images])


def test_the_crop_is_each_half_with_black_past_the_border(tmp_path):
    path = str(tmp_path / "img.png")
    _halves(path, 3, 7)
    files = aro.CroppedImageFiles([path] * 3, [(0, 0, 16, 24), (16, 0, 16, 24), (24, 0, 16, 24)], _Uint8())
    assert files.shape == (3, 24, 16, 3)
    left, right, past = files[0:3]
    assert (left == 70).all() and (right == 150).all()
    assert (past[:, :8] == 150).all() and (past[:, 8:] == 0).all()
    with pytest.raises(ValueError, match="one box per image; received 1 boxes for 3 images"):
        aro.CroppedImageFiles([path] * 3, [(0, 0, 1, 1)], _Uint8())


# ------------------------------------------------------------------ malformed VG files


def _rewrite(path, edit):
    records = json.loads(path.read_text())
    edit(records)
    path.write_text(json.dumps(records))


def test_a_missing_key_names_the_file_and_the_entry(tmp_path):
    directory, path = _vg(tmp_path)
    _rewrite(path, lambda records: records[1].pop("relation_name"))
    with pytest.raises(ValueError, match=r"visual_genome_relation\.json, entry 1: missing key\(s\) "
                                         r"\['relation_name'\]"):
        aro.vg_relation(directory)
    directory, path = _vg(tmp_path / "a", relation=False)
    _rewrite(path, lambda records: records[4].update(attributes=["red"]))
    with pytest.raises(ValueError, match=r"visual_genome_attribution\.json, entry 4: `attributes` must be a list "
                                         r"of 2"):
        aro.vg_attribution(directory)


def test_a_missing_image_names_the_file_the_entry_and_the_path(tmp_path):
    directory, _ = _vg(tmp_path)
    os.remove(directory / "images" / "2316002.jpg")
    with pytest.raises(FileNotFoundError, match=r"visual_genome_relation\.json, entry 2: image not found: "
                                                r".*2316002\.jpg"):
        aro.vg_relation(directory)


def test_a_box_outside_the_image_names_the_file_and_the_entry(tmp_path):
    directory, path = _vg(tmp_path)
    _rewrite(path, lambda records: records[5].update(bbox_x=40))
    benchmark = aro.vg_relation(directory)
    with pytest.raises(ValueError, match=r"visual_genome_relation\.json, entry 5: the box \(x=40, y=0, w=16, "
                                         r"h=24\) lies outside the 32 x 24 image"):
        aro.evaluate_aro(Oracle(), benchmark)
    _rewrite(path, lambda records: records[2].update(bbox_w=0))
    with pytest.raises(ValueError, match=r"visual_genome_relation\.json, entry 2: the box needs a positive width"):
        aro.vg_relation(directory)


# ------------------------------------------------------------------ captions and perturbations

NOUNS, ADJECTIVES = {"thing", "mat", "dog", "ball", "park"}, {"small", "red", "big", "green"}


def _tagger(caption):
    """A fixed lexicon: Penn Treebank NN / JJ for the words above, DT for every other."""
    return [(w, "NN" if w.lower() in NOUNS else "JJ" if w.lower() in ADJECTIVES else "DT")
            for w in aro.split_words(caption)]


def test_pre_caption_cleans_as_blip():
    assert aro.pre_caption('A "Big" dog: (running)!  Fast;~ #1*\n') == "a big dog running fast 1"
    assert aro.pre_caption(" ".join(f"w{i}" for i in range(40))) == " ".join(f"w{i}" for i in range(30))
    assert aro.pre_caption("one, two's - three", max_words=2) == "one, two's"


def test_the_trigram_perturbations_keep_each_trigram():
    words = "a b c d e f g".split()
    shuffler = aro.TextShuffler(tagger=_tagger, word_tokenize=str.split, seed=3)
    seen = set()
    for _ in range(30):
        within = shuffler.shuffle_within_trigrams(" ".join(words)).split()
        assert sorted(within[:3]) == list("abc") and sorted(within[3:6]) == list("def") and within[6] == "g"
        across = shuffler.shuffle_trigrams(" ".join(words))
        assert across in {" ".join(p) for p in itertools.permutations(["a b c", "d e f", "g"])}
        seen.update([" ".join(within), across])
    assert len(seen) > 8  # both actually shuffle


def test_the_noun_and_adjective_perturbations_move_only_their_words():
    caption = "a small dog and a red ball in the big green park"
    words = caption.split()
    shuffler = aro.TextShuffler(tagger=_tagger, seed=0)
    for _ in range(20):
        moved = shuffler.shuffle_nouns_and_adj(caption).split()
        for kind in (NOUNS, ADJECTIVES):
            where = [i for i, w in enumerate(words) if w in kind]
            assert sorted(moved[i] for i in where) == sorted(words[i] for i in where)
        assert [m for m, w in zip(moved, words) if w not in NOUNS | ADJECTIVES] == [
            w for w in words if w not in NOUNS | ADJECTIVES]
        rest = shuffler.shuffle_allbut_nouns_and_adj(caption).split()
        assert [r for r, w in zip(rest, words) if w in NOUNS | ADJECTIVES] == [w for w in words
                                                                              if w in NOUNS | ADJECTIVES]
        assert sorted(rest) == sorted(words)


def _authors_perturbations(captions, seed):
    """The authors' procedure with their global generators (`seed_all`, then each caption's four
    perturbations in turn), written from their description in `dataset_zoo/perturbations.py`."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed)
    try:
        out = []
        for caption in captions:
            text, tags = np.array([w for w, _ in _tagger(caption)]), [t for _, t in _tagger(caption)]
            nouns = [i for i, t in enumerate(tags) if t in aro.NOUN_TAGS]
            adjectives = [i for i, t in enumerate(tags) if t in aro.ADJECTIVE_TAGS]
            first = text.copy()
            first[nouns] = np.random.permutation(first[nouns])
            first[adjectives] = np.random.permutation(first[adjectives])
            second, keep = text.copy(), np.isin(np.arange(len(text)), nouns + adjectives)
            second[~keep] = np.random.permutation(second[~keep])
            tokens = aro.split_words(caption)
            within = [tokens[i:i + 3] for i in range(0, len(tokens), 3)]
            for trigram in within:
                random.shuffle(trigram)
            across = [tokens[i:i + 3] for i in range(0, len(tokens), 3)]
            random.shuffle(across)
            trigrams = [" ".join(" ".join(t) for t in g) for g in (within, across)]
            out.append([" ".join(first), " ".join(second)] + trigrams)
        return out
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def test_the_perturbations_draw_as_the_authors_seeded_generators():
    captions = ["A small dog chases a red ball in the park.", "The big thing, on a green mat, isn't small.",
                "dog"]
    for seed in (1, 7):
        shuffler = aro.TextShuffler(tagger=_tagger, seed=seed)
        ours = [[shuffler.perturb(name, c) for name in aro.PERTURBATIONS] for c in captions]
        assert ours == _authors_perturbations(captions, seed)
    assert ours != _authors_perturbations(captions, 1)


def test_without_a_tagger_or_spacy_the_error_says_how_to_get_one(monkeypatch):
    monkeypatch.setattr(aro, "spacy", None)
    with pytest.raises(ImportError, match=re.escape("pip install spacy && python -m spacy download en_core_web_sm")):
        aro.TextShuffler()


def test_the_default_tagger_is_spacys_en_core_web_sm(monkeypatch):
    # A stand-in for spaCy (not installed here): its tokens' `text` and `tag_` are what the
    # shuffler reads, from the pipeline `spacy.load` was asked for.
    class Token:
        def __init__(self, text, tag):
            self.text, self.tag_ = text, tag

    class Spacy:
        @staticmethod
        def load(name):
            if name != "en_core_web_sm":
                raise OSError(f"[E050] Can't find model '{name}'.")
            return lambda caption: [Token(w, t) for w, t in _tagger(caption)]

    monkeypatch.setattr(aro, "spacy", Spacy)
    caption = "a small dog and a red ball"
    assert aro.spacy_tagger()(caption) == _tagger(caption)
    assert aro.TextShuffler(seed=4).shuffle_nouns_and_adj(caption) == aro.TextShuffler(
        tagger=_tagger, seed=4).shuffle_nouns_and_adj(caption)
    with pytest.raises(ImportError, match=r"spaCy cannot load 'en_core_web_lg' .*python -m spacy download"):
        aro.spacy_tagger("en_core_web_lg")


# ------------------------------------------------------------------ Order fixtures

ORDER_CAPTION = "A small thing {} sits on a red mat."
ORIGINAL = re.compile(r"a small thing (\d+) sits on a red mat")


class OrderOracle(Oracle):
    """Sees the answer: a caption scores 1 with its image when it is the cleaned original, else 0."""

    def tokenizer(self, texts):
        ids = [int(m.group(1)) if (m := ORIGINAL.fullmatch(t)) else LEVELS for t in texts]
        return {"token_ids": np.array(ids)[:, None], "padding_mask": np.ones((len(ids), 1), bool)}

    def encode_text(self, texts, normalize=False):
        ids = keras.ops.convert_to_numpy(self.tokenizer(texts)["token_ids"])[:, 0]
        return {"embeds": np.vstack([np.eye(LEVELS), np.zeros((1, LEVELS))])[ids]}


def _order(root, coco=True):
    entries = []
    for i in range(4):
        image = f"val2014/COCO_val2014_{i:012d}.jpg" if coco else f"flickr30k-images/{1000 + i}.jpg"
        _solid(str(root / image), i)
        entries.append({"image": image, "caption": [ORDER_CAPTION.format(i)] * (1 + i % 2)})
    path = root / ("coco_karpathy_test.json" if coco else "flickr30k_test.json")
    path.write_text(json.dumps(entries))
    return root, path


@pytest.mark.parametrize("coco", [True, False])
def test_order_reads_one_item_per_caption_with_its_four_perturbations(tmp_path, coco):
    directory, _ = _order(tmp_path, coco)
    benchmark = (aro.coco_order if coco else aro.flickr30k_order)(directory, tagger=_tagger)
    assert benchmark.name == ("coco_order" if coco else "flickr30k_order") and len(benchmark.items) == 6
    assert [item.key for item in benchmark.items] == ["0:0", "1:0", "1:1", "2:0", "3:0", "3:1"]
    raw = [ORDER_CAPTION.format(i) for i in (0, 1, 1, 2, 3, 3)]
    want = [[aro.pre_caption(c) for c in [caption] + perturbed]
            for caption, perturbed in zip(raw, _authors_perturbations(raw, 1))]
    assert [list(item.captions) for item in benchmark.items] == want
    again = (aro.coco_order if coco else aro.flickr30k_order)(directory, tagger=_tagger, seed=2)
    assert [item.captions for item in again.items] != [item.captions for item in benchmark.items]


def test_order_precision_at_1_counts_an_unchanged_perturbation_as_a_tie(tmp_path):
    # The oracle ranks the original first; a perturbation equal to it ties: the authors' argmax
    # counts that item right ("optimistic": 1.0), "expected" gives it 1 / (1 + copies).
    benchmark = aro.coco_order(_order(tmp_path)[0], tagger=_tagger)
    copies = [sum(c == item.captions[0] for c in item.captions[1:]) for item in benchmark.items]
    assert 0 < sum(copies) and min(copies) == 0  # the fixture has both kinds of items
    assert aro.evaluate_aro(OrderOracle(), benchmark, ties="optimistic")["metrics"] == {"acc": 1.0}
    result = aro.evaluate_aro(OrderOracle(), benchmark, batch_size=4)
    assert result["metrics"]["acc"] == pytest.approx(np.mean([1 / (1 + n) for n in copies]), abs=1e-12)
    for c, name in enumerate(aro.PERTURBATIONS, 1):
        same = [item.captions[c] == item.captions[0] for item in benchmark.items]
        assert result["groups"][name]["acc"] == pytest.approx(1 - np.mean(same) / 2, abs=1e-12)


@pytest.mark.parametrize("ties, want", [("expected", 0.2), ("pessimistic", 0.0), ("optimistic", 1.0)])
def test_a_constant_model_scores_chance_or_the_tie_rule_on_order(tmp_path, ties, want):
    benchmark = aro.flickr30k_order(_order(tmp_path, coco=False)[0], tagger=_tagger)
    assert aro.evaluate_aro(OrderOracle(constant=True), benchmark, ties=ties)["metrics"]["acc"] == pytest.approx(want,
                                                                                                          abs=1e-12)


def test_malformed_order_files_name_the_file_and_the_entry(tmp_path):
    directory, path = _order(tmp_path)
    _rewrite(path, lambda entries: entries[2].pop("caption"))
    with pytest.raises(ValueError, match=r"coco_karpathy_test\.json, entry 2: missing key\(s\) \['caption'\]"):
        aro.coco_order(directory, tagger=_tagger)
    _rewrite(path, lambda entries: entries[2].update(caption="one caption"))
    with pytest.raises(ValueError, match=r"coco_karpathy_test\.json, entry 2: `caption` must be a non-empty list"):
        aro.coco_order(directory, tagger=_tagger)
    directory, path = _order(tmp_path / "b")
    os.remove(directory / "val2014" / "COCO_val2014_000000000001.jpg")
    with pytest.raises(FileNotFoundError, match=r"coco_karpathy_test\.json, entry 1: image not found"):
        aro.coco_order(directory, tagger=_tagger)


# ------------------------------------------------------------------ a real family, and clip_benchmark


@run_once  # ~7 s of encoder calls; the batched selection scores are checked in every backend elsewhere
def test_a_real_model_scores_the_crops_as_one_by_one(tmp_path):
    # The reference crops with PIL itself and scores every crop against every caption in one
    # call each, then keeps each item's own block (batched evaluation is checked with the Oracle).
    model = _preset("clip_shapes")
    benchmark = aro.vg_relation(_vg(tmp_path)[0])
    i2t, t2i = aro.aro_scores(model, benchmark, batch_size=6)  # the shapes of the reference calls
    crops = [np.asarray(Image.open(item.images[0]).convert("RGB").crop((x, y, x + w, y + h)))
             for item, (x, y, w, h) in zip(benchmark.items, benchmark.boxes)]
    everything = keras.ops.convert_to_numpy(model.score(
        model.encode_image(model.preprocessor(crops)),
        model.encode_text([caption for item in benchmark.items for caption in item.captions])))
    scores = np.stack([everything[i, 2 * i:2 * i + 2] for i in range(len(crops))])[:, None]
    np.testing.assert_allclose(i2t, scores, rtol=1e-5, atol=1e-5)
    assert t2i is i2t  # a symmetric score: one matrix
    metrics, groups = aro.aro_metrics(benchmark, i2t, t2i)
    rows = {g: [i for i, item in enumerate(benchmark.items) if item.group == g] for g in ("holding", "next to", "on")}
    per_group = {g: selection_metrics("caption", scores[r], scores[r])["acc"] for g, r in rows.items()}
    assert metrics["macro_acc"] == pytest.approx((per_group["holding"] + per_group["on"]) / 2, abs=1e-12)
    assert {g: v["acc"] for g, v in groups.items()} == pytest.approx(per_group, abs=1e-12)


@run_once  # clip_benchmark's metric code runs in PyTorch, whatever Keras' backend
def test_precision_at_1_agrees_with_clip_benchmark_on_the_same_scores():
    # clip_benchmark has no ARO reader; its image_caption_selection.evaluate, given an item's
    # captions with the true one first, scores argmax == 0: ARO's Precision@1 on 5 captions
    # and, true caption first, the VG accuracy on 2. Random scores never tie; with tied scores
    # its argmax (first index wins) is our "optimistic" rule.
    import torch
    from clip_benchmark.metrics import image_caption_selection

    rng = np.random.default_rng(0)
    for n_captions, tied in ((5, False), (2, False), (5, True)):
        images, texts = rng.normal(size=(200, 16)), rng.normal(size=(200, n_captions, 16))
        if tied:
            texts[::2, 1] = texts[::2, 0]  # half the items: a perturbation equal to the original
        loader = [(torch.tensor(images[s:s + 64, :, None, None]),
                   [[str(n_captions * i + c) for c in range(n_captions)] for i in range(s, min(s + 64, 200))])
                  for s in range(0, 200, 64)]
        tokenizer = lambda ids: torch.tensor([int(i) for i in ids])  # noqa: E731
        model = clip_benchmark_embedding_model(texts)
        theirs = image_caption_selection.evaluate(model, loader, tokenizer, "cpu", amp=False)["text_acc"]
        unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)  # noqa: E731
        scores = np.einsum("nd,ncd->nc", unit(images), unit(texts))[:, None]
        ours = selection_metrics("caption", scores, scores, ties="optimistic" if tied else "expected")["acc"]
        assert abs(ours - theirs) <= 1e-6 and 0.0 < ours < 1.0, (n_captions, tied, ours, theirs)


@run_once  # the command's wiring; the scores themselves are checked above
def test_vlzoo_eval_scores_vg_and_explains_the_order_tagger(tmp_path, capsys, monkeypatch):
    from vlzoo.cli import main

    directory, _ = _vg(tmp_path)
    out = tmp_path / "vgr.json"
    assert main(["eval", "--preset", "clip_shapes", "--benchmark", "vg_relation", "--data", str(directory),
                 "--ties", "pessimistic", "--json", str(out)]) == 0
    assert f"vg_relation: {len(RELATIONS)} items" in capsys.readouterr().out
    record, = json.loads(out.read_text())
    want = aro.evaluate_aro(_preset("clip_shapes"), aro.vg_relation(directory), ties="pessimistic")
    assert record["metrics"] == want["metrics"] and set(record["metrics"]) == {"acc", "macro_acc"}
    directory, _ = _vg(tmp_path / "attribution", relation=False)
    assert main(["eval", "--preset", "filip_shapes", "--benchmark", "vg_attribution", "--data", str(directory),
                 "--json", str(out)]) == 0
    record, = json.loads(out.read_text())
    want = aro.evaluate_aro(_preset("filip_shapes"), aro.vg_attribution(directory))
    assert record["dataset"] == "vg_attribution" and record["metrics"] == want["metrics"]
    monkeypatch.setattr(aro, "spacy", None)
    root, _ = _order(tmp_path / "order")
    assert main(["eval", "--preset", "clip_shapes", "--benchmark", "coco_order", "--data", str(root)]) == 2
    assert "python -m spacy download en_core_web_sm" in capsys.readouterr().err
