"""vlzoo.evaluation: templates, recall@K by hand (several captions per image, ties), zero-shot against numpy
references and each family's own ensembling, dispatch, and the callbacks inside `fit`."""

import functools
import itertools
import math
import warnings

import keras
import numpy as np
import pytest
from backend_utils import run_once
from conftest import tiny_batch, to_numpy
from margins import DECISION_MARGIN, ranking_gap, shallow_towers
from keras import ops

import vlzoo
from vlzoo.evaluation import (
    DEFAULT_TEMPLATES, IMAGENET_TEMPLATES, SIMPLE_TEMPLATES, ClassTextsMethod, EmbeddingMean,
    EnsembleScoresMethod, RetrievalCallback, TokenSimilarityMean, ZeroShotCallback, build_prompts,
    recall_at_k, retrieval_recall, zero_shot_accuracy, zero_shot_classifier,
)
from vlzoo.evaluation.slots import slot_zero_shot_accuracy
from vlzoo.models import CLIP

CLASS_NAMES = ["red circle", "blue square", "green triangle", "yellow star", "purple cross", "orange ring"]
TEMPLATES = ("a photo of a {}.", "a drawing of the {}.", lambda name: f"{name}, small")
CAPTIONS = ["a red circle", "a small red circle", "a blue square", "two squares", "a green triangle",
            "a yellow star", "a purple cross", "an orange ring", "a big orange ring", "a ring"]
CAPTION_IMAGE_IDS = np.array([0, 0, 1, 1, 2, 3, 4, 5, 5, 5])


@functools.lru_cache(maxsize=None)
def preset(name):
    """Tiny models are random-initialised; one per preset for the module (not trained here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vlzoo.from_preset(name)


def images_of(n, seed=0):
    return np.random.default_rng(seed).normal(size=(n, 32, 32, 3)).astype("float32")


def class_texts(model, names=CLASS_NAMES, templates=TEMPLATES):
    """Tokenizer dict with `(C, K, T)` values, the input of the families' own ensembling methods."""
    tokens = model.tokenizer(build_prompts(names, templates))
    return {key: value.reshape(len(names), len(templates), -1) for key, value in tokens.items()}


def normalize(x, slot_dim=None):
    """L2 normalisation; per slot of width `slot_dim` (then divided by sqrt(L), as SPARO) when given."""
    x = np.asarray(x, np.float64)
    slot_dim = slot_dim or x.shape[-1]
    slots = x.reshape(x.shape[:-1] + (-1, slot_dim))
    slots = slots / np.maximum(np.linalg.norm(slots, axis=-1, keepdims=True), 1e-12) / np.sqrt(slots.shape[-2])
    return slots.reshape(x.shape)


def topk_reference(scores, labels, ks):
    order = np.argsort(-scores, axis=1, kind="stable")
    return {f"top{k}": float(np.mean([label in row[:k] for row, label in zip(order, labels)])) for k in ks}


def labels_from(scores):
    """Labels making the reference top-1 exactly 0.5: even images get their top class, odd their third."""
    order = np.argsort(-scores, axis=1)
    return np.where(np.arange(len(scores)) % 2 == 0, order[:, 0], order[:, 2])


# ------------------------------------------------------------------ templates


def test_templates_are_clips():
    assert len(IMAGENET_TEMPLATES) == len(set(IMAGENET_TEMPLATES)) == 80
    assert all(t.count("{}") == 1 for t in IMAGENET_TEMPLATES)
    assert (IMAGENET_TEMPLATES[0], IMAGENET_TEMPLATES[39], IMAGENET_TEMPLATES[-1]) == (
        "a bad photo of a {}.", "a photo of a {}.", "a tattoo of the {}.")
    assert len(SIMPLE_TEMPLATES) == 7 and set(SIMPLE_TEMPLATES) <= set(IMAGENET_TEMPLATES)
    assert DEFAULT_TEMPLATES == ("a photo of a {}.",)
    assert build_prompts(["cat", "dog"], ("a {}.", lambda c: c.upper())) == ["a cat.", "CAT", "a dog.", "DOG"]


