"""Llip: cross-attention head, chunked sigmoid loss, model, zero-shot, presets.

Golden values come from the numpy reference below, written from the Llip paper
(the authors' `CMP` / `xAttnPred` / `CMPLoss`): per-token key and value
matrices, heads concatenated *then* multiplied by `W_O` (vlzoo folds `W_O`
into the values), no head biases, no `1/sqrt(d_h)`, float64 throughout.
"""

import math
import resource

import keras
import numpy as np
import pytest
import reference_towers as ref
from backend_utils import value_and_grad
from conftest import TINY_TEXT, TINY_VISION, fit_and_measure, tiny_batch, to_numpy

from vlzoo.layers.llip import LlipCrossAttention
from vlzoo.losses.contrastive import siglip_logits, siglip_loss
from vlzoo.losses.llip import (
    llip_attention_weights, llip_contextualize, llip_logits, llip_loss, llip_template_average,
)
from vlzoo.models.llip import Llip
from vlzoo.presets import catalogue
from vlzoo._backends.keras_internals import without_weights
from vlzoo.presets.local import count_parameters_abstractly

PRESETS = {name: entry for name, entry in catalogue.definitions().items() if entry["family"] == "llip"}

# softplus(10) and softplus(-10): the per-pair losses of a positive and a
# negative pair at S = 0 with the initial bias b = -10 (docs/families/llip.md §Loss).
SOFTPLUS_10 = 10.000045398899218
SOFTPLUS_MINUS_10 = 4.5398899216870535e-05

# ------------------------------------------------------------ numpy reference


def np_layer_norm(x, gamma, beta, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def np_l2n(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def head_weights(layer):
    """The head's weights as float64 numpy: projections and (gamma, beta) of each norm."""
    weights = {name: ref.w(getattr(layer, name)) for name in ("q_proj", "k_proj", "v_proj", "out_proj")}
    for name in ("q_norm", "k_norm", "v_norm"):
        norm = getattr(layer, name)
        if norm is not None:
            weights[name] = (ref.w(norm.gamma), ref.w(norm.beta))
    return weights


def np_head(h, g, weights, num_heads, tau):
    """Llip's cross-attention: `(z (N_I, N_T, D), phi (N_I, N_T, M, K))`."""
    h, g = np.asarray(h, np.float64), np.asarray(g, np.float64)
    q = g @ weights["q_proj"]
    k = np.einsum("ikw,kwd->ikd", h, weights["k_proj"])
    v = np.einsum("ikw,kwd->ikd", h, weights["v_proj"])
    if "q_norm" in weights:
        q, k, v = (np_layer_norm(x, *weights[f"{n}_norm"]) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    n_i, n_t, d = h.shape[0], g.shape[0], q.shape[-1]
    q = q.reshape(n_t, num_heads, d // num_heads)
    k = k.reshape(n_i, -1, num_heads, d // num_heads)
    v = v.reshape(n_i, -1, num_heads, d // num_heads)
    logits = np.einsum("jmd,ikmd->ijmk", q, k) / tau
    logits -= logits.max(-1, keepdims=True)
    phi = np.exp(logits)
    phi /= phi.sum(-1, keepdims=True)
    heads = np.einsum("ijmk,ikmd->ijmd", phi, v).reshape(n_i, n_t, d)
    return heads @ weights["out_proj"], phi


def np_logits(z, t, a, b):
    return a * np.einsum("ijd,jd->ij", np_l2n(z), np_l2n(np.asarray(t, np.float64))) + b


def np_loss(logits):
    labels = 2 * np.eye(len(logits)) - 1
    return np.logaddexp(0.0, -labels * logits).sum() / len(logits)  # -sum(log_sigmoid) / N


# -------------------------------------------------------------------- helpers


def tiny_llip(num_tokens=4, num_layers=1, **overrides):
    """A tiny Llip, one block per tower unless `num_layers` says otherwise: what the tests below check (the head,
    the loss, the towers against NumPy block by block, serialisation) does not depend on the depth, and each block
    adds to what JAX compiles and TensorFlow traces."""
    config = dict(vision={**TINY_VISION, "num_layers": num_layers, "num_prefix_tokens": num_tokens},
                  text={**TINY_TEXT, "num_layers": num_layers}, embed_dim=16, num_heads=2)
    return Llip(**{**config, **overrides})


# Models the tests only read (none assigns a weight or an attribute of its model), built once per module: each
# model's encoders are programs of their own, compiled (JAX) or traced (TensorFlow) on first use.
@pytest.fixture(scope="module")
def plain_llip():
    return tiny_llip()


@pytest.fixture(scope="module")
def qkv_llip():
    return tiny_llip(use_qkv_norm=True)


def random_head(use_qkv_norm=False, num_tokens=3, temperature=0.7, seed=0):
    """A built head (K=3, W_v=12, W_t=10, D=8, M=2) with random norm parameters."""
    layer = LlipCrossAttention(num_tokens, 12, 10, 8, num_heads=2, temperature=temperature,
                               use_qkv_norm=use_qkv_norm)
    layer.build()
    rng = np.random.default_rng(seed)
    for norm in (layer.q_norm, layer.k_norm, layer.v_norm):
        if norm is not None:
            norm.gamma.assign(rng.normal(1.0, 0.3, size=8).astype("float32"))
            norm.beta.assign(rng.normal(0.0, 0.3, size=8).astype("float32"))
    return layer


def random_inputs(n_i=4, n_t=5, num_tokens=3, seed=1):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n_i, num_tokens, 12)).astype("float32"),
            rng.normal(size=(n_t, 10)).astype("float32"))


def head_tensors(layer, h, g):
    keys, values = layer.image_keys_values(keras.ops.convert_to_tensor(h))
    return to_numpy(layer.text_queries(keras.ops.convert_to_tensor(g))), to_numpy(keys), to_numpy(values)


def random_pairs(n=5, k=3, m=2, dh=4, d=8, seed=2):
    """Random (queries, keys, folded values, text embeddings) of n paired samples."""
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, m, dh)).astype("float32"), rng.normal(size=(n, k, m, dh)).astype("float32"),
            rng.normal(size=(n, k, m, d)).astype("float32"), rng.normal(size=(n, d)).astype("float32"))


