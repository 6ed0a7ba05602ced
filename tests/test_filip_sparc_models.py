"""FILIP and SPARC models: forward against numpy, family scores and losses, training, persistence."""

import math

import keras
import numpy as np
import pytest
import reference
import reference_token_losses as ref_tok
import reference_towers as ref
from conftest import fit_and_measure, tiny_batch, to_numpy
from margins import assert_decision_margin

import vlzoo
from vlzoo.losses import filip_loss, filip_similarity, sparc_loss
from vlzoo.models import FILIP, SPARC

PRESETS = {"filip": "filip_tiny", "sparc": "sparc_tiny"}
# The tiny presets have the CLIP BPE vocabulary (49408) and context 16; the
# batch below uses ids < 64 and T = 12 (one shape everywhere: JAX compiles
# each op once per shape).
BATCH = dict(batch_size=4, sequence_length=12)
# The NumPy towers' features differ from the model's by up to 2e-5: FILIP's token dropping and SPARC's threshold,
# whose values jump at their boundaries, must be decided alike by both (ten times that margin, tests/margins.py).
# The batch of the two NumPy comparisons keeps it on every backend (at least 8e-4 with seed 2; seed 0 put a
# SPARC similarity 2.5e-5 from its threshold on JAX).
REFERENCE_MARGIN = 2e-4
REFERENCE_BATCH = dict(BATCH, seed=2)


def _model(family, **overrides):
    return vlzoo.from_preset(PRESETS[family], load_weights=False, **overrides)


def _scale(model):
    return math.exp(float(to_numpy(model.logit_scale)))


def _numpy_features(model, batch):
    """Projected image/text tokens and global embeddings, computed in numpy from the weights."""
    _, vis = ref.vision_forward(batch["images"], model.vision)
    _, txt = ref.text_forward(batch["token_ids"], batch["padding_mask"], model.text)
    vis = vis[:, model.vision.num_prefix_tokens:]
    img_tokens = ref.dense(vis, model.image_projection)
    txt_tokens = ref.dense(txt, model.text_projection)
    if getattr(model, "vision_head", None) is not None:
        hidden = ref.activation(ref.dense(vis.mean(1), model.vision_head), "gelu")
        img_global = ref.dense(hidden, model.image_projection)
    else:
        img_global = img_tokens.mean(1)
    return img_tokens, txt_tokens, img_global, ref_tok.masked_mean(txt_tokens, batch["padding_mask"])


def test_filip_forward_scores_and_loss_match_numpy():
    model = _model("filip")
    batch = tiny_batch(**REFERENCE_BATCH)
    img_tokens, txt_tokens, img_global, txt_global = _numpy_features(model, batch)
    image, text = model.encode_image(batch["images"]), model.encode_text(batch)
    assert set(image) == {"embeds", "tokens"} and set(text) == {"embeds", "tokens", "mask"}
    assert tuple(image["tokens"].shape) == (4, 16, 16)  # P = 16 patches, CLS left out
    np.testing.assert_allclose(to_numpy(image["tokens"]), img_tokens, atol=2e-5)
    np.testing.assert_allclose(to_numpy(text["tokens"]), txt_tokens, atol=2e-5)
    np.testing.assert_allclose(to_numpy(image["embeds"]), img_global, atol=2e-5)
    np.testing.assert_allclose(to_numpy(text["embeds"]), txt_global, atol=2e-5)
    np.testing.assert_array_equal(to_numpy(text["mask"]), batch["padding_mask"])

    scale = _scale(model)
    s_i, s_t = ref_tok.filip_similarity(img_tokens, txt_tokens, batch["padding_mask"])
    sim = to_numpy(model.similarity(batch["images"], batch))
    np.testing.assert_allclose(sim, scale * s_i, atol=1e-4)
    # The model's score is exactly the loss module's on its own tokens.
    own_i, own_t = filip_similarity(image["tokens"], text["tokens"], text["mask"])
    np.testing.assert_allclose(sim, scale * to_numpy(own_i), atol=1e-6)
    np.testing.assert_allclose(to_numpy(model.score(image, text, direction="t2i")), scale * to_numpy(own_t),
                               atol=1e-6)
    assert not np.allclose(s_i, s_t)

    outputs = model(batch)
    eval_loss = float(to_numpy(model.compute_loss(y_pred=outputs, training=False)))
    assert abs(eval_loss - ref_tok.filip_loss(img_tokens, txt_tokens, batch["padding_mask"], scale)) < 1e-4

    # keep_ratio (0.5 in filip_tiny) applies in training only.
    assert model.keep_ratio == 0.5
    assert_decision_margin(model, batch, margin=REFERENCE_MARGIN, gradients=False)
    train_loss = float(to_numpy(model.compute_loss(y_pred=outputs, training=True)))
    expected = ref_tok.filip_loss_dropped(img_tokens, txt_tokens, batch["padding_mask"], scale, 0.5)
    assert abs(train_loss - expected) < 1e-4
    assert abs(train_loss - eval_loss) > 1e-3
    unselected = float(to_numpy(filip_loss(outputs["image_tokens"], outputs["text_tokens"],
                                           outputs["text_mask"], outputs["logit_scale"])))
    assert abs(eval_loss - unselected) < 1e-6


