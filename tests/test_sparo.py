"""SPARO: the read-out against a numpy loop of Eq. 1, the invariants of docs/families/sparo.md
(§Hand-checked cases), the model against numpy towers, slot selection, parameter counts of the presets,
training and persistence."""

import math

import keras
import numpy as np
import pytest
import reference
import reference_towers as ref
from backend_utils import value_and_grad
from conftest import TINY_TEXT, TINY_VISION, fit_and_measure, tiny_batch, to_numpy
from margins import DECISION_MARGIN, ranking_gap

import vlzoo
from vlzoo.presets import catalogue
from vlzoo._backends.keras_internals import without_weights
from vlzoo.evaluation.slots import per_slot_zero_shot_accuracy, rank_slots, select_slots, slot_zero_shot_accuracy
from vlzoo.layers.sparo import SPAROReadout
from vlzoo.layers.text import end_token_index
from vlzoo.models.base import LOGIT_SCALE_MAX
from vlzoo.models.sparo import (
    SPARO, normalize_slots,
)

PRESETS = {name: entry for name, entry in catalogue.definitions().items() if entry["family"] == "sparo"}


def sparo_clip_config(patch, num_slots=64, slot_dim=64, image_size=224):
    """The authors' ViT-B-`patch`-SPARO: open_clip ViT-B + 12/512/8 text (exact GELU, LN eps 1e-5, context 77).

    Depths are the full 12 with `reduce_depth=1`, so each tower keeps 11 blocks.
    """
    towers = dict(activation="gelu", layer_norm_epsilon=1e-5)
    return dict(
        vision=dict(image_size=image_size, patch_size=patch, hidden_dim=768, num_layers=12, num_heads=12,
                    intermediate_dim=3072, **towers),
        text=dict(vocabulary_size=49408, sequence_length=77, hidden_dim=512, num_layers=12, num_heads=8,
                  intermediate_dim=2048, **towers),
        num_slots=num_slots, slot_dim=slot_dim, reduce_depth=1,
    )


L, V, D = 4, 8, 8


# ---------------------------------------------------------------- numpy references


