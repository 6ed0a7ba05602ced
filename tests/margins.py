"""How far a test's inputs keep from the ties of a family's discrete choices.

Two computations of the same loss (the whole batch and its micro-batches, two
backends, two thread counts) add the same float32 terms in different orders:
their values agree to about 1e-6 of their scale, not bit for bit. Where the
loss goes through a discrete choice (a max or min, a top-k, a threshold, a
ReLU at 0), the two computations take the same branch only when the candidates
differ by more than that. Near a tie each branch gives a valid gradient, and
they can differ by a whole term: STAIR's max pooling with two positions
3.7e-8 apart failed the gradient-caching test on an Intel AMX host.

A test that compares gradients or values through such a choice calls
`assert_decision_margin(model, batch)` first: every choice of the family's
training loss on that batch must be decided by at least `DECISION_MARGIN` of
its values' scale: 14 times the largest difference between the whole-batch
and the micro-batched features that decide them (7.2e-7 of their scale, on
JAX; 3.9e-7 on TensorFlow, 2.0e-7 on PyTorch; the same with one thread and
the ISAs capped to AVX2), so that both computations take the same branch on
any CPU whose float32 arithmetic is IEEE's, in any summation order.

The margins are computed here in float64 NumPy from the model's own features,
independently of the library's loss code. Families whose losses are smooth
(CLIP, SigLIP, SPARO, Llip and FLAIR: softmax, sigmoid and attention) have no
such choice.
"""

import warnings

import numpy as np
from keras import ops

import vlzoo
from vlzoo.models.stair import BERT_SPECIAL_IDS
from vlzoo.presets import catalogue, merge_config
from vlzoo.tokenizers import BERT_UNCASED_VOCABULARY_SIZE

from conftest import tiny_batch
from reference import l2_normalize
from reference_token_losses import filip_keep_count

DECISION_MARGIN = 1e-5
# One training step of a tiny preset (seeded with `keras.utils.set_random_seed(0)`) on `tiny_batch(8, seed=
# MARGIN_SEED)` keeps every choice `DECISION_MARGIN` from a tie on each backend (at least 5e-5 of the scale),
# with STAIR's vocabulary cut to 32 entries: with 30,522 its 2 x 8 x 30,522 pooled maxima always hold near-ties
# (3.7e-8 apart with seed 1 on JAX: the failure seen on an Intel AMX host).
MARGIN_SEED = 2
TINY_OVERRIDES = {"stair": dict(text={"vocabulary_size": 32}, embed_dim=None, excluded_token_ids=None)}


def top_two_gap(values, axis, valid=None):
    """`max - second max` of `values` along `axis` over the `valid` entries (inf where fewer than two)."""
    values = np.asarray(values, np.float64)
    if valid is not None:
        values = np.where(valid, values, -np.inf)
    ordered = np.sort(values, axis=axis)
    if ordered.shape[axis] < 2:
        return np.full(np.delete(ordered.shape, axis), np.inf)
    top, second = np.take(ordered, -1, axis=axis), np.take(ordered, -2, axis=axis)
    with np.errstate(invalid="ignore"):  # -inf - -inf where fewer than two are valid
        return np.where(np.isfinite(second), top - second, np.inf)


def ranking_gap(scores, axis=1):
    """The smallest gap between two entries of `scores` along `axis` (a ranking, a top-k or an argmax over that
    axis is decided by at least this much)."""
    ordered = np.sort(np.asarray(scores, np.float64), axis=axis)
    return float(np.diff(ordered, axis=axis).min())


def target_gap(scores, targets):
    """The smallest gap between a row's target entry `scores[i, targets[i]]` and any other entry of that row:
    the target's rank (a top-k hit, a recall) is decided by at least this much."""
    scores = np.asarray(scores, np.float64)
    rows = np.arange(len(scores))
    gaps = np.abs(scores - scores[rows, targets][:, None])
    gaps[rows, targets] = np.inf
    return float(gaps.min())


def threshold_gap(values, threshold, valid=None):
    """`|values - threshold|` over the `valid` entries (inf elsewhere)."""
    gap = np.abs(np.asarray(values, np.float64) - threshold)
    return gap if valid is None else np.where(valid, gap, np.inf)


def pooling_margin(logits, valid=None):
    """STAIR's `log1p(relu(max_j logits[:, j]))`: the top two valid positions of every (example, vocabulary entry),
    and the top against the ReLU's 0 (a max below 0 must stay below; one above it must beat the second position
    clipped at 0). `logits` `(B, S, V)`, `valid` `(B, S)` bool; relative to the largest |logit|."""
    logits = np.asarray(logits, np.float64)
    valid = np.ones(logits.shape[:2], bool) if valid is None else np.asarray(valid, bool)
    ordered = np.sort(np.where(valid[:, :, None], logits, -np.inf), axis=1)
    top = ordered[:, -1]
    second = np.maximum(ordered[:, -2], 0.0) if logits.shape[1] > 1 else np.zeros_like(top)
    gap = np.where(top > 0.0, top - second, np.where(np.isfinite(top), -top, np.inf))
    return float(gap.min() / max(np.abs(logits).max(), np.finfo(np.float64).tiny))