# ------------------------------------------------------------ head and loss


@pytest.mark.parametrize("use_qkv_norm", [False, True])
def test_cross_attention_matches_numpy(use_qkv_norm):
    layer = random_head(use_qkv_norm)
    h, g = random_inputs()
    weights = head_weights(layer)
    z_ref, phi_ref = np_head(h, g, weights, 2, 0.7)
    z = to_numpy(layer(h, g))
    assert z.shape == (4, 5, 8)  # N_I != N_T
    np.testing.assert_allclose(z, z_ref, atol=1e-5)
    queries, keys, values = head_tensors(layer, h, g)
    assert queries.shape == (5, 2, 4) and keys.shape == (4, 3, 2, 4) and values.shape == (4, 3, 2, 8)
    np.testing.assert_allclose(to_numpy(llip_attention_weights(queries, keys, 0.7)), phi_ref, atol=1e-6)
    # The folded values are V of each head times its block of W_O.
    v = np.einsum("ikw,kwd->ikd", h.astype(np.float64), weights["v_proj"])
    if use_qkv_norm:
        v = np_layer_norm(v, *weights["v_norm"])
    folded = np.einsum("ikmd,mde->ikme", v.reshape(4, 3, 2, 4), weights["out_proj"].reshape(2, 4, 8))
    np.testing.assert_allclose(values, folded, atol=1e-5)
    # The call-time temperature overrides the layer's.
    np.testing.assert_allclose(to_numpy(layer(h, g, temperature=3.0)), np_head(h, g, weights, 2, 3.0)[0], atol=1e-5)
    assert len(layer.weights) == (10 if use_qkv_norm else 4)  # no biases anywhere


def test_attention_weights_invariants_and_temperature_limits():
    layer = random_head()
    h, g = random_inputs()
    queries, keys, values = head_tensors(layer, h, g)
    phi = to_numpy(llip_attention_weights(queries, keys, 0.7))
    assert phi.shape == (4, 5, 2, 3) and (phi >= 0).all()
    np.testing.assert_allclose(phi.sum(-1), 1.0, atol=1e-6)
    # tau -> 0: one-hot at the argmax of the raw logits.
    raw = np.einsum("jmd,ikmd->ijmk", queries, keys)
    sharp = to_numpy(llip_attention_weights(queries, keys, 1e-4))
    np.testing.assert_allclose(sharp, np.eye(3)[raw.argmax(-1)], atol=1e-6)
    # tau -> infinity: the plain average of the mixture tokens, the same for every text.
    weights = head_weights(layer)
    average = (np.einsum("ikw,kwd->ikd", h.astype(np.float64), weights["v_proj"]).mean(1)) @ weights["out_proj"]
    z = to_numpy(llip_contextualize(queries, keys, values, 1e9))
    np.testing.assert_allclose(z, np.broadcast_to(average[:, None], z.shape), atol=1e-5)
    # Finite temperatures do depend on the text (K > 1).
    z = to_numpy(llip_contextualize(queries, keys, values, 0.7))
    assert np.abs(z[:, 0] - z[:, 1]).max() > 1e-3


