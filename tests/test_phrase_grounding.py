"""Phrase grounding on Flickr30k Entities and RefCOCO files in their published layouts (written here: PIL
images, ElementTree annotations, the refer pickles), scored with a model whose answer is known: it grounds
every phrase on the bright part of its image, so a phrase whose box is painted white is a hit and one
elsewhere a miss. The boxes pass through the preprocessor's resize and centre crop as the pixels do."""

import json
import pickle
import xml.etree.ElementTree as ElementTree

import keras
import numpy as np
import pytest
from backend_utils import run_once
from PIL import Image

import vlzoo
from vlzoo import cli
from vlzoo.evaluation import phrase_grounding
from vlzoo.evaluation.grounding import patch_coverage


class _BrightModel:
    """A SPARC model whose every token maps to the patches that are mostly white in the preprocessed image."""

    def __init__(self):
        self.model = vlzoo.from_preset("sparc_tiny", load_weights=False)

    def __getattr__(self, name):
        return getattr(self.model, name)

    def token_patch_alignment(self, images, texts):
        pixels = np.asarray(keras.ops.convert_to_numpy(images)) * np.asarray(self.preprocessor.std) + np.asarray(
            self.preprocessor.mean)  # back to [0, 1]
        patch = self.vision.patch_size
        bright = patch_coverage(pixels.mean(axis=-1) > 0.5, patch)  # (B, P)
        weights = (bright > 0.5).astype(np.float32)
        count, length = tuple(texts["token_ids"].shape)
        return np.broadcast_to(weights[:, None, :], (count, length, weights.shape[-1]))


def _picture(path, width, height, white):
    """A black picture with the box `white` (x0, y0, x1, y1) painted white."""
    pixels = np.zeros((height, width, 3), np.uint8)
    x0, y0, x1, y1 = white
    pixels[y0:y1, x0:x1] = 255
    Image.fromarray(pixels).save(path)


# Two pictures: a square one, and a wide one whose sides the centre crop cuts (sparc_tiny: 32 px, 8 px patches).
# In each, the bright box lands on the crop's top-left quadrant (4 whole patches of 16).
_SCENES = [
    ("1000", 64, 64, (0, 0, 32, 32), (40, 40, 64, 64)),  # bright box, a box elsewhere (share 0.140625)
    ("2000", 96, 64, (16, 0, 48, 32), (0, 40, 16, 64)),  # the dark box lies in the part cropped away
]


@pytest.fixture(scope="module")
def flickr30k_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("flickr30k_entities")
    for folder in ("Annotations", "Sentences", "flickr30k-images"):
        (root / folder).mkdir()
    for image_id, width, height, bright, dark in _SCENES:
        _picture(root / "flickr30k-images" / f"{image_id}.jpg", width, height, bright)
        annotation = ElementTree.Element("annotation")
        ElementTree.SubElement(annotation, "filename").text = f"{image_id}.jpg"
        size = ElementTree.SubElement(annotation, "size")
        for tag, value in (("width", width), ("height", height), ("depth", 3)):
            ElementTree.SubElement(size, tag).text = str(value)
        objects = (((f"{image_id}1",), bright), ((f"{image_id}2", f"{image_id}4"), dark), ((f"{image_id}3",), None))
        for names, box in objects:
            item = ElementTree.SubElement(annotation, "object")
            for name in names:
                ElementTree.SubElement(item, "name").text = name
            if box is None:
                ElementTree.SubElement(item, "nobndbox").text = "1"
                ElementTree.SubElement(item, "scene").text = "1"
            else:
                corners = ElementTree.SubElement(item, "bndbox")
                for tag, value in zip(("xmin", "ymin", "xmax", "ymax"), box):
                    ElementTree.SubElement(corners, tag).text = str(value)
        ElementTree.ElementTree(annotation).write(root / "Annotations" / f"{image_id}.xml")
        (root / "Sentences" / f"{image_id}.txt").write_text(
            f"[/EN#{image_id}1/people A bright box] sits beside [/EN#{image_id}2/other a dark spot] in "
            f"[/EN#{image_id}3/scene the scene] .\n"
            f"[/EN#{image_id}4/other/bodyparts Darkness] surrounds [/EN#{image_id}1/people the white square] .\n")
    (root / "test.txt").write_text("1000\n2000\n")
    (root / "val.txt").write_text("")
    return root