def np_readout(h, layer, end_index=None):
    """Eq. 1 of the paper, one slot at a time (float64): returns (slots (B, L, V), attention (B, L, n))."""
    h = np.asarray(h, np.float64)
    q, kernel, bias = ref.w(layer.queries), ref.w(layer.key.kernel), ref.w(layer.key.bias)
    w_out, c_out = ref.w(layer.output_dense.kernel), ref.w(layer.output_dense.bias)
    dk = layer.key_dim
    slots, maps = [], []
    for slot in range(layer.num_slots):
        cols = slice((slot // layer.group_size) * dk, (slot // layer.group_size + 1) * dk)
        keys = h @ kernel[:, cols] + bias[cols]  # K_l h_j + b_l, (B, n, D)
        values = keys
        if layer.value is not None:
            values = h @ ref.w(layer.value.kernel)[:, cols] + ref.w(layer.value.bias)[cols]
        logits = keys @ q[slot] / math.sqrt(dk)  # (B, n)
        if end_index is not None:
            logits = np.where(np.arange(h.shape[1])[None] > np.asarray(end_index)[:, None], -np.inf, logits)
        attn = np.exp(logits - logits.max(-1, keepdims=True))
        attn /= attn.sum(-1, keepdims=True)
        slots.append(np.einsum("bn,bnd->bd", attn, values) @ w_out + c_out)
        maps.append(attn)
    return np.stack(slots, 1), np.stack(maps, 1)


def np_normalize_slots(y, slot_dim):
    """`y_l / ||y_l|| / sqrt(S)` per slot of a `(B, S * V)` array."""
    slots = y.reshape(y.shape[0], -1, slot_dim)
    return (reference.l2_normalize(slots) / math.sqrt(slots.shape[1])).reshape(y.shape)


def np_mean_slot_cosine(y_img, y_txt, slot_dim, slots=None):
    """`(N_img, N_txt)` mean over the slots in `slots` of cos(y^i_l, y^t_l)."""
    a = reference.l2_normalize(y_img.reshape(y_img.shape[0], -1, slot_dim))
    b = reference.l2_normalize(y_txt.reshape(y_txt.shape[0], -1, slot_dim))
    chosen = range(a.shape[1]) if slots is None else slots
    return np.mean([a[:, s] @ b[:, s].T for s in chosen], axis=0)


def np_slot_scores(image_embeds, class_embeds, slot_dim):
    """`(L, N, C)` cosines of every slot of every image with its prompt-ensembled class weights, by loops."""
    n, c, k = image_embeds.shape[0], class_embeds.shape[0], class_embeds.shape[1]
    num_slots = image_embeds.shape[1] // slot_dim
    img = image_embeds.reshape(n, num_slots, slot_dim)
    txt = class_embeds.reshape(c, k, num_slots, slot_dim)
    scores = np.zeros((num_slots, n, c))
    for slot in range(num_slots):
        weights = reference.l2_normalize(reference.l2_normalize(txt[:, :, slot]).mean(1))
        for i in range(n):
            scores[slot, i] = weights @ reference.l2_normalize(img[i, slot])
    return scores


def np_slot_accuracy(image_embeds, class_embeds, labels, slot_dim):
    """Per-slot prompt-ensembled zero-shot accuracy `(L,)`."""
    return np.mean(np.argmax(np_slot_scores(image_embeds, class_embeds, slot_dim), axis=2) == labels, axis=1)


# ---------------------------------------------------------------- builders


def _readout(width=32, num_slots=L, slot_dim=V, key_dim=D, seed=0, **kwargs):
    """A built read-out with random weights everywhere (biases included, so they are exercised)."""
    layer = SPAROReadout(num_slots, slot_dim, key_dim, **kwargs)
    layer.build((None, None, width))
    rng = np.random.default_rng(seed)
    for variable in layer.weights:
        variable.assign(rng.normal(size=variable.shape).astype("float32") * 0.5)
    return layer


def _model(**overrides):
    """Tiny SPARO: vocabulary 64, 3 - 1 = 2 blocks per tower, L=4, V=D=8."""
    config = dict(vision={**TINY_VISION, "num_layers": 3}, text={**TINY_TEXT, "num_layers": 3},
                  num_slots=L, slot_dim=V)
    config.update(overrides)
    return SPARO(**config)


def _tokens(batch=3, length=7, width=32, seed=1):
    return np.random.default_rng(seed).normal(size=(batch, length, width)).astype("float32")


def _count_abstractly(config):
    """Parameter count of `SPARO(**config)` without allocating its weights (as `vlzoo.presets.preset_info`)."""
    with without_weights():
        model = SPARO(**config)
        total = sum(int(np.prod(v.shape)) for v in model.weights)
        towers = (len(model.vision.blocks), len(model.text.blocks))
        readouts = [sum(int(np.prod(v.shape)) for v in readout.weights)
                    for readout in (model.vision_readout, model.text_readout)]
    return total, towers, readouts


# ---------------------------------------------------------------- the read-out layer


@pytest.mark.parametrize("group_size,share", [(1, True), (2, True), (1, False), (4, False)])
def test_readout_matches_the_per_slot_loop_of_eq_1(group_size, share):
    layer = _readout(group_size=group_size, share_key_value=share)
    h = _tokens()
    out = layer(h)
    slots, maps = np_readout(h, layer)
    np.testing.assert_allclose(to_numpy(out["slots"]), slots, atol=1e-5)
    np.testing.assert_allclose(to_numpy(out["attention"]), maps, atol=1e-6)
    end = np.array([0, 3, 6])
    out = layer(h, end_index=end)
    slots, maps = np_readout(h, layer, end)
    np.testing.assert_allclose(to_numpy(out["slots"]), slots, atol=1e-5)
    np.testing.assert_allclose(to_numpy(out["attention"]), maps, atol=1e-6)


def test_hand_checked_scale_is_one_over_sqrt_key_dim():
    # One slot, d = D = V = 4, K = W = identity, no biases: tokens e0, e1; q = 2 e0.
    # logits = (q . k_j) / sqrt(4) = (1, 0) -> attention (e/(1+e), 1/(1+e)) = (0.7311, 0.2689)
    # (1/D would give 0.6225, no scaling 0.8808); y = attention mixed keys = (0.7311, 0.2689, 0, 0).
    layer = SPAROReadout(1, 4, 4)
    layer.build((None, None, 4))
    layer.set_weights([np.array([[2.0, 0, 0, 0]]), np.eye(4), np.zeros(4), np.eye(4), np.zeros(4)])
    out = layer(np.eye(4, dtype="float32")[None, :2])
    expected = np.array([math.e / (1 + math.e), 1 / (1 + math.e)])
    np.testing.assert_allclose(to_numpy(out["attention"])[0, 0], expected, atol=1e-6)
    np.testing.assert_allclose(to_numpy(out["slots"])[0, 0], [0.7310586, 0.2689414, 0, 0], atol=1e-6)


def test_grouped_slots_share_one_key_projection():
    layer = _readout(group_size=2)
    assert tuple(layer.key.kernel.shape) == (32, (L // 2) * D)
    queries = to_numpy(layer.queries).copy()
    queries[1], queries[3] = queries[0], queries[2]  # slots 2k and 2k+1 share key group k
    layer.queries.assign(queries)
    slots = to_numpy(layer(_tokens())["slots"])
    np.testing.assert_allclose(slots[:, 1], slots[:, 0], atol=1e-6)
    np.testing.assert_allclose(slots[:, 3], slots[:, 2], atol=1e-6)
    assert not np.allclose(slots[:, 0], slots[:, 2], atol=1e-3)


def test_parameter_count_and_key_value_tying():
    d, num_slots, dk, v = 48, 8, 6, 5
    for group_size in (1, 2):
        tied = SPAROReadout(num_slots, v, dk, group_size=group_size)
        tied.build((None, None, d))
        keys = num_slots // group_size
        assert tied.count_params() == num_slots * dk + (d + 1) * keys * dk + (dk + 1) * v
        assert [x.path.split("/")[-2:] for x in tied.weights if len(x.shape) == 2 and x.shape[0] == d] == [
            ["key", "kernel"]]
        untied = SPAROReadout(num_slots, v, dk, group_size=group_size, share_key_value=False)
        untied.build((None, None, d))
        assert untied.count_params() == tied.count_params() + (d + 1) * keys * dk
    # The per-tower read-out sizes of docs/families/sparo.md §Presets.
    for d, num_slots, expected in ((768, 64, 3_158_080), (768, 128, 6_312_000), (512, 64, 2_109_504),
                                   (512, 128, 4_214_848), (384, 64, 1_585_216)):
        assert num_slots * 64 + (d + 1) * num_slots * 64 + 65 * 64 == expected


def test_slot_independence_in_queries_and_key_columns():
    layer = _readout()
    h = _tokens()
    names = [v.path for v in layer.trainable_variables]
    index = names.index(layer.queries.path)
    values = [to_numpy(v) for v in layer.trainable_variables]
    probe = np.random.default_rng(3).normal(size=(V,)).astype("float32")
    for slot in range(L):
        def loss(q, slot=slot):
            variables = list(values)
            variables[index] = q
            slots = layer.stateless_call(variables, [], h)[0]["slots"]
            return keras.ops.sum(slots[:, slot] * keras.ops.convert_to_tensor(probe))

        _, (grad,) = value_and_grad(loss, values[index])
        others = [m for m in range(L) if m != slot]
        assert np.abs(grad[slot]).max() > 1e-4
        np.testing.assert_array_equal(grad[others], 0.0)
    # Perturbing slot 1's key columns moves slot 1 only.
    before = to_numpy(layer(h)["slots"])
    kernel = to_numpy(layer.key.kernel).copy()
    kernel[:, D:2 * D] += 0.3
    layer.key.kernel.assign(kernel)
    after = to_numpy(layer(h)["slots"])
    np.testing.assert_array_equal(after[:, [0, 2, 3]], before[:, [0, 2, 3]])
    assert np.abs(after[:, 1] - before[:, 1]).max() > 1e-3


def test_key_bias_shifts_slots_without_moving_attention():
    layer = _readout()
    h = _tokens()
    before = layer(h)
    delta = np.random.default_rng(4).normal(size=(D,))
    bias = to_numpy(layer.key.bias).copy()
    bias[2 * D:3 * D] += delta
    layer.key.bias.assign(bias)
    after = layer(h)
    np.testing.assert_allclose(to_numpy(after["attention"]), to_numpy(before["attention"]), atol=1e-6)
    shift = to_numpy(after["slots"]) - to_numpy(before["slots"])
    np.testing.assert_allclose(shift[:, 2], np.broadcast_to(delta @ ref.w(layer.output_dense.kernel), (3, V)),
                               atol=1e-5)
    np.testing.assert_allclose(shift[:, [0, 1, 3]], 0.0, atol=1e-6)


def test_positions_after_the_end_index_are_masked_exactly():
    layer = _readout()
    h = _tokens()
    end = np.array([2, 6, 0])
    out = layer(h, end_index=end)
    attention = to_numpy(out["attention"])
    after_end = np.arange(7)[None, None] > end[:, None, None]
    assert np.all(attention[np.broadcast_to(after_end, attention.shape)] == 0.0)
    np.testing.assert_allclose(attention.sum(-1), 1.0, atol=1e-6)
    changed = h.copy()
    changed[np.broadcast_to(after_end[:, 0, :, None], h.shape)] = 7.0
    np.testing.assert_array_equal(to_numpy(layer(changed, end_index=end)["slots"]), to_numpy(out["slots"]))
    at_end = h.copy()
    at_end[0, 2] += 1.0  # position == end: attended
    assert np.abs(to_numpy(layer(at_end, end_index=end)["slots"])[0] - to_numpy(out["slots"])[0]).max() > 1e-4
    # A single allowed token: y_l = W (K_l h_0 + b_l) + c.
    single = to_numpy(out["slots"])[2]
    kernel, bias = ref.w(layer.key.kernel), ref.w(layer.key.bias)
    keys = (h[2, 0] @ kernel + bias).reshape(L, D)
    np.testing.assert_allclose(single, keys @ ref.w(layer.output_dense.kernel) + ref.w(layer.output_dense.bias),
                               atol=1e-5)


def test_bfloat16_softmax_stays_finite_and_masked():
    layer = SPAROReadout(L, V, D, dtype="bfloat16")
    h = keras.ops.cast(_tokens() * 30.0, "bfloat16")  # large logits
    out = layer(h, end_index=np.array([1, 3, 6]))
    assert keras.backend.standardize_dtype(out["attention"].dtype) == "float32"
    attention, slots = to_numpy(out["attention"]), to_numpy(keras.ops.cast(out["slots"], "float32"))
    assert np.isfinite(attention).all() and np.isfinite(slots).all()
    assert np.all(attention[0, :, 2:] == 0.0) and np.all(attention[1, :, 4:] == 0.0)
    np.testing.assert_allclose(attention.sum(-1), 1.0, atol=1e-5)


def test_vision_readout_is_permutation_invariant():
    layer = _readout()
    h = _tokens(length=9)
    perm = np.random.default_rng(5).permutation(9)
    np.testing.assert_allclose(to_numpy(layer(h[:, perm])["slots"]), to_numpy(layer(h)["slots"]), atol=1e-5)


def test_end_token_index_takes_the_first_end_token():
    # End-token padding (keras-hub / HF CLIP tokenizers) makes argmax ambiguous: the first one counts.
    ids = np.array([[49406, 320, 49407, 49407, 49407], [49406, 320, 1125, 49407, 0], [49406, 5, 6, 7, 8]], "int32")
    # Default: the first largest id, as open_clip's argmax (row 3 has no end token: its start token wins).
    np.testing.assert_array_equal(to_numpy(end_token_index(ids)), [2, 3, 0])
    # An explicit end id: its first position, T - 1 when absent.
    np.testing.assert_array_equal(to_numpy(end_token_index(ids, end_token_id=49407)), [2, 3, 4])
    np.testing.assert_array_equal(to_numpy(end_token_index(ids, end_token_id=320)), [1, 1, 4])  # absent: T - 1


def test_initialisation_statistics():
    layer = SPAROReadout(64, 64, 64)
    layer.build((None, None, 96))
    q = to_numpy(layer.queries)
    assert abs(q.std() - 1.0) < 0.05 and abs(q.mean()) < 0.05
    kernel, limit = to_numpy(layer.key.kernel), math.sqrt(6 / (96 + 64 * 64))
    assert np.abs(kernel).max() <= limit and np.abs(kernel).max() > 0.95 * limit
    w_out = to_numpy(layer.output_dense.kernel)
    assert np.abs(w_out).max() <= 1 / 8 and np.abs(w_out).max() > 0.95 / 8
    assert not to_numpy(layer.key.bias).any() and not to_numpy(layer.output_dense.bias).any()


def test_readout_serialization_round_trip():
    layer = _readout(group_size=2, share_key_value=False, name="readout")
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert isinstance(restored, SPAROReadout) and restored.get_config() == layer.get_config()
    restored.set_weights(layer.get_weights())
    h = _tokens()
    np.testing.assert_array_equal(to_numpy(restored(h)["slots"]), to_numpy(layer(h)["slots"]))


def test_readout_rejects_bad_arguments():
    with pytest.raises(ValueError, match="group_size"):
        SPAROReadout(6, 8, 8, group_size=4)
    with pytest.raises(ValueError, match="num_slots"):
        SPAROReadout(0, 8, 8)
    layer = _readout()
    with pytest.raises(ValueError, match=r"`tokens` must have shape \(B, n, 32\)"):
        layer(np.zeros((2, 5, 16), "float32"))
    with pytest.raises(ValueError, match="end_index"):
        layer(_tokens(), end_index=np.zeros((3, 1), "int32"))


# ---------------------------------------------------------------- normalisation and selection


def test_hand_checked_slot_normalisation():
    # Slots (3, 4) and (0, 2): unit slots (0.6, 0.8), (0, 1), each divided by sqrt(2).
    out = to_numpy(normalize_slots(np.array([[3.0, 4.0, 0.0, 2.0]]), slot_dim=2))
    np.testing.assert_allclose(out, [[0.6 / math.sqrt(2), 0.8 / math.sqrt(2), 0.0, 1 / math.sqrt(2)]], atol=1e-7)
    zero = to_numpy(normalize_slots(np.array([[0.0, 0.0, 1.0, 0.0]]), slot_dim=2))
    np.testing.assert_array_equal(zero, [[0.0, 0.0, 1 / np.float32(math.sqrt(2)), 0.0]])
    with pytest.raises(ValueError, match=r"\(B, S \* 3\)"):
        normalize_slots(np.ones((2, 4)), slot_dim=3)


def test_normalised_encodings_and_mean_slot_cosine():
    model = _model()
    batch = tiny_batch()
    img = to_numpy(model.encode_image(batch["images"], normalize=True)["embeds"])
    txt = to_numpy(model.encode_text(batch, normalize=True)["embeds"])
    for y in (img, txt):
        np.testing.assert_allclose(np.linalg.norm(y.reshape(4, L, V), axis=-1), 1 / math.sqrt(L), atol=1e-6)
        np.testing.assert_allclose(np.linalg.norm(y, axis=-1), 1.0, atol=1e-6)
    raw_img = to_numpy(model.encode_image(batch["images"])["embeds"])
    raw_txt = to_numpy(model.encode_text(batch)["embeds"])
    np.testing.assert_allclose(img @ txt.T, np_mean_slot_cosine(raw_img, raw_txt, V), atol=1e-6)


def test_slot_selection_scores_the_mean_cosine_over_the_chosen_slots():
    model = _model()
    batch = tiny_batch()
    scale = math.exp(float(to_numpy(model.logit_scale)))
    raw_img = to_numpy(model.encode_image(batch["images"])["embeds"])
    raw_txt = to_numpy(model.encode_text(batch)["embeds"])
    full = to_numpy(model.similarity(batch["images"], batch))
    np.testing.assert_allclose(full, scale * np_mean_slot_cosine(raw_img, raw_txt, V), atol=1e-4)
    np.testing.assert_allclose(to_numpy(model.similarity(batch["images"], batch, slots=np.ones(L, bool))), full,
                               atol=1e-5)
    subset = to_numpy(model.similarity(batch["images"], batch, slots=[3, 1]))
    np.testing.assert_allclose(subset, scale * np_mean_slot_cosine(raw_img, raw_txt, V, [1, 3]), atol=1e-4)
    assert np.abs(subset - full).max() > 1e-2
    np.testing.assert_allclose(to_numpy(model.similarity(batch["images"], batch, slots=[1, 3])), subset, atol=1e-6)
    mask = np.array([False, True, False, True])
    np.testing.assert_allclose(to_numpy(model.score({"embeds": raw_img}, {"embeds": raw_txt}, slots=mask)), subset,
                               atol=1e-5)
    selected = model.encode_image(batch["images"], normalize=True, slots=[3, 1])
    assert set(selected) == {"embeds"}
    selected = to_numpy(selected["embeds"])
    assert selected.shape == (4, 2 * V)
    np.testing.assert_allclose(selected, np_normalize_slots(raw_img.reshape(4, L, V)[:, [1, 3]].reshape(4, -1), V),
                               atol=1e-6)
    for bad, error in (([], ValueError), ([0, 4], ValueError), ([1, 1], ValueError), (np.ones(3, bool), ValueError),
                       ([0.5], TypeError)):
        with pytest.raises(error, match="slots"):
            model.score({"embeds": raw_img}, {"embeds": raw_txt}, slots=bad)
    with pytest.raises(ValueError, match=r"`image_embeds` must have shape \(B, 32\)"):
        model.score({"embeds": raw_img[:, :8]}, {"embeds": raw_txt})


def test_per_slot_zero_shot_accuracy_and_ranking():
    rng = np.random.default_rng(6)
    n, c, k, num_slots, v = 12, 3, 2, 5, 4
    labels = rng.integers(0, c, size=n)
    class_embeds = rng.normal(size=(c, k, num_slots * v))
    image_embeds = rng.normal(size=(n, num_slots * v))
    # Slot 3 sees each image's class prompt (accuracy 1); others are random.
    image_embeds.reshape(n, num_slots, v)[:, 3] = class_embeds.reshape(c, k, num_slots, v)[labels, 0, 3] * 2.0
    class_embeds.reshape(c, k, num_slots, v)[:, 1, 3] = class_embeds.reshape(c, k, num_slots, v)[:, 0, 3]
    acc = to_numpy(per_slot_zero_shot_accuracy(image_embeds, class_embeds, labels, slot_dim=v))
    expected = np_slot_accuracy(image_embeds, class_embeds, labels, v)
    np.testing.assert_allclose(acc, expected, atol=1e-6)
    assert acc[3] == 1.0
    np.testing.assert_array_equal(rank_slots(acc), np.argsort(-expected, kind="stable"))
    assert rank_slots(acc, top_k=1).tolist() == [3]
    # Ties go to the lower slot index; one template per class may be passed as (C, L * V).
    np.testing.assert_array_equal(rank_slots(np.array([0.5, 0.7, 0.5, 0.7])), [1, 3, 0, 2])
    one = to_numpy(per_slot_zero_shot_accuracy(image_embeds, class_embeds[:, 0], labels, slot_dim=v))
    np.testing.assert_allclose(one, np_slot_accuracy(image_embeds, class_embeds[:, :1], labels, v), atol=1e-6)
    with pytest.raises(ValueError, match="class_embeds"):
        per_slot_zero_shot_accuracy(image_embeds, class_embeds[..., :-1], labels, slot_dim=v)
    with pytest.raises(ValueError, match="top_k"):
        rank_slots(acc, top_k=6)


def test_model_ranks_slots_by_zero_shot_accuracy():
    model = _model()
    batch = tiny_batch(batch_size=6, seed=2)
    labels = np.array([0, 1, 2, 0, 1, 2])
    prompts = tiny_batch(batch_size=6, seed=3)
    class_texts = {key: prompts[key].reshape(3, 2, -1) for key in ("token_ids", "padding_mask")}
    acc = to_numpy(slot_zero_shot_accuracy(model, batch["images"], labels, class_texts))
    class_embeds = to_numpy(model.encode_text(prompts)["embeds"]).reshape(3, 2, L * V)
    image_embeds = to_numpy(model.encode_image(batch["images"])["embeds"])
    # Every image's best class wins in every slot by a margin: the model's argmaxes are the reference's.
    assert ranking_gap(np_slot_scores(image_embeds, class_embeds, V), axis=2) >= DECISION_MARGIN
    expected = np_slot_accuracy(image_embeds, class_embeds, labels, V)
    np.testing.assert_allclose(acc, expected, atol=1e-6)
    np.testing.assert_array_equal(select_slots(model, batch["images"], labels, class_texts, top_k=2),
                                  np.argsort(-expected, kind="stable")[:2])


# ---------------------------------------------------------------- the model


def test_model_forward_scores_and_loss_match_numpy():
    model = _model()
    batch = tiny_batch()
    _, vis = ref.vision_forward(batch["images"], model.vision)
    _, txt = ref.text_forward(batch["token_ids"], batch["padding_mask"], model.text)
    end = batch["padding_mask"].sum(1) - 1  # tiny_batch puts the end token (id 63) last
    img_slots, img_maps = np_readout(vis, model.vision_readout)
    txt_slots, txt_maps = np_readout(txt, model.text_readout, end)
    y_img, y_txt = img_slots.reshape(4, -1), txt_slots.reshape(4, -1)
    np.testing.assert_allclose(to_numpy(model.encode_image(batch["images"])["embeds"]), y_img, atol=2e-5)
    np.testing.assert_allclose(to_numpy(model.encode_text(batch)["embeds"]), y_txt, atol=2e-5)
    np.testing.assert_allclose(to_numpy(model.image_attention(batch["images"])), img_maps, atol=1e-5)
    np.testing.assert_allclose(to_numpy(model.text_attention(batch)), txt_maps, atol=1e-5)
    scale = math.exp(float(to_numpy(model.logit_scale)))
    np.testing.assert_allclose(to_numpy(model.similarity(batch["images"], batch)),
                               scale * np_mean_slot_cosine(y_img, y_txt, V), atol=1e-4)
    loss = float(to_numpy(model.compute_loss(y_pred=model(batch))))
    expected = reference.clip_loss(np_normalize_slots(y_img, V), np_normalize_slots(y_txt, V), scale)
    assert abs(loss - expected) < 1e-4
    # Not the globally normalised concatenation (plain CLIP on y): SPARO weighs every slot equally.
    assert abs(expected - reference.clip_loss(y_img, y_txt, scale)) > 1e-3


def test_architecture_depth_norms_and_no_projection():
    model = _model()
    assert len(model.vision.blocks) == len(model.text.blocks) == 2  # 3 - reduce_depth
    assert model.vision.projection is None and model.text.projection is None
    assert model.vision.num_prefix_tokens == 1 and model.vision.use_pre_norm
    for tower in (model.vision, model.text):
        assert tower.layer_norm_epsilon == 1e-5 and tower.activation == "gelu"
        assert all(b.ln_1.epsilon == 1e-5 and b.num_layers == 2 for b in tower.blocks)
    assert model.vision_readout.key_dim == model.text_readout.key_dim == 32 // 4
    assert tuple(model.image_attention(tiny_batch()["images"]).shape) == (4, L, 1 + 16)  # CLS + 4x4 patches
    assert model.embed_dim == L * V and model.get_config()["vision"]["num_layers"] == 3
    full = _model(reduce_depth=0)
    assert len(full.vision.blocks) == 3 and full.get_config()["text"]["num_layers"] == 3


def test_padding_after_the_end_token_does_not_change_text_encodings():
    model = _model()
    batch = tiny_batch()
    other = dict(batch)
    rng = np.random.default_rng(7)
    other["token_ids"] = np.where(batch["padding_mask"], batch["token_ids"],
                                  rng.integers(1, 63, size=batch["token_ids"].shape)).astype("int32")
    assert not np.array_equal(other["token_ids"], batch["token_ids"])
    plain = to_numpy(model.encode_text(batch)["embeds"])
    np.testing.assert_allclose(to_numpy(model.encode_text(other)["embeds"]), plain, atol=1e-6)
    # End-token padding (ties of the largest id) reads the same positions.
    padded = dict(batch, token_ids=np.where(batch["padding_mask"], batch["token_ids"], 63).astype("int32"))
    np.testing.assert_allclose(to_numpy(model.encode_text(padded)["embeds"]), plain, atol=1e-6)
    changed = dict(batch, token_ids=batch["token_ids"].copy())
    changed["token_ids"][0, 0] = (changed["token_ids"][0, 0] % 60) + 1
    assert np.abs(to_numpy(model.encode_text(changed)["embeds"])[0]
                  - to_numpy(model.encode_text(batch)["embeds"])[0]).max() > 1e-4


def test_weight_decay_covers_queries_and_kernels_only():
    model = _model()
    excluded = {v.path for v in model.no_weight_decay_variables()}
    names = {v.path: v.path.split("/")[-1] for v in model.trainable_variables}
    decayed = {names[p] for p in names if p not in excluded}
    assert decayed == {"kernel", "queries"}
    assert model.vision_readout.queries.path not in excluded
    assert {"bias", "gamma", "beta", "logit_scale", "prefix_tokens"} <= {names[p] for p in excluded}


def test_logit_scale_init_and_clamp():
    model = _model()
    assert abs(float(to_numpy(model.logit_scale_value())) - 1 / 0.07) < 1e-3
    model.logit_scale.assign(8.0)
    model.compile(optimizer=keras.optimizers.SGD(0.0))
    model.train_on_batch(tiny_batch())
    assert abs(float(to_numpy(model.logit_scale)) - LOGIT_SCALE_MAX) < 1e-6


@pytest.mark.slow
def test_fit_lowers_the_loss():
    keras.utils.set_random_seed(0)
    model = _model()
    before, after = fit_and_measure(model, tiny_batch(batch_size=8, seed=1))
    assert after < 0.6 * before, (before, after)


def test_mixed_precision_keeps_encodings_and_loss_in_float32():
    model = _model(dtype="mixed_bfloat16")
    batch = tiny_batch()
    outputs = model(batch)
    assert keras.backend.standardize_dtype(outputs["image_embeds"].dtype) == "bfloat16"
    loss = model.compute_loss(y_pred=outputs)
    assert keras.backend.standardize_dtype(loss.dtype) == "float32" and np.isfinite(float(to_numpy(loss)))
    normalised = model.encode_text(batch, normalize=True)
    assert keras.backend.standardize_dtype(normalised["embeds"].dtype) == "float32"


def test_save_load_round_trip_and_config(tmp_path):
    model = _model(group_size=2, end_token_id=63)
    batch = tiny_batch()
    model.save_to_preset(tmp_path / "sparo")
    loaded = vlzoo.from_preset(str(tmp_path / "sparo"))
    assert type(loaded) is SPARO and loaded.get_config() == model.get_config()
    for a, b in zip(model.weights, loaded.weights):
        assert a.path == b.path
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))
    np.testing.assert_array_equal(to_numpy(loaded.similarity(batch["images"], batch, slots=[0, 2])),
                                  to_numpy(model.similarity(batch["images"], batch, slots=[0, 2])))
    overrides = dict(num_slots=8, slot_dim=4, key_dim=6, group_size=4, share_key_value=False, reduce_depth=2,
                     end_token_id=None)
    rebuilt = SPARO.from_config({**model.get_config(), **overrides})
    assert rebuilt.get_config() == {**model.get_config(), **overrides}
    assert len(rebuilt.vision.blocks) == 1 and rebuilt.text_readout.value is not None
    # The embedding width is derived, not stored, so slot overrides of a preset cannot contradict it.
    assert "embed_dim" not in model.get_config() and rebuilt.embed_dim == 32
    assert vlzoo.from_preset("sparo_tiny", load_weights=False, num_slots=8, slot_dim=2).embed_dim == 16


def test_model_rejects_inconsistent_arguments():
    with pytest.raises(ValueError, match="embed_dim"):
        _model(embed_dim=512)
    with pytest.raises(ValueError, match="num_layers"):
        _model(reduce_depth=3)
    with pytest.raises(ValueError, match="reduce_depth"):
        _model(reduce_depth=-1)


# ---------------------------------------------------------------- presets


SPEC_COUNTS = {  # counts of the authors' code (model.parameters())
    "sparo_clip_vit_b16": (sparo_clip_config(16), 143_992_705),
    "sparo_clip_vit_b32": (sparo_clip_config(32), 145_649_281),
    "sparo_clip_vit_b32_l128": (sparo_clip_config(32, num_slots=128), 150_908_545),
    "b32_v8": (sparo_clip_config(32, slot_dim=8), 145_642_001),
    "b16_l128": (sparo_clip_config(16, num_slots=128), 149_251_969),
}


@pytest.mark.parametrize("name", sorted(SPEC_COUNTS))
def test_parameter_counts_match_the_authors_configs(name):
    config, expected = SPEC_COUNTS[name]
    if name in PRESETS:
        assert PRESETS[name]["config"] == config
    total, towers, readouts = _count_abstractly(config)
    assert total == expected
    assert towers == (11, 11)
    num_slots = config["num_slots"]
    assert readouts == [num_slots * 64 + 769 * num_slots * 64 + (64 + 1) * config["slot_dim"],
                        num_slots * 64 + 513 * num_slots * 64 + (64 + 1) * config["slot_dim"]]


def test_presets_use_exact_gelu_and_open_clip_layer_norm():
    assert set(PRESETS) == {"sparo_clip_vit_b16", "sparo_clip_vit_b32", "sparo_clip_vit_b32_l128", "sparo_tiny",
                            "sparo_shapes"}
    for name, preset in PRESETS.items():
        config = preset["config"]
        for tower in ("vision", "text"):
            assert config[tower]["activation"] == "gelu", name
            assert config[tower].get("layer_norm_epsilon", 1e-5) == 1e-5, name
        assert config["reduce_depth"] == 1 and "embed_dim" not in config
    tiny = SPARO(**PRESETS["sparo_tiny"]["config"])
    assert (tiny.num_slots, tiny.slot_dim, tiny.vision_readout.key_dim, len(tiny.text.blocks)) == (4, 8, 8, 2)
    ids = np.array([[49406, 320, 49407, 49407]], "int32")
    attention = to_numpy(tiny.text_attention({"token_ids": ids, "padding_mask": np.array([[1, 1, 1, 0]], bool)}))
    assert np.all(attention[0, :, 3] == 0.0) and np.all(attention[0, :, 2] > 0.0)
