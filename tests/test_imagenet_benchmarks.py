"""ImageNet-1k validation, ImageNetV2, ImageNet-Sketch, ImageNet-A and ImageNet-R read from tiny fixtures
in their published layouts: the shipped class lists against clip_benchmark's and open_clip's copies, the
label rules, test models whose answers are known (an oracle: 1.0; a constant: chance exactly), malformed
layouts, and a real family end to end against a per-image computation."""

import ast
import functools
import importlib.util
import json
import os

import keras
import numpy as np
import pytest
from backend_utils import run_once
from margins import DECISION_MARGIN, target_gap
from PIL import Image

import vlzoo
from vlzoo.evaluation import benchmarks, imagenet
from vlzoo.evaluation.templates import build_prompts
from vlzoo.evaluation.zeroshot import EmbeddingMean, classification_metrics
from vlzoo.preprocessing import ImagePreprocessor

TEMPLATES = ("a photo of a {}.", "art of the {}.")


def _solid(path, level):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(np.full((24, 32, 3), 20 * level + 10, np.uint8)).save(path)


class Oracle:
    """A stand-in model that sees the answer: an image of grey level `k` is class `classes[k]`, a prompt is
    the class it was written for (the first of a duplicated name: CLIP's list names "missile" and
    "sunglasses" twice); embeddings are one-hot over the classes. `constant=True` scores everything alike."""

    symmetric_score = True
    prompt_ensembling = EmbeddingMean()

    def __init__(self, class_names, classes, constant=False):
        self.size, self.classes, self.constant = len(class_names), np.array(classes), constant
        self.prompts = {}
        for index, prompt in enumerate(build_prompts(class_names, TEMPLATES)):
            self.prompts.setdefault(prompt, index // len(TEMPLATES))
        self.preprocessor = ImagePreprocessor(image_size=8)
        self._levels = np.array([self.preprocessor(np.full((1, 24, 32, 3), 20 * k + 10, np.uint8)).mean()
                                 for k in range(len(classes))])

    def tokenizer(self, texts):
        ids = np.array([[self.prompts[t]] for t in texts])
        return {"token_ids": ids, "padding_mask": np.ones_like(ids, bool)}

    def encode_image(self, images):
        means = np.asarray(images).reshape(len(images), -1).mean(axis=1)
        return {"embeds": np.eye(self.size)[self.classes[np.abs(means[:, None] - self._levels).argmin(axis=1)]]}

    def encode_text(self, texts, normalize=False):
        ids = texts if isinstance(texts, dict) else self.tokenizer(texts)
        return {"embeds": np.eye(self.size)[keras.ops.convert_to_numpy(ids["token_ids"])[:, 0]]}

    def normalize_embeds(self, embeds):
        return embeds  # one-hot rows, and means of equal ones

    def score(self, image_embeds, text_embeds):
        scores = keras.ops.matmul(image_embeds["embeds"], keras.ops.transpose(text_embeds["embeds"]))
        return keras.ops.zeros_like(scores) if self.constant else scores


# ------------------------------------------------------------------ fixtures in each layout


def _folders(root, folders, extension, per_class=2):
    """`root/<folder>/<i><extension>`, image `i` of folder `k` a solid grey of level `k`."""
    for level, folder in enumerate(folders):
        for i in range(per_class):
            _solid(str(root / folder / f"{level}_{i}{extension}"), level)
    return root


W = imagenet.IMAGENET_WNIDS
LAYOUTS = {  # name: (reader, folder names, the labels they give, extension, beside the folders)
    "imagenet1k": (imagenet.imagenet, [W[0], W[417], W[999]], [0, 417, 999], ".JPEG", None),
    "imagenet_sketch": (imagenet.imagenet_sketch, [W[2], W[10]], [2, 10], ".JPEG", None),
    "imagenetv2": (imagenet.imagenet_v2, ["2", "10", "100", "999"], [2, 10, 100, 999], ".jpeg", None),
    "imagenet-a": (imagenet.imagenet_a, [imagenet.IMAGENET_A_WNIDS[i] for i in (0, 57, 199)], [0, 57, 199], ".jpg",
                   "README.txt"),
    "imagenet-r": (imagenet.imagenet_r, [imagenet.IMAGENET_R_WNIDS[i] for i in (0, 199)], [0, 199], ".jpg",
                   "README.txt"),
}


def _layout(tmp_path, name):
    reader, folders, labels, extension, beside = LAYOUTS[name]
    root = _folders(tmp_path / name, folders, extension)
    if beside:
        (root / beside).write_text("The 200 classes of the benchmark.\n")
    return root


# ------------------------------------------------------------------ the class lists


def _assigned(path, names):
    """The literal values assigned to `names` anywhere in the Python file `path` (read, not imported:
    clip_benchmark's builder and open_clip import torchvision)."""
    with open(path) as f:
        tree = ast.parse(f.read())
    return {node.targets[0].id: ast.literal_eval(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) in names}


def _peer_file(package, name):
    return os.path.join(os.path.dirname(importlib.util.find_spec(package).origin), name)


@run_once  # reads peers' files; nothing depends on the backend
def test_the_class_lists_equal_clip_benchmarks_and_open_clips():
    # clip_benchmark 1.6.2's builder: `all_imagenet_wordnet_ids` (module level), `imagenet_a_wnids` /
    # `imagenet_r_wnids` (inside `build_dataset`); its en_classnames.json; open_clip's zero_shot_metadata.
    found = _assigned(_peer_file("clip_benchmark", os.path.join("datasets", "builder.py")),
                      ("all_imagenet_wordnet_ids", "imagenet_a_wnids", "imagenet_r_wnids"))
    all_wnids, a_wnids, r_wnids = (found[k] for k in ("all_imagenet_wordnet_ids", "imagenet_a_wnids",
                                                      "imagenet_r_wnids"))
    open_clip_names = _assigned(_peer_file("open_clip", "zero_shot_metadata.py"), ("IMAGENET_CLASSNAMES",))
    assert len(imagenet.IMAGENET_WNIDS) == 1000 and imagenet.IMAGENET_WNIDS == tuple(all_wnids)
    assert list(imagenet.IMAGENET_WNIDS) == sorted(set(all_wnids))  # index order is the sorted order
    with open(_peer_file("clip_benchmark", os.path.join("datasets", "en_classnames.json"))) as f:
        assert imagenet.IMAGENET_CLASSNAMES == tuple(json.load(f)["imagenet1k"])
    assert imagenet.IMAGENET_CLASSNAMES == tuple(open_clip_names["IMAGENET_CLASSNAMES"])
    assert imagenet.IMAGENET_CLASSNAMES[:2] == ("tench", "goldfish")
    for ours, theirs in ((imagenet.IMAGENET_A_WNIDS, a_wnids), (imagenet.IMAGENET_R_WNIDS, r_wnids)):
        assert len(ours) == 200 and set(ours) == set(theirs) and list(ours) == sorted(ours)


def test_the_subset_class_names_are_the_masked_1k_names(tmp_path):
    # clip_benchmark keeps `[name for name, keep in zip(1k names, mask) if keep]`; ImageFolder's sorted
    # wnid folders then give label j to the j-th of them.
    for reader, subset in ((imagenet.imagenet_a, imagenet.IMAGENET_A_WNIDS),
                           (imagenet.imagenet_r, imagenet.IMAGENET_R_WNIDS)):
        mask = [w in set(subset) for w in imagenet.IMAGENET_WNIDS]
        root = _folders(tmp_path / reader.__name__, [subset[0]], ".jpg")
        names = reader(root).class_names
        assert names == tuple(n for n, keep in zip(imagenet.IMAGENET_CLASSNAMES, mask) if keep) and len(names) == 200
    assert imagenet.imagenet_a(tmp_path / "imagenet_a").class_names[0] == "stingray"  # n01498041, 1k index 6
    assert imagenet.imagenet_r(tmp_path / "imagenet_r").class_names[-1] == "acorn"  # n12267677, 1k index 988


# ------------------------------------------------------------------ labels and known answers


@pytest.mark.parametrize("name", LAYOUTS)
def test_labels_come_from_the_folder_names(tmp_path, name):
    reader, folders, labels, extension, _ = LAYOUTS[name]
    benchmark = reader(_layout(tmp_path, name))
    assert benchmark.name == name and benchmark.source == str(tmp_path / name)
    assert len(benchmark.class_names) == (200 if name in ("imagenet-a", "imagenet-r") else 1000)
    got = {os.path.basename(os.path.dirname(p)): int(label) for p, label in zip(benchmark.images, benchmark.labels)}
    assert got == dict(zip(folders, labels)) and len(benchmark.images) == 2 * len(folders)
    assert benchmark.labels.dtype == np.int64 and all(p.endswith(extension) for p in benchmark.images)


def test_imagenet_v2_folder_10_is_class_10_not_its_string_sorted_position(tmp_path):
    # torchvision's ImageFolder (the ImageNetV2 README's suggestion) sorts the folder names as strings:
    # "10", "100", "2", "999" would be labels 0, 1, 2, 3.
    benchmark = imagenet.imagenet_v2(_layout(tmp_path, "imagenetv2"))
    folders = [os.path.basename(os.path.dirname(p)) for p in benchmark.images]
    string_sorted = {folder: position for position, folder in enumerate(sorted(set(folders)))}
    assert benchmark.labels.tolist() == [int(f) for f in folders] != [string_sorted[f] for f in folders]
    assert benchmark.class_names[benchmark.labels[folders.index("10")]] == "brambling"  # class 10


@pytest.mark.parametrize("name", LAYOUTS)
def test_an_oracle_scores_one_and_a_constant_model_scores_chance_exactly(tmp_path, name):
    # The oracle knows the fixture's classes (grey level k is `labels[k]`), not what the reader made of them.
    reader, _, labels, _, _ = LAYOUTS[name]
    benchmark = reader(_layout(tmp_path, name))
    oracle = Oracle(benchmark.class_names, labels)
    result = benchmarks.evaluate_classification(oracle, benchmark, TEMPLATES, batch_size=3)
    assert result["dataset"] == name and result["task"] == "zeroshot_classification"
    assert result["metrics"] == {"acc1": 1.0, "acc5": 1.0, "mean_per_class_recall": 1.0}
    classes = len(benchmark.class_names)
    constant = Oracle(benchmark.class_names, labels, constant=True)
    chance = benchmarks.evaluate_classification(constant, benchmark, TEMPLATES)["metrics"]
    assert chance == pytest.approx({"acc1": 1 / classes, "acc5": 5 / classes, "mean_per_class_recall": 1 / classes},
                                   rel=1e-12)


def test_a_missing_or_empty_class_folder_leaves_the_class_set_whole(tmp_path):
    root = _layout(tmp_path, "imagenet1k")
    os.makedirs(root / W[5])  # empty
    benchmark = imagenet.imagenet(root)
    assert benchmark.class_names == imagenet.IMAGENET_CLASSNAMES and sorted(set(benchmark.labels)) == [0, 417, 999]


def test_images_are_matched_by_extension_in_any_case(tmp_path):
    root = _folders(tmp_path / "val", [W[3]], ".JPEG")
    for extension in (".jpeg", ".Jpg", ".png"):
        _solid(str(root / W[3] / f"extra{extension}"), 0)
    assert len(imagenet.imagenet(root).images) == 5


# ------------------------------------------------------------------ malformed layouts


@pytest.mark.parametrize("reader, folder, message", [
    (imagenet.imagenet, "n99999999", r"folder 'n99999999' is not a class of imagenet1k; expected one folder per "
                                     r"synset of its 1000 \(WordNet ids such as 'n01440764'\)"),
    (imagenet.imagenet, "val", r"folder 'val' is not a class of imagenet1k"),
    (imagenet.imagenet_a, W[0], r"folder 'n01440764' is not a class of imagenet-a; .* its 200"),  # tench: not in A
    (imagenet.imagenet_r, W[999], r"folder 'n15075141' is not a class of imagenet-r"),
    (imagenet.imagenet_v2, "1000", r"folder '1000' is not a class of imagenetv2; expected one folder per class "
                                   r"named by its index, 0 to 999"),
    (imagenet.imagenet_v2, "010", r"folder '010' is not a class of imagenetv2"),
    (imagenet.imagenet_v2, W[0], r"folder 'n01440764' is not a class of imagenetv2"),
])
def test_a_folder_that_is_no_class_is_named(tmp_path, reader, folder, message):
    root = _folders(tmp_path / "data", [folder], ".jpg")
    with pytest.raises(ValueError, match=message):
        reader(root)


def test_a_file_that_is_no_image_is_named(tmp_path):
    root = _layout(tmp_path, "imagenet1k")
    (root / W[417] / ".DS_Store").write_bytes(b"\0")
    with pytest.raises(ValueError, match=W[417] + r".\.DS_Store: not an image \(expected one of \['\.jpeg', '\.jpg', "
                                         r"'\.png'\], in any case\)"):
        imagenet.imagenet(root)


def test_a_readme_is_allowed_beside_the_a_and_r_folders_only(tmp_path):
    root = _layout(tmp_path, "imagenet_sketch")
    (root / "README.txt").write_text("sketches\n")
    with pytest.raises(ValueError, match=r"README\.txt: a file beside the class folders; imagenet_sketch expects "
                                         r"only one folder per synset"):
        imagenet.imagenet_sketch(root)
    root = _layout(tmp_path, "imagenet-r")
    (root / "notes.txt").write_text("mine\n")
    with pytest.raises(ValueError, match=r"notes\.txt: a file beside the class folders; imagenet-r"):
        imagenet.imagenet_r(root)


def test_a_folder_inside_a_class_folder_is_named(tmp_path):
    root = _layout(tmp_path, "imagenetv2")
    _solid(str(root / "10" / "nested" / "0.jpeg"), 0)
    with pytest.raises(ValueError, match=r"10.nested: a folder inside a class folder"):
        imagenet.imagenet_v2(root)


def test_a_missing_or_imageless_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"Benchmark directory not found: .*absent"):
        imagenet.imagenet(tmp_path / "absent")
    os.makedirs(tmp_path / "empty" / W[0])
    with pytest.raises(ValueError, match=r"empty: no image in any class folder; imagenet1k expects"):
        imagenet.imagenet(tmp_path / "empty")