def test_loss_and_logits_match_numpy():
    layer = random_head(use_qkv_norm=True)
    h, g = random_inputs(n_i=5, n_t=5)
    t = np.random.default_rng(3).normal(size=(5, 8)).astype("float32")
    queries, keys, values = head_tensors(layer, h, g)
    z, _ = np_head(h, g, head_weights(layer), 2, 0.7)
    a, b = 1 / 0.07, -10.0
    expected = np_logits(z, t, a, b)
    np.testing.assert_allclose(to_numpy(llip_logits(queries, keys, values, t, a, b, 0.7)), expected, atol=1e-4)
    loss = float(to_numpy(llip_loss(queries, keys, values, t, a, b, 0.7)))
    assert abs(loss - np_loss(expected)) < 1e-5 * max(1.0, abs(loss))
    # The diagonal uses image i mixed by its own caption: swapping two captions
    # (queries and targets together) changes the loss.
    swap = [1, 0, 2, 3, 4]
    swapped = float(to_numpy(llip_loss(queries[swap], keys, values, t[swap], a, b, 0.7)))
    assert abs(swapped - np_loss(np_logits(np_head(h, g[swap], head_weights(layer), 2, 0.7)[0], t[swap], a, b))) < 1e-4
    assert abs(swapped - loss) > 1e-3


def test_loss_hand_checked_values_and_stability():
    queries, keys, values, t = random_pairs(n=4)
    # S = 0 (zero text embeddings) and the initial bias -10: per image
    # softplus(10) + (N - 1) softplus(-10), whatever the scale.
    zero = np.zeros_like(t)
    for scale in (1 / 0.07, 10.0):
        loss = float(to_numpy(llip_loss(queries, keys, values, zero, scale, -10.0, 5.0)))
        assert abs(loss - (SOFTPLUS_10 + 3 * SOFTPLUS_MINUS_10)) < 1e-5
    # Logits up to |1e4|: finite, and equal to the stable numpy value.
    big = float(to_numpy(llip_loss(queries, keys, values, t, 1e4, 0.0, 5.0)))
    z = to_numpy(llip_contextualize(queries, keys, values, 5.0))
    assert np.isfinite(big)
    assert abs(big - np_loss(np_logits(z, t, 1e4, 0.0))) < 1e-3 * abs(big)


@pytest.mark.parametrize("chunks", [dict(num_chunks=3), dict(num_chunks=2), dict(num_chunks=5), dict(num_chunks=8),
                                    dict(num_chunks=3, remat=False)])  # of 5 texts: 2+2+1, 3+2, 1 each
def test_chunked_equals_unchunked_value_and_gradient(chunks):
    queries, keys, values, t = random_pairs(n=5)
    scalars = (np.float32(4.0), np.float32(-2.0))

    def loss(**kwargs):
        return lambda q, k, v, e, a, b: llip_loss(q, k, v, e, a, b, 0.7, **kwargs)

    value, grads = value_and_grad(loss(), queries, keys, values, t, *scalars)
    chunked_value, chunked_grads = value_and_grad(loss(**chunks), queries, keys, values, t, *scalars)
    np.testing.assert_allclose(chunked_value, value, rtol=1e-5, atol=1e-5)
    for got, want in zip(chunked_grads, grads):
        assert np.abs(want).max() > 0
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        to_numpy(llip_logits(queries, keys, values, t, 4.0, -2.0, 0.7, **chunks)),
        to_numpy(llip_logits(queries, keys, values, t, 4.0, -2.0, 0.7)), atol=1e-5)


def test_one_mixture_token_gives_zero_query_and_key_gradients():
    queries, keys, values, t = random_pairs(n=4, k=1)
    z = to_numpy(llip_contextualize(queries, keys, values, 5.0))
    np.testing.assert_array_equal(z, np.broadcast_to(z[:, :1], z.shape))  # the same z_ij for every j
    _, grads = value_and_grad(lambda q, k, v, e: llip_loss(q, k, v, e, 10.0, -10.0, 5.0),
                              queries, keys, values, t)
    assert np.all(grads[0] == 0) and np.all(grads[1] == 0)  # W_Q, W_K: exactly zero gradient
    assert np.abs(grads[2]).max() > 0 and np.abs(grads[3]).max() > 0