def _expected_chances():
    """Each scene's (bright, dark) boxes' share of the 32 px crop, worked out by hand."""
    return {"1000": (0.25, (24 / 64) ** 2), "2000": (0.25, 0.0)}


def test_flickr30k_entities_reads_the_phrases_and_their_boxes(flickr30k_root):
    benchmark = phrase_grounding.flickr30k_entities(str(flickr30k_root))
    assert benchmark.name == "flickr30k_entities/test" and len(benchmark) == 8  # the scene phrases have no box
    assert benchmark.captions[0] == "A bright box sits beside a dark spot in the scene ."
    first, end, boxes, group = benchmark.phrases[0][0]
    assert (first, end, group) == (0, 3, "people") and boxes.tolist() == [[0, 0, 32, 32]]
    # "Darkness surrounds the white square .": the second phrase is words 2-4; "other/bodyparts" is "other".
    assert [(f, e, g) for f, e, _, g in benchmark.phrases[1]] == [(0, 1, "other"), (2, 5, "people")]


def test_a_model_that_finds_the_bright_box_scores_its_known_answer(flickr30k_root):
    benchmark = phrase_grounding.flickr30k_entities(str(flickr30k_root))
    record = phrase_grounding.evaluate_phrase_grounding(_BrightModel(), benchmark, batch_size=3)
    chances = _expected_chances()
    # Per scene: the two bright-box phrases hit (pointing and mass 1); the two dark ones miss (0).
    expected_chance = np.mean([c for scene in chances.values() for c in (scene[0], scene[1], scene[1], scene[0])])
    assert record["method"] == "token_alignment"
    assert record["metrics"] == pytest.approx({"pointing": 0.5, "mass": 0.5, "chance": expected_chance,
                                               "phrases": 8.0}, abs=1e-6)
    assert record["groups"]["people"]["pointing"] == 1.0 and record["groups"]["other"]["pointing"] == 0.0


@pytest.fixture(scope="module")
def refcoco_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("refer")
    images = root / "images" / "mscoco" / "images" / "train2014"
    images.mkdir(parents=True)
    (root / "refcoco").mkdir()
    listing, annotations, refs = [], [], []
    for k, (image_id, width, height, bright, dark) in enumerate(_SCENES):
        name = f"COCO_train2014_{int(image_id):012d}.jpg"
        _picture(images / name, width, height, bright)
        listing.append({"id": int(image_id), "file_name": name, "width": width, "height": height})
        for ann, (box, category, sentences) in enumerate([(bright, 1, ["the bright box", "white square top left"]),
                                                           (dark, 2, ["the dark corner"])]):
            x0, y0, x1, y1 = box
            annotations.append({"id": 10 * k + ann, "image_id": int(image_id), "category_id": category,
                                "bbox": [x0, y0, x1 - x0, y1 - y0], "area": (x1 - x0) * (y1 - y0)})
            refs.append({"ref_id": len(refs), "ann_id": 10 * k + ann, "image_id": int(image_id),
                         "category_id": category, "split": "val" if k == 0 else "testA", "file_name": name,
                         "sentences": [{"sent": s, "raw": s, "tokens": s.split(), "sent_id": i}
                                       for i, s in enumerate(sentences)]})
    (root / "refcoco" / "instances.json").write_text(json.dumps({
        "images": listing, "annotations": annotations,
        "categories": [{"id": 1, "name": "square"}, {"id": 2, "name": "corner"}]}))
    with open(root / "refcoco" / "refs(unc).p", "wb") as f:
        pickle.dump(refs, f, protocol=2)  # as the refer toolkit's Python 2 wrote them
    return root


