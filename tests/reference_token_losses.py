"""Numpy references of the token-level losses (FILIP, SPARC), independent of
vlzoo and Keras, in float64, written from the papers (docs/families/filip.md, sparc.md) with plain
loops over pairs and tokens where it keeps them obviously right.
"""

import math

import numpy as np

from reference import l2_normalize
from reference import log_softmax

# ------------------------------------------------------------------ FILIP


def filip_similarity(image_tokens, text_tokens, text_mask, image_mask=None):
    """`(S_I, S_T)`, each `(B_img, B_txt)`, by loops over pairs.

    S_I[i, j] = mean_{p real} max_{t real} <x_ip, y_jt>
    S_T[i, j] = mean_{t real} max_{p real} <x_ip, y_jt>
    (0 when a side has no real token)."""
    x = l2_normalize(image_tokens)
    y = l2_normalize(text_tokens)
    tm = np.asarray(text_mask, bool)
    im = (np.ones(x.shape[:2], bool) if image_mask is None
          else np.asarray(image_mask, bool))
    s_i = np.zeros((len(x), len(y)))
    s_t = np.zeros((len(x), len(y)))
    for i in range(len(x)):
        for j in range(len(y)):
            xi, yj = x[i][im[i]], y[j][tm[j]]
            if len(xi) == 0 or len(yj) == 0:
                continue
            a = xi @ yj.T  # (P_real, T_real)
            s_i[i, j] = a.max(axis=1).mean()
            s_t[i, j] = a.max(axis=0).mean()
    return s_i, s_t


def filip_loss_from_similarity(s_i, s_t, logit_scale, image_ids=None):
    """Eq. 1 from the two similarity matrices (rows of `S_I` for images,
    columns of `S_T` for texts)."""
    li = float(logit_scale) * np.asarray(s_i, np.float64)
    lt = float(logit_scale) * np.asarray(s_t, np.float64).T
    n = len(li)
    if image_ids is None:
        targets = np.eye(n)
    else:
        ids = np.asarray(image_ids)
        pos = (ids[:, None] == ids[None, :]).astype(np.float64)
        targets = pos / pos.sum(1, keepdims=True)
    i2t = -np.sum(targets * log_softmax(li, 1)) / n
    t2i = -np.sum(targets * log_softmax(lt, 1)) / n
    return 0.5 * (i2t + t2i)


def filip_loss(image_tokens, text_tokens, text_mask, logit_scale,
               image_mask=None, image_ids=None):
    s_i, s_t = filip_similarity(image_tokens, text_tokens, text_mask,
                                image_mask)
    return filip_loss_from_similarity(s_i, s_t, logit_scale, image_ids)


def filip_wrong_variants(s_i, s_t, logit_scale):
    """Known-wrong losses of the hand-worked case in test_filip_loss.py, from the right
    similarity matrices (the pad variants need the tokens: see the test)."""
    s = float(logit_scale)
    n = len(s_i)
    d = np.arange(n)

    def ce_rows(logits):
        return -np.mean(log_softmax(logits, 1)[d, d])

    return {
        # text->image term built from S_I^T instead of S_T^T
        "t2i_from_s_i": 0.5 * (ce_rows(s * s_i) + ce_rows(s * s_i.T)),
        # image->text term built from S_T instead of S_I
        "i2t_from_s_t": 0.5 * (ce_rows(s * s_t) + ce_rows(s * s_t.T)),
        # text->image softmax over the rows of S_T (not its columns)
        "t2i_rows_of_s_t": 0.5 * (ce_rows(s * s_i) + ce_rows(s * s_t)),
    }


def filip_keep_count(n, keep_ratio):
    """`max(1, round_half_up(keep_ratio * n))` (at most n)."""
    return min(n, max(1, int(math.floor(keep_ratio * n + 0.5))))


def filip_selection(image_tokens, text_tokens, text_mask, keep_ratio,
                    group_size=None):
    """Indices kept by FILIP's token dropping: `(B, k_P)` and `(B, k_T)`,
    each row sorted by decreasing score. Scores: the max similarity against
    all real tokens of the partners in the same group (contiguous blocks of
    `group_size`; None = whole batch); padded text tokens score -inf."""
    x = l2_normalize(image_tokens)
    y = l2_normalize(text_tokens)
    tm = np.asarray(text_mask, bool)
    b = len(x)
    g = np.zeros(b, int) if group_size is None else np.arange(b) // group_size
    a = np.einsum("ipd,jtd->ijpt", x, y)
    a = np.where(tm[None, :, None, :], a, -np.inf)
    a = np.where((g[:, None] == g[None, :])[:, :, None, None], a, -np.inf)
    score_img = a.max(axis=(1, 3))
    score_txt = a.max(axis=(0, 2))
    score_txt = np.where(tm, score_txt, -np.inf)
    kp = filip_keep_count(x.shape[1], keep_ratio)
    kt = filip_keep_count(y.shape[1], keep_ratio)
    idx_img = np.argsort(-score_img, axis=1, kind="stable")[:, :kp]
    idx_txt = np.argsort(-score_txt, axis=1, kind="stable")[:, :kt]
    return idx_img, idx_txt


