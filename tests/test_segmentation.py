"""Zero-shot segmentation on PASCAL VOC 2012 fixtures in the real layout: the mIoU accumulator against a
confusion-matrix reference and hand-checked cases, an oracle model (mIoU 1.0), malformed files, and tiny
FILIP and SPARC models end to end against a numpy re-computation."""

import json
import os
import types
import warnings

import keras
import numpy as np
import pytest
from backend_utils import run_once
from PIL import Image

import vlzoo
from vlzoo.evaluation.segmentation import (
    BACKGROUND_NAMES, VOC_CLASSES, SegmentationMetrics, evaluate_segmentation, patch_embeddings,
    segmentation_metrics, voc2012,
)
from vlzoo.evaluation.zeroshot import EmbeddingMean, zero_shot_classifier
from vlzoo.preprocessing import ImagePreprocessor

HEIGHT, WIDTH, PATCH = 32, 48, 16  # a 2 x 3 patch grid for the oracle

# ------------------------------------------------------------------------- metrics


def confusion_reference(predictions, labels, num_classes, ignore_index=255):
    """mIoU, pixel and mean accuracy from one confusion matrix over all labelled pixels."""
    cm = np.zeros((num_classes, num_classes), np.int64)
    for p, l in zip(predictions, labels):
        keep = np.asarray(l) != ignore_index
        cm += np.bincount(num_classes * np.asarray(l)[keep] + np.asarray(p)[keep],
                          minlength=num_classes ** 2).reshape(num_classes, num_classes)
    diag, rows, cols = np.diag(cm), cm.sum(1), cm.sum(0)
    union = rows + cols - diag
    iou = [d / u for d, u in zip(diag, union) if u]
    acc = [d / r for d, r in zip(diag, rows) if r]
    return {"mIoU": np.mean(iou), "pixel_accuracy": diag.sum() / rows.sum(), "mean_accuracy": np.mean(acc)}


def test_metrics_match_a_confusion_matrix():
    rng = np.random.default_rng(0)
    labels, predictions = [], []
    for h, w in [(5, 7), (9, 4), (6, 6), (3, 11)]:  # sizes differ between images
        label = rng.integers(0, 5, (h, w))
        label[rng.random((h, w)) < 0.2] = 255
        labels.append(label)
        predictions.append(np.where(rng.random((h, w)) < 0.6, np.minimum(label, 4), rng.integers(0, 5, (h, w))))
    result = segmentation_metrics(predictions, labels, 5)
    expected = confusion_reference(predictions, labels, 5)
    for name, value in expected.items():
        assert result[name] == pytest.approx(value, abs=1e-12)
    assert 0.3 < result["mIoU"] < 0.9


def test_metrics_hand_checked():
    # valid pixels 0, 2, 3: I = (1, 1), predicted (1, 2), labelled (2, 1): U = (2, 2)
    result = segmentation_metrics([[0, 0, 1, 1]], [[0, 255, 1, 0]], 2, class_names=["a", "b"])
    assert result["mIoU"] == 0.5 and result["pixel_accuracy"] == pytest.approx(2 / 3)
    assert result["mean_accuracy"] == 0.75 and result["per_class"]["b"] == {"IoU": 0.5, "accuracy": 1.0}
    # the prediction under an ignored pixel is not read (even out of range); elsewhere it is checked
    assert segmentation_metrics([[9, 1]], [[255, 1]], 2)["mIoU"] == 1.0
    with pytest.raises(ValueError, match=r"image 0: prediction values must lie in \[0, 2\)"):
        segmentation_metrics([[9, 1]], [[0, 1]], 2)
    with pytest.raises(ValueError, match="label values"):
        segmentation_metrics([[0, 1]], [[0, 7]], 2)
    with pytest.raises(ValueError, match="differ in shape"):
        segmentation_metrics([np.zeros((2, 3), int)], [np.zeros((3, 2), int)], 2)
    with pytest.raises(ValueError, match="every pixel is ignored"):
        segmentation_metrics([[0, 1]], [[255, 255]], 2)