def test_template_average_helper():
    rng = np.random.default_rng(4)
    queries, embeds = rng.normal(size=(3, 4, 2, 5)), rng.normal(size=(3, 4, 8))
    q, e = llip_template_average(queries, embeds)
    np.testing.assert_allclose(to_numpy(q), queries.mean(1), atol=1e-6)
    np.testing.assert_allclose(to_numpy(e), np_l2n(np_l2n(embeds).mean(1)), atol=1e-6)


def test_bad_inputs_raise_clear_errors(plain_llip):
    queries, keys, values, t = random_pairs(n=4)
    with pytest.raises(ValueError, match=r"`keys` must have shape \(N_I, K, M, d_h\)"):
        llip_loss(queries, keys[..., :3], values, t, 10.0, -10.0, 5.0)
    with pytest.raises(ValueError, match="`values` must have shape"):
        llip_logits(queries, keys, values[:, :2], t, 10.0, -10.0, 5.0)
    with pytest.raises(ValueError, match="`text_embeds` must have shape"):
        llip_logits(queries, keys, values, t[:, :5], 10.0, -10.0, 5.0)
    with pytest.raises(ValueError, match="same N"):
        llip_loss(queries[:3], keys, values, t[:3], 10.0, -10.0, 5.0)
    with pytest.raises(ValueError, match="rank 3"):
        llip_attention_weights(queries[0], keys, 5.0)
    with pytest.raises(ValueError, match="`temperature` must be > 0"):
        llip_loss(queries, keys, values, t, 10.0, -10.0, 0.0)
    with pytest.raises(ValueError, match="`num_chunks` must be a python int >= 1"):
        llip_loss(queries, keys, values, t, 10.0, -10.0, 5.0, num_chunks=0)
    layer = random_head()
    with pytest.raises(ValueError, match="mixture_tokens"):
        layer(np.ones((2, 4, 12), "float32"), np.ones((3, 10), "float32"))  # K = 4, not 3
    with pytest.raises(ValueError, match="text_features"):
        layer(np.ones((2, 3, 12), "float32"), np.ones((3, 11), "float32"))
    with pytest.raises(ValueError, match="must divide"):
        LlipCrossAttention(3, 12, 10, 8, num_heads=3)
    with pytest.raises(ValueError, match="output_dim"):
        tiny_llip(vision={**TINY_VISION, "num_prefix_tokens": 4, "output_dim": 16})
    model = plain_llip
    batch = tiny_batch()
    with pytest.raises(TypeError, match="encode_image"):
        model.score(np.ones((4, 16)), model.encode_text(batch))
    with pytest.raises(ValueError, match=r"\(C, P, T\)"):
        model.encode_class_texts({"token_ids": batch["token_ids"]})


# -------------------------------------------------------------------- model


def test_model_matches_numpy_towers_and_head(qkv_llip):
    model = qkv_llip
    batch = tiny_batch()
    _, vision_tokens = ref.vision_forward(batch["images"], model.vision)
    g, _ = ref.text_forward(batch["token_ids"], batch["padding_mask"], model.text)
    h = vision_tokens[:, :4]  # the K mixture-token outputs, after ln_post
    t = g @ ref.w(model.text_projection.kernel)
    z, _ = np_head(h, g, head_weights(model.cross_attention), 2, 5.0)
    a, b = math.exp(float(to_numpy(model.logit_scale))), float(to_numpy(model.logit_bias))
    assert abs(a - 1 / 0.07) < 1e-4 and b == -10.0 and not model.text_projection.use_bias
    logits = np_logits(z, t, a, b)

    image, text = model.encode_image(batch["images"]), model.encode_text(batch)
    np.testing.assert_allclose(to_numpy(image["mixture_tokens"]), h, atol=2e-5)
    np.testing.assert_allclose(to_numpy(text["embeds"]), t, atol=2e-5)
    np.testing.assert_allclose(to_numpy(model.similarity(batch["images"], batch)), logits, atol=1e-4)
    np.testing.assert_allclose(to_numpy(model.contextualize(batch["images"], batch)), z, atol=1e-4)
    np.testing.assert_allclose(to_numpy(model.contextualize(batch["images"], batch, normalize=True)),
                               np_l2n(z), atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(to_numpy(model.encode_text(batch, normalize=True)["embeds"]), axis=-1),
                               1.0, atol=1e-6)
    loss = float(to_numpy(model.compute_loss(y_pred=model(batch), training=False)))
    assert abs(loss - np_loss(logits)) < 1e-4
    # Call-time temperature.
    z1, _ = np_head(h, g, head_weights(model.cross_attention), 2, 1.0)
    np.testing.assert_allclose(to_numpy(model.similarity(batch["images"], batch, temperature=1.0)),
                               np_logits(z1, t, a, b), atol=1e-4)
    # Chunked scores and loss, through the model's own options.
    chunked = tiny_llip(use_qkv_norm=True, num_chunks=3)
    chunked.set_weights(model.get_weights())
    np.testing.assert_allclose(to_numpy(chunked.similarity(batch["images"], batch)), logits, atol=1e-4)
    assert abs(float(to_numpy(chunked.compute_loss(y_pred=chunked(batch)))) - loss) < 1e-4