def test_the_names_are_clip_benchmarks():
    assert list(imagenet.IMAGENET_BENCHMARKS) == ["imagenet1k", "imagenetv2", "imagenet_sketch", "imagenet-a",
                                                  "imagenet-r"]


# ------------------------------------------------------------------ a real family


@functools.lru_cache(maxsize=None)
def _preset(name):
    return vlzoo.from_preset(name)


@run_once  # the readers know no backend; evaluate_classification runs in each one in test_selection_benchmarks
def test_a_real_model_scores_every_image_against_every_class(tmp_path):
    # clip_shapes over ImageNet-R's 200 classes (its tokenizer reads CLIP's BPE), checked against the
    # images and the prompts encoded here one by one: one template, so the class embedding is the prompt's.
    model = _preset("clip_shapes")
    benchmark = imagenet.imagenet_r(_layout(tmp_path, "imagenet-r"))
    result = benchmarks.evaluate_classification(model, benchmark, ("a photo of a {}.",), batch_size=4)
    pixels = model.preprocessor([np.asarray(Image.open(p).convert("RGB")) for p in benchmark.images])
    images = model.encode_image(pixels)
    texts = model.encode_text([f"a photo of a {name}." for name in benchmark.class_names])
    scores = keras.ops.convert_to_numpy(model.score(images, texts))
    want = classification_metrics(scores, benchmark.labels)
    # Each image's class is ranked with a margin: batches of 4 and these calls rank it alike on any CPU.
    assert target_gap(scores, benchmark.labels) >= DECISION_MARGIN * np.abs(scores).max()
    assert result["metrics"] == pytest.approx(want, abs=1e-12) and scores.shape == (4, 200)