def test_dataset_sums_differ_from_the_per_image_mean():
    # image A: 4 pixels of class 0, all right; image B: 2 pixels of class 1 predicted 0
    result = segmentation_metrics([np.zeros((1, 4), int), np.zeros((1, 2), int)],
                                  [np.zeros((1, 4), int), np.ones((1, 2), int)], 2)
    assert result["mIoU"] == pytest.approx((4 / 6 + 0) / 2)  # dataset-summed (mmseg)
    assert result["mIoU_per_image"] == pytest.approx((1.0 + 0.0) / 2)
    assert result["pixel_accuracy"] == pytest.approx(4 / 6)


def test_classes_without_union_are_skipped():
    metrics = SegmentationMetrics(4)
    metrics.update(np.array([[0, 1], [1, 0]]), np.array([[0, 1], [0, 0]]))  # classes 2, 3: no pixel
    result = metrics.result(["w", "x", "y", "z"])
    assert result["mIoU"] == pytest.approx((2 / 3 + 1 / 2) / 2)
    assert result["per_class"]["y"] == {"IoU": None, "accuracy": None}
    assert result["mean_accuracy"] == pytest.approx((2 / 3 + 1) / 2)


# ------------------------------------------------------------------ fixtures (VOC layout)


def grey(c):
    return 8 + 12 * c  # class c's grey level in the oracle's images


def save_mask(label, path):
    """A palette PNG of class indices (with a full palette: PIL would renumber a partial one)."""
    mask = Image.fromarray(label, mode="P")
    mask.putpalette([v for c in range(256) for v in (c, 255 - c, 7 * c % 256)])
    mask.save(path)


def write_voc(root, layouts, split="val"):
    """`VOCdevkit/VOC2012` with one image per layout: a `(2, 3)` grid of classes (16 x 16 px cells),
    a palette PNG of them, and a void (255) line where `void` is set."""
    base = root / "VOCdevkit" / "VOC2012"
    for folder in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        os.makedirs(base / folder, exist_ok=True)
    ids = []
    for n, (grid, void) in enumerate(layouts):
        image_id = f"2007_{n:06d}"
        label = np.kron(np.array(grid, np.uint8), np.ones((PATCH, PATCH), np.uint8))
        Image.fromarray(np.repeat(grey(label)[..., None], 3, axis=-1).astype(np.uint8)).save(
            base / "JPEGImages" / f"{image_id}.jpg", quality=98)
        if void:
            label[:, 0] = 255
        save_mask(label, base / "SegmentationClass" / f"{image_id}.png")
        ids.append(image_id)
    (base / "ImageSets" / "Segmentation" / f"{split}.txt").write_text("\n".join(ids) + "\n")
    return base


STRIPES = [([[15, 15, 8], [15, 15, 8]], True),   # person | cat, columns
           ([[0, 0, 0], [12, 12, 12]], False),   # background above a dog, rows
           ([[1, 1, 1], [1, 1, 1]], True)]       # an aeroplane everywhere