def test_one_mixture_token_reduces_to_siglip():
    model = tiny_llip(num_tokens=1)
    batch = tiny_batch()
    weights = head_weights(model.cross_attention)
    h = to_numpy(model.encode_image(batch["images"])["mixture_tokens"])[:, 0]
    image_embeds = h @ weights["v_proj"][0] @ weights["out_proj"]  # a CLIP-style visual projection
    text_embeds = to_numpy(model.encode_text(batch)["embeds"])
    a, b = model.logit_scale_value(), model.logit_bias
    np.testing.assert_allclose(to_numpy(model.similarity(batch["images"], batch)),
                               to_numpy(siglip_logits(image_embeds, text_embeds, a, b)), atol=1e-4)
    loss = float(to_numpy(model.compute_loss(y_pred=model(batch))))
    assert abs(loss - float(to_numpy(siglip_loss(image_embeds, text_embeds, a, b)))) < 1e-4
    z = to_numpy(model.contextualize(batch["images"], batch))
    np.testing.assert_allclose(z, np.broadcast_to(z[:, :1], z.shape), atol=1e-6)


def _permute_mixture_tokens(model, perm, with_projections=True):
    k = model.num_mixture_tokens
    vit, head = model.vision, model.cross_attention
    vit.prefix_tokens.assign(to_numpy(vit.prefix_tokens)[perm])
    table = to_numpy(vit.position_embedding.embeddings)
    vit.position_embedding.embeddings.assign(np.concatenate([table[:k][perm], table[k:]]))
    if with_projections:
        head.k_proj.assign(to_numpy(head.k_proj)[perm])
        head.v_proj.assign(to_numpy(head.v_proj)[perm])


def test_permuting_mixture_tokens_leaves_scores_unchanged():
    model = tiny_llip()
    batch = tiny_batch()
    before = to_numpy(model.contextualize(batch["images"], batch))
    scores = to_numpy(model.similarity(batch["images"], batch))
    perm = [2, 0, 3, 1]
    _permute_mixture_tokens(model, perm)
    np.testing.assert_allclose(to_numpy(model.contextualize(batch["images"], batch)), before, atol=1e-5)
    np.testing.assert_allclose(to_numpy(model.similarity(batch["images"], batch)), scores, atol=1e-4)
    # Control: the tokens alone, without their key/value matrices, do change z.
    _permute_mixture_tokens(model, perm, with_projections=False)
    assert np.abs(to_numpy(model.contextualize(batch["images"], batch)) - before).max() > 1e-3


def test_pair_scores_have_no_cross_talk(plain_llip):
    model = plain_llip
    batch = tiny_batch()
    image, text = model.encode_image(batch["images"]), model.encode_text(batch)
    full = to_numpy(model.score(image, text))
    # Sub-batches (of the cached encodings) score as the matching block.
    sub_image = {key: value[1:3] for key, value in image.items()}
    sub_text = {key: value[1:3] for key, value in text.items()}
    np.testing.assert_allclose(to_numpy(model.score(sub_image, text)), full[1:3], atol=1e-5)
    np.testing.assert_allclose(to_numpy(model.score(image, sub_text)), full[:, 1:3], atol=1e-5)
    perm = [3, 2, 0, 1]
    texts = {key: batch[key][perm] for key in ("token_ids", "padding_mask")}
    np.testing.assert_allclose(to_numpy(model.similarity(batch["images"], texts)), full[:, perm], atol=1e-5)
    np.testing.assert_allclose(to_numpy(model.similarity(batch["images"][perm], batch)), full[perm], atol=1e-5)
    # Identical captions: every row of the scores is constant.
    same = {key: np.repeat(batch[key][:1], 4, axis=0) for key in ("token_ids", "padding_mask")}
    scores = to_numpy(model.similarity(batch["images"], same))
    np.testing.assert_allclose(scores, np.broadcast_to(scores[:, :1], scores.shape), atol=1e-5)