@run_once  # the command's wiring; the scores themselves are checked above
def test_vlzoo_eval_reads_each_variant_by_its_name(tmp_path, capsys):
    from vlzoo.cli import main

    root = _layout(tmp_path, "imagenet-r")
    out = tmp_path / "r.json"
    assert main(["eval", "--preset", "clip_shapes", "--benchmark", "imagenet-r", "--data", str(root),
                 "--templates", "simple", "--json", str(out)]) == 0
    assert "imagenet-r: 4 images of 2 of 200 classes, 7 template(s)" in capsys.readouterr().out
    record, = json.loads(out.read_text())
    want = benchmarks.evaluate_classification(_preset("clip_shapes"), imagenet.imagenet_r(root),
                                              vlzoo.evaluation.SIMPLE_TEMPLATES)
    assert record["dataset"] == "imagenet-r" and record["metrics"] == want["metrics"]
    assert main(["eval", "--preset", "clip_shapes", "--benchmark", "imagenetv2", "--data", str(root)]) == 2
    assert "--data" in capsys.readouterr().err  # wnid folders are no ImageNetV2 class indices


# ------------------------------------------------------------------ any image folder


def _image_folder(tmp_path):
    """Class folders in an order a string sort decides, one nested, names with underscores."""
    root = _folders(tmp_path / "flowers", ["sun_flower", "daisy", "rose"], ".png")
    _solid(str(root / "rose" / "more" / "deep.jpg"), 2)  # ImageFolder walks class folders recursively
    return root