def test_sparc_forward_scores_and_loss_match_numpy():
    model = _model("sparc")
    batch = tiny_batch(**REFERENCE_BATCH)
    assert model.vision.num_prefix_tokens == 0 and model.vision_head is not None
    img_tokens, txt_tokens, img_global, txt_global = _numpy_features(model, batch)
    image, text = model.encode_image(batch["images"]), model.encode_text(batch)
    np.testing.assert_allclose(to_numpy(image["tokens"]), img_tokens, atol=2e-5)
    np.testing.assert_allclose(to_numpy(text["tokens"]), txt_tokens, atol=2e-5)
    np.testing.assert_allclose(to_numpy(image["embeds"]), img_global, atol=2e-5)
    # Global text embedding = masked mean of the projected tokens (g_t is linear).
    np.testing.assert_allclose(to_numpy(text["embeds"]), txt_global, atol=2e-5)
    np.testing.assert_allclose(
        to_numpy(text["embeds"]), ref_tok.masked_mean(to_numpy(text["tokens"]), batch["padding_mask"]), atol=1e-6)

    scale = _scale(model)
    np.testing.assert_allclose(to_numpy(model.similarity(batch["images"], batch)),
                               reference.clip_logits(img_global, txt_global, scale), atol=1e-4)

    assert_decision_margin(model, batch, margin=REFERENCE_MARGIN, gradients=False)
    outputs = model(batch)
    loss = float(to_numpy(model.compute_loss(y_pred=outputs, training=False)))
    expected = (0.5 * reference.clip_loss(img_global, txt_global, scale)
                + 1.0 * ref_tok.sparc_fine_grained_loss(img_tokens, txt_tokens, batch["padding_mask"], scale))
    assert abs(loss - expected) < 1e-4
    # Same value in training (no train-only behaviour), and the loss module on the outputs.
    assert abs(float(to_numpy(model.compute_loss(y_pred=outputs, training=True))) - loss) < 1e-6
    direct = sparc_loss(outputs["image_embeds"], outputs["text_embeds"], outputs["image_tokens"],
                        outputs["text_tokens"], outputs["text_mask"], outputs["logit_scale"])
    assert abs(float(to_numpy(direct)) - loss) < 1e-6

    # Without h_v the global image embedding is the mean of the projected patches.
    plain = _model("sparc", global_vision_head=False, lambda_global=2.0, lambda_fine=0.0)
    image = plain.encode_image(batch["images"])
    np.testing.assert_allclose(to_numpy(image["embeds"]), to_numpy(image["tokens"]).mean(1), atol=1e-6)
    out = plain(batch)
    only_global = float(to_numpy(plain.compute_loss(y_pred=out)))
    expected = 2.0 * reference.clip_loss(to_numpy(out["image_embeds"]), to_numpy(out["text_embeds"]), _scale(plain))
    assert abs(only_global - expected) < 1e-4


@pytest.mark.parametrize("family", ["filip", "sparc"])
def test_padding_content_does_not_change_scores_or_loss(family):
    model = _model(family)
    batch = tiny_batch(**BATCH)
    other = dict(batch)
    rng = np.random.default_rng(5)
    other["token_ids"] = np.where(batch["padding_mask"], batch["token_ids"],
                                  rng.integers(1, 63, size=batch["token_ids"].shape)).astype("int32")
    assert not np.array_equal(other["token_ids"], batch["token_ids"])
    np.testing.assert_allclose(to_numpy(model.similarity(batch["images"], other)),
                               to_numpy(model.similarity(batch["images"], batch)), atol=1e-5)
    a = float(to_numpy(model.compute_loss(y_pred=model(batch), training=False)))
    b = float(to_numpy(model.compute_loss(y_pred=model(other), training=False)))
    assert abs(a - b) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("family", ["filip", "sparc"])