def _class_prompts(num_classes=2, num_prompts=2, seed=7):
    """Tokenised prompts `(C, P, T)`; C * P = 4 texts, the batch size of the other tests (JAX compiles
    each op once per shape)."""
    batch = tiny_batch(batch_size=num_classes * num_prompts, seed=seed)
    return {key: batch[key].reshape(num_classes, num_prompts, -1) for key in ("token_ids", "padding_mask")}


def test_zero_shot_averages_queries_and_targets_over_templates(qkv_llip):
    model = qkv_llip
    images = tiny_batch()["images"]
    prompts = _class_prompts()
    flat = {key: value.reshape(4, -1) for key, value in prompts.items()}
    text = model.encode_text(flat)
    queries = to_numpy(text["queries"]).reshape(2, 2, 2, 8)
    embeds = to_numpy(text["embeds"]).reshape(2, 2, 16)
    classes = model.encode_class_texts(prompts)
    np.testing.assert_allclose(to_numpy(classes["queries"]), queries.mean(1), atol=1e-5)
    np.testing.assert_allclose(to_numpy(classes["embeds"]), np_l2n(np_l2n(embeds).mean(1)), atol=1e-5)
    # With qkv_norm the query is the mean of the normalised queries, not Q_norm((mean g) W_Q).
    g = to_numpy(model.text(flat["token_ids"], flat["padding_mask"])["pooled"]).reshape(2, 2, -1).mean(1)
    shortcut = to_numpy(model.cross_attention.text_queries(keras.ops.convert_to_tensor(g)))
    assert np.abs(shortcut - queries.mean(1)).max() > 1e-3
    # Scores: one cross-attention per (image, class) with the averaged query.
    tokens = to_numpy(model.encode_image(images)["mixture_tokens"]).astype(np.float64)
    weights = head_weights(model.cross_attention)
    k, v = (np_layer_norm(np.einsum("ikw,kwd->ikd", tokens, weights[f"{n}_proj"]), *weights[f"{n}_norm"])
            .reshape(4, 4, 2, 8) for n in ("k", "v"))
    logits = np.einsum("jmd,ikmd->ijmk", queries.mean(1), k) / 5.0
    phi = np.exp(logits - logits.max(-1, keepdims=True))
    phi /= phi.sum(-1, keepdims=True)
    z = np.einsum("ijmk,ikmd->ijmd", phi, v).reshape(4, 2, 16) @ weights["out_proj"]
    a = math.exp(float(to_numpy(model.logit_scale)))
    expected = np_logits(z, np_l2n(embeds).mean(1), a, -10.0)
    scores = to_numpy(model.ensemble_scores(images, prompts))
    np.testing.assert_allclose(scores, expected, atol=1e-4)
    # Label-leak guards: permuting the classes permutes the columns; other images change nothing.
    permuted = {key: value[::-1] for key, value in prompts.items()}
    np.testing.assert_allclose(to_numpy(model.ensemble_scores(images, permuted)), scores[:, ::-1], atol=1e-5)
    others = np.concatenate([images[:1], tiny_batch(seed=9)["images"][1:]])
    np.testing.assert_allclose(to_numpy(model.ensemble_scores(others, prompts))[0], scores[0], atol=1e-5)
    # One template per class: the same as scoring the prompts directly.
    single = {key: value[:, None] for key, value in flat.items()}
    np.testing.assert_allclose(to_numpy(model.ensemble_scores(images, single)),
                               to_numpy(model.similarity(images, flat)), atol=1e-5)