@pytest.mark.parametrize("names, templates, error, match", [
    (["cat"], ("a photo",), ValueError, "exactly one"),
    (["cat"], ("a {} {}",), ValueError, "exactly one"),
    (["cat"], (3,), TypeError, "callables"),
    (["cat"], (), ValueError, "templates"),
    ("cat", ("a {}.",), ValueError, "class_names"),
    ([1], ("a {}.",), TypeError, "class_names"),
])
def test_build_prompts_errors(names, templates, error, match):
    with pytest.raises(error, match=match):
        build_prompts(names, templates)


# ------------------------------------------------------------- recall by hand

# 3 images, 6 captions: captions 0-1 describe image 0, 2-4 image 1, 5 image 2.
HAND_IDS = np.array([0, 0, 1, 1, 1, 2])
HAND_SCORES = np.array([
    [0.5, 0.2, 0.5, 0.1, 0.0, 0.3],  # best own caption 0.5 ties with caption 2's
    [0.9, 0.2, 0.4, 0.6, 0.2, 0.8],  # best own 0.6, behind 0.9 and 0.8
    [0.1, 0.1, 0.1, 0.1, 0.1, 0.1],  # constant row: all five negatives tie
], "float32")
# Negatives ahead of the best positive, per query (pessimistic counts equal scores, optimistic does not):
#   i2t rows:    pessimistic [1, 2, 5], optimistic [0, 2, 0]
#   t2i columns: pessimistic [1, 1, 1, 0, 0, 2], optimistic [1, 0, 1, 0, 0, 2]
HAND_EXPECTED = {
    "pessimistic": {"i2t_r@1": 0 / 3, "i2t_r@2": 1 / 3, "i2t_r@3": 2 / 3,
                    "t2i_r@1": 2 / 6, "t2i_r@2": 5 / 6, "t2i_r@3": 6 / 6},
    "optimistic": {"i2t_r@1": 2 / 3, "i2t_r@2": 2 / 3, "i2t_r@3": 3 / 3,
                   "t2i_r@1": 3 / 6, "t2i_r@2": 5 / 6, "t2i_r@3": 6 / 6},
}


class MatrixModel:
    """Duck-typed model: an image is its row index (pixel [0, 0, 0]), a text its column index
    (`token_ids[:, 0]`); `score` reads fixed matrices, `S_T` from `t2i` when given (as FILIP's `direction`)."""

    symmetric_score = True

    def __init__(self, i2t):
        self.i2t = i2t

    def encode_image(self, images):
        return np.asarray(images)[:, 0, 0, 0].astype(int)

    def encode_text(self, texts):
        return to_numpy(texts["token_ids"])[:, 0]

    def score(self, image_embeds, text_embeds):
        return self.i2t[np.ix_(to_numpy(image_embeds), to_numpy(text_embeds))]


class DirectionalMatrixModel(MatrixModel):
    symmetric_score = False

    def __init__(self, i2t, t2i):
        super().__init__(i2t)
        self.t2i = t2i

    def score(self, image_embeds, text_embeds, direction="i2t"):
        scores = self.i2t if direction == "i2t" else self.t2i
        return scores[np.ix_(to_numpy(image_embeds), to_numpy(text_embeds))]


def index_inputs(num_images, num_texts):
    images = np.broadcast_to(np.arange(num_images, dtype="float32")[:, None, None, None], (num_images, 1, 1, 3))
    return images, {"token_ids": np.arange(num_texts)[:, None]}


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic"])
def test_recall_at_k_by_hand(ties):
    result = recall_at_k(HAND_SCORES, HAND_IDS, ks=(3, 1, 2), ties=ties)
    assert list(result) == ["i2t_r@1", "i2t_r@2", "i2t_r@3", "t2i_r@1", "t2i_r@2", "t2i_r@3"]
    assert result == pytest.approx(HAND_EXPECTED[ties], abs=1e-12)
    # Streaming over blocks of images (the t2i side keeps only the max(ks) best negatives) is exact.
    images, texts = index_inputs(3, 6)
    for batch_size in (1, 2, 3):
        streamed = retrieval_recall(MatrixModel(HAND_SCORES), images, texts, HAND_IDS, ks=(1, 2, 3),
                                    batch_size=batch_size, ties=ties)
        assert streamed == pytest.approx(HAND_EXPECTED[ties], abs=1e-12)