@pytest.mark.parametrize("split, scene", [("val", "1000"), ("testA", "2000")])
def test_refcoco_expressions_score_their_known_answer(refcoco_root, split, scene):
    benchmark = phrase_grounding.refcoco(str(refcoco_root), split=split)
    assert benchmark.captions == ["the bright box", "white square top left", "the dark corner"]
    record = phrase_grounding.evaluate_phrase_grounding(_BrightModel(), benchmark)
    bright, dark = _expected_chances()[scene]
    assert record["groups"]["square"] == pytest.approx(
        {"pointing": 1.0, "mass": 1.0, "chance": bright, "phrases": 2.0}, abs=1e-6)
    assert record["groups"]["corner"] == pytest.approx(
        {"pointing": 0.0, "mass": 0.0, "chance": dark, "phrases": 1.0}, abs=1e-6)


def test_layout_errors_name_what_is_missing(tmp_path, refcoco_root):
    with pytest.raises(FileNotFoundError, match="Flickr30k Entities"):
        phrase_grounding.flickr30k_entities(str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match="no expressions in split 'testB'; its splits are"):
        phrase_grounding.refcoco(str(refcoco_root), split="testB")
    with pytest.raises(ValueError, match="`dataset` must be one of"):
        phrase_grounding.refcoco(str(refcoco_root), dataset="refclef")
    evil = tmp_path / "evil" / "refcoco"
    evil.mkdir(parents=True)
    (tmp_path / "evil" / "images" / "mscoco" / "images" / "train2014").mkdir(parents=True)
    with open(evil / "refs(unc).p", "wb") as f:
        pickle.dump([{"split": "val", "payload": np.float32(1)}], f)  # a class, not plain data
    with pytest.raises(pickle.UnpicklingError, match="expected plain data only"):
        phrase_grounding.refcoco(str(tmp_path / "evil"))


@run_once  # the command's wiring; the scores are checked on every backend above
def test_eval_reads_the_layouts_from_the_command_line(flickr30k_root, refcoco_root, tmp_path, capsys):
    for benchmark, root, split in (("flickr30k_entities", flickr30k_root, None), ("refcoco", refcoco_root, "testA")):
        path = tmp_path / f"{benchmark}.json"
        argv = ["eval", "--preset", "sparc_shapes", "--benchmark", benchmark, "--data", str(root), "--json", str(path)]
        assert cli.main(argv + (["--split", split] if split else [])) == 0, capsys.readouterr().err
        (record,) = json.loads(path.read_text())
        assert record["task"] == "phrase_grounding" and record["dataset"] == f"{benchmark}/{split or 'test'}"
        assert 0 <= record["metrics"]["pointing"] <= 1 and record["metrics"]["phrases"] == (8 if split is None else 3)


def test_region_mask_follows_the_resize_and_crop_with_fractional_edges():
    from vlzoo.preprocessing import ImagePreprocessor

    # Squashed 8 x 8 -> 4 x 4: x in [1, 3) becomes [0.5, 1.5), half of columns 0 and 1; every row.
    mask = ImagePreprocessor(4, crop="none").region_mask([[1, 0, 3, 8]], (8, 8))
    np.testing.assert_allclose(mask, np.tile([0.5, 0.5, 0.0, 0.0], (4, 1)))
    # 8 high x 16 wide -> 4 x 8, cropped at column 2: x in [4, 8) becomes [2, 4) then [0, 2).
    mask = ImagePreprocessor(4).region_mask([[4, 0, 8, 8], [0, 0, 2, 8]], (8, 16))
    np.testing.assert_allclose(mask, np.tile([1.0, 1.0, 0.0, 0.0], (4, 1)))
    with pytest.raises(ValueError, match="x0 <= x1"):
        ImagePreprocessor(4).region_mask([[3, 0, 1, 2]], (8, 8))