class Oracle:
    """Patch tokens: one-hot of the class whose grey level a 16 x 16 patch shows; a prompt: one-hot
    of the class it names (every background prompt names class 0)."""

    has_dense_embeddings = True
    image_embedding_keys = ("embeds", "tokens")
    prompt_ensembling = EmbeddingMean()
    vision = types.SimpleNamespace(patch_size=PATCH, num_prefix_tokens=0)

    def __init__(self):
        self.preprocessor = ImagePreprocessor(image_size=(HEIGHT, WIDTH))
        self._levels = np.array([self.preprocessor(np.full((1, 4, 4, 3), grey(c), np.uint8)).mean()
                                 for c in range(21)])
        self._vocabulary = {name: c for c, name in enumerate(VOC_CLASSES)}
        self._vocabulary.update({name: 0 for name in BACKGROUND_NAMES})

    def tokenizer(self, texts):
        ids = [[next(self._vocabulary[name] for name in sorted(self._vocabulary, key=len, reverse=True)
                     if name in text)] for text in texts]
        return {"token_ids": np.array(ids), "padding_mask": np.ones((len(ids), 1), bool)}

    def encode_image(self, images):
        cells = np.asarray(images).reshape(len(images), HEIGHT // PATCH, PATCH, WIDTH // PATCH, PATCH, 3)
        means = cells.mean(axis=(2, 4, 5)).reshape(len(images), -1)
        tokens = np.eye(21)[np.abs(means[..., None] - self._levels).argmin(-1)]
        return {"embeds": tokens.mean(1), "tokens": tokens}

    def dense_image_embeddings(self, images):
        return self.encode_image(images)["tokens"]

    def encode_text(self, texts, normalize=False):
        return {"embeds": np.eye(21)[keras.ops.convert_to_numpy(texts["token_ids"])[:, 0]]}

    def normalize_embeds(self, embeds):
        return embeds

    def logit_scale_value(self):
        return np.float32(100.0)


def test_reader_and_oracle(tmp_path):
    benchmark = voc2012(str(write_voc(tmp_path, STRIPES)))
    assert len(benchmark.images) == 3 and benchmark.class_names[11] == "dining table"
    assert benchmark.masks[1].endswith(os.path.join("SegmentationClass", "2007_000001.png"))
    result = evaluate_segmentation(Oracle(), benchmark, batch_size=2)
    assert result["dataset"] == "voc2012/voc20" and result["task"] == "zeroshot_segmentation"
    assert result["metrics"] == {"mIoU": 1.0, "pixel_accuracy": 1.0, "mean_accuracy": 1.0, "mIoU_per_image": 1.0}
    assert len(result["groups"]) == 20 and result["groups"]["cat"]["IoU"] == 1.0
    assert result["groups"]["bus"]["IoU"] is None  # absent and never predicted: skipped
    voc21 = evaluate_segmentation(Oracle(), benchmark, background="prompts")
    assert voc21["dataset"] == "voc2012/voc21" and voc21["metrics"]["mIoU"] == 1.0
    assert voc21["groups"]["background"]["IoU"] == 1.0 and len(voc21["groups"]) == 21


def test_background_threshold_and_present_classes(tmp_path):
    # no background / object border: the thresholded probabilities are exact away from it
    layouts = [STRIPES[0], STRIPES[2], ([[0, 0, 0], [0, 0, 0]], False)]
    benchmark = voc2012(str(write_voc(tmp_path, layouts)))
    result = evaluate_segmentation(Oracle(), benchmark, background=0.5)
    assert result["metrics"]["mIoU"] == 1.0 and result["groups"]["background"]["IoU"] == 1.0
    present = evaluate_segmentation(Oracle(), benchmark, candidates="present")
    assert present["dataset"] == "voc2012/voc20/present" and present["metrics"]["mIoU"] == 1.0


class Constant(Oracle):
    """Every patch looks alike, here a cat: every pixel is called cat, whatever the image shows."""

    def encode_image(self, images):
        tokens = np.zeros((len(images), (HEIGHT // PATCH) * (WIDTH // PATCH), 21))
        tokens[..., 8] = 1.0
        return {"embeds": tokens.mean(1), "tokens": tokens}


def test_a_constant_model_scores_the_one_class_baseline_exactly(tmp_path):
    # With every pixel called cat, the confusion has one column: IoU(cat) = cat pixels / labelled pixels, any
    # other class 0, and mIoU averages over the classes present or predicted (background and void ignored).
    base = write_voc(tmp_path, STRIPES)
    benchmark = voc2012(str(base))
    labels = np.concatenate([np.asarray(Image.open(path)).ravel() for path in benchmark.masks])
    labelled = labels[(labels != 0) & (labels != 255)]
    counted = set(labelled.tolist()) | {8}
    cat = float(np.mean(labelled == 8))
    result = evaluate_segmentation(Constant(), benchmark)
    assert result["metrics"]["pixel_accuracy"] == pytest.approx(cat, abs=1e-12)
    assert result["metrics"]["mIoU"] == pytest.approx(cat / len(counted), abs=1e-12)
    assert result["groups"]["cat"]["IoU"] == pytest.approx(cat, abs=1e-12) and 0.0 < cat < 1.0
    assert {name for name, group in result["groups"].items() if group["IoU"] == 0.0} == {
        VOC_CLASSES[c] for c in counted - {8}}


class Swapped(Oracle):
    """Sees cats as persons: with `candidates="present"` the cat-only image is still right."""

    def encode_image(self, images):
        embeds = super().encode_image(images)
        tokens = embeds["tokens"].copy()
        tokens[..., 15] += tokens[..., 8] * 2
        return {"embeds": tokens.mean(1), "tokens": tokens}


def test_present_candidates_use_each_images_own_classes(tmp_path):
    benchmark = voc2012(str(write_voc(tmp_path, [([[8, 8, 8], [8, 8, 8]], False), STRIPES[0]])))
    plain = evaluate_segmentation(Swapped(), benchmark)
    given = evaluate_segmentation(Swapped(), benchmark, candidates="present")
    # plain: every cat pixel is called person (cat IoU 0; person: 2/3 of image 1 over all of it)
    assert plain["groups"]["cat"]["IoU"] == 0.0
    assert plain["groups"]["person"]["IoU"] == pytest.approx((HEIGHT * 31) / (2 * HEIGHT * WIDTH - HEIGHT))
    # given: image 0 has only cats to choose from; image 1 still confuses its cat stripe
    assert given["groups"]["cat"]["IoU"] == pytest.approx(HEIGHT * WIDTH / (HEIGHT * WIDTH + HEIGHT * 16))


@run_once  # a check of the model's declared outputs, before any computation
def test_families_without_patch_embeddings_are_refused(tmp_path):
    benchmark = voc2012(str(write_voc(tmp_path, STRIPES[:1])))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        clip = vlzoo.from_preset("clip_tiny")
    with pytest.raises(TypeError, match=r"CLIP models give only a global one.*filip, pe_core, sparc, tipsv2"):
        evaluate_segmentation(clip, benchmark)
    with pytest.raises(ValueError, match="`background` must be"):
        evaluate_segmentation(Oracle(), benchmark, background=1.5)
    with pytest.raises(ValueError, match="`candidates` must be"):
        evaluate_segmentation(Oracle(), benchmark, candidates="some")


def test_malformed_files_are_named(tmp_path):
    base = write_voc(tmp_path, STRIPES[:2])
    with pytest.raises(FileNotFoundError, match=r"test.txt"):
        voc2012(str(base), split="test")
    png = base / "SegmentationClass" / "2007_000001.png"
    label = np.array(Image.open(png))
    os.remove(png)
    with pytest.raises(FileNotFoundError, match=r"entry 2007_000001: file not found: .*2007_000001.png"):
        voc2012(str(base))
    bad = label.copy()
    bad[3, 3] = 21
    save_mask(bad, png)
    with pytest.raises(ValueError, match=r"2007_000001.png: label values must be class indices in \[0, 21\)"):
        evaluate_segmentation(Oracle(), voc2012(str(base)))
    save_mask(np.ascontiguousarray(label[:, :40]), png)
    with pytest.raises(ValueError, match=r"2007_000001.png: label size 40x32 differs from its image"):
        evaluate_segmentation(Oracle(), voc2012(str(base)))
    Image.fromarray(np.repeat(label[..., None], 3, -1)).save(png)
    with pytest.raises(ValueError, match=r"2007_000001.png: expected a palette"):
        evaluate_segmentation(Oracle(), voc2012(str(base)))


# ------------------------------------------------------------------- real models end to end


def bilinear(scores, height, width):
    """Half-pixel bilinear upsampling of `(h, w, C)` (the `align_corners=False` convention)."""
    h, w = scores.shape[:2]

    def axis(n_out, n_in):
        source = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        low = np.floor(source).astype(int)
        return low, np.minimum(low + 1, n_in - 1), source - low

    y0, y1, fy = axis(height, h)
    x0, x1, fx = axis(width, w)
    rows = scores[y0] * (1 - fy)[:, None, None] + scores[y1] * fy[:, None, None]
    return rows[:, x0] * (1 - fx)[None, :, None] + rows[:, x1] * fx[None, :, None]


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


E2E_LAYOUTS = STRIPES + [([[2, 5, 9], [2, 5, 9]], False), ([[7, 7, 7], [19, 19, 19]], True)]


@pytest.mark.parametrize("name", ["filip_tiny", "sparc_tiny", "pe_core_tiny", "tipsv2_tiny"])
def test_tiny_models_end_to_end(tmp_path, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vlzoo.from_preset(name)
    benchmark = voc2012(str(write_voc(tmp_path, E2E_LAYOUTS)))
    templates = ("a photo of a {}.", "a drawing of the {}.")
    results = {candidates: evaluate_segmentation(model, benchmark, templates, candidates=candidates, batch_size=5)
               for candidates in ("all", "present")}
    # numpy re-computation: whole-image resize, per-patch cosines, bilinear, argmax, confusion matrix
    pre = model.preprocessor
    pixels = ImagePreprocessor(pre.image_size, pre.mean, pre.std, pre.interpolation, crop="none")(
        [np.array(Image.open(path)) for path in benchmark.images])
    names = list(VOC_CLASSES[1:])
    prompts = model.tokenizer([t.format(n) for n in names for t in templates])
    text = {k: keras.ops.convert_to_numpy(v) for k, v in model.encode_text(prompts).items()}
    grid = 32 // model.vision.patch_size
    if name != "filip_tiny":  # per-patch embeddings against the prompt-ensembled global text embeddings
        patches = unit(keras.ops.convert_to_numpy(model.dense_image_embeddings(pixels)))
        classes = unit(unit(text["embeds"]).reshape(20, 2, -1).mean(1))
        scores = patches @ classes.T
    else:
        image_tokens = keras.ops.convert_to_numpy(model.encode_image(pixels)["tokens"])
        patches = unit(image_tokens[:, image_tokens.shape[1] - grid * grid:])  # without CLS, if the model uses it
        tokens = unit(text["tokens"]).reshape(20, 2, -1, patches.shape[-1])
        cosines = np.einsum("bpd,cktd->bpckt", patches, tokens)
        scores = np.where(text["mask"].reshape(20, 2, -1), cosines, -2).max(-1).mean(-1)
        # the mean over patches of FILIP's map is its own zero-shot score over the logit scale
        classifier = zero_shot_classifier(model, names, templates)
        own = keras.ops.convert_to_numpy(classifier(pixels)) / float(keras.ops.convert_to_numpy(
            model.logit_scale_value()))
        np.testing.assert_allclose(scores.mean(1), own, atol=1e-5)
    ours = keras.ops.convert_to_numpy(patch_embeddings(model, pixels))
    np.testing.assert_allclose(ours.reshape(patches.shape), patches, atol=1e-5)
    for candidates, result in results.items():
        labels, predictions = [], []
        for image_scores, path in zip(scores.reshape(len(E2E_LAYOUTS), grid, grid, 20), benchmark.masks):
            label = np.array(Image.open(path)).astype(int)
            label = np.where(label == 0, 255, np.where(label == 255, 255, label - 1))
            upsampled = bilinear(image_scores, *label.shape)
            if candidates == "present":
                upsampled = np.where(np.isin(np.arange(20), label), upsampled, -np.inf)
            labels.append(label)
            predictions.append(upsampled.argmax(-1))
        expected = confusion_reference(predictions, labels, 20)
        for metric, value in expected.items():
            assert result["metrics"][metric] == pytest.approx(value, abs=2e-3)
        per_class = segmentation_metrics(predictions, labels, 20, class_names=names)["per_class"]
        for class_name, value in per_class.items():
            assert result["groups"][class_name]["IoU"] == pytest.approx(value["IoU"], abs=5e-3)
    assert 0.2 < results["present"]["metrics"]["mIoU"] < 1.0  # the choices inside images are not trivial


@run_once  # the command's wiring; the scores themselves are checked above
def test_vlzoo_eval_segments_voc_with_a_patch_family_and_refuses_others(tmp_path, capsys):
    from vlzoo.cli import main

    directory = str(write_voc(tmp_path, STRIPES))
    out = tmp_path / "voc.json"
    assert main(["eval", "--preset", "sparc_shapes", "--benchmark", "voc2012", "--data", directory,
                 "--templates", "simple", "--candidates", "present", "--json", str(out)]) == 0
    assert "voc2012: 3 images, 21 classes, 7 template(s)" in capsys.readouterr().out
    record, = json.loads(out.read_text())
    want = evaluate_segmentation(vlzoo.from_preset("sparc_shapes"), voc2012(directory),
                                 vlzoo.evaluation.SIMPLE_TEMPLATES, candidates="present")
    assert record["task"] == "zeroshot_segmentation" and record["metrics"] == want["metrics"]
    assert main(["eval", "--preset", "clip_shapes", "--benchmark", "voc2012", "--data", directory]) == 2
    assert "argument --preset: Zero-shot segmentation needs per-patch image embeddings" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--preset", "sparc_shapes", "--benchmark", "voc2012", "--data", directory, "--background", "1.5"])