def filip_loss_dropped(image_tokens, text_tokens, text_mask, logit_scale,
                       keep_ratio, group_size=None):
    """FILIP loss after token dropping (static `k`, kept padding masked)."""
    ii, ti = filip_selection(image_tokens, text_tokens, text_mask, keep_ratio,
                             group_size)
    x = np.take_along_axis(np.asarray(image_tokens, np.float64),
                           ii[..., None], 1)
    y = np.take_along_axis(np.asarray(text_tokens, np.float64),
                           ti[..., None], 1)
    m = np.take_along_axis(np.asarray(text_mask, bool), ti, 1)
    return filip_loss(x, y, m, logit_scale)


def filip_ensemble_scores(image_tokens, text_tokens, text_mask):
    """`(B, N)`: mean over the `K` templates of `S_I`; text `(N, K, T, D)`."""
    n, k = np.shape(text_mask)[:2]
    out = np.zeros((len(image_tokens), n))
    for c in range(n):
        for t in range(k):
            s_i, _ = filip_similarity(image_tokens, text_tokens[c, t][None],
                                      text_mask[c, t][None])
            out[:, c] += s_i[:, 0] / k
    return out


# ------------------------------------------------------------------ SPARC


def sparc_alignment_weights(patch_embeds, token_embeds, threshold=None):
    """`(B, T, P)` by loops over rows: min-max over patches (a row with all
    similarities equal -> all 1), `s < threshold -> 0`, divide by the sum."""
    v = np.asarray(patch_embeds, np.float64)
    t = np.asarray(token_embeds, np.float64)
    b, n_tok, n_patch = len(t), t.shape[1], v.shape[1]
    sigma = 1.0 / n_patch if threshold is None else threshold
    a = np.zeros((b, n_tok, n_patch))
    for i in range(b):
        for l in range(n_tok):
            s = v[i] @ t[i, l]
            lo, hi = s.min(), s.max()
            sh = np.ones_like(s) if hi == lo else (s - lo) / (hi - lo)
            st = np.where(sh < sigma, 0.0, sh)
            a[i, l] = st / st.sum()
    return a


def sparc_fine_grained(patch_embeds, token_embeds, token_mask, logit_scale,
                       threshold=None, reduction="tokens", weights=None):
    """`(L_vl, L_lv, L_f)` by loops over samples, only the real tokens
    entering (which is what key and query masking amount to). `weights`
    overrides the alignment (to build a stop-gradient variant)."""
    v = np.asarray(patch_embeds, np.float64)
    t = np.asarray(token_embeds, np.float64)
    m = np.asarray(token_mask, bool)
    a = (sparc_alignment_weights(v, t, threshold) if weights is None
         else np.asarray(weights, np.float64))
    per_vl, per_lv, counts = [], [], []
    for i in range(len(t)):
        c = l2_normalize(a[i] @ v[i])[m[i]]
        tn = l2_normalize(t[i])[m[i]]
        z = float(logit_scale) * c @ tn.T  # rows c_j, columns t_k
        n = len(z)
        per_vl.append(-np.trace(log_softmax(z, 1)) if n else 0.0)
        per_lv.append(-np.trace(log_softmax(z.T, 1)) if n else 0.0)
        counts.append(n)
    per_vl, per_lv = np.array(per_vl), np.array(per_lv)
    counts = np.array(counts, np.float64)
    if reduction == "tokens":
        l_vl = per_vl.sum() / max(counts.sum(), 1.0)
        l_lv = per_lv.sum() / max(counts.sum(), 1.0)
    else:
        l_vl = np.mean(per_vl / np.maximum(counts, 1.0))
        l_lv = np.mean(per_lv / np.maximum(counts, 1.0))
    return l_vl, l_lv, 0.5 * (l_vl + l_lv)


def sparc_fine_grained_loss(*args, **kwargs):
    return sparc_fine_grained(*args, **kwargs)[2]


def masked_mean(x, mask):
    """`(B, D)` mean of `(B, T, D)` over the real tokens."""
    x = np.asarray(x, np.float64)
    m = np.asarray(mask, np.float64)[..., None]
    return (x * m).sum(1) / np.maximum(m.sum(1), 1.0)