def test_an_image_folder_labels_the_sorted_class_folders(tmp_path):
    benchmark = benchmarks.image_folder(_image_folder(tmp_path))
    assert benchmark.name == "image_folder" and benchmark.class_names == ("daisy", "rose", "sun flower")
    got = {os.path.relpath(p, tmp_path / "flowers"): int(label) for p, label in zip(benchmark.images, benchmark.labels)}
    assert got == {os.path.join("daisy", "1_0.png"): 0, os.path.join("daisy", "1_1.png"): 0,
                   os.path.join("rose", "more", "deep.jpg"): 1, os.path.join("rose", "2_0.png"): 1,
                   os.path.join("rose", "2_1.png"): 1, os.path.join("sun_flower", "0_0.png"): 2,
                   os.path.join("sun_flower", "0_1.png"): 2}
    # Grey level k of the fixture: sun_flower 0, daisy 1, rose 2 -> labels 2, 0, 1.
    oracle = Oracle(benchmark.class_names, [2, 0, 1])
    result = benchmarks.evaluate_classification(oracle, benchmark, TEMPLATES, ks=(1,))
    assert result["metrics"] == {"acc1": 1.0, "mean_per_class_recall": 1.0}
    constant = Oracle(benchmark.class_names, [2, 0, 1], constant=True)
    assert benchmarks.evaluate_classification(constant, benchmark, TEMPLATES, ks=(1, 2))["metrics"] == pytest.approx(
        {"acc1": 1 / 3, "acc2": 2 / 3, "mean_per_class_recall": 1 / 3}, rel=1e-12)