def test_fit_lowers_the_loss(family):
    keras.utils.set_random_seed(0)
    model = _model(family)
    before, after = fit_and_measure(model, tiny_batch(batch_size=8, seed=1, sequence_length=12))
    assert after < 0.6 * before, (before, after)


@pytest.mark.parametrize("family", ["filip", "sparc"])
def test_save_load_round_trip_and_config(family, tmp_path):
    model = _model(family)
    batch = tiny_batch(**BATCH)
    model.save_to_preset(tmp_path / family)
    loaded = vlzoo.from_preset(str(tmp_path / family))
    assert type(loaded) is type(model)
    for a, b in zip(model.weights, loaded.weights):
        assert a.path == b.path
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    np.testing.assert_array_equal(to_numpy(loaded.similarity(batch["images"], batch)),
                                  to_numpy(model.similarity(batch["images"], batch)))
    assert loaded.get_config() == model.get_config()
    tokens = loaded.tokenizer(["a red circle"])
    assert tuple(tokens["token_ids"].shape) == (1, 16)

    cls = {"filip": FILIP, "sparc": SPARC}[family]
    overrides = (dict(num_chunks=3, keep_ratio=0.25, interaction_include_cls=True, selection_group_size=2)
                 if family == "filip" else
                 dict(lambda_global=0.25, lambda_fine=5.0, threshold=0.1, reduction="samples",
                      global_vision_head=False, text_pool="mean"))
    config = {**model.get_config(), **overrides}
    rebuilt = cls.from_config(config)
    assert rebuilt.get_config() == config
    for key, value in overrides.items():
        assert getattr(rebuilt, key) == value


def test_filip_options_change_the_computation():
    batch = tiny_batch(**BATCH)
    model = _model("filip", num_chunks=3)  # blocks of 2 of the 4 texts
    reference_model = _model("filip")
    reference_model.set_weights(model.get_weights())
    np.testing.assert_allclose(to_numpy(model.similarity(batch["images"], batch)),
                               to_numpy(reference_model.similarity(batch["images"], batch)), atol=1e-5)
    with_cls = _model("filip", interaction_include_cls=True)
    assert tuple(with_cls.encode_image(batch["images"])["tokens"].shape) == (4, 17, 16)
    with pytest.raises(ValueError, match="keep_ratio"):
        _model("filip", keep_ratio=0.0)
    # A SPARC ViT with a CLS token (a SPARC started from CLIP) attends to it but leaves it
    # out of the patch set and the mean pool: P = 16 patches, checked against numpy.
    sparc_cls = _model("sparc", vision={"num_prefix_tokens": 1})
    img_tokens, _, img_global, _ = _numpy_features(sparc_cls, batch)
    image = sparc_cls.encode_image(batch["images"])
    assert tuple(image["tokens"].shape) == (4, 16, 16)
    np.testing.assert_allclose(to_numpy(image["tokens"]), img_tokens, atol=2e-5)
    np.testing.assert_allclose(to_numpy(image["embeds"]), img_global, atol=2e-5)


# Published geometry: FILIP counts of the paper (CLS and LNs kept).
FILIP_SPEC_COUNTS = {"filip_vit_b32": 150.95e6, "filip_vit_l14": 426.70e6, "filip_vit_b16": 149.29e6}


@pytest.mark.parametrize("name", sorted(FILIP_SPEC_COUNTS))
def test_filip_parameter_counts_match_the_spec(name):
    count = vlzoo.preset_info(name)["params"]
    assert abs(count - FILIP_SPEC_COUNTS[name]) < 0.01e6, count


@pytest.mark.parametrize("name,patches", [("sparc_vit_b32", 49), ("sparc_vit_b16", 196), ("sparc_vit_l14", 256),
                                          ("filip_vit_b32", 49), ("filip_vit_l14", 256)])
def test_big_preset_geometry(name, patches):
    config = vlzoo.presets.model_config(name)["config"]
    vision, text = config["vision"], config["text"]
    assert (vision["image_size"] // vision["patch_size"]) ** 2 == patches
    if name.startswith("sparc"):
        assert config["embed_dim"] == 512 and text["sequence_length"] == 55
        assert (text["num_layers"], text["hidden_dim"], text["num_heads"]) == (12, 768, 12)
        assert vision.get("num_prefix_tokens", 0) == 0
        assert "CLIP BPE" in vlzoo.preset_info(name)["description"]
    else:
        assert config["embed_dim"] == 256 and text["sequence_length"] == 77