def _expected_by_enumeration(scores, positive, k):
    """Mean over rows of the share of all orderings (ties broken every possible way) that put a positive
    in the top k: the definition of the "expected" rule, counted, not computed by its formula."""
    hits = []
    for row, pos in zip(scores, positive):
        orders = [order for order in itertools.permutations(range(len(row)))
                  if all(row[a] >= row[b] for a, b in zip(order, order[1:]))]
        hits.append(np.mean([any(pos[j] for j in order[:k]) for order in orders]))
    return float(np.mean(hits))


def test_recall_expected_ties_count_every_ordering_and_stream_exactly():
    # Integer scores of 3 levels: ties everywhere. 3 images x 6 captions (2 each), and 5 x 5, where a
    # caption's 4 negative images exceed the max(ks) = 3 the streamed t2i side keeps, so ties of its
    # positive can fall past the kept ones. Streaming in blocks of 1 and 3 images must not change a count.
    rng = np.random.default_rng(4)
    for num_images, ids in ((3, np.repeat(np.arange(3), 2)), (5, np.arange(5))):
        images, texts = index_inputs(num_images, len(ids))
        positive = ids[None, :] == np.arange(num_images)[:, None]
        for trial in range(3):
            scores = rng.integers(0, 3, size=(num_images, len(ids))).astype("float32")
            want = {}
            for k in (1, 2, 3):
                want[f"i2t_r@{k}"] = _expected_by_enumeration(scores, positive, k)
                want[f"t2i_r@{k}"] = _expected_by_enumeration(scores.T, positive.T, k)
            assert recall_at_k(scores, ids, ks=(1, 2, 3), ties="expected") == pytest.approx(want, abs=1e-12)
            for batch_size in (1, 3):
                streamed = retrieval_recall(MatrixModel(scores), images, texts, ids, ks=(1, 2, 3),
                                            batch_size=batch_size, ties="expected")
                assert streamed == pytest.approx(want, abs=1e-12), (num_images, trial, batch_size)


def test_recall_of_a_constant_model_is_chance_under_expected_ties():
    # 5 images, 3 captions each: a caption's image is 1 of 5 (K / 5); an image's 3 captions are among K of
    # 15 with probability 1 - C(12, K) / C(15, K).
    scores, ids = np.zeros((5, 15)), np.repeat(np.arange(5), 3)
    got = recall_at_k(scores, ids, ks=(1, 5, 10), ties="expected")
    want = {f"t2i_r@{k}": min(k / 5, 1.0) for k in (1, 5, 10)}
    want.update({f"i2t_r@{k}": 1 - math.comb(12, k) / math.comb(15, k) for k in (1, 5, 10)})
    assert got == pytest.approx(want, abs=1e-12)


def test_recall_one_caption_per_image_and_separate_t2i_scores():
    scores = np.array([[3.0, 1.0, 2.0], [0.0, 1.0, 5.0], [1.0, 4.0, 2.0]])
    # i2t: image 0 ranks its caption first, images 1 and 2 second (behind 5.0 and 4.0).
    # t2i: caption 0 ranks image 0 first; captions 1 and 2 rank theirs third (one tie, one higher).
    assert recall_at_k(scores, ks=(1, 2)) == pytest.approx(
        {"i2t_r@1": 1 / 3, "i2t_r@2": 1.0, "t2i_r@1": 1 / 3, "t2i_r@2": 1 / 3})
    t2i = np.eye(3)  # ranks every caption's image first
    expected = {"i2t_r@1": 1 / 3, "i2t_r@2": 1.0, "t2i_r@1": 1.0, "t2i_r@2": 1.0}
    assert recall_at_k(scores, ks=(1, 2), t2i_scores=t2i) == pytest.approx(expected)
    images, texts = index_inputs(3, 3)
    model = DirectionalMatrixModel(scores, t2i)
    assert retrieval_recall(model, images, texts, ks=(1, 2), batch_size=2) == pytest.approx(expected)


@pytest.mark.parametrize("kwargs, match", [
    (dict(image_ids=[0, 0, 1, 1, 1, 1]), "1 of the 3 images have none in `image_ids`: \\[2\\]"),
    (dict(image_ids=[0, 0, 1, 1, 1, 3]), "must lie in \\[0, 3\\)"),
    (dict(image_ids=[0, 0, 1, 1, 2]), "shape \\(N_texts,\\) = \\(6,\\)"),
    (dict(image_ids=np.array([0, 0, 1, 1, 1, 2.0])), "must be ints"),
    (dict(), "3 images and 6 captions"),
    (dict(image_ids=HAND_IDS, ties="random"), "ties"),
    (dict(image_ids=HAND_IDS, ks=(0, 1)), "ks"),
])
def test_recall_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        recall_at_k(HAND_SCORES, **kwargs)