def late_interaction_margins(image, text, text_valid, image_valid=None):
    """FILIP's token-wise maxima, both directions: each real image token's best real text token of every caption
    (`S_I`), each real text token's best image token of every image (`S_T`). Tokens `(B_i, P, D)`, `(B_t, T, D)`
    (normalised here), masks `(B_t, T)` and `(B_i, P)` bool. Cosines: the scale is 1."""
    text_valid = np.asarray(text_valid, bool)
    image_valid = np.ones(np.shape(image)[:2], bool) if image_valid is None else np.asarray(image_valid, bool)
    sims = np.einsum("ipd,jtd->ijpt", l2_normalize(image), l2_normalize(text))  # (B_i, B_t, P, T)
    by_text = top_two_gap(sims, axis=3, valid=text_valid[None, :, None, :])  # (B_i, B_t, P)
    by_image = top_two_gap(sims, axis=2, valid=image_valid[:, None, :, None])  # (B_i, B_t, T)
    return {"late interaction, image tokens": np.where(image_valid[:, None, :], by_text, np.inf).min(),
            "late interaction, text tokens": np.where(text_valid[None, :, :], by_image, np.inf).min()}


def sparc_alignment_margins(patches, tokens, token_valid, threshold=None, epsilon=1e-5):
    """SPARC's sparsified alignment of each real token: its patches' min-max scaled similarities `s` keep away
    from the threshold (`1/P` by default), its max and min patches are decided (the gradients flow through
    them), and the spread of its similarities (over `|t| max_p |v_p|`) is away from `epsilon`, below which a row
    is uniform. Embeddings `(B, P, D)`, `(B, T, D)`; mask `(B, T)` bool. `s` lies in [0, 1]: the scale is 1."""
    patches, tokens = np.asarray(patches, np.float64), np.asarray(tokens, np.float64)
    valid = np.asarray(token_valid, bool)
    bound = np.linalg.norm(tokens, axis=-1, keepdims=True) * np.linalg.norm(patches, axis=-1).max(-1)[:, None, None]
    sims = np.einsum("btd,bpd->btp", tokens, patches) / np.where(bound > 0, bound, 1.0)
    lo, hi = sims.min(axis=-1, keepdims=True), sims.max(axis=-1, keepdims=True)
    span = hi - lo
    # A spread of exactly 0 (identical patches, one patch) is exact in every summation order: a uniform row.
    flat = (span == 0.0)[..., 0]
    scaled = (sims - lo) / np.where(span > 0, span, 1.0)
    threshold = 1.0 / patches.shape[1] if threshold is None else threshold
    decided = (valid & ~flat)[:, :, None]
    return {
        "threshold": threshold_gap(scaled, threshold, decided).min(),
        "max patch": np.where(decided[..., 0], top_two_gap(scaled, axis=-1), np.inf).min(),
        "min patch": np.where(decided[..., 0], top_two_gap(-scaled, axis=-1), np.inf).min(),
        "uniform row": np.where(decided[..., 0], np.abs(span[..., 0] - epsilon) / epsilon, np.inf).min(),
    }


def stair_margins(model, batch):
    """STAIR's pooling of both towers' vocabulary logits (`pooling_margin`)."""
    texts = {"token_ids": batch["token_ids"], "padding_mask": batch["padding_mask"]}
    # With `zero_excluded` the excluded entries are multiplied by 0: their choices carry no gradient.
    columns = np.flatnonzero(model._keep) if model.zero_excluded else slice(None)
    return {
        "text pooling": pooling_margin(ops.convert_to_numpy(model.text_token_logits(texts))[:, :, columns],
                                       batch["padding_mask"]),
        "image pooling": pooling_margin(ops.convert_to_numpy(model.image_token_logits(batch["images"]))[:, :, columns]),
    }


def filip_margins(model, batch):
    """FILIP in training: the top-k boundary of the token dropping on each side (the `k`-th kept against the best
    dropped real token), then the late interaction's maxima over the kept tokens (`late_interaction_margins`)."""
    if model.selection_group_size is not None:
        raise NotImplementedError("the margins of FILIP's grouped token selection are not computed here")
    outputs = model(batch, training=True)
    image, text = (l2_normalize(ops.convert_to_numpy(outputs[key])) for key in ("image_tokens", "text_tokens"))
    text_valid = np.asarray(ops.convert_to_numpy(outputs["text_mask"]), bool)
    sims = np.einsum("ipd,jtd->ijpt", image, text)  # (B_i, B_t, P, T)
    sims = np.where(text_valid[None, :, None, :], sims, -np.inf)  # scores against real tokens only
    kept, margins = [], {}
    for name, scores in (("image token selection", sims.max(axis=(1, 3))),
                         ("text token selection", sims.max(axis=(0, 2)))):
        k = filip_keep_count(scores.shape[1], model.keep_ratio)
        ordered = -np.sort(-scores, axis=1)
        with np.errstate(invalid="ignore"):  # -inf - -inf between padded tokens: nan, read as no boundary
            boundary = ordered[:, k - 1] - ordered[:, k] if k < scores.shape[1] else np.full(len(scores), np.inf)
        margins[name] = np.nan_to_num(boundary, nan=np.inf, posinf=np.inf).min()
        kept.append(np.argsort(-scores, axis=1, kind="stable")[:, :k])
    image_kept, text_kept = kept
    image, text = (np.take_along_axis(x, i[..., None], axis=1) for x, i in ((image, image_kept), (text, text_kept)))
    return {**margins, **late_interaction_margins(image, text, np.take_along_axis(text_valid, text_kept, axis=1))}


