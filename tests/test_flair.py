"""FLAIR against the authors' code (golden fixture), its caption sampling, loss and converter.

`tests/fixtures/flair/` holds a small random model of the authors' `FLAIR` class
(ExplainableML/flair at 0f9ce05), its inputs (three images, two captions each) and
what their code returns, written by `tests/fixtures/flair/make_fixture.py` (see the
fixture's README). Every value compared here comes from their code or from a
numpy reference written in this file.
"""

import itertools
import json
import pathlib

import keras
import numpy as np
import pytest
from backend_utils import run_once
from conftest import to_numpy

import vlzoo
from vlzoo.convert.flair import _rules, from_flair_checkpoint
from vlzoo.layers import TextConditionedPooling
from vlzoo.losses import flair_caption_indices, flair_loss, flair_pair_logits

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "flair"
ATOL = 1e-5  # float32; logits up to 16 in magnitude, losses up to 18; rtol 0


def load():
    """(authors' FLAIR arguments and settings, state dict, inputs, outputs)."""
    config = json.loads((FIXTURE / "config.json").read_text())
    return (config, *(dict(np.load(FIXTURE / f"{name}.npz")) for name in ("state_dict", "inputs", "outputs")))


def overrides(config):
    """`from_preset("flair_tiny", **overrides)` arguments giving the fixture's architecture."""
    arguments = config["flair_arguments"]
    v, t = arguments["vision_cfg"], arguments["text_cfg"]
    return dict(
        vision=dict(image_size=v["image_size"], patch_size=v["patch_size"], hidden_dim=v["width"],
                    num_layers=v["layers"], num_heads=v["width"] // v["head_width"], intermediate_dim=4 * v["width"]),
        text=dict(vocabulary_size=t["vocab_size"], sequence_length=t["context_length"], hidden_dim=t["width"],
                  num_layers=t["layers"], num_heads=t["heads"], intermediate_dim=4 * t["width"]),
        embed_dim=arguments["embed_dim"], num_heads=8, init_logit_bias=arguments["init_logit_bias"],
    )


def vlzoo_inputs(inputs):
    """Images NCHW -> NHWC; token ids with their padding mask (open_clip pads with 0)."""
    ids = inputs["token_ids"]
    return np.transpose(inputs["images_nchw"], (0, 2, 3, 1)), {"token_ids": ids, "padding_mask": ids != 0}


def reference_caption_indices(offsets, k):
    """The authors' rule, written from their `downsample_text_features`: each image's own K caption rows and
    row `j*K + offset` of every other image `j`, sorted."""
    b = offsets.shape[0]
    rows = []
    for i in range(b):
        others = [j for j in range(b) if j != i]
        picked = [j * k + offsets[i, c] for c, j in enumerate(others)]
        rows.append(sorted([i * k + m for m in range(k)] + picked))
    return np.array(rows)


def reference_loss(conditioned_all, global_all, bias, offsets, k, use_global):
    """FLAIR's loss in numpy from the all-pairs logits: TCS over each image's sampled captions (labels +1 on its
    own), divided by their number; MPS over all captions divided by their number; averaged."""
    b = conditioned_all.shape[0]
    indices = reference_caption_indices(offsets, k)

    def minus_log_sigmoid(x):
        return np.logaddexp(0.0, -x)

    tcs = 0.0
    for i in range(b):
        for j in indices[i]:
            tcs += minus_log_sigmoid((1 if j // k == i else -1) * conditioned_all[i, j])
    tcs /= indices.shape[1]
    if not use_global:
        return tcs
    labels = np.where(np.arange(b * k)[None] // k == np.arange(b)[:, None], 1.0, -1.0)
    mps = minus_log_sigmoid(labels * (global_all + bias)).sum() / (b * k)
    return (tcs + mps) / 2


@pytest.fixture(scope="module")
def fixture():
    return load()


@pytest.fixture(scope="module")
def converted(fixture):
    config, state_dict, _, _ = fixture
    return from_flair_checkpoint(state_dict, "flair_tiny", **overrides(config))


# ----------------------------------------------------------------------------- the authors' code


def test_embeddings_and_scores_match_the_authors(fixture, converted):
    _, _, inputs, outputs = fixture
    images, texts = vlzoo_inputs(inputs)
    image, text = converted.encode_image(images), converted.encode_text(texts)
    np.testing.assert_allclose(to_numpy(image["embeds"]), outputs["image_features"], atol=ATOL, rtol=0)
    np.testing.assert_allclose(to_numpy(image["tokens"]), outputs["image_tokens"], atol=ATOL, rtol=0)
    np.testing.assert_allclose(to_numpy(text["embeds"]), outputs["text_features"], atol=ATOL, rtol=0)
    # `get_logits`: every image pooled by every caption, bias included.
    np.testing.assert_allclose(to_numpy(converted.score(image, text)), outputs["conditioned_logits"], atol=ATOL,
                               rtol=0)
    # `get_logits_as_clip`: global embeddings, no bias.
    bias = float(outputs["logit_bias"])
    np.testing.assert_allclose(to_numpy(converted.score(image, text, mode="global")) - bias,
                               outputs["global_logits"], atol=ATOL, rtol=0)
    converted.num_chunks = 4  # blocks of 2 of the 6 texts
    try:
        np.testing.assert_allclose(to_numpy(converted.score(image, text)), outputs["conditioned_logits"], atol=ATOL,
                                   rtol=0)
    finally:
        converted.num_chunks = None


def _copy(model, **config):
    """A FLAIR of `model`'s config with `config`'s entries, `model`'s weights."""
    copy = vlzoo.FLAIR.from_config({**model.get_config(), **config})
    copy.set_weights(model.get_weights())
    return copy


def test_num_chunks_with_a_padded_last_block_scores_as_one_block_and_round_trips(fixture, converted):
    """`num_chunks=3` over 8 texts plans blocks of 3, the last one padded: the scores of one block. The
    setting round-trips through the config (a saved model)."""
    _, _, inputs, _ = fixture
    images, _ = vlzoo_inputs(inputs)
    chunked = _copy(converted, num_chunks=3)
    assert vlzoo.FLAIR.from_config(chunked.get_config()).get_config() == chunked.get_config()
    image = converted.encode_image(images)
    eight = {"embeds": np.random.default_rng(0).normal(size=(8, converted.embed_dim)).astype("float32")}
    np.testing.assert_allclose(to_numpy(chunked.score(image, eight)), to_numpy(converted.score(image, eight)),
                               atol=ATOL, rtol=0)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="a number of texts unknown while tracing")
def test_num_chunks_scores_a_number_of_texts_unknown_while_tracing(fixture, converted):
    import tensorflow as tf

    _, _, inputs, outputs = fixture
    images, texts = vlzoo_inputs(inputs)
    image, text = converted.encode_image(images), converted.encode_text(texts)
    chunked = _copy(converted, num_chunks=4)  # 4 blocks of ceil(N / 4) texts, N a tensor
    score = tf.function(lambda embeds: chunked.score(image, {"embeds": embeds}),
                        input_signature=[tf.TensorSpec((None, converted.embed_dim), tf.float32)])
    np.testing.assert_allclose(to_numpy(score(text["embeds"])), outputs["conditioned_logits"], atol=ATOL, rtol=0)


def _layer_norm(x, layer):
    gamma, beta = (to_numpy(w).astype(np.float64) for w in (layer.gamma, layer.beta))
    mean, variance = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + layer.epsilon) * gamma + beta


def _dense(x, layer):
    return x @ to_numpy(layer.kernel).astype(np.float64) + to_numpy(layer.bias).astype(np.float64)


def test_text_attention_maps_are_the_weights_the_pooling_mixes_with(fixture, converted):
    """numpy reference of the authors' attention (LayerNorm'd, biased projections, per-head scaled dot
    products, softmax with a zero slot), averaged over the heads; the per-head weights pool the values into
    `contextualize`'s embeddings, which match the authors' scores above."""
    _, _, inputs, _ = fixture
    images, texts = vlzoo_inputs(inputs)
    maps = to_numpy(converted.text_attention_maps(images, texts))
    pool = converted.text_pooling
    tokens = to_numpy(converted.encode_image(images)["tokens"]).astype(np.float64)
    captions = to_numpy(converted.encode_text(texts)["embeds"]).astype(np.float64)
    heads, width = pool.num_heads, pool.head_dim
    q = _dense(_layer_norm(captions, pool.q_norm), pool.query).reshape(len(captions), heads, width)
    k = _dense(_layer_norm(tokens, pool.k_norm), pool.key).reshape(*tokens.shape[:2], heads, width)
    v = _dense(_layer_norm(tokens, pool.v_norm), pool.value).reshape(*tokens.shape[:2], heads, width)
    logits = np.einsum("smd,npmd->nsmp", q, k) / np.sqrt(width)
    logits = np.concatenate([logits, np.zeros(logits.shape[:-1] + (1,))], axis=-1)
    weights = np.exp(logits - logits.max(-1, keepdims=True))
    weights = (weights / weights.sum(-1, keepdims=True))[..., :-1]  # the zero slot's share left out
    assert maps.shape == (len(images), len(captions), tokens.shape[1]) and maps.dtype == np.float32
    # The logits stay under 3 in magnitude and the weights under 0.33: float32 rounding moves a weight by
    # about 1e-7 at most (seen 2.5e-8 on all three backends).
    np.testing.assert_allclose(maps, weights.mean(axis=2), atol=1e-6, rtol=0)
    assert np.all(maps.sum(-1) < 1.0)  # the slot always takes a share
    mixed = np.einsum("nsmp,npmd->nsmd", weights, v).reshape(len(images), len(captions), heads * width)
    np.testing.assert_allclose(to_numpy(converted.contextualize(images, texts)), _dense(mixed, pool.output_dense),
                               atol=ATOL, rtol=0)


def test_loss_matches_the_authors(fixture, converted):
    """The fixture's draw of captions (`offsets`, the authors' `torch.randint`) gives their `FlairLoss`, and the
    model's own training loss is the loss of one of the 2^6 possible draws."""
    config, _, inputs, outputs = fixture
    k = config["num_captions"]
    images, texts = vlzoo_inputs(inputs)
    image, text = converted.encode_image(images), converted.encode_text(texts)
    rows = flair_caption_indices(outputs["offsets"], k)
    np.testing.assert_array_equal(to_numpy(rows), reference_caption_indices(outputs["offsets"], k))
    sampled = to_numpy(text["embeds"])[to_numpy(rows)]
    scale = converted.logit_scale_value()
    conditioned = flair_pair_logits(converted.text_pooling(sampled, image["tokens"]), sampled, scale,
                                    converted.logit_bias)
    overall = vlzoo.losses.siglip_logits(image["embeds"], text["embeds"], scale, converted.logit_bias)
    np.testing.assert_allclose(float(to_numpy(flair_loss(conditioned, k, overall))), outputs["loss_mps_true"],
                               atol=ATOL, rtol=0)
    np.testing.assert_allclose(float(to_numpy(flair_loss(conditioned, k))), outputs["loss_mps_false"], atol=ATOL,
                               rtol=0)

    batch = {"images": images, **{key: value.reshape(3, k, -1) for key, value in texts.items()}}
    model_loss = float(to_numpy(converted.compute_loss(y_pred=converted(batch), training=True)))
    bias = float(outputs["logit_bias"])
    candidates = [
        reference_loss(outputs["conditioned_logits"], outputs["global_logits"], bias, np.reshape(draw, (3, 2)), k,
                       True)
        for draw in itertools.product(range(k), repeat=6)
    ]
    assert min(abs(model_loss - c) for c in candidates) < ATOL, (model_loss, sorted(candidates)[:4])
    # The fixture's own draw, through the reference: the numpy loss is the authors'.
    np.testing.assert_allclose(reference_loss(outputs["conditioned_logits"], outputs["global_logits"], bias,
                                              outputs["offsets"], k, True), outputs["loss_mps_true"], atol=ATOL)


@run_once
def test_fixture_layout_is_the_authors_and_counts_match(fixture):
    config, state_dict, _, _ = fixture
    model = vlzoo.from_preset("flair_tiny", load_weights=False, **overrides(config))
    sources = {key for rule in _rules(model) for key in rule.sources}
    assert sources == set(state_dict)
    # Their ViT-B-16-FLAIR built from its model config (make_fixture.py) has our preset's parameter count.
    assert vlzoo.preset_info("flair_vit_b16")["params"] == config["vit_b16_flair_parameters"] == 150_674_434


# ----------------------------------------------------------------------------- sampling and loss


@run_once
def test_caption_indices_follow_the_authors_rule():
    rng = np.random.default_rng(0)
    for b, k in ((1, 3), (2, 1), (3, 2), (5, 4), (6, 10)):
        offsets = rng.integers(0, k, size=(b, b - 1))
        rows = to_numpy(flair_caption_indices(offsets, k))
        np.testing.assert_array_equal(rows, reference_caption_indices(offsets, k))
        np.testing.assert_array_equal(rows[np.arange(b)[:, None], np.arange(b)[:, None] + np.arange(k)],
                                      np.arange(b * k).reshape(b, k))  # own captions at columns i .. i + K - 1


def test_flair_loss_hand_checked_cases():
    """B = 2, K = 2 (S = 3 sampled captions per image, 4 captions in all)."""
    ln2 = np.log(2.0)
    # Every logit 0: each term is ln 2; TCS = 6 ln 2 / 3, MPS = 8 ln 2 / 4 (the authors' divisors, not the pair
    # counts: a mean over pairs would give ln 2).
    assert abs(float(to_numpy(flair_loss(np.zeros((2, 3)), 2, np.zeros((2, 4))))) - 2 * ln2) < 1e-6
    assert abs(float(to_numpy(flair_loss(np.zeros((2, 3)), 2))) - 2 * ln2) < 1e-6
    # Own captions at columns i, i + 1 of the conditioned logits, i*K, i*K + 1 of the global ones.
    own_tcs = np.array([[1.0, 1.0, -1.0], [-1.0, 1.0, 1.0]])
    own_mps = np.array([[1.0, 1.0, -1.0, -1.0], [-1.0, -1.0, 1.0, 1.0]])
    x = 3.0
    expected = (6 * np.logaddexp(0, -x) / 3 + 8 * np.logaddexp(0, -x) / 4) / 2
    assert abs(float(to_numpy(flair_loss(x * own_tcs, 2, x * own_mps))) - expected) < 1e-6
    flipped = (6 * np.logaddexp(0, x) / 3 + 8 * np.logaddexp(0, x) / 4) / 2
    assert abs(float(to_numpy(flair_loss(-x * own_tcs, 2, -x * own_mps))) - flipped) < 1e-6


def test_training_with_several_captions_per_image():
    model = vlzoo.from_preset("flair_tiny", seed=3)
    rng = np.random.default_rng(1)
    ids = np.zeros((4, 3, 16), "int32")
    ids[..., 0] = 49406
    ids[..., 1:5] = rng.integers(1, 49000, size=(4, 3, 4))
    ids[..., 5] = 49407
    batch = {"images": rng.normal(size=(4, 32, 32, 3)).astype("float32"), "token_ids": ids,
             "padding_mask": ids != 0}
    assert tuple(model(batch)["text_embeds"].shape) == (4, 3, 16)
    model.compile(optimizer="adamw")
    losses = [model.train_on_batch(batch, return_dict=True)["loss"] for _ in range(3)]
    assert np.isfinite(losses).all() and losses[-1] < losses[0]


# ----------------------------------------------------------------------------- errors


@run_once
def test_clear_errors(fixture):
    config, state_dict, _, _ = fixture
    pooling = TextConditionedPooling(16, num_heads=4)
    with pytest.raises(ValueError, match=r"`tokens` must have shape \(N, P, D\) with D = 16; received \(2, 9, 8\)"):
        pooling(np.ones((2, 5, 16), "float32"), np.ones((2, 9, 8), "float32"))
    with pytest.raises(ValueError, match="`num_heads` must be a positive integer dividing `embed_dim` \\(16\\)"):
        TextConditionedPooling(16, num_heads=3)
    with pytest.raises(ValueError, match=r"`conditioned_logits` must have shape \(B, B \+ 2 - 1\); received \(2, 2\)"):
        flair_loss(np.zeros((2, 2)), 2)
    with pytest.raises(ValueError, match=r"`global_logits` must have shape \(B, B \* 2\) = \(2, 4\), "
                       r"matching `conditioned_logits` \(2, 3\); received \(2, 3\)"):
        flair_loss(np.zeros((2, 3)), 2, np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"`global_logits` must have shape \(R, B \* 2\) = \(1, 4\)"):
        flair_loss(np.zeros((1, 3)), 2, np.zeros((2, 4)), rows=(1, 1))
    with pytest.raises(ValueError, match=r"`offsets` must have shape \(B, B - 1\); received \(3, 3\)"):
        flair_caption_indices(np.zeros((3, 3), "int32"), 2)
    with pytest.raises(ValueError, match="`mode` must be one of"):
        vlzoo.from_preset("flair_tiny").score({"embeds": np.ones((1, 16))}, {"embeds": np.ones((1, 16))}, mode="x")
    with pytest.raises(ValueError, match="'clip_tiny' is a CLIP preset; expected a FLAIR preset"):
        from_flair_checkpoint(state_dict, "clip_tiny")
    with pytest.raises(ValueError, match=r"'flair_tiny'.*vocabulary: checkpoint 512 \('token_embedding.weight' "
                                         r"\(512, 32\)\), preset 49408.*embed dim D: checkpoint 32"):
        from_flair_checkpoint(state_dict, "flair_tiny")
    with pytest.raises(ValueError, match="FLAIR's vision tower has no projection of its own"):
        vlzoo.from_preset("flair_tiny", vision=dict(output_dim=16))


@run_once
def test_vlzoo_convert_command_writes_a_preset_with_the_authors_scores(fixture, tmp_path, capsys):
    """`vlzoo convert --from flair` on the authors' release layout (`torch.save` of a training checkpoint with
    DDP's `module.` keys): the saved preset scores as their `get_logits`."""
    import torch

    from vlzoo import cli

    config, state_dict, inputs, outputs = fixture
    architecture = tmp_path / "architecture"
    vlzoo.from_preset("flair_tiny", load_weights=False, **overrides(config)).save_to_preset(str(architecture))
    checkpoint = tmp_path / "flair-tiny.pt"
    torch.save({"epoch": 32, "state_dict": {f"module.{k}": torch.from_numpy(v) for k, v in state_dict.items()}},
               checkpoint)
    argv = ["convert", "--from", "flair", "--checkpoint", checkpoint, "--preset", architecture,
            "--out", tmp_path / "converted", "--quiet"]
    assert cli.main([str(a) for a in argv]) == 0
    assert "preset reload: identical similarities" in capsys.readouterr().out
    images, texts = vlzoo_inputs(inputs)
    np.testing.assert_allclose(to_numpy(vlzoo.from_preset(str(tmp_path / "converted")).similarity(images, texts)),
                               outputs["conditioned_logits"], atol=ATOL, rtol=0)