def test_an_image_folder_takes_class_names_from_a_file_and_names_a_wrong_count(tmp_path):
    root = _image_folder(tmp_path)
    names = tmp_path / "classnames.txt"
    names.write_text("common daisy\n\ngarden rose\nsunflower\n")
    assert benchmarks.image_folder(root, classes=names).class_names == ("common daisy", "garden rose", "sunflower")
    names.write_text("common daisy\ngarden rose\n")
    with pytest.raises(ValueError, match=r"classnames\.txt: 2 class names for the 3 class folders of .*flowers "
                                         r"\('daisy' \.\.\. 'sun_flower'\); expected one name per folder"):
        benchmarks.image_folder(root, classes=names)
    with pytest.raises(FileNotFoundError, match="Benchmark directory not found"):
        benchmarks.image_folder(tmp_path / "absent")
    os.makedirs(tmp_path / "flat")
    _solid(str(tmp_path / "flat" / "0.jpg"), 0)
    with pytest.raises(ValueError, match=r"flat has no class sub-folders"):
        benchmarks.image_folder(tmp_path / "flat")


@run_once  # the command's wiring; the scores themselves are checked above
@pytest.mark.parametrize("name", [*LAYOUTS, "image_folder"])
def test_vlzoo_eval_runs_every_folder_benchmark(tmp_path, capsys, name):
    from vlzoo.cli import main

    templates = tmp_path / "templates.txt"
    templates.write_text("a photo of a {}.\n")
    if name == "image_folder":
        root, chosen = _image_folder(tmp_path), benchmarks.image_folder(_image_folder(tmp_path))
    else:
        root = _layout(tmp_path, name)
        chosen = imagenet.IMAGENET_BENCHMARKS[name](root)
    out = tmp_path / "records.json"
    assert main(["eval", "--preset", "siglip_shapes", "--benchmark", name, "--data", str(root),
                 "--templates", str(templates), "--json", str(out)]) == 0
    record, = json.loads(out.read_text())
    want = benchmarks.evaluate_classification(_preset("siglip_shapes"), chosen, ["a photo of a {}."])
    assert record["dataset"] == name and record["task"] == "zeroshot_classification"
    assert record["metrics"] == want["metrics"] and f"| {name} | siglip_shapes |" in capsys.readouterr().out
    if name == "image_folder":
        (tmp_path / "two.txt").write_text("a\nb\n")
        assert main(["eval", "--preset", "siglip_shapes", "--benchmark", name, "--data", str(root),
                     "--classes", str(tmp_path / "two.txt")]) == 2
        assert "argument --classes: " in (err := capsys.readouterr().err) and "2 class names for the 3 class" in err
        assert main(["eval", "--preset", "siglip_shapes", "--benchmark", name, "--data", str(root),
                     "--classes", str(tmp_path / "absent.txt")]) == 2
        assert "argument --classes: file not found" in capsys.readouterr().err
    else:
        assert main(["eval", "--preset", "siglip_shapes", "--benchmark", name, "--data", str(root),
                     "--classes", str(templates)]) == 2
        assert "--classes is for image_folder" in capsys.readouterr().err