def sparc_margins(model, batch):
    """SPARC's sparsified alignment of the model's token embeddings (`sparc_alignment_margins`)."""
    outputs = model(batch, training=True)
    return sparc_alignment_margins(*(ops.convert_to_numpy(outputs[key]) for key in ("image_tokens", "text_tokens")),
                                   ops.convert_to_numpy(outputs["text_mask"]), model.threshold)


def stair_restricted_to(token_ids, extra_ids):
    """STAIR overrides that zero every vocabulary entry but the real words of `token_ids` (BERT's specials,
    ids below 999, stay excluded) and `extra_ids`: a few hundred pooled maxima instead of 2 x B x 30,522, which
    random weights cannot all keep from ties. For tests whose captions come from STAIR's own tokenizer."""
    kept = {int(i) for i in np.unique(token_ids) if i >= BERT_SPECIAL_IDS} | {int(i) for i in extra_ids}
    return dict(zero_excluded=True, excluded_token_ids=sorted(set(range(BERT_UNCASED_VOCABULARY_SIZE)) - kept))


FAMILY_MARGINS = {"stair": stair_margins, "filip": filip_margins, "sparc": sparc_margins}


def decision_margins(model, batch):
    """`{choice: relative margin}` of the family's training loss on `batch` (empty for smooth losses)."""
    margins = FAMILY_MARGINS.get(model.family)
    return {} if margins is None else margins(model, batch)


# The choices whose flip changes the loss's value (the others, maxima and minima, change its gradient only).
VALUE_CHOICES = ("image token selection", "text token selection", "threshold")


def assert_decision_margin(model, batch, margin=DECISION_MARGIN, gradients=True):
    """Fails, naming the choice, where `batch` brings one of the model's discrete choices within `margin` of a
    tie: the comparison that follows would then depend on the CPU's summation order, not on the code.
    `gradients=False` checks only the choices that decide the loss's value (`VALUE_CHOICES`)."""
    for choice, value in decision_margins(model, batch).items():
        if not gradients and choice not in VALUE_CHOICES:
            continue
        assert value >= margin, (
            f"{model.family}'s {choice} is decided by {value:.2e} of its scale on this batch, under the {margin:.0e} "
            "that two float32 computations need to take the same branch on every CPU: build the inputs with a "
            "margin (another seed or smaller sizes), do not loosen the comparison."
        )


def tiny_family_model(family, shallow=True, **overrides):
    """`{family}_tiny` with `TINY_OVERRIDES` and `overrides` (a random init: seed it first), with the fewest
    blocks per tower the family accepts (`shallow_towers`) unless `shallow=False`."""
    if shallow:
        overrides = merge_config(shallow_towers(family), overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny presets have no weights
        return vlzoo.from_preset(f"{family}_tiny", **merge_config(TINY_OVERRIDES.get(family, {}), overrides))


def shallow_towers(family):
    """The overrides that give `{family}_tiny` the fewest blocks per tower its family accepts: one, or one more
    than the blocks its towers set aside (`reduce_depth`, SPARO's). For the cross-cutting tests, whose checks
    (a step, its shares and micro-batches, saving, export, degenerate inputs) do not depend on the depth and
    whose tracing and compilation grow with it."""
    blocks = catalogue.definitions()[f"{family}_tiny"]["config"].get("reduce_depth", 0) + 1
    return dict(vision=dict(num_layers=blocks), text=dict(num_layers=blocks))


def margin_batch(model, batch_size=8, captions=1):
    """`tiny_batch(batch_size, seed=MARGIN_SEED)` shaped for `model`; with `captions=2`, a second caption per
    image (`tiny_batch(seed=1)`'s): `(B, 2, T)` token ids and mask (TIPSv2's web and synthetic captions, FLAIR's
    several)."""
    text = dict(sequence_length=model.text.sequence_length, vocabulary_size=model.text.vocabulary_size)
    batch = tiny_batch(batch_size, seed=MARGIN_SEED, image_size=model.vision.image_size, **text)
    if captions == 2:
        second = tiny_batch(batch_size, seed=1, **text)
        batch.update({key: np.stack([batch[key], second[key]], axis=1) for key in ("token_ids", "padding_mask")})
    return batch