def test_recall_rejects_non_finite_and_bad_shapes():
    with pytest.raises(ValueError, match="non-finite"):
        recall_at_k(np.array([[np.nan, 0.0], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="N_images, N_texts"):
        recall_at_k(np.zeros(3))
    with pytest.raises(ValueError, match="t2i_scores"):
        recall_at_k(np.eye(2), t2i_scores=np.eye(3))


# ------------------------------------------------------------ retrieval on models


def first_on_every_backend(names):
    """`names` as parameters: the first runs in every pass, the others in one (`run_once`). What these tests check
    is the evaluation's batching and bookkeeping (numpy around the model's encoders and `score`), the same code on
    every backend; each family's encoders and `score` are checked on every backend by the family tests, and each
    backend's path through this module by the first name. Each further shape a test feeds compiles the encoders
    again on JAX and traces them again on TensorFlow."""
    return [names[0], *(pytest.param(name, marks=run_once) for name in names[1:])]


@pytest.mark.parametrize("name", first_on_every_backend(["clip_tiny", "filip_tiny", "llip_tiny", "sparo_tiny"]))
def test_retrieval_recall_matches_model_similarity(name):
    model = preset(name)
    images = images_of(6, seed=1)
    tokens = model.tokenizer(CAPTIONS)
    kwargs = dict(slots=[0, 2]) if name == "sparo_tiny" else {}
    result = retrieval_recall(model, images, CAPTIONS, CAPTION_IMAGE_IDS, ks=(1, 2, 3), batch_size=4, **kwargs)
    if name == "filip_tiny":  # FILIP ranks captions with S_I and images with S_T
        i2t, t2i = (to_numpy(model.similarity(images, tokens, direction=d)) for d in ("i2t", "t2i"))
        assert not np.allclose(i2t, t2i)
    else:
        i2t = t2i = to_numpy(model.similarity(images, tokens, **kwargs))
    # Batches of 4 and one call rank alike: no two scores of a ranking within rounding of each other.
    assert min(ranking_gap(i2t, axis=1), ranking_gap(t2i, axis=0)) >= DECISION_MARGIN * np.abs(i2t).max()
    assert result == pytest.approx(recall_at_k(i2t, CAPTION_IMAGE_IDS, ks=(1, 2, 3), t2i_scores=t2i))
    # Token dicts are accepted as well as strings.
    assert retrieval_recall(model, images, tokens, CAPTION_IMAGE_IDS, ks=(1, 2, 3), **kwargs) == result


# ------------------------------------------------------------------- zero-shot


def embedding_mean_reference(model, images, names=CLASS_NAMES, templates=TEMPLATES, slots=None):
    """CLIP's ensembling in numpy from the model's raw embeddings: `(N, C)` scores."""
    text = model.encode_text(model.tokenizer(build_prompts(names, templates)))
    image = model.encode_image(images)
    text, image = to_numpy(text["embeds"]), to_numpy(image["embeds"])
    slot_dim = getattr(model, "slot_dim", None)
    if slots is not None:
        pick = lambda x: x.reshape(len(x), -1, slot_dim)[:, slots].reshape(len(x), -1)  # noqa: E731
        text, image = pick(text), pick(image)
    classes = normalize(normalize(text, slot_dim).reshape(len(names), len(templates), -1).mean(axis=1), slot_dim)
    bias = float(to_numpy(model.logit_bias)) if hasattr(model, "logit_bias") else 0.0
    return float(to_numpy(model.logit_scale_value())) * normalize(image, slot_dim) @ classes.T + bias


CLIP_LIKE = ["clip_tiny", "siglip_tiny", "sparc_tiny", "sparo_tiny", "stair_tiny"]


@pytest.mark.parametrize("name", first_on_every_backend(CLIP_LIKE))
def test_embedding_mean_matches_numpy(name):
    if name not in vlzoo.list_presets():
        pytest.skip(f"{name} is not registered")
    model = preset(name)
    images = images_of(8)
    reference = embedding_mean_reference(model, images)
    # batch_size=4 prompts: one class (3 templates) per text batch, so the class groups are concatenated.
    classifier = zero_shot_classifier(model, CLASS_NAMES, TEMPLATES, batch_size=4)
    assert isinstance(classifier.ensembling, EmbeddingMean)
    np.testing.assert_allclose(to_numpy(classifier(images)), reference, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(classifier.scores(images, batch_size=3), reference, rtol=1e-4, atol=1e-4)
    labels = labels_from(reference)
    # The classifier's float32 scores round the reference's (about 1e-6 of their scale, under the tolerance
    # above): with every ranking decided by DECISION_MARGIN of the scale, its rankings are the reference's.
    assert ranking_gap(reference) >= DECISION_MARGIN * np.abs(reference).max()
    expected = topk_reference(reference, labels, (1, 3, 5))
    assert expected["top1"] == 0.5 and expected["top3"] == 1.0
    assert classifier.accuracy(images, labels, top_k=(1, 3, 5), batch_size=3) == expected
    assert zero_shot_accuracy(model, images, labels, CLASS_NAMES, TEMPLATES, top_k=(5, 1, 3), batch_size=3) == expected


def test_filip_classifier_is_its_ensemble_scores():
    model = preset("filip_tiny")
    images = images_of(8)
    classifier = zero_shot_classifier(model, CLASS_NAMES, TEMPLATES, batch_size=4)
    assert isinstance(classifier.ensembling, TokenSimilarityMean)
    scores = to_numpy(classifier(images))
    scale = float(to_numpy(model.logit_scale_value()))
    own = scale * to_numpy(model.ensemble_scores(images, class_texts(model)))
    np.testing.assert_allclose(scores, own, rtol=1e-5, atol=1e-5)
    # FILIP averages similarities over templates, not embeddings: the mean of the per-template S_I.
    per_template = [to_numpy(model.similarity(images, model.tokenizer(build_prompts(CLASS_NAMES, (t,)))))
                    for t in TEMPLATES]
    np.testing.assert_allclose(scores, np.mean(per_template, axis=0), rtol=1e-5, atol=1e-5)
    labels = labels_from(own)
    assert ranking_gap(own) >= DECISION_MARGIN * np.abs(own).max()  # batches of 5 rank as one call
    assert classifier.accuracy(images, labels, top_k=(1, 3), batch_size=5) == topk_reference(own, labels, (1, 3))


def test_llip_classifier_is_its_ensemble_scores():
    model = preset("llip_tiny")
    images = images_of(8)
    classifier = zero_shot_classifier(model, CLASS_NAMES, TEMPLATES, batch_size=7)
    assert isinstance(classifier.ensembling, ClassTextsMethod)
    own = to_numpy(model.ensemble_scores(images, class_texts(model)))
    np.testing.assert_allclose(to_numpy(classifier(images)), own, rtol=1e-5, atol=1e-5)
    # Score arguments reach the family's score: Llip's cross-attention temperature.
    cold = zero_shot_classifier(model, CLASS_NAMES, TEMPLATES, temperature=0.5)
    cold_own = to_numpy(model.ensemble_scores(images, class_texts(model), temperature=0.5))
    np.testing.assert_allclose(to_numpy(cold(images)), cold_own, rtol=1e-5, atol=1e-5)
    assert not np.allclose(cold_own, own)
    labels = labels_from(own)
    assert ranking_gap(own) >= DECISION_MARGIN * np.abs(own).max()
    assert classifier.accuracy(images, labels, top_k=(1, 2), batch_size=3) == topk_reference(own, labels, (1, 2))


def test_sparo_slot_restriction():
    model = preset("sparo_tiny")
    images = images_of(8)
    slots = [3, 1]
    reference = embedding_mean_reference(model, images, slots=[1, 3])
    classifier = zero_shot_classifier(model, CLASS_NAMES, TEMPLATES, slots=slots)
    np.testing.assert_allclose(to_numpy(classifier(images)), reference, rtol=1e-4, atol=1e-4)
    assert not np.allclose(reference, embedding_mean_reference(model, images), atol=1e-3)
    # One slot at a time: the same accuracies as SPARO's own per-slot selection criterion.
    labels = labels_from(embedding_mean_reference(model, images))
    # Each slot's scores rank the classes with a margin: both paths rank alike.
    for slot in range(model.num_slots):
        single = embedding_mean_reference(model, images, slots=[slot])
        assert ranking_gap(single) >= DECISION_MARGIN * np.abs(single).max(), slot
    own = to_numpy(slot_zero_shot_accuracy(model, images, labels, class_texts(model)))
    ours = [zero_shot_accuracy(model, images, labels, CLASS_NAMES, TEMPLATES, top_k=1, slots=[slot])["top1"]
            for slot in range(model.num_slots)]
    np.testing.assert_allclose(ours, own, atol=1e-6)


class MaxTemplateCLIP(CLIP):
    """A CLIP with its own `ensemble_scores` (the best template per class), which its ensembling names."""

    family = "max_template_clip"
    ensembling = EnsembleScoresMethod()

    @property
    def prompt_ensembling(self):
        return self.ensembling

    def ensemble_scores(self, images, class_texts):
        c, k, t = class_texts["token_ids"].shape
        flat = {key: ops.reshape(value, (c * k, t)) for key, value in class_texts.items()}
        return ops.max(ops.reshape(self.similarity(images, flat), (-1, c, k)), axis=2)


def test_dispatch(monkeypatch):
    expected = {"clip_tiny": EmbeddingMean, "siglip_tiny": EmbeddingMean, "sparo_tiny": EmbeddingMean,
                "sparc_tiny": EmbeddingMean, "filip_tiny": TokenSimilarityMean, "llip_tiny": ClassTextsMethod}
    for name, cls in expected.items():
        assert type(preset(name).prompt_ensembling) is cls, name
    # Every family's mean is over its global embedding "embeds": the class representation is `{"embeds": (C, D)}`.
    for name in ("sparc_tiny", "clip_tiny"):
        classes = preset(name).prompt_ensembling.encode_classes(preset(name), class_texts(preset(name)))
        assert set(classes) == {"embeds"}
        assert tuple(classes["embeds"].shape) == (len(CLASS_NAMES), preset(name).embed_dim)

    # A model's own `ensemble_scores`, when its `prompt_ensembling` names it...
    model = MaxTemplateCLIP.from_config(preset("clip_tiny").get_config())
    images = images_of(4)
    per_template = [to_numpy(model.similarity(images, model.tokenizer(build_prompts(CLASS_NAMES, (t,)))))
                    for t in TEMPLATES]
    classifier = zero_shot_classifier(model, CLASS_NAMES, TEMPLATES, batch_size=4)
    assert isinstance(classifier.ensembling, EnsembleScoresMethod)
    np.testing.assert_allclose(to_numpy(classifier(images)), np.max(per_template, axis=0), rtol=1e-5, atol=1e-5)
    # ... and another ensembling of the same model gives that ensembling's scores.
    monkeypatch.setattr(model, "ensembling", EmbeddingMean())
    np.testing.assert_allclose(to_numpy(zero_shot_classifier(model, CLASS_NAMES, TEMPLATES)(images)),
                               embedding_mean_reference(model, images), rtol=1e-4, atol=1e-4)
    # A family whose score needs more than the global embedding (FILIP's tokens), given the embedding mean,
    # gets a clear error naming the argument.
    filip = preset("filip_tiny")
    monkeypatch.setattr(type(filip), "prompt_ensembling", EmbeddingMean())
    with pytest.raises(TypeError, match=r"`text_embeds` must be the dict returned by `FILIP.encode_text`"):
        zero_shot_classifier(filip, CLASS_NAMES, TEMPLATES)(images)


def test_zero_shot_ties():
    model = preset("clip_tiny")
    images = images_of(8)
    names = ["red circle", "red circle", "blue square"]  # classes 0 and 1 tie exactly
    classifier = zero_shot_classifier(model, names, TEMPLATES)
    scores = classifier.scores(images)
    np.testing.assert_array_equal(scores[:, 0], scores[:, 1])
    labels = np.zeros(8, "int64")
    assert classifier.accuracy(images, labels, top_k=(1, 2), ties="pessimistic") == {
        "top1": 0.0, "top2": float(np.mean(scores[:, 0] > scores[:, 2]))}
    assert classifier.accuracy(images, labels, top_k=(1, 3), ties="optimistic") == {
        "top1": float(np.mean(scores[:, 0] >= scores[:, 2])), "top3": 1.0}


def test_zero_shot_errors_and_progress(capsys):
    model = preset("clip_tiny")
    images = images_of(4)
    classifier = zero_shot_classifier(model, CLASS_NAMES[:3], TEMPLATES)
    for labels, match in [(np.zeros(3, "int64"), "shape \\(N,\\) = \\(4,\\)"),
                          (np.array([0, 1, 2, 3]), "must lie in \\[0, 3\\)"),
                          (np.zeros(4, "float32"), "must be ints")]:
        with pytest.raises(ValueError, match=match):
            classifier.accuracy(images, labels)
    with pytest.raises(ValueError, match="top_k"):
        classifier.accuracy(images, np.zeros(4, "int64"), top_k=0)
    with pytest.raises(ValueError, match="ties"):
        zero_shot_accuracy(model, images, np.zeros(4, "int64"), CLASS_NAMES, ties="first")
    with pytest.raises(ValueError, match="\\(N, H, W, 3\\)"):
        classifier.accuracy(images[0], np.zeros(32, "int64"))
    with pytest.raises(ValueError, match="batch_size"):
        zero_shot_classifier(model, CLASS_NAMES, TEMPLATES, batch_size=0)
    capsys.readouterr()
    classifier.accuracy(images, np.zeros(4, "int64"), batch_size=2, verbose=True)
    assert "2/2" in capsys.readouterr().out


# ------------------------------------------------------------------- callbacks


def test_callbacks_log_into_history():
    # One block per tower (`shallow_towers`): what the callbacks log does not depend on the depth, and tracing `fit`'s
    # step and the encoders (TensorFlow) or compiling them (JAX) grows with it.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vlzoo.from_preset("clip_tiny", **shallow_towers("clip"))
    model.compile(optimizer=keras.optimizers.Adam(1e-3))
    images = images_of(6, seed=2)
    labels = np.array([0, 1, 2, 3, 4, 5])
    zero_shot = ZeroShotCallback(images, labels, CLASS_NAMES, TEMPLATES, top_k=(1, 2), batch_size=4)
    retrieval = RetrievalCallback(images, CAPTIONS, CAPTION_IMAGE_IDS, every_n_epochs=2, ks=(1, 5))
    train = tiny_batch(batch_size=8, vocabulary_size=49408, sequence_length=16)
    history = model.fit(train, batch_size=4, epochs=2, verbose=0, shuffle=False,
                        callbacks=[zero_shot, retrieval]).history
    assert len(history["loss"]) == len(history["val_zeroshot_top1"]) == len(history["val_zeroshot_top2"]) == 2
    assert set(history) >= {"val_i2t_r@1", "val_i2t_r@5", "val_t2i_r@1", "val_t2i_r@5"}
    assert all(len(history[f"val_{d}_r@{k}"]) == 1 for d in ("i2t", "t2i") for k in (1, 5))
    # The logged values are those of the trained model at the end of the last epoch, computed in other batches
    # than below: the trained model's scores rank with a margin, so both computations rank alike.
    scores = to_numpy(zero_shot_classifier(model, CLASS_NAMES, TEMPLATES)(images))
    similarity = to_numpy(model.similarity(images, model.tokenizer(CAPTIONS)))
    for values, axis in ((scores, 1), (similarity, 1), (similarity, 0)):
        assert ranking_gap(values, axis) >= DECISION_MARGIN * np.abs(values).max()
    assert history["val_zeroshot_top1"][-1] == zero_shot_accuracy(
        model, images, labels, CLASS_NAMES, TEMPLATES, top_k=1)["top1"]
    recall = retrieval_recall(model, images, CAPTIONS, CAPTION_IMAGE_IDS, ks=(1, 5))
    assert {f"val_{name}": value for name, value in recall.items()} == {
        name: history[name][-1] for name in history if "_r@" in name}


def test_callback_argument_errors():
    images, labels = images_of(2), np.array([0, 1])
    with pytest.raises(ValueError, match="every_n_epochs"):
        ZeroShotCallback(images, labels, CLASS_NAMES, every_n_epochs=0)
    with pytest.raises(ValueError, match="exactly one"):
        ZeroShotCallback(images, labels, CLASS_NAMES, templates=("a photo",))
    with pytest.raises(ValueError, match="ks"):
        RetrievalCallback(images, CAPTIONS[:2], ks=())