def test_zero_shot_accepts_prompt_strings():
    model = tiny_llip()
    prompts = _class_prompts()
    strings = [[f"class {c} prompt {p}" for p in range(2)] for c in range(2)]
    lookup = {s: i for i, s in enumerate(s for row in strings for s in row)}
    flat = {key: value.reshape(4, -1) for key, value in prompts.items()}
    model.tokenizer = lambda texts: {key: value[[lookup[s] for s in texts]] for key, value in flat.items()}
    images = tiny_batch()["images"]
    np.testing.assert_allclose(to_numpy(model.ensemble_scores(images, strings)),
                               to_numpy(model.ensemble_scores(images, prompts)), atol=1e-6)
    with pytest.raises(ValueError, match="same number P"):
        model.encode_class_texts([["a", "b"], ["c"]])


@pytest.mark.slow
@pytest.mark.parametrize("num_chunks", [None, 3])
def test_fit_lowers_the_loss(num_chunks):
    keras.utils.set_random_seed(0)
    model = tiny_llip(num_chunks=num_chunks, num_layers=2)  # 3 chunks of 3 for 8 texts: one padded
    tokens = to_numpy(model.vision.prefix_tokens)
    before, after = fit_and_measure(model, tiny_batch(batch_size=8, seed=1))
    assert after < 0.6 * before, (before, after)
    assert np.abs(to_numpy(model.vision.prefix_tokens) - tokens).max() > 1e-4
    assert float(to_numpy(model.logit_bias)) != -10.0
    assert 0.0 <= float(to_numpy(model.logit_scale)) <= math.log(100.0) + 1e-6


def test_initialisation_follows_the_authors():
    # The authors' CMP / xAttnPred / CLIP (facebookresearch/Llip, llip/open_clip/model.py):
    # q_proj ~ N(0, W_t**-0.5), k_proj and v_proj ~ N(0, W_v**-0.5) per token,
    # out_proj ~ N(0, D**-0.5), logit scale ln(1 / 0.07), bias -10 (the model configs'
    # init_logit_bias). Their tiny runs start as slowly as vlzoo's; keep this init.
    keras.utils.set_random_seed(0)
    head = LlipCrossAttention(8, 64, 96, 64, num_heads=4)
    head.build()
    expected = {"q_proj": 96**-0.5, "k_proj": 64**-0.5, "v_proj": 64**-0.5, "out_proj": 64**-0.5}
    for name, std in expected.items():  # >= 4096 draws each: 5% is over 4 standard errors
        values = to_numpy(getattr(head, name)).ravel()
        assert abs(values.std() / std - 1) < 0.05, (name, values.std(), std)
        assert abs(values.mean()) < 0.1 * std, (name, values.mean())
    model = tiny_llip()
    assert np.isclose(float(to_numpy(model.logit_scale)), math.log(1 / 0.07))
    assert float(to_numpy(model.logit_bias)) == -10.0
    assert model.temperature == 5.0


def test_weight_decay_follows_the_authors(qkv_llip):
    model = qkv_llip
    excluded = {v.path for v in model.no_weight_decay_variables()}
    decayed = {v.path for v in model.trainable_variables} - excluded
    assert all(len(v.shape) < 2 for v in model.no_weight_decay_variables())
    for name in ("prefix_tokens", "position_embedding/embeddings", "token_embedding/embeddings",
                 "k_proj", "v_proj", "q_proj", "out_proj", "text_projection/kernel"):
        assert any(name in path for path in decayed), name
    for name in ("logit_scale", "logit_bias", "q_norm/gamma", "post_norm/beta"):
        assert any(name in path for path in excluded), name


def test_serialization_round_trips(tmp_path):
    layer = random_head(use_qkv_norm=True, temperature=2.0)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert isinstance(restored, LlipCrossAttention) and restored.get_config() == layer.get_config()

    model = tiny_llip(temperature=2.0, use_qkv_norm=True, num_chunks=2)
    batch = tiny_batch()
    config = keras.saving.serialize_keras_object(model)
    assert config["registered_name"] == "vlzoo>Llip"
    rebuilt = keras.saving.deserialize_keras_object(config)
    assert rebuilt.get_config() == model.get_config()
    assert (rebuilt.temperature, rebuilt.num_chunks, rebuilt.cross_attention.use_qkv_norm) == (2.0, 2, True)
    model.save_weights(str(tmp_path / "llip.weights.h5"))
    rebuilt.load_weights(str(tmp_path / "llip.weights.h5"))
    np.testing.assert_array_equal(to_numpy(rebuilt.similarity(batch["images"], batch)),
                                  to_numpy(model.similarity(batch["images"], batch)))


# ------------------------------------------------------------------ presets

# The authors' classes instantiated from their configs (their code at d5649c3).
SPEC = {
    # name: (K, tau, qkv_norm, D, text context, parameters)
    "llip_vit_b32": (64, 5.0, False, 512, 77, 201_836_802),
    "llip_vit_b16": (32, 5.0, False, 512, 77, 174_965_250),
    "llip_vit_b16_k64": (64, 5.0, False, 512, 77, 200_180_226),
    "llip_vit_l14": (32, 1.0, False, 768, 64, 478_394_882),
    "llip_vit_h14": (64, 5.0, True, 1024, 77, 1_154_835_458),
    "llip_vit_g14": (64, 5.0, True, 1280, 77, 2_813_561_090),
}


def _serialized(name):
    return {"module": "vlzoo.models.llip", "class_name": "Llip", "registered_name": "vlzoo>Llip",
            "config": PRESETS[name]["config"]}


def _closed_form(config):
    """The closed form of the parameter count (docs/families/llip.md §Presets)."""
    vision, text = config["vision"], config["text"]
    d, k = config["embed_dim"], vision["num_prefix_tokens"]
    w_v, w_t, p = vision["hidden_dim"], text["hidden_dim"], vision["patch_size"]
    patches = (vision["image_size"] // p) ** 2

    def blk(w, m):
        return 4 * w * w + 4 * w + 2 * w * m + m + w + 4 * w

    count = 3 * p * p * w_v + k * w_v + (patches + k) * w_v + 4 * w_v
    count += vision["num_layers"] * blk(w_v, vision["intermediate_dim"])
    count += 49408 * w_t + text["sequence_length"] * w_t + text["num_layers"] * blk(w_t, 4 * w_t) + 2 * w_t
    return count + 2 * k * w_v * d + 2 * w_t * d + d * d + 2 + (6 * d if config["use_qkv_norm"] else 0)


@pytest.mark.parametrize("name", sorted(SPEC))
def test_preset_parameter_counts_match_the_spec_exactly(name):
    k, tau, qkv_norm, d, context, params = SPEC[name]
    config = PRESETS[name]["config"]
    assert (config["vision"]["num_prefix_tokens"], config["temperature"], config["use_qkv_norm"]) == (k, tau, qkv_norm)
    assert (config["embed_dim"], config["num_heads"], config["text"]["sequence_length"]) == (d, 8, context)
    assert config["embed_dim"] % config["num_heads"] == 0
    assert _closed_form(config) == params
    assert count_parameters_abstractly(_serialized(name)) == params


def test_g14_builds_abstractly_with_output_shapes():
    """Parameter count and output shapes of the 2.8B-parameter preset, without allocating its weights."""
    start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with without_weights():
        model = Llip(**PRESETS["llip_vit_g14"]["config"])
        assert sum(int(np.prod(v.shape)) for v in model.weights) == SPEC["llip_vit_g14"][-1]
        vit = model.vision
        assert vit.num_prefix_tokens + vit.grid_size[0] * vit.grid_size[1] == 320
        assert tuple(vit.position_embedding.embeddings.shape) == (320, 1664)
        assert (vit.num_layers, model.text.num_layers) == (48, 32)
        # The output shapes are set by the widths, the mixture tokens and the heads; every block maps its
        # (B, N, W) input to that shape, so the preset is traced symbolically with one block per tower (the 80
        # blocks took 16 s of TensorFlow graph building and added nothing to what the shapes show).
        config = PRESETS["llip_vit_g14"]["config"]
        model = Llip(**{**config, "vision": {**config["vision"], "num_layers": 1},
                        "text": {**config["text"], "num_layers": 1}})
        images = keras.KerasTensor((2, 224, 224, 3))
        texts = {"token_ids": keras.KerasTensor((3, 77), "int32"),
                 "padding_mask": keras.KerasTensor((3, 77), "bool")}
        image, text = model.encode_image(images), model.encode_text(texts)
        assert {key: tuple(v.shape) for key, v in image.items()} == {
            "embeds": (2, 1280), "mixture_tokens": (2, 64, 1664), "keys": (2, 64, 8, 160), "values": (2, 64, 8, 1280)}
        assert {key: tuple(v.shape) for key, v in text.items()} == {"queries": (3, 8, 160), "embeds": (3, 1280)}
        assert tuple(model.score(image, text).shape) == (2, 3)
    # ru_maxrss is in KiB on Linux; the weights alone would be 11 GB (the head 1.1 GB).
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start < 700 * 1024
